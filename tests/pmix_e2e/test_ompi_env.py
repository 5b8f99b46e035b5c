"""What Open MPI 4.1 programs are told by the environment pydvm gives each
rank, against Open MPI's own ``mpirun`` (runtime/node/ompienv.py; docs/runtime.md,
"The rank environment"): MPI_INFO_ENV and MPI_UNIVERSE_SIZE, a spawned job's
own shared-memory directories on each node, oversubscription.
"""

from __future__ import annotations

import os
import re

import pytest

from conftest import local_mpi
from dvmkit import start_dvm, wait_for
from pmixkit import FAR, HEAD


CORES = os.cpu_count() or 1


@pytest.fixture(scope="module")
def core_dvm(tmp_path_factory, libpmix):
    """The head node alone, with as many slots as this machine has cores (as
    mpirun counts its slots here)."""
    with start_dvm(tmp_path_factory.mktemp("core-dvm"), f"{HEAD}:{CORES}",
                   {"pydvm_pmix": "on"}) as d:
        yield local_mpi(d)


def _info(out: str) -> dict[int, dict[str, str]]:
    got: dict[int, dict[str, str]] = {}
    for rank, key, value in re.findall(r"^INFO rank=(\d+) (\w+)=(.*)$", out, re.M):
        got.setdefault(int(rank), {})[key] = value
    return got


def test_mpi_info_env_and_universe_size_as_under_mpirun(core_dvm, mpicc, mpirun, tmp_path):
    """MPI_INFO_ENV (command, argv, maxprocs, wdir, Open MPI's ompi_num_apps,
    ompi_first_rank, ompi_np, ompi_positioned_file_dir), MPI_UNIVERSE_SIZE and
    MPI_APPNUM of an MPMD job (N ranks with arguments : 1 rank), oversubscribed
    by one rank: found under pydvm as under mpirun, equal but for two pinned
    differences -- each app's real first rank (mpirun 4.1.4: "0 0"), and a
    universe of at least the job's size (mpirun: its slots)."""
    exe = mpicc("mpi_info_env")
    n = max(2, CORES)
    argv = ("-n", str(n), exe, "a", "b c", ":", "-n", "1", exe)
    ref = mpirun(n, *argv[2:], extra=())  # mpirun(n, ...) puts -n n first
    assert ref.returncode == 0, ref.stdout + ref.stderr
    p = core_dvm.run(*argv, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    ours, theirs = _info(p.stdout), _info(ref.stdout)
    assert sorted(ours) == sorted(theirs) == list(range(n + 1))
    for r in ours:
        assert [k for k, v in ours[r].items() if v == "Not found"] == (
            ["argv"] if r == n else []), (r, ours[r])  # app 1 has no arguments
        assert ours[r]["wdir"] == str(tmp_path)
        assert ours[r]["ompi_positioned_file_dir"] != theirs[r]["ompi_positioned_file_dir"]
        pinned = {"ompi_first_rank": f"0 {n}", "universe_size": str(n + 1),
                  "ompi_positioned_file_dir": ours[r]["ompi_positioned_file_dir"],
                  "wdir": ours[r]["wdir"]}
        assert {**theirs[r], **pinned} == ours[r], r
        assert theirs[r]["ompi_first_rank"] == "0 0"
        assert theirs[r]["universe_size"] == str(CORES)
    assert ours[0]["argv"] == "a b c" and ours[n]["command"] == "mpi_info_env"
    assert [ours[r]["appnum"] for r in (0, n)] == ["0", "1"]


def test_an_oversubscribed_node_tells_open_mpi_to_yield(core_dvm, mpicc):
    """One rank more than the node's slots: ``OMPI_MCA_mpi_oversubscribe=1``
    (Open MPI then yields while it waits) and a barrier loop completes; as
    many as its slots: 0.  (The cost: bench/mpi/oversubscribed.py.)"""
    exe = mpicc("mpi_barrier_loop")
    p = core_dvm.run("-n", str(CORES + 1), exe, "2000", timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert re.search(rf"^BARRIER size={CORES + 1} n=2000 us=[\d.]+ oversubscribe=1$",
                     p.stdout, re.M), p.stdout
    p = core_dvm.run("-n", str(CORES), exe, "2000", timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert re.search(rf"^BARRIER size={CORES} n=2000 us=[\d.]+ oversubscribe=0$",
                     p.stdout, re.M), p.stdout


@pytest.fixture
def one_slot_dvm(tmp_path, libpmix):
    """The head node and ``far`` with one slot each: a spawned job of two fills both."""
    with start_dvm(tmp_path, f"{HEAD}:1,{FAR}:1", {"pydvm_pmix": "on"}) as d:
        yield local_mpi(d)


def _job_files(dvmid: str) -> set[str]:
    """Files under this DVM's nodes' job directories in /dev/shm (their
    ``owner`` marks aside)."""
    out = set()
    for root, _dirs, files in os.walk("/dev/shm"):
        if f"/{dvmid}-" in root and "-jobs-" in root:
            out |= {os.path.join(root, f) for f in files if f != "owner"}
    return out


def test_spawned_children_on_two_nodes_use_their_own_nodes_directories(one_slot_dvm, mpicc):
    """MPI_Comm_spawn copies every OMPI_MCA_* of the parent into its children,
    the shared-memory directory pydvm chose for the parent's node included:
    the child on ``far`` must still get ``far``'s own (two children of one
    machine sharing one directory overwrite each other's segments: segfaults
    or hangs), the job works, and no file is left in any job directory."""
    d = one_slot_dvm
    dvmid = d.uri.rsplit("/", 1)[1]
    exe = mpicc("mpi_spawn_dirs")
    for _ in range(2):
        p = d.run("--host", HEAD, "-n", "1", exe, "2", "20", timeout=90)
        assert p.returncode == 0, p.stdout + p.stderr
        kids = re.findall(r"CHILD rank=(\d) size=2 node=(\S+) vader=(\S+) tmpdir=(\S+) "
                          r"files=(\S+)", p.stdout)
        assert sorted(k[1] for k in kids) == sorted([HEAD, FAR]), p.stdout
        assert [(node, vader, tmpdir) for _r, node, vader, tmpdir, _f in kids
                if f"/{dvmid}-{node}-jobs-" not in vader or tmpdir != vader] == [], p.stdout
        for _rank, node, vader, tmpdir, files in kids:
            assert files.startswith(vader + "/"), (vader, files)  # OMPI_FILE_LOCATION
        assert p.stdout.count("DONE sum=") == 2 and "BAD" not in p.stdout, p.stdout
        assert "PARENT rounds=20" in p.stdout
    left = wait_for(lambda: not _job_files(dvmid) or None, timeout=15, what="no job files") \
        if _job_files(dvmid) else True
    assert left and not _job_files(dvmid)


def test_mpi4py_spawns_children_over_two_nodes_again_and_again(one_slot_dvm, mpi4py_python):
    """mpi4py's own spawn test (TestSpawnWorldMany, N=2) segfaulted in
    mca_btl_vader_poll_handle_frag or hung when the child on ``far`` used the
    parent node's directory: five rounds, each child pair over both nodes."""
    from pmixkit import CLIENTS
    p = one_slot_dvm.run("--host", HEAD, "-n", "1", mpi4py_python,
                         str(CLIENTS / "mpi4py_spawn_many.py"), "2", "5", timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert [ln for ln in p.stdout.splitlines() if ln.startswith("ROUND")] == [
        f"ROUND {r} size=2 total=3" for r in range(5)], p.stdout
    dvmid = one_slot_dvm.uri.rsplit("/", 1)[1]
    kids = re.findall(r"CHILD node=(\S+) vader=(\S+)", p.stdout)
    assert sorted(n for n, _ in kids) == sorted([HEAD, FAR] * 5), p.stdout
    assert [(n, v) for n, v in kids if f"/{dvmid}-{n}-jobs-" not in v] == []


MPI_ERR_RMA_SHARED = 71  # Open MPI 4.1's mpi.h


def test_shared_memory_windows_within_a_node_not_across_two_local_nodes(
        one_slot_dvm, pdvm, mpicc, mpirun):
    """MPI_Win_allocate_shared over the world: within one node as under mpirun
    on one machine; across two nodes of a DVM that share a machine (local
    daemons) refused with MPI_ERR_RMA_SHARED, as under mpirun across two
    hosts -- pydvm's nodes are hosts to Open MPI, wherever they run
    (docs/runtime.md, "Local nodes are hosts")."""
    exe = mpicc("mpi_win_shared")
    ref = mpirun(2, exe)
    assert ref.returncode == 0, ref.stdout + ref.stderr
    assert sorted(lines_of(ref.stdout, "WIN")) == ["WIN rank=0 rc=0 sum=1",
                                                   "WIN rank=1 rc=0 sum=0"]
    p = pdvm.run("--host", f"{FAR}:2", "-n", "2", exe)
    assert p.returncode == 0, p.stdout + p.stderr
    assert sorted(lines_of(p.stdout, "WIN")) == sorted(lines_of(ref.stdout, "WIN"))
    p = one_slot_dvm.run("-n", "2", exe)
    assert p.returncode == 0, p.stdout + p.stderr
    assert sorted(lines_of(p.stdout, "WIN")) == [f"WIN rank={r} rc={MPI_ERR_RMA_SHARED}"
                                                 for r in (0, 1)]


def lines_of(out: str, prefix: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.startswith(prefix)]
