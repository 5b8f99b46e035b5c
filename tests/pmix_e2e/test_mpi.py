"""Open MPI 4.1 and mpi4py programs started by ``pydvm run`` (no mpirun).

MPI_Init/Finalize, the name service, collectives (modex fences through the
master when ranks are on two nodes), MPMD app numbers, accept/connect
between two jobs, MPI_Comm_spawn and mpi4py.futures.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pmixkit import CLIENTS, FAR, HEAD, PMIX_CLIENTS
from dvmkit import LineReader, finish, lines

PLACEMENTS = {"head": [f"{HEAD}:2"], "daemon": [f"{FAR}:2"], "both": [f"{HEAD}:1,{FAR}:1"]}


@pytest.mark.parametrize("where", list(PLACEMENTS))
def test_mpi_init_and_the_name_service(pdvm, mpicc, where):
    """Two ranks (on the head node, a daemon node, or one on each): MPI_Publish_name /
    MPI_Lookup_name / MPI_Unpublish_name served by pydvm's store; a missing name is
    MPI_ERR_NAME; MPI_Info range/persistence arrive."""
    exe = mpicc("mpi_names")
    p = pdvm.run("--tag-output", "--host", *PLACEMENTS[where], "-n", "2", exe)
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    for r in (0, 1):
        assert f",{r}] INIT rank={r} size=2 appnum=0" in out
        assert f",{r}] LOOKUP rc=0 port=port-of-rank-0" in out
        assert f",{r}] LOOKUP2 rc=38 class=38" in out
        assert f",{r}] LOOKUP3 rc=0 port=port-of-rank-0" in out
        assert f",{r}] FINALIZE rank={r}" in out
    assert pdvm.store()["master"]["items"] == 0  # pydvm-svc2 (APP) went with the job


def test_mpi4py_names_and_allgather_across_two_nodes(pdvm, mpi4py_python):
    p = pdvm.run("--host", f"{HEAD}:1,{FAR}:1", "-n", "2", mpi4py_python,
                 str(PMIX_CLIENTS / "mpi4py_names.py"))
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("LOOKUP port=py-port-0") == 2
    assert p.stdout.count("LOOKUP2 error_class=38") == 2
    assert p.stdout.count("ALLGATHER [0, 10]") == 2


def test_mpmd_ranks_get_their_app_numbers_across_nodes(pdvm, mpicc):
    exe = mpicc("mpi_names")
    p = pdvm.run("--host", HEAD, "-n", "1", exe, ":", "--host", FAR, "-n", "1", exe)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "INIT rank=0 size=2 appnum=0" in p.stdout
    assert "INIT rank=1 size=2 appnum=1" in p.stdout


@pytest.mark.parametrize("server_node,client_node", [(FAR, HEAD), (HEAD, HEAD)],
                         ids=["two-nodes", "one-node"])
def test_accept_connect_between_two_jobs(pdvm, mpicc, server_node, client_node):
    """A server job publishes its port and accepts; a separate client job looks it up
    and connects; they exchange messages over the intercommunicator and disconnect."""
    server, client = mpicc("mpi_server"), mpicc("mpi_client")
    svc = f"svc-{server_node}-{client_node}"
    bg = pdvm.run_bg("--host", server_node, "-n", "1", server, svc)
    out = LineReader(bg.stdout)
    try:
        assert out.wait_line("PUBLISHED") == "PUBLISHED rc=0"
        p = pdvm.run("--host", client_node, "-n", "1", client, svc)
        assert p.returncode == 0, p.stdout + p.stderr
        assert lines(p, "CONNECT") == ["CONNECT rc=0"]
        assert lines(p, "RECV") == ["RECV val=42"]
        assert finish(bg) == 0
    finally:
        if bg.poll() is None:
            bg.kill()
    got = out.join()
    assert "ACCEPT rc=0" in got and "GOT back=43" in got and "DONE" in got
    assert pdvm.store()["master"]["items"] == 0


def test_mpi_comm_spawn_starts_a_child_job_whose_output_reaches_the_parents_run(pdvm, mpicc):
    exe = mpicc("mpi_spawn")
    p = pdvm.run("--tag-output", "--host", HEAD, "-n", "1", exe, "2")
    assert p.returncode == 0, p.stdout + p.stderr
    parent = lines(p, "[")
    spawn = [ln for ln in parent if "SPAWN rc=0" in ln]
    assert len(spawn) == 1
    pns = spawn[0][1:].split(",")[0]
    kids = [ln for ln in parent if "CHILD rank=" in ln]
    assert len(kids) == 2, p.stdout
    assert all(not ln.startswith(f"[{pns},") for ln in kids)  # a job of its own
    assert any("PARENT sum=3" in ln for ln in parent)
    assert pdvm.store()["master"]["items"] == 0


def test_output_filename_numbers_a_spawned_job_2_where_mpirun_writes_none(
        pdvm, mpicc, mpirun, tmp_path):
    """`--output-filename DIR` on a persistent DVM: the run's own job is
    DIR/1 whatever its number in the DVM, the job it spawns DIR/2.  mpirun
    4.1.4 writes its own job's files and none for a spawned job (its output
    reaches the terminal only); pydvm keeps the child's too."""
    exe = mpicc("mpi_spawn")

    def tree(root: Path) -> dict[str, str]:
        return {str(f.relative_to(root)): f.read_text() for f in sorted(root.rglob("*"))
                if f.is_file()}
    ref = mpirun(1, "--output-filename", str(tmp_path / "ref"), exe, "2", timeout=90)
    assert ref.returncode == 0, ref.stdout + ref.stderr
    assert tree(tmp_path / "ref") == {"1/rank.0/stdout": "SPAWN rc=0\nPARENT sum=3\n",
                                      "1/rank.0/stderr": ""}
    p = pdvm.run("--output-filename", str(tmp_path / "ours"), "--host", HEAD, "-n", "1", exe,
                 "2")
    assert p.returncode == 0, p.stdout + p.stderr
    assert tree(tmp_path / "ours") == {
        "1/rank.0/stdout": "SPAWN rc=0\nPARENT sum=3\n", "1/rank.0/stderr": "",
        "2/rank.0/stdout": "CHILD rank=0 size=2\n", "2/rank.1/stdout": "CHILD rank=1 size=2\n"}


def test_a_relative_program_and_its_relative_spawn_resolve_in_the_jobs_directory(pdvm, mpicc):
    """`pydvm run ./mpi_spawn` from the program's directory (not the DVM's), on the
    daemon node: the job runs, and its MPI_Comm_spawn("./mpi_spawn") finds the child
    in the parent's working directory."""
    exe = Path(mpicc("mpi_spawn"))
    assert Path.cwd() != exe.parent
    p = pdvm.run("--host", FAR, "-n", "1", "./mpi_spawn", "2", cwd=exe.parent)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SPAWN rc=0" in p.stdout and p.stdout.count("CHILD rank=") == 2, p.stdout


def test_mpi4py_futures_pool_spawns_its_workers(pdvm, mpi4py_python):
    p = pdvm.run("--host", FAR, "-n", "1", mpi4py_python, str(CLIENTS / "mpi4py_futures.py"))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "RESULTS [32, 9, 64]" in p.stdout and "POOL DONE" in p.stdout


def _shm() -> set[str]:
    """Every file under /dev/shm."""
    import os
    out = set()
    for root, _dirs, files in os.walk("/dev/shm"):
        out |= {os.path.join(root, f) for f in files}
    return out


def test_two_nodes_on_one_machine_share_no_segment_and_leave_none(make_pdvm, mpicc):
    """The head node and ``far`` run on this one machine, two ranks each: Open MPI
    derives its shared-memory segment names from the host name, which both nodes
    share -- yet the allreduce works every time, and no job, not even a killed
    one, leaves a segment in /dev/shm (nor the DVM, once stopped)."""
    allreduce, fail = mpicc("mpi_allreduce"), mpicc("mpi_fail")
    before = _shm()
    pdvm = make_pdvm()
    for _ in range(3):
        p = pdvm.run("--host", f"{HEAD}:2,{FAR}:2", "-n", "4", allreduce, timeout=60)
        assert p.returncode == 0, p.stdout + p.stderr
        assert p.stdout.count("size=4 sum=6") == 4, p.stdout
    p = pdvm.run("--host", f"{HEAD}:2,{FAR}:2", "-n", "4", fail, "3", "kill", timeout=60)
    assert p.returncode == 137, p.stdout + p.stderr
    # what this DVM's jobs made (other tests' DVMs may run meanwhile): in its
    # nodes' directories, and Open MPI's own names, which carry no DVM id
    dvmid = pdvm.uri.rsplit("/", 1)[1]

    def ours(files):
        return {f for f in files if f"/{dvmid}-" in f or "/pydvm-" not in f}

    def left_now():
        return {f for f in ours(_shm() - before) if not f.endswith("/owner")}  # the nodes' own
    # Open MPI's names carry no DVM id: an mpirun of another test running
    # meanwhile has its segments there until its job ends -- ours never go
    import time
    deadline = time.monotonic() + 15
    while left_now() and time.monotonic() < deadline:
        time.sleep(0.2)
    left = left_now()
    assert not left, f"left in /dev/shm by the jobs: {sorted(left)}"
    pdvm.stop()
    left = {f for f in ours(_shm() - before) if f"/{dvmid}-" in f}
    assert not left, f"left in /dev/shm by the DVM: {sorted(left)}"


def _ranks_that(out: str, err: str, what: str) -> set[int]:
    """The pids of the ranks (``RANK r PID p`` on stdout) that printed ``what``
    among Open MPI's hwloc diagnostics (``[host:pid] hwloc:base ...``)."""
    import re
    pids = {int(p) for p in re.findall(r"RANK \d+ PID (\d+)", out)}
    said = {int(p) for p in re.findall(r"\[[^\]:]+:(\d+)\] hwloc:base:? " + re.escape(what),
                                        out + err)}
    return said & pids


def _ranks_saying_hwloc(out: str, err: str) -> set[int]:
    """The pids of the ranks that printed any hwloc:base diagnostic."""
    import re
    pids = {int(p) for p in re.findall(r"RANK \d+ PID (\d+)", out)}
    return pids & {int(p) for p in re.findall(r"\[[^\]:]+:(\d+)\] hwloc:base", out + err)}


def test_mpi_init_finds_the_topology_it_is_given_as_under_mpirun(pdvm, mpicc, mpirun):
    """Two ranks: mpirun binds each to a core and says so
    (OMPI_MCA_orte_bound_at_launch, PMIX_CPUSET, PMIX_LOCALITY_STRING), and
    MPI_Init then never looks at the hardware topology; pydvm binds and tells
    Open MPI the same, on the head node and on a daemon node, and no rank
    looks either.  Unbound (``--bind-to none``) no rank discovers the topology
    itself: the node's PMIx server shares the one it discovered once, and
    MPI_Init adopts it -- discovering it is tens of milliseconds of every
    rank's start."""
    from placed import pydvm_run
    exe = mpicc("mpi_topology")
    verbose = ("--mca", "hwloc_base_verbose", "5")
    ref = mpirun(2, exe, extra=verbose)
    assert ref.returncode == 0, ref.stdout + ref.stderr
    assert ref.stdout.count("RANK ") == 2, ref.stdout
    assert not _ranks_saying_hwloc(ref.stdout, ref.stderr), ref.stderr  # bound: skipped
    for host in (HEAD, FAR):
        p = pdvm.run("--host", f"{host}:2", "-n", "2", "env", "OMPI_MCA_hwloc_base_verbose=5",
                     exe)
        assert p.returncode == 0, p.stdout + p.stderr
        assert p.stdout.count("RANK ") == 2, p.stdout
        assert not _ranks_saying_hwloc(p.stdout, p.stderr), p.stdout + p.stderr
        p = pydvm_run(["--bind-to", "none", "--host", f"{host}:2", "-n", "2", "env",
                       "OMPI_MCA_hwloc_base_verbose=5", exe], pdvm.env, pdvm.uri)
        assert p.returncode == 0, p.stdout + p.stderr
        assert p.stdout.count("RANK ") == 2, p.stdout
        assert not _ranks_that(p.stdout, p.stderr, "discovering topology"), p.stderr
        assert len(_ranks_that(p.stdout, p.stderr, "topology in shared memory")) == 2, \
            p.stdout + p.stderr


def test_bound_ranks_get_their_cpuset_and_locality_from_pmix_as_under_mpirun(pdvm, pmixcc,
                                                                             mpirun):
    """What PMIx says of each local rank's binding (PMIX_CPUSET,
    PMIX_LOCALITY_STRING), read by the ranks themselves: the same strings as
    under mpirun for the same two ranks (one core each; which rank has which
    core may differ: pydvm takes the least-loaded core first, and other
    tests' ranks may be bound meanwhile)."""
    exe = pmixcc("pmix_binding")

    def values(p):
        return sorted(ln.split(" ", 2)[2] for ln in p.stdout.splitlines())

    ref = mpirun(2, exe)
    assert ref.returncode == 0, ref.stdout + ref.stderr
    want = values(ref)
    assert "pmix.locstr=SK0:L30:L20:L10:CR0:HT0:NM0" in want, want
    got = pdvm.run("--host", f"{FAR}:2", "-n", "2", exe)
    assert got.returncode == 0, got.stdout + got.stderr
    assert values(got) == want


def test_the_job_api_captures_the_output_of_the_jobs_a_job_spawns(pdvm, mpicc, monkeypatch):
    """Through ``pydvm.jobs``, an MPI_Comm_spawn's children write where their
    parent's output goes (captured here, and per line to a callback), as
    ``pydvm run`` prints them; nothing of theirs is left on the connection's
    tables once the parent ended."""
    import pydvm.jobs

    exe = mpicc("mpi_spawn")
    monkeypatch.setenv("PYDVM_STATE_DIR", pdvm.env["PYDVM_STATE_DIR"])
    seen: list[tuple[int, str]] = []
    with pydvm.jobs.connect(pdvm.uri) as dvm:
        job = dvm.submit([exe, "2"], n=1, hosts=[HEAD], env=pdvm.env, stdout="capture")
        cb = dvm.submit([exe, "2"], n=1, hosts=[HEAD], env=pdvm.env,
                        stdout=lambda rank, line: seen.append((rank, line)))
        r, rcb = job.result(timeout=120), cb.result(timeout=120)
        assert r.returncode == 0 and rcb.returncode == 0, (r, rcb)
        out = r.stdout.decode()
        assert "SPAWN rc=0" in out and "PARENT sum=3" in out, out
        assert sorted(ln.strip() for ln in out.splitlines() if "CHILD" in ln) == [
            "CHILD rank=0 size=2", "CHILD rank=1 size=2"], out
        kids = sorted((rank, ln.strip()) for rank, ln in seen if "CHILD" in ln)
        assert kids == [(0, "CHILD rank=0 size=2"), (1, "CHILD rank=1 size=2")], seen
        assert not dvm._by_ns  # the parents and their children, forgotten at their end
