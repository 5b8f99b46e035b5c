"""Every MPI of the family under pydvm run, beside its own launcher in the same test.

The same programs (kit.py) on a DVM of two local nodes of two slots, a and
b: four ranks, two per node.  MPICH and Intel MPI find pydvm through PMI-1,
Open MPI 5 through PMIx -- chosen by pydvm from the program (``--mpi
auto``).  Before pydvm served PMI-1, the MPICH-family rows ran as four
one-rank programs that exited 0 (MPICH 5.0.2 aborted on the PMIx
variables every job got)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from . import kit

sys.path.insert(0, str(Path(__file__).parent.parent / "e2e"))

from dvmkit import start_dvm  # noqa: E402

HOSTS = ["a", "b"]
PYDVM = [sys.executable, "-m", "pydvm"]


@pytest.fixture(scope="module")
def dvm(tmp_path_factory):
    with start_dvm(tmp_path_factory.mktemp("mpifamily"), "a:2,b:2") as d:
        yield d


def pydvm_run(dvm, mpi: kit.MPI, program: str | None, *run_args: str, args=(), apps=None,
              timeout: float = 90) -> kit.Result:
    """``pydvm run RUN_ARGS... PROGRAM ARGS`` (or MPMD ``apps``) in the MPI's environment."""
    env = mpi.environ(program if isinstance(program, str) else None, base=dvm.env)
    env["PYDVM_URI"] = dvm.uri
    argv = list(run_args)
    if apps is None:
        argv += mpi.argv_of(program, args)
    else:
        for i, (n, prog, a) in enumerate(apps):
            argv += ([":"] if i else []) + ["-n", str(n), *mpi.argv_of(prog, a)]
            env.update(mpi.program_env.get(prog, {}))
    return kit.run_argv([*PYDVM, "run", *argv], env, timeout=timeout)


def native_layout(mpi: kit.MPI, n: int = 4, ppn: int = 2) -> dict:
    return {"n": n, "ppn": ppn, "hosts": HOSTS} if mpi.named_hosts else {"n": n}


def assert_hello(res: kit.Result, n: int = 4) -> None:
    assert res.returncode == 0, res.describe()
    seen = kit.hello_ranks(res.stdout)
    assert sorted(seen) == list(range(n)), res.describe()
    assert {size for size, _ in seen.values()} == {n}, res.describe()
    assert kit.said(res.stdout, "sum ok"), res.describe()


@pytest.mark.parametrize("program", ["hello", "hello.py"])
def test_hello_over_two_nodes(dvm, mpi, program):
    native = kit.run_native(mpi, program, **native_layout(mpi), timeout=90)
    assert_hello(native)
    ours = pydvm_run(dvm, mpi, program, "--host", "a:2,b:2", "-n", "4")
    assert_hello(ours)


def test_ranks_per_node_as_the_launcher_says(dvm, pmi1_mpi):
    probe = ["/bin/sh", "-c", 'echo "$PMI_RANK $MPI_LOCALNRANKS $MPI_LOCALRANKID"']
    native = kit.run_native(pmi1_mpi, probe, n=4, ppn=2, hosts=HOSTS, timeout=60)
    ours = pydvm_run(dvm, pmi1_mpi, probe, "--mpi", "pmi1", "--host", "a:2,b:2", "-n", "4")
    assert ours.returncode == native.returncode == 0, ours.describe() + native.describe()
    assert sorted(ours.lines()) == sorted(native.lines()) == ["0 2 0", "1 2 1", "2 2 0",
                                                              "3 2 1"]


def test_mpi_abort_status(dvm, mpi):
    native = kit.run_native(mpi, "abort", **native_layout(mpi), timeout=60)
    ours = pydvm_run(dvm, mpi, "abort", "--host", "a:2,b:2", "-n", "4", timeout=60)
    assert native.returncode == mpi.abort_status == 7, native.describe()
    assert ours.returncode == 7, ours.describe()
    assert "passed" not in ours.stdout, ours.describe()
    assert re.search(r"called PMIx?_Abort with status 7", ours.stderr), ours.describe()


def test_a_rank_that_dies_ends_the_job(dvm, mpi):
    # MPICH's own launcher does not end the job over two named nodes
    # (kit.py: die_ends_named); pydvm does, on two nodes.
    native = kit.run_native(mpi, "die", **(native_layout(mpi) if mpi.die_ends_named
                                           else {"n": 4}), timeout=60)
    ours = pydvm_run(dvm, mpi, "die", "--host", "a:2,b:2", "-n", "4", timeout=60)
    assert native.returncode in mpi.die_status, native.describe()
    if mpi.interface == "pmix":
        # Open MPI's surviving ranks see the lost peer over their own links
        # and may call MPI_Abort before the dead rank's end reaches the
        # master: the job then ends with that abort's status (14, seen)
        assert ours.returncode in (3, 14), ours.describe()
    else:
        assert ours.returncode == 3, ours.describe()
    assert "passed" not in ours.stdout, ours.describe()
    assert "without finalizing" in ours.stderr or ours.returncode == 14, ours.describe()


@pytest.mark.parametrize("name", kit.able(program="pubconn"))
def test_publish_lookup_connect_accept(dvm, get_mpi, name):
    mpi = get_mpi(name)
    apps = [(1, "pubconn", ["server"]), (1, "pubconn", ["client"])]
    native = kit.run_native(mpi, None, apps=apps, hosts=HOSTS if mpi.named_hosts else None,
                            ppn=1 if mpi.named_hosts else None, timeout=90)
    ours = pydvm_run(dvm, mpi, None, "--host", "a:1,b:1", apps=apps)
    for res in (native, ours):
        assert res.returncode == 0, res.describe()
        for phrase in ("server published ", "client looked up ", "server got 2000 ok",
                       "client got 1000 ok", "server unpublished", "server done",
                       "client done"):
            assert kit.said(res.stdout, phrase), res.describe()


@pytest.mark.parametrize("name", kit.able(program="pubconn"))
def test_the_name_service_spans_jobs(dvm, get_mpi, name):
    """Server and client as two separate jobs: they meet through the DVM's
    store (under the MPI's own launcher two jobs share no names)."""
    mpi = get_mpi(name)
    env = mpi.environ("pubconn", base=dvm.env)
    env["PYDVM_URI"] = dvm.uri
    service = f"pydvm-{name}-jobs"
    server = subprocess.Popen([*PYDVM, "run", "--host", "a:1", "-n", "1",
                               *mpi.argv_of("pubconn", ["server", service])], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        client = pydvm_run(dvm, mpi, "pubconn", "--host", "b:1", "-n", "1",
                           args=["client", service])
        assert client.returncode == 0, client.describe()
        assert kit.said(client.stdout, "client got 1000 ok"), client.describe()
        out, err = server.communicate(timeout=90)
        assert server.returncode == 0, out + err
        assert kit.said(out, "server got 2000 ok") and kit.said(out, "server unpublished")
    finally:
        if server.poll() is None:
            kit.kill_group(server.pid)
            server.wait(timeout=30)


@pytest.mark.parametrize("name", kit.able(program="spawn"))
def test_spawn(dvm, get_mpi, name):
    mpi = get_mpi(name)
    kw = {"n": 2, "ppn": 1, "hosts": HOSTS} if mpi.named_hosts else {"n": 2}
    native = kit.run_native(mpi, "spawn", **kw, timeout=90)
    ours = pydvm_run(dvm, mpi, "spawn", "--host", "a:2,b:2", "-n", "2")
    for res in (native, ours):
        assert res.returncode == 0, res.describe()
        out = res.stdout
        assert sorted(re.findall(r"parent \d of 2 got 2001 ok", out)) == [
            "parent 0 of 2 got 2001 ok", "parent 1 of 2 got 2001 ok"], res.describe()
        assert sorted(re.findall(r"child \d of 2 parents 2 got 201 ok", out)) == [
            "child 0 of 2 parents 2 got 201 ok", "child 1 of 2 parents 2 got 201 ok"], \
            res.describe()
        assert kit.said(out, "merged size 4 ok"), res.describe()


@pytest.mark.parametrize("name", ["mpich-deb", "mpich"])
def test_sixteen_jobs_in_a_row(dvm, get_mpi, name):
    # The PMI-1 server's jobs.  (Open MPI 5's and Intel MPI's MPI_Init alone
    # take 1.5-2 s here under either launcher: their rows run the rest.)
    mpi = get_mpi(name)
    for i in range(16):
        res = pydvm_run(dvm, mpi, "hello", "--host", "a:2,b:2", "-n", "4")
        assert res.returncode == 0 and sorted(kit.hello_ranks(res.stdout)) == [0, 1, 2, 3], \
            (i, res.describe())


def test_intel_mpi_over_pmix(dvm, get_mpi):
    """--mpi pmix: Intel MPI is told where the node's libpmix is
    (I_MPI_PMI_LIBRARY) and speaks PMIx instead of PMI-1."""
    mpi = get_mpi("impi")
    ours = pydvm_run(dvm, mpi, "hello", "--mpi", "pmix", "--host", "a:2,b:2", "-n", "4",
                     "-x", "I_MPI_DEBUG=5")
    assert_hello(ours)
    assert "PMI API: pmix" in ours.stdout + ours.stderr, ours.describe()
    mine = pydvm_run(dvm, mpi, ["/bin/sh", "-c", "echo $I_MPI_PMI_LIBRARY"], "--mpi", "pmix",
                     "-x", "I_MPI_PMI_LIBRARY=/mine/libpmix.so", "-n", "1")
    assert mine.stdout.strip() == "/mine/libpmix.so", mine.describe()


def test_mpich5_is_never_offered_both_interfaces(dvm, get_mpi):
    """MPICH >= 4.1 aborts on PMI-1 and PMIx variables together: a PMI-1
    job's processes carry no PMIX_* variable."""
    mpi = get_mpi("mpich")
    ours = pydvm_run(dvm, mpi, ["/bin/sh", "-c", "env | grep -c '^PMIX_' || true"],
                     "--mpi", "pmi1", "-n", "2")
    assert ours.lines() == ["0", "0"], ours.describe()
