"""Launching jobs: a persistent DVM's ``pydvm run`` against a fresh ``mpirun``.

    python bench/launch/launch.py [--reps 7] [--seq 100]

Side by side in one run, alternating pydvm and mpirun, whole-process wall
times, medians (one-node DVM, already running, started here):

* ``run -n 1 true`` and ``run -n 4 true``;
* ``run --pmix -n 4 ./hello`` (C: MPI_Init, MPI_Allreduce, MPI_Finalize),
  against ``mpirun -n 4 ./hello``;
* the same over 3 nodes, 2 ranks each: a DVM on 3 test hosts (network
  namespaces on a bridge, daemons started by the ssh launcher through ``ip
  netns exec``), against ``mpirun --host h1:2,h2:2,h3:2`` whose daemons are
  started in those namespaces by an rsh agent doing the same (root and
  iproute2 needed; without them the row says why);
* 100 sequential ``-n 1 true`` jobs, and 8 concurrent submitters x 25 jobs:
  jobs per second;
* ``python -c "import pydvm"`` minus ``python -c pass``;
* the tool's start-up: ``pydvm --version`` minus ``python -c pass`` (what
  every command pays before it does anything), and ``pydvm run -n 1 true``
  minus ``pydvm --version`` (what a run costs past that: connecting, the
  job, its end).

Prints a table with pydvm / mpirun ratios (for jobs/s: pydvm's over
mpirun's) and, last, ``launch ratio R``: the worst time ratio.  Needs
``mpirun``/``mpicc`` (Debian's openmpi-bin, libopenmpi-dev) for the
mpirun rows; without them those rows say so.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PYDVM = [sys.executable, "-m", "pydvm"]
HELLO = r"""
#include <mpi.h>
int main(int argc, char **argv)
{
    int rank, sum;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Finalize();
    return 0;
}
"""


def wall(argv: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, timeout=300)
    took = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({p.returncode}): {p.stderr.decode()[-500:]}")
    return took


def alternate(a: list[str], b: list[str] | None, env_a: dict, env_b: dict, reps: int):
    """Medians of ``a`` and ``b`` run alternately (after one warm-up each)."""
    ta, tb = [], []
    wall(a, env_a)
    if b:
        wall(b, env_b)
    for _ in range(reps):
        ta.append(wall(a, env_a))
        if b:
            tb.append(wall(b, env_b))
    return statistics.median(ta), (statistics.median(tb) if b else None)


#: mpirun's rsh agent for test hosts: the daemon's command line run in the
#: host's network namespace under the host's name, as ssh would run it there.
NETNS_AGENT = """#!/bin/sh
h=$1; shift
exec ip netns exec "$h" unshare --uts sh -c "hostname $h; $*"
"""


def over_test_hosts(hello: Path, tmp: Path, mpirun: list[str], mpi_env: dict, reps: int):
    """(pydvm, mpirun) medians of the MPI hello over 3 test hosts, or (None, why)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "multinode"))
    from hostnet import HostNet, unavailable_reason

    why = unavailable_reason()
    if why:
        return None, why
    tag = 233
    net_only = f"10.250.{tag}.0/24"
    agent = tmp / "netns-agent"
    agent.write_text(NETNS_AGENT)
    agent.chmod(0o755)
    with HostNet(3, tag=tag) as net:
        hosts = ",".join(f"{n}:2" for n in net.names)
        env = dict(os.environ, PYDVM_STATE_DIR=str(tmp / "state-net"),
                   OMPI_MCA_btl_tcp_if_include=net_only)
        env.pop("PYDVM_URI", None)
        p = subprocess.run(PYDVM + ["start", "--daemonize", "--hosts", hosts, "--launcher", "ssh",
                                    "--mca", "plm_ssh_agent", "ip netns exec",
                                    "--bind", net.master_addr],
                           env=env, capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            raise SystemExit(f"pydvm start over test hosts failed: {p.stderr}")
        env["PYDVM_URI"] = p.stdout.strip()
        try:
            return alternate(
                PYDVM + ["run", "--pmix", "--host", hosts, "-n", "6", str(hello)],
                mpirun + ["--host", hosts, "-n", "6", "--mca", "plm_rsh_agent", str(agent),
                          "--mca", "plm_rsh_no_tree_spawn", "1",
                          "--mca", "oob_tcp_if_include", net_only,
                          "--mca", "btl_tcp_if_include", net_only, str(hello)],
                env, mpi_env, reps)
        finally:
            subprocess.run(PYDVM + ["stop"], env=env, capture_output=True, timeout=120)


def jobs_per_second(argv: list[str], env: dict, total: int, submitters: int) -> float:
    """``total`` jobs by ``submitters`` threads, each running its share in turn."""
    share = total // submitters
    errors: list[str] = []

    def submit() -> None:
        for _ in range(share):
            p = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=300)
            if p.returncode != 0:
                errors.append(p.stderr.decode()[-300:])
    threads = [threading.Thread(target=submit) for _ in range(submitters)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.perf_counter() - t0
    if errors:
        raise SystemExit(f"{len(errors)} jobs failed: {errors[0]}")
    return share * submitters / took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--seq", type=int, default=100)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pydvm-bench-launch-"))
    env = dict(os.environ, PYDVM_STATE_DIR=str(tmp / "state"))
    env.pop("PYDVM_URI", None)
    mpi_env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PYDVM_", "PMIX_", "OMPI_", "SLURM_"))}
    have_mpi = bool(shutil.which("mpirun") and shutil.which("mpicc"))
    mpirun = ["mpirun", "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0
                                              else [])
    hello = tmp / "hello"
    if have_mpi:
        (tmp / "hello.c").write_text(HELLO)
        subprocess.run(["mpicc", "-O1", "-o", str(hello), str(tmp / "hello.c")], check=True)
    p = subprocess.run(PYDVM + ["start", "--daemonize"], env=env, capture_output=True,
                       text=True, timeout=120)
    if p.returncode != 0:
        raise SystemExit(f"pydvm start failed: {p.stderr}")
    env["PYDVM_URI"] = p.stdout.strip()
    run = PYDVM + ["run"]
    rows = []
    try:
        for n in (1, 4):
            a, b = alternate(run + ["-n", str(n), "true"],
                             mpirun + ["-n", str(n), "true"] if have_mpi else None,
                             env, mpi_env, args.reps)
            rows.append((f"run -n {n} true", a, b, "s"))
        if have_mpi:
            a, b = alternate(run + ["--pmix", "-n", "4", str(hello)],
                             mpirun + ["-n", "4", str(hello)], env, mpi_env, args.reps)
            rows.append(("run --pmix -n 4 ./hello (MPI_Init, Allreduce, Finalize)", a, b, "s"))
            a, b = over_test_hosts(hello, tmp, mpirun, mpi_env, args.reps)
            if a is None:
                print(f"(3 test hosts row skipped: {b})", file=sys.stderr)
            else:
                rows.append(("the same, -n 6 over 3 test hosts (netns)", a, b, "s"))
        a = jobs_per_second(run + ["-n", "1", "true"], env, args.seq, 1)
        b = jobs_per_second(mpirun + ["-n", "1", "true"], mpi_env, args.seq, 1) \
            if have_mpi else None
        rows.append((f"{args.seq} sequential -n 1 true", a, b, "jobs/s"))
        a = jobs_per_second(run + ["-n", "1", "true"], env, 200, 8)
        b = jobs_per_second(mpirun + ["-n", "1", "true"], mpi_env, 200, 8) if have_mpi else None
        rows.append(("8 submitters x 25 jobs, -n 1 true", a, b, "jobs/s"))
        # As installed: with bytecode cached (a first run writes it, even
        # where PYTHONDONTWRITEBYTECODE is set; otherwise every import compiles)
        env_imp = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
        imp, base = alternate([sys.executable, "-c", "import pydvm"],
                              [sys.executable, "-c", "pass"], env_imp, env_imp, args.reps)
        rows.append(('python -c "import pydvm" minus python -c pass', imp - base, None, "s"))
        ver, base = alternate(PYDVM + ["--version"], [sys.executable, "-c", "pass"], env_imp,
                              env_imp, args.reps)
        rows.append(("pydvm --version minus python -c pass (tool start-up)", ver - base, None,
                     "s"))
        job, ver = alternate(run + ["-n", "1", "true"], PYDVM + ["--version"], env_imp, env_imp,
                             args.reps)
        rows.append(("pydvm run -n 1 true minus pydvm --version", job - ver, None, "s"))
    finally:
        subprocess.run(PYDVM + ["stop"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{'what':<58} | {'pydvm':>10} | {'mpirun':>10} | {'ratio':>6}")
    print("-" * 94)
    worst = 0.0
    for what, a, b, unit in rows:
        if unit == "s":
            ratio = a / b if b else None
            fa, fb = f"{a * 1000:.0f} ms", (f"{b * 1000:.0f} ms" if b else "-")
        else:
            ratio = b / a if b else None  # time per job, pydvm / mpirun
            fa, fb = f"{a:.1f}/s", (f"{b:.1f}/s" if b else "-")
        if ratio is not None:
            worst = max(worst, ratio)
        print(f"{what:<58} | {fa:>10} | {fb:>10} | "
              f"{(f'{ratio:.2f}' if ratio is not None else '-'):>6}")
    print(f"launch ratio R {worst:.2f} (pydvm / mpirun time, worst row; jobs/s rows as time "
          "per job)")


if __name__ == "__main__":
    main()
