"""The direct data path: a daemon node's client, one hop from the master store.

Nodes a, b, c of these DVMs all have daemons.  A client there sends its
master-store requests straight to the master, vouched for by the credential
its daemon put in its environment at launch; LOCAL ones still go to its
daemon.  The path taken is proven by the master's own counts (``pydvm
info``'s ``direct``), never by timing.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from pathlib import Path

import pytest

from dvmkit import LineReader, finish, job_script, lines, pid_alive, wait_for
from pydvm.client import direct as _direct
from pydvm.errors import PMIxError, Status
from pydvm.runtime.shared.auth import DvmUri
from pydvm.runtime.shared.credential import Credential, Voucher

pytestmark = pytest.mark.e2e


def master_info(dvm) -> dict:
    from pydvm.cli.tool import call

    saved = os.environ.get("PYDVM_STATE_DIR")
    os.environ["PYDVM_STATE_DIR"] = dvm.env["PYDVM_STATE_DIR"]
    try:
        return asyncio.run(call(DvmUri.parse(dvm.uri), {"t": "info"}))
    finally:
        if saved is None:
            os.environ.pop("PYDVM_STATE_DIR", None)
        else:
            os.environ["PYDVM_STATE_DIR"] = saved


def direct_counts(dvm) -> dict:
    return master_info(dvm)["direct"]


def handshake(dvm, token: str, nspace: str, rank: int) -> str:
    """Open a direct connection as a client holding ``token`` would, from
    this (test) process -- no client-side checks in the way.  Returns
    ``OK`` (then closes it) or the refusal's status name and text."""
    info = _direct.DirectInfo(DvmUri.parse(dvm.uri), Credential.parse(token), nspace, rank)
    try:
        ch = _direct.open_blocking(info)
    except PMIxError as exc:
        return f"{exc.status.pmix_name} {exc}"
    assert ch is not None, "the master was unreachable"
    ch.close()
    return "OK"


def cred_lines(reader: LineReader, n: int) -> dict[int, tuple[str, str]]:
    """``{rank: (nspace, token)}`` from the job's first ``n`` CRED lines."""
    found = wait_for(lambda: (c := [ln for ln in list(reader.lines) if ln.startswith("CRED")])
                     and len(c) >= n and c, what=f"{n} CRED lines")
    got = {}
    for ln in found:
        _, rank, ns, token = ln.split(" ", 3)
        got[int(rank)] = (ns, token)
    return got


def test_daemon_node_client_publishes_looks_up_and_unpublishes_over_the_direct_path(dvm):
    """Every master-store request of a client on daemon node b goes straight to
    the master (its counts say four: publish, lookup, unpublish's master part,
    lookup); the LOCAL item still lands in b's node store."""
    before = direct_counts(dvm)
    p = dvm.run("--host", "b", "-n", "1", *job_script("direct_ops"), "basic")
    assert p.returncode == 0, p.stdout + p.stderr
    assert lines(p, "DIRECT") == ["DIRECT True"], p.stdout
    assert "FOUND d-session s1" in p.stdout and "FOUND d-local l1" in p.stdout, p.stdout
    assert lines(p, "GONE") == ["GONE d-other"], p.stdout
    after = direct_counts(dvm)
    assert after["accepted"] == before["accepted"] + 1, (before, after)
    assert after["requests"] == before["requests"] + 4, (before, after)
    assert after["open"] == 0  # closed with its process
    st = dvm.store()
    assert "d-session" in st["master"]["keys"] and "d-local" not in st["master"]["keys"], st
    assert st["b"]["keys"] == ["d-local"], st["b"]


@pytest.mark.parametrize("field,value", [("app", "5"), ("key", "flip"), ("nonce", "00" * 16)])
def test_a_forged_credential_is_refused_no_permissions_and_nothing_is_stored(dvm, field, value):
    """A job process edits its own credential: its direct connection is refused
    PMIX_ERR_NO_PERMISSIONS, the refusal is logged, nothing is stored, and the
    master goes on serving others."""
    p = dvm.run("--host", "b", "-n", "1", *job_script("direct_ops"), "forge", field, value)
    assert p.returncode == 0, p.stdout + p.stderr
    assert lines(p, "PUBLISH") == ["PUBLISH PMIX_ERR_NO_PERMISSIONS"], p.stdout
    assert "forged" not in dvm.store()["master"]["keys"]
    assert "refused a direct connection" in dvm.log("master")
    assert direct_counts(dvm)["refused"] >= 1
    q = dvm.run("--host", "c", "-n", "1", *job_script("direct_ops"), "basic")
    assert "DIRECT True" in q.stdout, q.stdout + q.stderr


def test_a_credential_is_accepted_only_unaltered_and_only_while_its_process_runs(dvm, tmp_path):
    """Presented from elsewhere (this test process, no client library checks):
    rank 1's credential is accepted while rank 1 runs; with another uid, or
    naming rank 0, it is refused; rank 0's own credential is refused once
    rank 0 has exited; rank 1's once the job has ended."""
    go = tmp_path / "go"
    job = dvm.run_bg("--host", "b:2", "-n", "2", *job_script("direct_ops"), "creds", str(go))
    reader = LineReader(job.stdout)
    try:
        creds = cred_lines(reader, 2)
        ns, tok1 = creds[1]
        assert creds[0][0] == ns
        assert handshake(dvm, tok1, ns, 1) == "OK"
        parts = tok1.split(":")
        for forged, rank in ((":".join(parts[:1] + ["4242"] + parts[2:]), 1), (tok1, 0)):
            got = handshake(dvm, forged, ns, rank)
            assert got.startswith("PMIX_ERR_NO_PERMISSIONS"), got
            assert "invalid direct-data credential" in got, got
        got = wait_for(lambda: (r := handshake(dvm, creds[0][1], ns, 0)) != "OK" and r,
                       timeout=10, what="rank 0's credential to be refused")
        assert got.startswith("PMIX_ERR_NO_PERMISSIONS") and "has ended" in got, got
        go.touch()
        assert finish(job) == 0
        got = handshake(dvm, tok1, ns, 1)
        assert got.startswith("PMIX_ERR_NO_PERMISSIONS"), got
    finally:
        go.touch()
        finish(job)
    assert dvm.store()["master"]["items"] == 0


def test_a_lingering_child_of_an_ended_process_loses_its_direct_connection(dvm, tmp_path):
    """A child holding its parent's open direct connection: once the parent is
    reaped the master closes it (a call on it fails UNREACH), a new client is
    refused, and nothing the child tried is stored -- while the job runs on."""
    go, report = tmp_path / "go", tmp_path / "child.out"
    job = dvm.run_bg("--host", "b", "-n", "1", *job_script("direct_ops"), "linger", str(go),
                     str(report), ":", "--host", "c", "-n", "1", "sh", "-c",
                     f'while [ ! -e "{go}.done" ]; do sleep 0.05; done')
    reader = LineReader(job.stdout)
    try:
        parent = int(reader.wait_line("PARENT EXITING").split()[2])
        wait_for(lambda: not pid_alive(parent), what="the parent to exit")
        assert report.read_text().startswith("OPEN True"), report.read_text()
        wait_for(lambda: direct_counts(dvm)["open"] == 0, timeout=10,
                 what="the master to close the child's direct connection")
        go.touch()
        got = wait_for(lambda: report.read_text().count("\n") == 3 and report.read_text(),
                       what="the child's two attempts")
        assert "HELD PMIX_ERR_UNREACH PMIX_ERR_UNREACH: master (direct) connection lost" in got, got
        assert "NEW PMIX_ERR_NO_PERMISSIONS" in got, got
        keys = dvm.store()["master"]["keys"]
        assert "early" in keys and not any(k.startswith("late-") for k in keys), keys
    finally:
        Path(f"{go}.done").touch()
        finish(job)


def test_a_direct_unpublish_also_removes_the_uids_local_item_from_the_node_store(dvm):
    """An unpublish has a node part: rank 1 on b, with its direct connection
    open, unpublishes a key rank 0 published LOCAL; it is gone from b's store."""
    p = dvm.run("--host", "b:2", "-n", "2", *job_script("direct_ops"), "unpub_local")
    assert p.returncode == 0, p.stdout + p.stderr
    assert lines(p, "UNPUB DIRECT") == ["UNPUB DIRECT True"], p.stdout
    assert lines(p, "LK") == ["LK PMIX_ERR_NOT_FOUND"], p.stdout
    assert "lk" not in dvm.store()["b"]["keys"]


def test_a_direct_unpublish_skips_the_node_store_only_while_it_holds_nothing_of_the_uid(dvm):
    """The master knows which uids b's store holds (its daemon reports a
    uid's first item before answering the publish that stored it): 30 times,
    rank 0 publishes a LOCAL key -- each time the store's only item of the
    uid -- and tells rank 1, which unpublishes it over its direct connection;
    every one is gone.  (That an unpublish while the node store holds nothing
    of the uid is not sent there at all, test_metrics.py's request counts
    show.)"""
    p = dvm.run("--host", "b:2", "-n", "2", *job_script("direct_ops"), "unpub_local_rounds",
                "30")
    assert p.returncode == 0, p.stdout + p.stderr
    assert lines(p, "GONE") == ["GONE 30 OF 30 DIRECT True"], p.stdout


def test_the_asyncio_clients_direct_unpublish_reaches_the_node_store_when_it_holds_the_uid(dvm):
    """The asyncio client's unpublish follows the same rule: with a LOCAL item
    of its uid on b, both stores lose the keys; with none, the master alone
    answers; both succeed."""
    p = dvm.run("--host", "b", "-n", "1", *job_script("direct_ops"), "aio_unpub")
    assert p.returncode == 0, p.stdout + p.stderr
    assert lines(p, "GONE") == ["GONE am PMIX_ERR_NOT_FOUND", "GONE al PMIX_ERR_NOT_FOUND"], \
        p.stdout
    assert lines(p, "AIO") == ["AIO direct=True"], p.stdout
    st = dvm.store()
    assert st["b"]["items"] == 0 and "am" not in st["master"]["keys"], st


def test_direct_data_off_hands_out_no_credential_and_refuses_direct_connections(make_dvm):
    """pydvm_direct_data off: no credential in a job's environment, every
    request goes through the daemon (the master counts none), and a
    connection presenting even a correctly made credential is refused."""
    dvm = make_dvm("a,b", pydvm_direct_data="off")
    p = dvm.run("--host", "b", "-n", "1", "sh", "-c", 'echo "CRED ${PYDVM_DIRECT_CRED:-none}"')
    assert lines(p, "CRED") == ["CRED none"], p.stdout
    p = dvm.run("--host", "b", "-n", "1", *job_script("direct_ops"), "basic")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "DIRECT False" in p.stdout and "FOUND d-session s1" in p.stdout, p.stdout
    assert "GONE d-other" in p.stdout, p.stdout
    assert direct_counts(dvm) == {"open": 0, "accepted": 0, "refused": 0, "requests": 0}
    dvmid = dvm.uri.rsplit("/", 1)[1]
    secret = dvm.secret()
    token = Voucher(secret, dvmid, "b", dvm.uri).environment(
        f"pydvm-{dvmid}@1", 0, os.getuid(), os.getgid(), 0, 0)["PYDVM_DIRECT_CRED"]
    got = handshake(dvm, token, f"pydvm-{dvmid}@1", 0)
    assert got.startswith("PMIX_ERR_NO_PERMISSIONS") and "off" in got, got


def test_a_parked_lookup_on_a_direct_connection_is_answered_by_another_jobs_publish(dvm):
    """An asyncio client on b parks a waiting lookup at the master over its
    direct connection; a publish by a job on c answers it."""
    job = dvm.run_bg("--host", "b", "-n", "1", *job_script("direct_ops"), "park")
    reader = LineReader(job.stdout)
    try:
        assert reader.wait_line("PARKED") == "PARKED direct=True"
        wait_for(lambda: dvm.store()["master"]["parked"] == 1, what="the lookup to park")
        p = dvm.run("--host", "c", "-n", "1", "pydvm", "publish", "parked-key=v1",
                    "--persistence", "session")
        assert p.returncode == 0, p.stderr
        assert reader.wait_line("ANSWER") == "ANSWER v1"
        assert finish(job) == 0
    finally:
        finish(job)
    assert direct_counts(dvm)["open"] == 0


def test_a_cancelled_lookup_leaves_the_master_store_and_the_direct_connection(dvm, tmp_path):
    """An asyncio waiting lookup parked at the master over the direct
    connection, then cancelled: nothing stays parked, nothing is pending on
    the connection, which stays open."""
    go = tmp_path / "go"
    job = dvm.run_bg("--host", "b", "-n", "1", *job_script("direct_ops"), "cancel", str(go))
    reader = LineReader(job.stdout)
    try:
        assert reader.wait_line("CANCELLED") == "CANCELLED direct=True pending=0"
        assert dvm.store()["master"]["parked"] == 0
        assert direct_counts(dvm)["open"] == 1
    finally:
        go.touch()
        finish(job)


def test_a_local_range_request_on_a_direct_connection_is_refused_and_stored_nowhere(dvm, tmp_path):
    """The master serves only what the routing table gives it: a LOCAL
    publish sent over a direct connection is refused PMIX_ERR_BAD_PARAM."""
    go = tmp_path / "go"
    job = dvm.run_bg("--host", "b:2", "-n", "2", *job_script("direct_ops"), "creds", str(go))
    reader = LineReader(job.stdout)
    try:
        ns, token = cred_lines(reader, 2)[1]  # rank 1 runs until GO
        info = _direct.DirectInfo(DvmUri.parse(dvm.uri), Credential.parse(token), ns, 1)
        ch = _direct.open_blocking(info)
        ch.send({"t": "publish", "id": 1, "pairs": {"loc": "1"}, "range": 2, "persist": 4})
        r = ch.recv(10)
        ch.close()
        assert r["status"] == -27 and "LOCAL" in r["msg"], r
    finally:
        go.touch()
        finish(job)
    st = dvm.store()
    assert st["master"]["items"] == 0 and st["b"]["items"] == 0, st


def test_a_proc_item_published_directly_goes_when_its_process_exits(dvm):
    """Rank 0 on b publishes a PROC item over its direct connection and exits;
    its sibling sees it go; nothing is left."""
    p = dvm.run("--host", "b:2", "-n", "2", *job_script("direct_ops"), "proc")
    assert p.returncode == 0, p.stdout + p.stderr
    assert lines(p, "P0 DIRECT") == ["P0 DIRECT True"], p.stdout
    assert lines(p, "P0 G") == ["P0 GONE"], p.stdout
    assert dvm.store()["master"]["items"] == 0



SAME_HOST = """
import socket
from pydvm import Client, Persistence
with Client() as c:
    c.publish({"via-unix": "1"}, persistence=Persistence.SESSION)
    print("DIRECT", c.direct, c._dch.sock.family == socket.AF_UNIX, c._dch.sock.getpeername())
"""


def test_a_daemon_node_on_the_masters_machine_reaches_it_over_a_unix_socket(make_dvm):
    """Local daemons run on the master's own machine: their clients' direct
    connections go to the master's direct-data Unix socket (its count says
    so), which only the DVM's user can open, and which goes with the DVM."""
    dvm = make_dvm("a,b")
    before = master_info(dvm)
    sock = Path(before["direct_unix"]["path"])
    assert sock.is_socket() and sock.stat().st_mode & 0o777 == 0o600, oct(sock.stat().st_mode)
    assert sock.parent.stat().st_mode & 0o777 == 0o700
    p = dvm.run("--host", "b", "-n", "1", sys.executable, "-c", SAME_HOST)
    assert p.returncode == 0, p.stdout + p.stderr
    assert lines(p, "DIRECT") == [f"DIRECT True True {sock}"], p.stdout
    after = master_info(dvm)
    assert after["direct_unix"]["accepted"] == before["direct_unix"]["accepted"] + 1
    assert after["direct"]["accepted"] == before["direct"]["accepted"] + 1
    assert "via-unix" in dvm.store()["master"]["keys"]
    dvm.stop()
    assert not sock.parent.exists()


def test_the_direct_data_socket_admits_direct_clients_only(dvm):
    """A peer on the direct-data socket that answers the challenge as a tool
    (with the DVM's secret) is refused: that socket is for job processes."""
    from pydvm.runtime.shared.auth import mac
    from pydvm.channel import BlockingChannel

    path = master_info(dvm)["direct_unix"]["path"]
    secret = dvm.secret()
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    ch = BlockingChannel(s)
    challenge = ch.recv(10)
    ch.send({"t": "auth", "id": 1, "role": "tool", "mac": mac(secret, challenge["nonce"], "tool")})
    r = ch.recv(10)
    ch.close()
    assert r["status"] == Status.ERR_NO_PERMISSIONS and "direct-data clients" in r["msg"], r
    p = dvm.run("--host", "b", "-n", "1", *job_script("direct_ops"), "basic")
    assert "DIRECT True" in p.stdout, p.stdout + p.stderr
