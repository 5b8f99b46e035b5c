"""PMIx for every user of a multi-user DVM (real uids, root-started DVM).

A non-root user's C PMIx job and Open MPI job run without a word from
libpmix on stderr and read their job data; identity is the registered one
whatever a client claims in its directives; and a user's process cannot
connect to another user's job's PMIx server with that job's variables.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import RUNUSER

sys.path.insert(0, str(Path(__file__).parents[1] / "pmix"))
from cbuild import pmix_cflags, require_libpmix  # noqa: E402

HERE = Path(__file__).parent
CLIENTS = [HERE.parent / "pmix" / "clients", HERE.parent / "pmix_e2e" / "clients"]


@pytest.fixture(scope="module")
def progs():
    """pmix_ops, pmix_keys, pmix_jctrl and mpi_allreduce, built where every test user
    can run them."""
    require_libpmix()
    if not shutil.which("gcc") or not shutil.which("mpicc"):
        pytest.skip("gcc and mpicc are needed (apt-get install gcc libopenmpi-dev)")
    d = Path(tempfile.mkdtemp(prefix="pydvm-mu-pmix-"))
    os.chmod(d, 0o755)
    out = {}
    for name, cc in (("pmix_ops", "gcc"), ("pmix_keys", "gcc"), ("pmix_jctrl", "gcc"),
                     ("mpi_allreduce", "mpicc")):
        src = next(c / f"{name}.c" for c in CLIENTS if (c / f"{name}.c").exists())
        flags = pmix_cflags() if cc == "gcc" else []
        r = subprocess.run([cc, "-O1", "-o", str(d / name), str(src), *flags],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        os.chmod(d / name, 0o755)
        out[name] = str(d / name)
    out["dir"] = str(d)
    yield out
    shutil.rmtree(d, ignore_errors=True)


def test_a_users_pmix_and_mpi_jobs_run_without_library_errors_and_read_their_data(
        mudvm, users, progs):
    """As pdvmtesta, on a root multi-user DVM: a C PMIx job reads universe, job and
    local sizes on both nodes, and an Open MPI allreduce runs -- nothing from
    libpmix on stderr (it used to print a PMIX ERROR per process)."""
    p = mudvm.as_user("pdvmtesta", "run", "--pmix", "--host", "a:1,b:2", "-n", "3",
                      progs["pmix_keys"])
    assert p.returncode == 0, p.stdout + p.stderr
    assert "PMIX ERROR" not in p.stderr and p.stderr == "", p.stderr
    for r, local in ((0, "1"), (1, "2"), (2, "2")):
        assert f"R{r} JOB pmix.univ.size=3" in p.stdout, p.stdout
        assert f"R{r} JOB pmix.job.size=3" in p.stdout
        assert f"R{r} JOB pmix.local.size={local}" in p.stdout
        assert f"R{r} PROC pmix.hname={'a' if r == 0 else 'b'}" in p.stdout
    p = mudvm.as_user("pdvmtesta", "run", "--pmix", "--host", "a:2,b:2", "-n", "4",
                      progs["mpi_allreduce"])
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("size=4 sum=6") == 4, p.stdout
    assert p.stderr == "", p.stderr


def test_a_pmix_claim_of_another_uid_neither_publishes_nor_unpublishes_as_them(
        mudvm, users, progs):
    """B's PMIx publish carrying PMIX_USERID = A's uid is recorded as B's (and goes
    with B's job); B's PMIx_Unpublish of A's key claiming A's uid leaves it."""
    a, b = users["pdvmtesta"], users["pdvmtestb"]
    ops = progs["pmix_ops"]
    p = mudvm.as_user("pdvmtesta", "run", "--pmix", "-n", "1", ops,
                      "pubd:persist=persist/4:akey:string:of-a")
    assert "PUBLISH key=akey status=0" in p.stdout, p.stdout + p.stderr
    bg = mudvm.popen_as("pdvmtestb", "run", "--pmix", "-n", "1", ops,
                        f"pubd:pmix.euid=uint32/{a}:bkey:string:of-b", "sleep:3000")
    try:
        from dvmkit import wait_for
        wait_for(lambda: str(b) in mudvm.store()["master"]["bytes_by_uid"],
                 what="B's item in the master store")
        by_uid = mudvm.store()["master"]["bytes_by_uid"]
        assert str(b) in by_uid and by_uid[str(a)] > 0
    finally:
        assert bg.wait(timeout=60) == 0
    assert str(b) not in mudvm.store()["master"]["bytes_by_uid"]  # went with B's job
    p = mudvm.as_user("pdvmtestb", "run", "--pmix", "-n", "1", ops,
                      f"unpubd:pmix.euid=uint32/{a}:akey")
    assert "UNPUBLISH status=0" in p.stdout, p.stdout + p.stderr
    p = mudvm.as_user("pdvmtesta", "run", "--pmix", "-n", "1", ops, "look:akey")
    assert re.search(r"LOOKUP .*status=0", p.stdout), p.stdout + p.stderr
    assert "value=of-a" in p.stdout


def test_a_users_process_cannot_connect_to_another_users_jobs_pmix_server(
        mudvm, users, progs):
    """B takes the PMIx variables of A's running job (server address, namespace,
    rank) and starts a PMIx client with them: libpmix refuses it at PMIx_Init,
    since the registered process is A's uid."""
    share = Path(tempfile.mkdtemp(prefix="pydvm-mu-env-"))
    os.chmod(share, 0o777)
    envfile = share / "a-env"
    bg = mudvm.popen_as("pdvmtesta", "run", "--pmix", "--host", "a", "-n", "1", "sh", "-c",
                        f"env | grep ^PMIX_ > {envfile}.tmp; mv {envfile}.tmp {envfile}; "
                        "sleep 20")
    try:
        from dvmkit import wait_for
        wait_for(envfile.exists, what="A's job to write its PMIx variables")
        os.chmod(envfile, 0o644)
        env = [ln for ln in envfile.read_text().splitlines() if ln]
        assert any(ln.startswith("PMIX_NAMESPACE=") for ln in env), env
        p = subprocess.run([RUNUSER, "-u", "pdvmtestb", "--", "env", *env, progs["pmix_ops"],
                            "pub:stolen:string:x"], capture_output=True, text=True, timeout=60)
        init = re.search(r"INIT status=(-?\d+)", p.stdout)
        assert init is None or init.group(1) != "0", p.stdout + p.stderr
        assert "PUBLISH key=stolen status=0" not in p.stdout
    finally:
        bg.kill()
        bg.wait(timeout=30)
        shutil.rmtree(share, ignore_errors=True)


def _read_until(bg: subprocess.Popen, marker: str) -> str:
    """What a running ``pydvm run`` printed, up to the line with ``marker``."""
    out = ""
    while marker not in out:
        line = bg.stdout.readline()
        assert line, out
        out += line
    return out


def _agents(user: str) -> list[int]:
    p = subprocess.run(["pgrep", "-u", user, "-f", "pydvm.runtime.pmixhost.agent"],
                       capture_output=True, text=True)
    return [int(x) for x in p.stdout.split()]


def test_each_user_gets_a_pmix_server_of_its_own_and_the_shared_memory_job_store(
        make_mudvm, users, progs):
    """Each user's PMIx processes, on the head node and on a daemon node, are
    served by a PMIx server running as that user: with libpmix's
    shared-memory job store (``pydvm_pmix_gds ds21,ds12,hash``) its directory
    is one that user owns, no fallback store is forced, the client library
    selects ds21 and reads the job data through it -- and the servers end
    with the DVM.  (The copying store, ``auto`` on this machine, has no
    files: each user's processes get their data from their own server.)"""
    mudvm = make_mudvm(pydvm_pmix_gds="ds21,ds12,hash")
    show = ("env | grep ^PMIX_ | sort; "
            "echo OWNER $(stat -c %U \"$PMIX_DSTORE_21_BASE_PATH\")")
    seen = {}
    for user in ("pdvmtesta", "pdvmtestb"):
        p = mudvm.as_user(user, "run", "--pmix", "--host", "a:1,b:1", "-n", "2",
                          "sh", "-c", show)
        assert p.returncode == 0, p.stdout + p.stderr
        assert p.stderr == "", p.stderr
        assert "PMIX_MCA_gds=" not in p.stdout, p.stdout
        assert p.stdout.count(f"OWNER {user}") == 2, p.stdout
        seen[user] = set(re.findall(r"PMIX_SERVER_URI41=(\S+)", p.stdout))
        assert len(seen[user]) == 2, p.stdout  # one server per node
        assert len(_agents(user)) == 2  # one per node, running as the user
        # the client library picks the shared-memory store and reads job data from it
        p = mudvm.as_user(user, "run", "--pmix", "--host", "a:1,b:2", "-n", "3", "sh", "-c",
                          f"PMIX_MCA_gds_base_verbose=5 exec {progs['pmix_keys']}")
        assert p.returncode == 0, p.stdout + p.stderr
        assert "PMIX ERROR" not in p.stderr, p.stderr
        for r, local in ((0, "1"), (1, "2"), (2, "2")):
            assert f"R{r} JOB pmix.univ.size=3" in p.stdout, p.stdout
            assert f"R{r} JOB pmix.local.size={local}" in p.stdout
        assert re.search(r"ds21", p.stderr), p.stderr
    assert not seen["pdvmtesta"] & seen["pdvmtestb"]
    mudvm.as_user(None, "stop", timeout=60)
    from dvmkit import wait_for
    wait_for(lambda: not _agents("pdvmtesta") and not _agents("pdvmtestb"),
             what="the users' PMIx servers to end with the DVM")


def test_when_a_users_pmix_server_dies_its_processes_end_and_the_next_job_gets_a_new_one(
        mudvm, users, progs):
    """Killing A's PMIx server on the head node ends A's PMIx job there (it
    cannot go on without its server) with an error instead of leaving it
    hanging; A's next PMIx job starts a new server and runs."""
    bg = mudvm.popen_as("pdvmtesta", "run", "--pmix", "--host", "a", "-n", "1",
                        progs["pmix_ops"], "pub:k:string:v", "sleep:60000")
    try:
        out = _read_until(bg, "PUBLISH")  # the job is running on its server
        assert "INIT status=0" in out and "PUBLISH key=k status=0" in out, out
        (pid,) = _agents("pdvmtesta")
        os.kill(pid, 9)
        assert bg.wait(timeout=60) != 0
    finally:
        if bg.poll() is None:
            bg.kill()
            bg.wait()
    p = mudvm.as_user("pdvmtesta", "run", "--pmix", "--host", "a", "-n", "1",
                      progs["pmix_keys"])
    assert p.returncode == 0 and p.stderr == "", p.stdout + p.stderr
    assert "R0 JOB pmix.job.size=1" in p.stdout, p.stdout
    assert len(_agents("pdvmtesta")) == 1 and _agents("pdvmtesta") != [pid]
    logs = "".join(f.read_text(errors="replace") for f in mudvm.log_dir.glob("*"))
    assert ("the PMIx server of uid" in logs and "(killed by signal SIGKILL)" in logs
            and "1 connected process(es) here are ended with their jobs" in logs), logs[-3000:]
    # the job ended saying why (what its pydvm run printed, logged by the master)
    assert "its PMIx server ended on node a (killed by signal SIGKILL)" in logs, logs[-3000:]


def test_a_users_pmix_server_goes_when_idle_and_comes_back_with_the_next_job(
        make_mudvm, users, progs):
    """With pydvm_pmix_user_idle 1, A's PMIx server on a node stops about a
    second after A's last PMIx job there ended -- not while a job runs -- and
    A's next PMIx job gets a new one."""
    from dvmkit import wait_for
    d = make_mudvm(pydvm_pmix_user_idle=1)
    bg = d.popen_as("pdvmtesta", "run", "--pmix", "--host", "a", "-n", "1",
                    progs["pmix_ops"], "pub:k:string:v", "sleep:8000")
    try:
        out = _read_until(bg, "PUBLISH")
        (first,) = _agents("pdvmtesta")
        p = d.as_user("pdvmtesta", "run", "--pmix", "--host", "a", "-n", "1",
                      progs["pmix_keys"])  # a second job ending: the first still runs
        assert p.returncode == 0, p.stdout + p.stderr
        time.sleep(1.5)
        assert _agents("pdvmtesta") == [first]  # never while a job of A runs here
    finally:
        assert bg.wait(timeout=60) == 0
    wait_for(lambda: not _agents("pdvmtesta"), timeout=10, what="the idle server to stop")
    bg = d.popen_as("pdvmtesta", "run", "--pmix", "--host", "a", "-n", "1",
                    progs["pmix_ops"], "pub:k2:string:v", "look:k2", "sleep:2000")
    try:
        out = _read_until(bg, "LOOKUP")
        assert "PUBLISH key=k2 status=0" in out and "LOOKUP status=0" in out, out
        (second,) = _agents("pdvmtesta")
        assert second != first
    finally:
        assert bg.wait(timeout=60) == 0


def test_pmix_queries_answer_only_about_the_askers_jobs(mudvm, users):
    """``pps`` in B's job lists B's namespace and not A's running job; in
    root's job, both (libpmix 4.2 does not name the asker: the agent relaying
    the query does, runtime/pmixhost/query.py)."""
    if not shutil.which("pps"):
        pytest.skip("pps not installed (apt-get install libpmix-bin)")
    bg = mudvm.popen_as("pdvmtesta", "run", "--pmix", "--host", "a", "-n", "1", "sh", "-c",
                        'echo "NS=$PMIX_NAMESPACE"; exec sleep 600')
    a_ns = _read_until(bg, "NS=").split("NS=", 1)[1].split()[0]
    try:
        show = 'echo "NS=$PMIX_NAMESPACE"; exec pps'
        for user in ("pdvmtestb", None):
            p = mudvm.as_user(user, "run", "--pmix", "--host", "a", "-n", "1", "sh", "-c",
                              show)
            assert p.returncode == 0, p.stdout + p.stderr
            own = re.search(r"NS=(\S+)", p.stdout).group(1)
            m = re.search(r"^Active nspaces: (.*)$", p.stderr, re.M)
            assert m, p.stderr
            seen = set(m.group(1).split(","))
            assert seen == ({own} if user else {own, a_ns}), (user, seen)
    finally:
        if bg.poll() is None:
            mudvm.as_user(None, "kill", a_ns)
        bg.wait(timeout=60)


def test_pmix_job_control_acts_only_on_the_askers_jobs_and_roots_on_all(mudvm, users, progs):
    """B's process cannot kill A's running job (PMIX_ERR_NO_PERMISSIONS, A's job
    runs on); B's own rank 0 signals its rank 1 through B's PMIx servers on
    both nodes, and its statements and allocation requests are answered through
    them as through the owner's; a process of root's job kills A's job
    (runtime/pmixhost/jobctl.py)."""
    bg = mudvm.popen_as("pdvmtesta", "run", "--pmix", "--host", "a", "-n", "1", "sh", "-c",
                        'echo "NS=$PMIX_NAMESPACE"; exec sleep 600')
    a_ns = _read_until(bg, "NS=").split("NS=", 1)[1].split()[0]
    try:
        p = mudvm.as_user("pdvmtestb", "run", "--host", "a", "-n", "1", progs["pmix_jctrl"],
                          "killns", a_ns)
        assert p.returncode == 0, p.stdout + p.stderr
        assert "JCTRL rank=0 status=-23 " in p.stdout, p.stdout
        assert bg.poll() is None
        p = mudvm.as_user("pdvmtestb", "run", "--host", "a:1,b:1", "-n", "2",
                          progs["pmix_jctrl"], "signal")
        assert p.returncode == 0, p.stdout + p.stderr
        assert "JCTRL rank=0 status=0 " in p.stdout and "SIGNALLED rank=1 sig=10" in p.stdout
        # statements (a data array of infos) and allocation requests across the agent's link
        p = mudvm.as_user("pdvmtestb", "run", "--host", "a", "-n", "1", progs["pmix_jctrl"],
                          "notes")
        assert "JCTRL rank=0 status=0 " in p.stdout, p.stdout + p.stderr
        p = mudvm.as_user("pdvmtestb", "run", "--host", "a", "-n", "1", progs["pmix_jctrl"],
                          "alloc")
        assert "ALLOC_NEW rank=0 status=-47 " in p.stdout, p.stdout + p.stderr
        p = mudvm.as_user(None, "run", "--host", "b", "-n", "1", progs["pmix_jctrl"],
                          "killns", a_ns)
        assert "JCTRL rank=0 status=0 " in p.stdout, p.stdout + p.stderr
        assert bg.wait(timeout=60) == 143  # its sleep ended by SIGTERM, as by pydvm kill
    finally:
        if bg.poll() is None:
            mudvm.as_user(None, "kill", a_ns)
        bg.wait(timeout=60)


def test_a_users_pmix_lookup_that_waits_is_parked_and_answered_and_one_process_keeps_order(
        mudvm, users, progs):
    """Through the user's own PMIx server (its agent relays each data request
    to the node as the store's request): a PMIx_Lookup with PMIX_WAIT of a key
    nobody holds is parked -- not answered by the node's at-once path -- and
    answered, typed, when another job of the user publishes the key; and one
    process's publish, lookup, unpublish, lookup are served in their order."""
    from dvmkit import wait_for
    ops = progs["pmix_ops"]
    bg = mudvm.popen_as("pdvmtesta", "run", "--pmix", "-n", "1", ops,
                        "lookd:wait=bool/1,timeout=int/60:wkey")
    try:
        wait_for(lambda: mudvm.store()["master"]["parked"] == 1, what="the lookup parked")
        p = mudvm.as_user("pdvmtesta", "run", "--pmix", "-n", "1", ops,
                          "pubd:persist=persist/4:wkey:uint8:200")
        assert "PUBLISH key=wkey status=0" in p.stdout, p.stdout + p.stderr
        out, _ = bg.communicate(timeout=60)
    finally:
        if bg.poll() is None:
            bg.kill()
            bg.wait()
    assert bg.returncode == 0, out
    assert "LOOKUP status=0" in out, out
    assert re.search(r"FOUND key=wkey proc=\S+ type=12 value=200", out), out  # PMIX_UINT8
    assert mudvm.store()["master"]["parked"] == 0
    p = mudvm.as_user("pdvmtesta", "run", "--pmix", "-n", "1", ops, "pub:okey:string:one",
                      "look:okey", "unpub:okey", "look:okey")
    assert p.returncode == 0, p.stdout + p.stderr
    lines = [ln for ln in p.stdout.splitlines() if ln.split()[0] in ("PUBLISH", "LOOKUP",
                                                                     "FOUND", "UNPUBLISH")]
    assert lines[0] == "PUBLISH key=okey status=0", p.stdout
    assert lines[1] == "LOOKUP status=0" and "value=one" in lines[2], p.stdout
    assert lines[3] == "UNPUBLISH status=0", p.stdout
    assert lines[4].startswith("LOOKUP status=") and lines[4] != "LOOKUP status=0", p.stdout
    assert len(lines) == 5, p.stdout
