"""MPI_Barrier with more ranks than a node has slots: pydvm against ``mpirun``.

    python bench/mpi/oversubscribed.py [--rounds 5] [--barriers 5000]

On one node of C cores (C = this machine's CPUs) a job of C+1 ranks
oversubscribes it.  ``mpirun --oversubscribe`` then tells Open MPI so
(``OMPI_MCA_mpi_oversubscribe=1``, whose default makes ``mpi_yield_when_idle``
true): a rank waiting in MPI_Barrier gives its CPU up to the one it waits
for.  pydvm tells it the same where a job runs more ranks on a node than its
slots (runtime/node/ompienv.py).  Rows, each the median of ROUNDS runs of
BARRIERS barriers (tests/pmix_e2e/clients/mpi_barrier_loop.c, built here
with mpicc), the sides alternating so they share the machine's noise:

* C+1 ranks on a one-node DVM of C slots (``pydvm run -n C+1``) against
  ``mpirun --oversubscribe -n C+1``;
* the same under pydvm with the hint overridden
  (``OMPI_MCA_mpi_oversubscribe=0``): what ranks cost before pydvm said it --
  they spin, each waiting for a time slice (no mpirun counterpart);
* C ranks (not oversubscribed) on both, for scale.

Prints microseconds per barrier, a table with pydvm / mpirun ratios, and
last ``oversubscribed barrier ratio R`` (pydvm / mpirun, the first row).
Needs ``mpirun`` and ``mpicc`` (Debian: openmpi-bin, libopenmpi-dev).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parents[1] / "tests" / "pmix_e2e" / "clients" / "mpi_barrier_loop.c"
PYDVM = [sys.executable, "-m", "pydvm"]
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl_tcp_if_include",
          "lo", "--mca", "oob_tcp_if_include", "lo"]


def barrier_us(argv: list[str], env: dict) -> float:
    """Microseconds per barrier that rank 0 of the job ``argv`` reports."""
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600,
                       stdin=subprocess.DEVNULL)
    m = re.search(r"BARRIER size=\d+ n=\d+ us=([\d.]+)", p.stdout)
    if p.returncode != 0 or not m:
        raise SystemExit(f"{' '.join(argv)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return float(m.group(1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--barriers", type=int, default=5000)
    a = ap.parse_args()
    if not (shutil.which("mpirun") and shutil.which("mpicc")):
        print("needs mpirun and mpicc (apt-get install openmpi-bin libopenmpi-dev)")
        return 1
    cores = os.cpu_count() or 1
    host = socket.gethostname()
    with tempfile.TemporaryDirectory(prefix="pydvm-oversub-") as tmp:
        exe = str(Path(tmp) / "mpi_barrier_loop")
        subprocess.run(["mpicc", "-O2", "-o", exe, str(SOURCE)], check=True)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PYDVM_", "PMIX_", "OMPI_"))}
        env["PYDVM_STATE_DIR"] = str(Path(tmp) / "state")
        env["OMPI_MCA_btl_tcp_if_include"] = "lo"  # as mpirun's, above
        p = subprocess.run(PYDVM + ["start", "--daemonize", "--hosts", f"{host}:{cores}",
                                    "--mca", "pydvm_pmix", "on"],
                           env=env, capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            raise SystemExit(f"pydvm start failed: {p.stderr}")
        env["PYDVM_URI"] = p.stdout.strip().splitlines()[-1]
        n = str(a.barriers)
        cases = [
            (f"{cores + 1} ranks on {cores} slots (oversubscribed)",
             PYDVM + ["run", "-n", str(cores + 1), exe, n],
             MPIRUN + ["-n", str(cores + 1), exe, n]),
            (f"{cores + 1} ranks on {cores} slots, hint overridden to 0",
             PYDVM + ["run", "-n", str(cores + 1), "env", "OMPI_MCA_mpi_oversubscribe=0", exe,
                      str(max(50, a.barriers // 50))], None),
            (f"{cores} ranks on {cores} slots", PYDVM + ["run", "-n", str(cores), exe, n],
             MPIRUN + ["-n", str(cores), exe, n]),
        ]
        rows = []
        try:
            for label, ours, theirs in cases:
                mine, ref = [], []
                for _ in range(a.rounds):
                    mine.append(barrier_us(ours, env))
                    if theirs:
                        ref.append(barrier_us(theirs, env))
                rows.append((label, statistics.median(mine),
                             statistics.median(ref) if ref else None))
        finally:
            subprocess.run(PYDVM + ["stop"], env=env, capture_output=True, timeout=60)
    print(f"MPI_Barrier, us per barrier (median of {a.rounds} runs x {a.barriers}; "
          f"{cores} cores, load {os.getloadavg()[0]:.1f})")
    print(f"{'case':<46} {'pydvm':>10} {'mpirun':>10} {'ratio':>7}")
    for label, mine, ref in rows:
        print(f"{label:<46} {mine:>10.1f} " + (f"{ref:>10.1f} {mine / ref:>7.2f}" if ref
                                                 else f"{'-':>10} {'-':>7}"))
    print(f"oversubscribed barrier ratio {rows[0][1] / rows[0][2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
