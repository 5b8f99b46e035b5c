"""PMIx_Publish / PMIx_Lookup through pydvm against Open MPI 4.1's own name service.

    python bench/pmix/pmix.py                 # 2,000 samples per op, 10 and 5,000 names held
    python bench/pmix/pmix.py --iters 500     # quicker
    python bench/pmix/pmix.py --rounds 1      # one run per side and level (as before 2026-12-03)

pydvm: a C client (bench/pmix/pmix_bench_client.c, gcc -lpmix) run by ``pydvm
run`` on the head node of a persistent DVM -- its PMIx server lives in the
master process, so a publish or lookup goes client -> libpmix -> the
master's store, answered inside libpmix's upcall on its progress thread
(docs/pmix.md, "Answered in the upcall").  Open MPI: the same measurements with MPI_Publish_name /
MPI_Lookup_name (bench/pmix/ompi_ns_client.c, mpicc) under ``mpirun`` (loopback
only, ``--allow-run-as-root``), whose data server lives in ``mpirun``.
Each client first holds N names, then times ITERS publishes of fresh names
and ITERS lookups of held ones; medians are compared.  The two sides run
interleaved in the same run, so they share the machine's noise: at each
level, ROUNDS alternating client runs per side (Open MPI, pydvm, Open MPI,
...), ITERS / ROUNDS samples each, pooled -- on a shared VM whose speed
drifts from one second to the next, one long run per side compared two
different machines.

Prints one row per (operation, names held) with both medians and their
ratio pydvm / Open MPI, then a summary line.  Targets: ratio <= 1.0 at 10
names held, <= 0.2 (5x faster) at 5,000.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PYDVM = [sys.executable, "-m", "pydvm"]
MPIRUN = ["mpirun", "--allow-run-as-root", "--bind-to", "none", "--mca", "btl", "self,vader",
          "--mca", "oob_tcp_if_include", "lo", "-n", "1"]


def build(tmp: Path) -> tuple[str, str]:
    try:
        flags = subprocess.run(["pkg-config", "--cflags", "--libs", "pmix"], check=True,
                               capture_output=True, text=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        flags = ["-I/usr/lib/x86_64-linux-gnu/pmix2/include", "-lpmix"]
    pmix_exe, ompi_exe = tmp / "pmix_bench_client", tmp / "ompi_ns_client"
    subprocess.run(["gcc", "-O2", "-o", str(pmix_exe), str(HERE / "pmix_bench_client.c"),
                    *flags], check=True)
    subprocess.run(["mpicc", "-O2", "-o", str(ompi_exe), str(HERE / "ompi_ns_client.c")],
                   check=True)
    return str(pmix_exe), str(ompi_exe)


def samples(stdout: str) -> dict[str, list[float]]:
    out = {}
    for line in stdout.splitlines():
        op, *vals = line.split()
        if op in ("PUBLISH", "LOOKUP"):
            out[op.lower()] = [float(v) for v in vals]
    return out


def run_pydvm(uri: str, env: dict, head: str, exe: str, held: int, iters: int) -> dict:
    p = subprocess.run(PYDVM + ["run", "--dvm", uri, "--pmix", "--host", head, "-n", "1", exe,
                                str(held), str(iters)],
                       env=env, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise SystemExit(f"pydvm run failed ({p.returncode}): {p.stderr[-2000:]}")
    return samples(p.stdout)


def run_ompi(exe: str, held: int, iters: int) -> dict:
    p = subprocess.run(MPIRUN + [exe, str(held), str(iters)], capture_output=True, text=True,
                       timeout=1800)
    if p.returncode != 0:
        raise SystemExit(f"mpirun failed ({p.returncode}): {p.stderr[-2000:]}")
    return samples(p.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--held", default="10,5000")
    ap.add_argument("--rounds", type=int, default=4,
                    help="alternating client runs per side and level (samples pooled)")
    a = ap.parse_args()
    from pydvm import pmix
    ok, why, path = pmix.available()
    if not ok or not shutil.which("mpirun") or not shutil.which("mpicc"):
        print(f"needs libpmix (libpmix2 libpmix-dev), gcc, mpicc and mpirun "
              f"(openmpi-bin libopenmpi-dev): {why}", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="pydvm-bench-pmix-"))
    env = dict(os.environ)
    env["PYDVM_STATE_DIR"] = str(tmp / "state")
    env.pop("PYDVM_URI", None)
    head = socket.gethostname()
    rows = []
    try:
        pmix_exe, ompi_exe = build(tmp)
        p = subprocess.run(PYDVM + ["start", "--daemonize", "--hosts", f"{head}:4",
                                    "--mca", "pydvm_pmix", "on", "--log-dir", str(tmp / "logs")],
                           env=env, capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            print(p.stderr, file=sys.stderr)
            return 1
        uri = p.stdout.strip()
        try:
            rounds = max(1, a.rounds)
            for held in [int(x) for x in a.held.split(",")]:
                o: dict = {"publish": [], "lookup": []}
                d: dict = {"publish": [], "lookup": []}
                for r in range(rounds):
                    n = a.iters // rounds + (1 if r < a.iters % rounds else 0)
                    for side, got in ((o, run_ompi(ompi_exe, held, n)),
                                      (d, run_pydvm(uri, env, head, pmix_exe, held, n))):
                        for op in side:
                            side[op] += got[op]
                for op in ("publish", "lookup"):
                    om, dm = statistics.median(o[op]), statistics.median(d[op])
                    rows.append((op, held, om, dm))
                    print(f"{op:<8} {held:>6} held: Open MPI {om:8.1f} us   pydvm {dm:8.1f} us"
                          f"   ratio {dm / om:5.2f}", flush=True)
        finally:
            subprocess.run(PYDVM + ["stop", "--dvm", uri], env=env, capture_output=True,
                           timeout=120)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print()
    print(f"# {why}; {os.cpu_count()} cpus; {a.iters} samples per operation in "
          f"{max(1, a.rounds)} alternating rounds; medians")
    print("| operation | names held | Open MPI µs | pydvm µs | pydvm / Open MPI |")
    print("|---|---|---|---|---|")
    for op, held, om, dm in rows:
        print(f"| {op} | {held:,} | {om:,.1f} | {dm:,.1f} | {dm / om:.2f} |")
    lo, hi = min(r[1] for r in rows), max(r[1] for r in rows)
    at_lo = ", ".join(f"{op} {dm / om:.2f}x" for op, held, om, dm in rows if held == lo)
    at_hi = ", ".join(f"{op} {om / dm:.1f}x faster" for op, held, om, dm in rows if held == hi)
    print(f"\nsummary: pydvm/Open MPI at {lo:,} held: {at_lo} (target <= 1.0); "
          f"at {hi:,} held: {at_hi} (target >= 5)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
