"""Job-level data as PMIx and MPI programs read it, through each of libpmix's
job stores (``pydvm_pmix_gds``: ``auto`` -- the copying ``hash`` on a
machine of at most 8 CPUs -- and the shared-memory ``ds21,ds12,hash``,
libpmix's own choice and ``mpirun``'s), for every rank on every node: a
single-application job, an MPMD job and a spawned job.  ``mpirun`` runs the
same program as the reference: every key a rank finds under ``mpirun`` must
be found under pydvm too, whichever store.
"""

from __future__ import annotations

import os
import re

import pytest

from pmixkit import CLIENTS, FAR, HEAD

SHARED = "ds21,ds12,hash"
pytestmark = pytest.mark.parametrize("pdvm", [{}, {"pydvm_pmix_gds": SHARED}], indirect=True,
                                     ids=["auto", "shared-store"])

#: nodes of the module's DVM in the order it was started with: their node ids.
NODE_IDS = {HEAD: 0, FAR: 1}


def keys(out: str) -> dict[tuple[int, str, str], str | None]:
    """pmix_keys output -> {(rank, what, key): value, or None when not found}."""
    got: dict[tuple[int, str, str], str | None] = {}
    for ln in out.splitlines():
        m = re.match(r"R(\d+) (\S+) (\S+?)(?:=(.*)| ERR .*)$", ln)
        if m:
            got[(int(m.group(1)), m.group(2), m.group(3))] = m.group(4)
    return got


def found(got: dict, rank: int) -> set[tuple[str, str]]:
    return {(what, key) for (r, what, key), v in got.items() if r == rank and v is not None}


def test_each_node_serves_its_ranks_from_the_store_pydvm_pmix_gds_names(pdvm, request):
    """What each rank is told to use (``PMIX_GDS_MODULE``, set by the node's
    PMIx server at the fork), on the head node and on ``far``."""
    shared = request.node.callspec.params["pdvm"].get("pydvm_pmix_gds") == SHARED
    want = SHARED if shared or len(os.sched_getaffinity(0)) > 8 else "hash"
    p = pdvm.run("--host", f"{HEAD}:1,{FAR}:1", "-n", "2", "sh", "-c",
                 'echo "R$PMIX_RANK $PMIX_GDS_MODULE"')
    assert p.returncode == 0, p.stdout + p.stderr
    assert sorted(p.stdout.split("\n"))[1:] == [f"R0 {want}", f"R1 {want}"], p.stdout


def test_every_rank_reads_its_job_node_and_process_data_from_the_default_store(
        pdvm, pmixcc):
    """Three ranks over two nodes (one on the head node, two on ``far``): universe
    and job size, app number and size, local size and peers, local/node rank,
    node id, number of nodes, host names."""
    exe = pmixcc("pmix_keys")
    p = pdvm.run("--host", f"{HEAD}:1,{FAR}:2", "-n", "3", exe)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "PMIX ERROR" not in p.stderr, p.stderr
    got = keys(p.stdout)
    nodes = {0: HEAD, 1: FAR, 2: FAR}
    peers = {HEAD: [0], FAR: [1, 2]}
    for r in range(3):
        node = nodes[r]

        def v(what: str, key: str) -> str | None:
            return got.get((r, what, key))
        assert v("JOB", "pmix.univ.size") == "8"      # the slots of the DVM's nodes: 4 + 4
        assert v("JOB", "pmix.max.size") == "8"
        assert v("JOB", "pmix.job.size") == "3"
        assert v("JOB", "pmix.num.nodes") == "2"
        assert v("JOB", "pmix.job.napps") == "1"
        assert v("JOB", "pmix.app.size") == "3"
        assert v("JOB", "pmix.jobid", ).startswith("pydvm-")
        assert v("JOB", "pmix.local.size") == str(len(peers[node]))
        assert v("JOB", "pmix.lpeers") == ",".join(map(str, peers[node]))
        assert v("JOB", "pmix.lldr") == str(peers[node][0])
        assert v("JOB", "pmix.nodeid") == str(NODE_IDS[node])
        assert v("PROC", "pmix.appnum") == "0"
        assert v("PROC", "pmix.apprank") == str(r)
        assert v("PROC", "pmix.grank") == str(r)
        assert v("PROC", "pmix.lrank") == str(peers[node].index(r))
        assert v("PROC", "pmix.nrank") == str(peers[node].index(r))
        assert v("PROC", "pmix.nodeid") == str(NODE_IDS[node])
        assert v("PROC", "pmix.hname") == node
        assert v("PEER0", "pmix.hname") == HEAD
        if node == HEAD:
            # libpmix 4.2 answers another node's PMIX_NODEID from its node
            # records, where it keeps the id out of reach of a key lookup:
            # NOT_FOUND for a rank on another node, whoever hosts the job.
            assert v("PEER0", "pmix.nodeid") == "0"
        assert v("APP0", "pmix.app.size") == "3"
        assert v("PROC", "pmix.parent") is None        # not spawned



def test_a_rank_finds_every_key_it_finds_under_mpirun(pdvm, pmixcc, mpirun):
    """The same program, three ranks on one node, under ``mpirun`` and under
    ``pydvm run``: every key found under the first is found under the second."""
    exe = pmixcc("pmix_keys")
    ref = mpirun(3, exe)
    assert ref.returncode == 0, ref.stdout + ref.stderr
    ref_got = keys(ref.stdout)
    assert len(found(ref_got, 0)) > 15, ref.stdout
    for host in (HEAD, FAR):
        p = pdvm.run("--host", f"{host}:3", "-n", "3", exe)
        assert p.returncode == 0, p.stdout + p.stderr
        got = keys(p.stdout)
        for r in range(3):
            missing = found(ref_got, r) - found(got, r)
            assert not missing, f"{host} rank {r}: found under mpirun, not under pydvm: " \
                                f"{sorted(missing)}"


def test_an_mpmd_job_gives_each_rank_its_application(pdvm, pmixcc):
    exe = pmixcc("pmix_keys")
    p = pdvm.run("--host", FAR, "-n", "1", exe, "2", ":", "--host", f"{HEAD}:2", "-n", "2",
                 exe, "2")
    assert p.returncode == 0, p.stdout + p.stderr
    got = keys(p.stdout)
    for r, (app, apprank, node) in {0: (0, 0, FAR), 1: (1, 0, HEAD), 2: (1, 1, HEAD)}.items():
        assert got[(r, "JOB", "pmix.job.napps")] == "2"
        assert got[(r, "JOB", "pmix.job.size")] == "3"
        assert got[(r, "JOB", "pmix.univ.size")] == "8"
        assert got[(r, "PROC", "pmix.appnum")] == str(app)
        assert got[(r, "PROC", "pmix.apprank")] == str(apprank)
        assert got[(r, "PROC", "pmix.hname")] == node
        assert got[(r, "APP0", "pmix.app.size")] == "1"
        assert got[(r, "APP1", "pmix.app.size")] == "2"
        assert got[(r, "APP1", "pmix.aldr")] == "1"
        assert got[(r, "PEER0", "pmix.appnum")] == "0"


def test_a_spawned_job_reads_its_own_layout_and_its_parent(pdvm, pmixcc, pmix_ops):
    """PMIx_Spawn of two ranks: they see their own job (size 2), that they were
    spawned, and which process spawned them."""
    exe = pmixcc("pmix_keys")
    p = pdvm.run("--host", HEAD, "-n", "1", pmix_ops, f"spawn:{exe}:2")
    assert p.returncode == 0, p.stdout + p.stderr
    m = re.search(r"SPAWN status=0 nspace=(\S+)", p.stdout)
    assert m, p.stdout
    got = keys(p.stdout)
    parent = re.search(r"R0 JOB pmix.jobid=(\S+)", p.stdout)
    for r in (0, 1):
        assert got[(r, "JOB", "pmix.job.size")] == "2"
        assert got[(r, "JOB", "pmix.spawned")] == "1"
        assert got[(r, "PROC", "pmix.parent")].endswith(":0")
        assert got[(r, "PROC", "pmix.parent")] != f"{m.group(1)}:0"
        assert got[(r, "PROC", "pmix.grank")] == str(r)
    assert parent is not None


def test_mpi4py_reads_its_world_universe_and_app_number_as_under_mpirun(pdvm, mpi4py_python,
                                                                       mpirun):
    """MPI_UNIVERSE_SIZE and MPI_APPNUM through Open MPI: under mpirun on this
    machine, and under pydvm across its two nodes (universe: the DVM's 8 slots)."""
    script = str(CLIENTS / "mpi4py_world.py")
    ref = mpirun(2, mpi4py_python, script)
    assert ref.returncode == 0, ref.stdout + ref.stderr
    assert ref.stdout.count("size=2 universe=") == 2, ref.stdout
    p = pdvm.run("--host", f"{HEAD}:2,{FAR}:2", "-n", "4", mpi4py_python, script)
    assert p.returncode == 0, p.stdout + p.stderr
    for r in range(4):
        assert f"WORLD rank={r} size=4 universe=8 appnum=0" in p.stdout, p.stdout
        assert f"SUM rank={r} sum=6" in p.stdout, p.stdout
    p = pdvm.run("--host", FAR, "-n", "1", mpi4py_python, script, ":", "--host", HEAD, "-n",
                 "1", mpi4py_python, script)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "WORLD rank=1 size=2 universe=8 appnum=1" in p.stdout, p.stdout
