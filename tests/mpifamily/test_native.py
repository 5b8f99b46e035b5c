"""The baseline: each MPI's programs under its own launcher.

(tests/mpifamily/test_under_pydvm.py runs hello, abort, the name service
and spawn under each launcher beside pydvm; what is left here is what only
the kit needs to know: the timing line the benchmark reads, the statuses of
a dying rank, and that each "cannot" is real.)

What a PMI-1 server must match is what these show: 4 ranks, 2 per node
(where the launcher takes named nodes), the exit status of an MPI_Abort and
of a rank that dies, and which MPIs can publish/connect and spawn at all.
"""

from __future__ import annotations

import re

import pytest

from . import kit

HOSTS = ["a", "b"]


def layout(mpi: kit.MPI) -> dict:
    """4 ranks, 2 per named node where the launcher takes named nodes."""
    return {"n": 4, "ppn": 2, "hosts": HOSTS} if mpi.named_hosts else {"n": 4}


def assert_hello(mpi: kit.MPI, res: kit.Result, n: int = 4) -> None:
    assert res.returncode == 0, res.describe()
    seen = kit.hello_ranks(res.stdout)
    assert sorted(seen) == list(range(n)), res.describe()
    assert {size for size, _ in seen.values()} == {n}, res.describe()
    assert kit.said(res.stdout, "sum ok"), res.describe()


def test_hello_timing_prints_init_seconds(mpi):
    res = kit.run_native(mpi, "hello", args=["--timing"], **layout(mpi), timeout=60)
    assert_hello(mpi, res)
    m = re.search(r"init_s=(\d+\.\d{6})", res.stdout)
    assert m and 0 < float(m.group(1)) < 60, res.describe()


def die_layout(mpi: kit.MPI) -> dict:
    # Hydra (MPICH's) with two named nodes on one machine does not end the
    # job when a rank dies: the other node's ranks spin on (measured).
    return layout(mpi) if mpi.die_ends_named else {"n": 4}


@pytest.mark.parametrize("how", ["exit", "signal"])
def test_die_status(mpi, how):
    args = ["--signal"] if how == "signal" else []
    res = kit.run_native(mpi, "die", args=args, **die_layout(mpi), timeout=60)
    want = mpi.die_status if how == "exit" else mpi.die_signal_status
    assert res.returncode in want, res.describe()
    assert kit.said(res.stdout, "rank 1 dying"), res.describe()
    assert "passed" not in res.stdout, res.describe()


CANNOT = [(name, program) for name, programs in kit.KNOWN_CANNOT.items()
          for program in programs]


@pytest.mark.parametrize("name,program", CANNOT)
def test_what_cannot_run_really_fails(get_mpi, name, program):
    """Each 'cannot' is a measured fact, not a guess: the program fails
    under the MPI's own launcher (on one node, where a failed rank ends
    the job), saying so."""
    mpi = get_mpi(name)
    assert program in mpi.cannot
    if program == "pubconn":
        res = kit.run_native(mpi, None, apps=[(1, "pubconn", ["server"])], timeout=60)
        assert kit.said(res.stdout, "FAIL: MPI_Open_port"), res.describe()
    else:
        res = kit.run_native(mpi, program, n=1, timeout=60)
        assert kit.said(res.stdout + res.stderr, "MPI_Init") or "FAIL" in res.stdout, \
            res.describe()
    assert res.returncode not in (0, None), res.describe()
