"""Unchanged PMIx C programs as jobs of a real DVM: every data operation and status.

Each test runs ``pmix_ops`` (tests/pmix/clients/pmix_ops.c) under ``pydvm
run``; its publish/lookup/unpublish go through the node's PMIx server into
pydvm's stores by the path native clients take.  ``node`` is where the
client runs: the head node (served by the master process) or a daemon node.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from pmixkit import FAR, HEAD, NODES, found, statuses
from dvmkit import LineReader, finish, lines, wait_for

JOBS = Path(__file__).parent / "jobs"
NATIVE = [sys.executable, str(JOBS / "native_ops.py")]
STRING, BOOL, SIZE, INT32, INT64, UINT8, FLOAT, DOUBLE, BYTES = 3, 1, 4, 9, 10, 12, 16, 17, 27
ERR_NO_PERMISSIONS, ERR_TIMEOUT, ERR_BAD_PARAM = -23, -24, -27
ERR_OUT_OF_RESOURCE, ERR_NOT_FOUND, ERR_NOT_SUPPORTED, ERR_DUPLICATE = -29, -46, -47, -53


def other(node: str) -> str:
    return FAR if node == HEAD else HEAD


@pytest.mark.parametrize("where", list(NODES))
def test_every_data_operation_and_status_of_a_pmix_client(pdvm, pmix_ops, where):
    """Publish (typed values, duplicate, bad key, unsupported type), lookup (found,
    missing, partial), unpublish (named keys, everything) -- each with its status."""
    node = NODES[where]
    p = pdvm.run("--host", node, "-n", "1", pmix_ops,
                 f"pub:{where}-a:string:one", f"pub:{where}-a:string:again",
                 f"pub:{where}-u8:uint8:200", f"pub:{where}-sz:size:123456789012",
                 f"pub:{where}-i32:int32:-5", f"pub:{where}-f:float:1.5",
                 f"pub:{where}-d:double:2.5", f"pub:{where}-b:bool:1",
                 f"pub:{where}-by:bytes:00ff10",
                 f"look:{where}-a,{where}-u8,{where}-sz,{where}-i32,{where}-f,{where}-d,"
                 f"{where}-b,{where}-by",
                 f"look:{where}-missing", f"look:{where}-a,{where}-missing",
                 f"unpub:{where}-a", f"look:{where}-a", "unpub:*", f"look:{where}-u8",
                 "lookuplong:600", f"pub:{where}-t:time:5")
    assert p.returncode == 0, p.stdout + p.stderr
    # (a publish cannot carry a key over 511 characters: pmix_info_t's key field
    # is that long; a lookup can, and is refused)
    assert statuses(p.stdout, "PUBLISH") == [0, ERR_DUPLICATE, 0, 0, 0, 0, 0, 0, 0,
                                             ERR_NOT_SUPPORTED]
    # found / not found / partial (answered SUCCESS with the keys found) /
    # unpublished / everything unpublished / a key over 511 characters
    assert statuses(p.stdout, "LOOKUP") == [0, ERR_NOT_FOUND, 0, ERR_NOT_FOUND, ERR_NOT_FOUND,
                                            ERR_BAD_PARAM]
    assert statuses(p.stdout, "UNPUBLISH") == [0, 0]
    f = found(p.stdout)
    ns = lines(p, "INIT")[0].split("nspace=")[1].split()[0]
    assert f[f"{where}-a"] == (STRING, "one", f"{ns}:0")
    assert f[f"{where}-u8"][:2] == (UINT8, "200")
    assert f[f"{where}-sz"][:2] == (SIZE, "123456789012")
    assert f[f"{where}-i32"][:2] == (INT32, "-5")
    assert f[f"{where}-f"][:2] == (FLOAT, "1.5")
    assert f[f"{where}-d"][:2] == (DOUBLE, "2.5")
    assert f[f"{where}-b"][:2] == (BOOL, "1")
    assert f[f"{where}-by"][:2] == (BYTES, "00ff10")
    assert "FINALIZE status=0" in p.stdout


@pytest.mark.parametrize("where", list(NODES))
def test_waiting_lookups_are_answered_by_a_later_publish_or_time_out(pdvm, pmix_ops, where):
    """PMIX_WAIT parks the lookup in the store: a publish from another node answers it;
    a wait count below the keys answers with those found; PMIX_TIMEOUT ends with TIMEOUT."""
    node = NODES[where]
    k = f"wait-{where}"
    p = pdvm.run("--tag-output", "--host", node, "-n", "1", pmix_ops,
                 f"lookd:wait=bool/1,timeout=int/30:{k}",
                 f"lookd:wait=int/1,timeout=int/30:{k}-never,{k}-second",
                 f"lookd:wait=bool/1,timeout=int/1:{k}-never", ":",
                 "--host", other(node), "-n", "1", pmix_ops, "sleep:700",
                 f"pub:{k}:uint16:65000", "sleep:300", f"pub:{k}-second:string:2nd")
    assert p.returncode == 0, p.stdout + p.stderr
    r0 = "\n".join(ln.split("] ", 1)[1] for ln in p.stdout.splitlines() if ",0] " in ln)
    assert statuses(r0, "LOOKUP") == [0, 0, ERR_TIMEOUT], r0
    got = found(r0)
    assert got[k][:2] == (13, "65000") and got[f"{k}-second"][1] == "2nd"
    assert f"{k}-never" not in got


def test_pmix_and_native_clients_see_each_others_items_with_their_types(pdvm, pmix_ops):
    """A native client's str/bytes/int/float/bool read as STRING/BYTE_OBJECT/INT64/DOUBLE/
    BOOL by a PMIx client, a Typed as its own type; a PMIx client's UINT8/SIZE read
    natively as ints named PMIX_UINT8/PMIX_SIZE.  An item readable only by another uid is
    NO_PERMISSIONS (not NOT_FOUND) to the PMIx client, which still owns and removes it."""
    uid = os.getuid()
    p = pdvm.run("--host", FAR, "-n", "1", *NATIVE, "pub:nx-s:str:hello", "pub:nx-by:bytes:0a0b",
                 "pub:nx-i:int:-7", "pub:nx-f:float:0.25", "pub:nx-b:bool:1",
                 f"pub:nx-u8:{UINT8}:9", f"pubacc:nx-secret:{uid + 4242}", "hold:4", ":",
                 "--host", HEAD, "-n", "1", pmix_ops, "sleep:1500",
                 "look:nx-s,nx-by,nx-i,nx-f,nx-b,nx-u8", "look:nx-secret", "unpub:nx-secret",
                 "pub:px-u8:uint8:250", "pub:px-sz:size:18000000000", "pub:px-s:string:pmix")
    assert p.returncode == 0, p.stdout + p.stderr
    f = found(p.stdout)
    assert {k: v[:2] for k, v in f.items()} == {
        "nx-s": (STRING, "hello"), "nx-by": (BYTES, "0a0b"), "nx-i": (INT64, "-7"),
        "nx-f": (DOUBLE, "0.25"), "nx-b": (BOOL, "1"), "nx-u8": (UINT8, "9")}
    assert statuses(p.stdout, "LOOKUP") == [0, ERR_NO_PERMISSIONS]
    assert statuses(p.stdout, "UNPUBLISH") == [0]
    # the reverse direction, while both items are held (INDEF via a PMIx publish)
    q = pdvm.run("--host", HEAD, "-n", "1", pmix_ops,
                 "pubd:persist=persist/0:px2-u8:uint8:250", "pubd:persist=persist/0:px2-sz:size:7")
    assert statuses(q.stdout, "PUBLISH") == [0, 0], q.stdout
    r = pdvm.run("--host", FAR, "-n", "1", *NATIVE, "look:px2-u8,px2-sz,nx-secret")
    assert "FOUND key=px2-u8 type=PMIX_UINT8 value=250" in r.stdout, r.stdout
    assert "FOUND key=px2-sz type=PMIX_SIZE value=7" in r.stdout
    assert "nx-secret" not in r.stdout  # the PMIx client's unpublish removed it
    pdvm.run("-n", "1", "pydvm", "unpublish", "px2-u8", "px2-sz")


def test_a_publish_over_the_cap_is_out_of_resource_and_the_cap_evicts_pmix_items(make_pdvm,
                                                                                  pmix_ops):
    """prte_data_server_max_size applies to PMIx items: one larger than the cap is
    OUT_OF_RESOURCE and stores nothing; a flood evicts the uid's oldest items."""
    d = make_pdvm(prte_data_server_max_size="1k")
    big = "x" * 2000
    p = d.run("--host", HEAD, "-n", "1", pmix_ops, f"pub:big:string:{big}",
              *[f"pubd:persist=persist/0:ev{i}:string:{'y' * 300}" for i in range(5)],
              "look:ev0", "look:ev4")
    assert p.returncode == 0, p.stdout + p.stderr
    assert statuses(p.stdout, "PUBLISH") == [ERR_OUT_OF_RESOURCE, 0, 0, 0, 0, 0]
    assert statuses(p.stdout, "LOOKUP") == [ERR_NOT_FOUND, 0]
    assert d.store()["master"]["evictions"] >= 1


@pytest.mark.parametrize("where", list(NODES))
def test_a_process_that_exits_without_finalize_is_deregistered_and_its_proc_items_purged(
        pdvm, pmix_ops, where):
    """No upcall tells the host that a client died without PMIx_Finalize: its reaping
    does -- its PROC item goes while its sibling still runs (kept running by
    --no-abort-on-failure), and the node goes on.  Ending without finalizing is
    a failure: the job exits 1, as under mpirun."""
    node = NODES[where]
    k = f"nofin-{where}"
    p = pdvm.run("--no-abort-on-failure", "--host", node, "-n", "1", pmix_ops,
                 f"pubd:persist=persist/2:{k}:string:v", "nofin", ":", "--host", node, "-n",
                 "1", pmix_ops, "sleep:1500", f"look:{k}")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "without finalizing" in p.stderr, p.stderr
    assert statuses(p.stdout, "PUBLISH") == [0]
    assert statuses(p.stdout, "LOOKUP") == [ERR_NOT_FOUND]
    assert p.stdout.count("FINALIZE status=0") == 1
    # the node still serves PMIx clients
    q = pdvm.run("--host", node, "-n", "1", pmix_ops, f"pub:{k}:string:again", f"look:{k}")
    assert statuses(q.stdout, "LOOKUP") == [0], q.stdout


@pytest.mark.parametrize("where", list(NODES))
def test_a_waiting_pmix_lookup_is_dropped_when_its_process_is_killed(pdvm, pmix_ops, where):
    node = NODES[where]
    bg = pdvm.run_bg("--host", node, "-n", "1", pmix_ops, "lookd:wait=bool/1:never-published")
    out = LineReader(bg.stdout)
    out.wait_line("INIT status=0")
    wait_for(lambda: pdvm.store()["master"]["parked"] == 1, what="the lookup to park")
    bg.send_signal(signal.SIGINT)
    assert finish(bg) == 130
    wait_for(lambda: pdvm.store()["master"]["parked"] == 0, what="the parked lookup to go")


def test_pmix_abort_ends_the_job_with_its_status(pdvm, pmix_ops):
    """PMIx_Abort(7): the job is killed, `pydvm run` exits 7 and says who aborted."""
    p = pdvm.run("--host", FAR, "-n", "1", pmix_ops, "sleep:300", "abort:7", ":",
                 "--host", HEAD, "-n", "1", pmix_ops, "sleep:30000", timeout=30)
    assert p.returncode == 7, p.stdout + p.stderr
    assert "called PMIx_Abort with status 7: test abort" in p.stderr


@pytest.mark.parametrize("collect", [1, 0])
def test_fence_across_nodes_with_and_without_data_collection(pdvm, pmix_ops, collect):
    """PMIx_Fence of ranks on two nodes goes through the master; with collection each
    rank then reads the other's committed value locally, without it through a direct
    modex (the master asks the node hosting that rank)."""
    p = pdvm.run("--tag-output", "--host", HEAD, "-n", "1", pmix_ops, "put:fk:v0", "commit",
                 f"fence:{collect}", "get:1:fk", "sleep:1500", ":",
                 "--host", FAR, "-n", "1", pmix_ops, "put:fk:v1", "commit",
                 f"fence:{collect}", "get:0:fk", "sleep:1500")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("FENCE status=0") == 2, p.stdout
    assert any(ln.endswith(",0] GET status=0 type=3 value=v1") for ln in p.stdout.splitlines())
    assert any(ln.endswith(",1] GET status=0 type=3 value=v0") for ln in p.stdout.splitlines())


def test_a_job_that_requires_pmix_where_it_is_missing_is_refused_clearly(tmp_path):
    """`pydvm run --pmix` on nodes without PMIx: a message naming them, not a hang."""
    import subprocess
    env = dict(os.environ, PYDVM_STATE_DIR=str(tmp_path))
    env.pop("PYDVM_URI", None)
    p = subprocess.run([sys.executable, "-m", "pydvm", "run", "--mca", "pydvm_pmix", "off",
                        "--pmix", "-n", "1", "true"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 1
    assert "PMIx is required (--pmix) but not available on:" in p.stderr
    assert "pydvm_pmix=off" in p.stderr


def test_a_fence_whose_participant_ended_fails_instead_of_hanging(pdvm, pmix_ops):
    """Rank 1 (another node) exits without entering the fence: rank 0's PMIx_Fence
    is answered with an error -- whether rank 1 ended before or after rank 0 arrived."""
    for delay in ("sleep:1000", "sleep:0"):
        p = pdvm.run("--tag-output", "--host", HEAD, "-n", "1", pmix_ops, delay, "fence:1", ":",
                     "--host", FAR, "-n", "1", pmix_ops, "sleep:300", timeout=30)
        assert p.returncode == 0, p.stdout + p.stderr
        got = [ln for ln in p.stdout.splitlines() if ",0] FENCE status=" in ln]
        assert got and not got[0].endswith("status=0"), p.stdout


def test_a_pmix_server_serves_many_jobs_in_a_row(pmix_ops, tmp_path):
    """The registration pattern of a node server (a namespace per job, its clients,
    the namespace deregistered at the job's end; no per-client deregistration)
    keeps serving new clients job after job.  Regression: with libpmix 4.2.2,
    PMIx_server_deregister_client at each reap left the server deaf to every new
    PMIx_Init after tens to hundreds of jobs (seen as MPI jobs hanging in init)."""
    import subprocess
    p = subprocess.run([sys.executable, str(JOBS / "server_churn.py"), str(tmp_path), pmix_ops,
                        "150"], capture_output=True, text=True, timeout=120)
    assert p.stdout.strip().splitlines()[-1] == "DONE 150 0", p.stdout + p.stderr
