"""Open MPI 4.1 programs launched directly (no mpirun) under the test host."""

from __future__ import annotations


from pydvm.pmix import constants as C

from .conftest import CLIENTS, OMPI_DIRECT_LAUNCH_ENV


def two_ranks(argv, **spec):
    return {"env": dict(OMPI_DIRECT_LAUNCH_ENV), "timeout": 30,
            "clients": [{"rank": r, "argv": list(argv)} for r in (0, 1)], **spec}


def test_mpi_c_publish_lookup_unpublish(harness, mpicc_build):
    exe = mpicc_build("mpi_names")
    res = harness(two_ranks([exe])).ok()
    for r in (0, 1):
        assert f"INIT rank={r} size=2 appnum=0" in res.out(r)
        assert "LOOKUP rc=0 port=port-of-rank-0" in res.out(r)
        # after MPI_Unpublish_name the name is gone: MPI_ERR_NAME
        assert "LOOKUP2 rc=38 class=38" in res.out(r)
        assert "LOOKUP3 rc=0 port=port-of-rank-0" in res.out(r)
        assert f"FINALIZE rank={r}" in res.out(r)
    assert "PUBLISH rc=0" in res.out(0) and "UNPUBLISH rc=0" in res.out(0)
    pubs = res.kinds("publish")
    # Open MPI sends range/persistence only when the MPI_Info asks (as PMIX_INT)
    assert (pubs[0]["range"], pubs[0]["persistence"]) == (None, None)
    assert (pubs[1]["range"], pubs[1]["persistence"]) == (C.RANGE_NAMESPACE, C.PERSIST_APP)
    assert {l["range"] for l in res.kinds("lookup") if l["keys"] == ["pydvm-svc2"]} == {3}
    assert len(res.kinds("client_finalized")) == 2


def test_mpi_mpmd_app_numbers(harness, mpicc_build):
    exe = mpicc_build("mpi_names")
    res = harness(two_ranks([exe], apps=[1, 1])).ok()
    assert "INIT rank=0 size=2 appnum=0" in res.out(0)
    assert "INIT rank=1 size=2 appnum=1" in res.out(1)


def test_without_schizo_setting_ranks_are_singletons(harness, mpicc_build):
    # the finding behind OMPI_DIRECT_LAUNCH_ENV: Open MPI's schizo/orte
    # declares every unrecognised launch a singleton (it sets ess=singleton,
    # overriding OMPI_MCA_ess=pmi), so nothing contacts the server
    exe = mpicc_build("mpi_names")
    spec = two_ranks([exe], env={"OMPI_MCA_ess": "pmi"})
    res = harness(spec).ok()
    assert "INIT rank=0 size=1 appnum=0" in res.out(1)
    assert res.requests == []


def test_mpi_accept_connect(harness, mpicc_build):
    exe = mpicc_build("mpi_accept")
    res = harness(two_ranks([exe])).ok()
    assert "ACCEPT rc=0" in res.out(0)
    assert "CONNECT rc=0" in res.out(1) and "RECV val=42" in res.out(1)
    # the handshake: FIRST_READ publishes and waiting lookups (PMIX_WAIT=true,
    # PMIX_TIMEOUT=600) of Open MPI's own keys
    first_read = [p for p in res.kinds("publish") if p["persistence"] == C.PERSIST_FIRST_READ]
    assert first_read
    waits = [l for l in res.kinds("lookup") if l["wait"] == 0]
    assert waits and all(l["timeout"] == 600 for l in waits)
    assert any(t == C.BYTE_OBJECT for p in first_read for _, t in p["pairs"].values())


def test_mpi4py_names_and_collecting_fence(harness, mpi4py_python):
    script = str(CLIENTS / "mpi4py_names.py")
    res = harness(two_ranks([mpi4py_python, script]),
                  env={"PMIX_MCA_pmix_server_fence_localonly_opt": "0"}).ok()
    for r in (0, 1):
        assert f"INIT rank={r} size=2" in res.out(r)
        assert "LOOKUP port=py-port-0" in res.out(r)
        assert "LOOKUP2 error_class=38" in res.out(r)
        assert "ALLGATHER [0, 10]" in res.out(r)
    fences = res.kinds("fence")
    # MPI_Init's modex fence carried data to collect through the host
    assert any(f["collect"] and f["ndata"] > 0 for f in fences)
