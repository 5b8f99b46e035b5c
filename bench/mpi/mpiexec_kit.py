"""Timing launches of the MPI-family ``hello`` under an MPI's own launcher.

A helper for benchmarks that compare pydvm's launch of an MPICH or Intel MPI
job with the MPI's own ``mpiexec``::

    from mpiexec_kit import time_native
    rows = time_native("mpich", runs=10, n=4, ppn=2)   # or an MPI object

Each launch is timed from the launcher's start to its exit (wall clock);
with ``timing=True`` the program also reports how long MPI_Init took (the
slowest rank's, ``init_s=`` in its output).  ``python bench/mpi/mpiexec_kit.py
[NAME ...]`` prints a table for the named MPIs (default: all of them).
"""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from mpifamily import kit  # noqa: E402


def time_native(mpi: "kit.MPI | str", runs: int = 10, n: int = 4, ppn: int | None = 2,
                hosts: list[str] | None = None, timing: bool = True,
                timeout: float = 120.0) -> list[dict]:
    """``runs`` launches of hello under ``mpi``'s own launcher; one dict per
    launch: ``wall_s`` (launch to exit) and ``init_s`` (None without
    ``timing``).  A launch that fails raises, showing its output."""
    if isinstance(mpi, str):
        mpi = kit.get(mpi)
    if mpi.named_hosts and ppn:
        hosts = hosts or [chr(ord("a") + i) for i in range(-(-n // ppn))]
    else:
        ppn, hosts = None, None
    mpi.build("hello")  # not timed
    rows = []
    for _ in range(runs):
        res = kit.run_native(mpi, "hello", n=n, ppn=ppn, hosts=hosts,
                             args=["--timing"] if timing else [], timeout=timeout)
        if res.returncode != 0 or sorted(kit.hello_ranks(res.stdout)) != list(range(n)):
            raise RuntimeError(f"{mpi.name}: hello failed\n{res.describe()}")
        m = re.search(r"init_s=(\d+\.\d+)", res.stdout)
        rows.append({"wall_s": res.seconds, "init_s": float(m.group(1)) if m else None})
    return rows


def summary(rows: list[dict]) -> dict:
    """Median and min of each measure."""
    out = {}
    for key in ("wall_s", "init_s"):
        vals = [r[key] for r in rows if r[key] is not None]
        if vals:
            out[key] = {"median": statistics.median(vals), "min": min(vals)}
    return out


def main(argv: list[str]) -> int:
    names = argv or list(kit.NAMES)
    print(f"{'MPI':<10} {'launcher':<14} {'runs':>4} {'wall med s':>10} {'wall min s':>10} "
          f"{'init med s':>10}")
    best = None
    for name in names:
        mpi = kit.get(name)
        s = summary(time_native(mpi, runs=5))
        init = s.get("init_s", {}).get("median", float("nan"))
        print(f"{name:<10} {Path(mpi.launcher[0]).name:<14} {5:>4} "
              f"{s['wall_s']['median']:>10.3f} {s['wall_s']['min']:>10.3f} {init:>10.3f}")
        if best is None or s["wall_s"]["median"] < best[1]:
            best = (name, s["wall_s"]["median"])
    print(f"summary: fastest own-launcher hello (4 ranks) is {best[0]}, "
          f"{best[1]:.3f} s median launch to exit")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
