"""The client libraries and the parameter registry, through a real DVM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

from dvmkit import PYDVM, LineReader, finish, job_script, start_dvm, wait_for


def test_asyncio_client_serves_concurrent_requests_on_one_connection(dvm):
    """A waiting lookup and the publish that satisfies it share one aio connection; errors are typed."""
    p = dvm.run("-n", "2", *job_script("aio_client"))
    assert p.returncode == 0, p.stderr
    out = sorted(p.stdout.splitlines())
    assert out == sorted(["WAITED 0 0", "WAITED 10 1", "DUPLICATE PMIX_ERR_DUPLICATE_KEY",
                          "DUPLICATE PMIX_ERR_DUPLICATE_KEY",
                          "PARTIAL True ['own-0']", "PARTIAL True ['own-1']", "GONE", "GONE"])


def test_client_outside_a_job_gets_a_clear_unreachable_error():
    """pydvm.Client() without a job environment raises UnreachableError saying why."""
    code = ("import os\nfor k in ('PYDVM_SERVER', 'PYDVM_NSPACE', 'PYDVM_RANK'): "
            "os.environ.pop(k, None)\n"
            "from pydvm import Client\nfrom pydvm.errors import UnreachableError\n"
            "try:\n    Client()\nexcept UnreachableError as e:\n    print('UNREACH', e)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert p.stdout.startswith("UNREACH PMIX_ERR_UNREACH: not inside a pydvm job"), p


def test_malformed_parameter_is_a_start_up_error_naming_it(tmp_path):
    """--mca with a bad value or an unknown name fails start-up with a message naming it."""
    for args, needle in ((["--mca", "prte_data_server_timeout", "soon"],
                          "prte_data_server_timeout"),
                         (["--mca", "prte_data_server_max_size", "-5"],
                          "prte_data_server_max_size"),
                         (["--mca", "no_such_param", "1"], "unknown parameter 'no_such_param'")):
        p = subprocess.run(PYDVM + ["start", "--hosts", "a", *args], capture_output=True,
                           text=True, timeout=60, env={"PYDVM_STATE_DIR": str(tmp_path),
                                                       "PATH": "/usr/bin:/bin"})
        assert p.returncode != 0 and needle in p.stderr, (args, p.stderr)
    p = subprocess.run(PYDVM + ["run", "-n", "1", "true"], capture_output=True, text=True,
                       timeout=60, env={"PRTE_MCA_prte_data_server_verbose": "loud",
                                        "PYDVM_STATE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert p.returncode != 0 and "PRTE_MCA_prte_data_server_verbose" in p.stderr, p.stderr


def test_info_lists_every_parameter_with_its_value_and_source(tmp_path):
    """Values from --mca, the environment and defaults are shown with where they came from."""
    import os

    os.environ["PRTE_MCA_prte_data_server_verbose"] = "1"
    try:
        d = start_dvm(tmp_path, "a", {"prte_data_server_timeout": "7"})
    finally:
        del os.environ["PRTE_MCA_prte_data_server_verbose"]
    try:
        out = d.cmd("info", check=True).stdout
        rows = {ln.split()[0]: ln for ln in out.splitlines() if ln.startswith(("prte_", "plm_",
                                                                              "pydvm_"))}
        assert "7.0" in rows["prte_data_server_timeout"]
        assert "(command line)" in rows["prte_data_server_timeout"]
        assert "(environment)" in rows["prte_data_server_verbose"]
        assert "(default)" in rows["prte_data_server_max_size"]
        assert "plm_ssh_agent" in rows
    finally:
        d.stop()


INTERRUPTED_LOOKUP = """
import os, sys, time
from pydvm import Client
with Client() as c:
    print("PID", os.getpid(), flush=True)
    try:
        c.lookup(["never-published"], wait=True)
    except KeyboardInterrupt:
        print("INTERRUPTED", flush=True)
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.05)
    print("STILL-SERVED", c.lookup(["after"])["after"], flush=True)
"""


@pytest.mark.parametrize("host", ["head", "b"])
def test_ctrl_c_in_a_waiting_lookup_withdraws_it_and_the_client_goes_on(make_dvm, tmp_path,
                                                                         host):
    """SIGINT while the blocking client waits in a lookup: the lookup leaves
    the master store (nothing stays parked), and the same client then gets
    answers -- on the head node and over a daemon node's direct path."""
    head = socket.gethostname()
    dvm = make_dvm(f"{head},b")
    go = tmp_path / "go"
    job = dvm.run_bg("--host", head if host == "head" else "b", "-n", "1", sys.executable,
                     "-c", INTERRUPTED_LOOKUP, str(go))
    reader = LineReader(job.stdout)
    try:
        pid = int(reader.wait_line("PID").split()[1])
        wait_for(lambda: dvm.store()["master"]["parked"] == 1, what="the lookup to park")
        os.kill(pid, signal.SIGINT)
        assert reader.wait_line("INTERRUPTED") == "INTERRUPTED"
        wait_for(lambda: dvm.store()["master"]["parked"] == 0, what="the lookup to be withdrawn")
        p = dvm.run("-n", "1", "pydvm", "publish", "after=1", "--persistence", "session")
        assert p.returncode == 0, p.stderr
        go.touch()
        assert reader.wait_line("STILL-SERVED") == "STILL-SERVED 1"
        assert finish(job) == 0
    finally:
        go.touch()
        finish(job)


# ---------------------------------------------------------------------------
# atomic updates, key counts, what unpublish removed, and one client shared
# by threads -- on the head node, over a daemon node's direct path, and
# through the daemon with direct data off
# ---------------------------------------------------------------------------

PLACES = ["head", "b-direct", "b-daemon"]


def _place(make_dvm, where):
    """A DVM of the head node and b, and the --host that puts a job there."""
    head = socket.gethostname()
    mca = {"pydvm_direct_data": "off"} if where == "b-daemon" else {}
    dvm = make_dvm(f"{head},b", **mca)
    return dvm, head if where == "head" else "b"


def _job(dvm, host, n, *args):
    p = dvm.run("--host", f"{host}:{n}", "-n", str(n), *job_script("atomic_ops"), *args)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout.splitlines()


@pytest.mark.parametrize("where", PLACES)
def test_adds_from_every_rank_return_each_value_exactly_once(make_dvm, where):
    """4 ranks x 50 adds to one counter, on two nodes: the values the adds
    returned are exactly 1..200 (no add lost, none answered twice)."""
    dvm, host = _place(make_dvm, where)
    other = "b" if host != "b" else socket.gethostname()
    p = dvm.run("--host", f"{host}:2,{other}:2", "-n", "4",
                *job_script("atomic_ops"), "counter", "50")
    assert p.returncode == 0, p.stdout + p.stderr
    got = sorted(int(v) for ln in p.stdout.splitlines() if ln.startswith("ADDED")
                 for v in ln.split()[1:])
    assert got == list(range(1, 201)), got
    assert dvm.store()["master"]["items"] == 0  # the job's counter went with the job


@pytest.mark.parametrize("where", PLACES)
def test_a_compare_and_set_race_has_exactly_one_winner(make_dvm, where):
    dvm, host = _place(make_dvm, where)
    out = _job(dvm, host, 4, "race")
    cas = [ln.split() for ln in out if ln.startswith("CAS")]
    assert len(cas) == 4, out
    winners = [c for c in cas if c[2] == "True"]
    assert len(winners) == 1, cas
    assert {c[1] for c in cas} == {winners[0][1]}, cas  # every rank sees the winner's value


@pytest.mark.parametrize("where", PLACES)
def test_a_lookup_waiting_in_one_thread_holds_up_no_other_threads_calls(make_dvm, where):
    """200 calls of another thread finish while the first thread's lookup
    still waits on the same client (one lock across an exchange would hold
    them until the lookup timed out); the waiter then gets its key."""
    dvm, host = _place(make_dvm, where)
    out = _job(dvm, host, 1, "threads")
    assert out == ["OTHER DONE waiting=True", "WAITER GOT go"], out


@pytest.mark.parametrize("where", PLACES)
def test_unpublish_says_how_many_keys_it_removed_from_both_stores(make_dvm, where):
    dvm, host = _place(make_dvm, where)
    out = _job(dvm, host, 1, "unpublish")
    assert out == ["REMOVED 2", "REMOVED 0", "REMOVED 2"], out


@pytest.mark.parametrize("where", PLACES)
def test_a_publish_sent_without_waiting_is_seen_next_and_its_refusal_raised_once(make_dvm,
                                                                                  where):
    dvm, host = _place(make_dvm, where)
    p = dvm.run("--host", host, "-n", "1", *job_script("atomic_ops"), "noack")
    assert p.returncode != 0, p.stdout  # close() raised the last refusal
    assert p.stdout.splitlines() == ["SEEN", "NEXT DuplicateKeyError True", "AFTER 1",
                                     "FLUSH DuplicateKeyError"], p.stdout + p.stderr
    assert "DuplicateKeyError" in p.stderr and "earlier publish" in p.stderr, p.stderr


@pytest.mark.parametrize("where", PLACES)
def test_keys_are_counted_and_listed_by_prefix_in_their_range(make_dvm, where):
    dvm, host = _place(make_dvm, where)
    out = _job(dvm, host, 1, "keys")
    assert out == ["KEYS 3 p/ p/a p/b", "LIMITED p/ p/a", "LOCAL 1"], out


@pytest.mark.parametrize("where", PLACES)
def test_the_asyncio_client_updates_counts_and_reports_unwaited_refusals(make_dvm, where):
    dvm, host = _place(make_dvm, where)
    out = _job(dvm, host, 1, "aio")
    assert out == ["ADD 2 5", "CAS b'x' True b'x' False", "APPEND b'ab' b'abcd'",
                   "KEYS 3 aa ac acs", "REMOVED 2", "FLUSH DuplicateKeyError",
                   "NOTINT BadParamError"], out


def test_pydvm_store_prefix_lists_only_your_keys_under_it(dvm):
    p = dvm.run("--host", "b", "-n", "1", "sh", "-c",
                "pydvm publish t/b=1 t/a=2 other=3 --persistence session && "
                "pydvm publish t/l=4 --range local --persistence session")
    assert p.returncode == 0, p.stdout + p.stderr
    out = dvm.cmd("store", "--json", "--prefix", "t/", check=True).stdout
    stores = {s["store"]: s for s in __import__("json").loads(out)["stores"]}
    assert stores["master"]["keys"] == ["t/a", "t/b"], stores["master"]
    assert [k["key"] for k in stores["master"]["key_info"]] == ["t/a", "t/b"]
    assert stores["master"]["items"] == 1  # the counts stay whole
    assert stores["b"]["keys"] == ["t/l"] and stores["a"]["keys"] == []
    text = dvm.cmd("store", "--prefix", "t/", check=True).stdout
    assert "t/a" in text and "other" not in text, text
