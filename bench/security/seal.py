"""What sealed links cost: the same work on a sealed DVM and a clear one, side by side.

    sudo python bench/security/seal.py            # the full run (a few minutes)
    sudo python bench/security/seal.py --quick    # fewer samples

Two DVMs run at once, each over two test hosts of its own (network
namespaces on one bridge, daemons started by the ssh launcher through ``ip
netns exec``; the master in the root namespace on the bridge address), so
every link between a master and a daemon, and every tool's and direct
client's link, is a TCP link between network stacks: one DVM with
``pydvm_seal network`` (the default: all of them sealed), one with
``pydvm_seal off`` (clear frames, as before sealing).  Each measurement is
taken on both back to back, after a pause, the order swapped every round,
so both see the same machine:

* **job API**: jobs per second of one ``pydvm.jobs`` connection submitting
  one-process ``true`` jobs, alternately to each node, output discarded;
* **publish/lookup round trip**: a job with one process on each node; the
  first publishes a key, the second's waiting lookup takes it and
  publishes the answer, which the first's waiting lookup takes (direct
  data: each process's own link to the master); the median round trip;
* **100 MB of output**: ``pydvm run`` of ``head -c 100M /dev/zero`` on a
  daemon node, its output to /dev/null: the wall time of the run;
* **MPI_Init**: a 4-process Open MPI job over the 2 nodes (``--pmix``, 2
  per node): the slowest process's ``MPI_Init``, taken by the program
  itself (``MPI_Wtime`` around it, reduced to the maximum).

Prints a table (medians, and sealed/clear as the cost: a time ratio, or the
inverse ratio of jobs per second) and, last, ``seal cost: ...`` with each
ratio and the worst (target: each at most 1.10).  Needs root and iproute2;
the MPI row needs mpicc and libpmix (it says why when it is left out).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "multinode"))
PYDVM = [sys.executable, "-m", "pydvm"]
TAG = 236  # the test hosts' subnet, 10.250.236.0/24: no test uses it
OUTPUT_BYTES = 100 * 1024 * 1024
#: Seconds of rest before each sample.
SETTLE = 0.5

INIT_C = r"""
#include <mpi.h>
#include <stdio.h>
#include <time.h>
static double now(void) {
    struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9;
}
int main(int argc, char **argv) {
    double t0 = now(), took, worst;
    int rank;
    MPI_Init(&argc, &argv);
    took = now() - t0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Reduce(&took, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) printf("INIT %.6f\n", worst);
    MPI_Finalize();
    return 0;
}
"""

#: One process of the round-trip job: rank 0 pings, rank 1 pongs.
PINGPONG = r"""
import json, os, statistics, sys, time
from pydvm import Client
n = int(sys.argv[1])
c = Client()
rank = int(os.environ["PYDVM_RANK"])
rtts = []
for i in range(n + 20):
    if rank == 0:
        t0 = time.perf_counter()
        c.publish({f"ping{i}": b"x" * 64})
        c.lookup([f"pong{i}"], wait=True, timeout=60)
        rtts.append(time.perf_counter() - t0)
    else:
        c.lookup([f"ping{i}"], wait=True, timeout=60)
        c.publish({f"pong{i}": b"y" * 64})
if rank == 0:
    print("RTT", json.dumps(statistics.median(rtts[20:])))
"""


class Dvm:
    """A running DVM over two test hosts, in one seal mode."""

    def __init__(self, mode: str, hosts: list[str], master: str, tmp: Path) -> None:
        self.mode, self.hosts = mode, hosts
        self.env = dict(os.environ,
                        OMPI_MCA_btl_tcp_if_include=f"10.250.{TAG}.0/24",
                        OMPI_MCA_oob_tcp_if_include=f"10.250.{TAG}.0/24")
        self.env.pop("PYDVM_URI", None)
        p = subprocess.run(PYDVM + ["start", "--daemonize", "--hosts",
                                    ",".join(f"{h}:2" for h in hosts), "--launcher", "ssh",
                                    "--mca", "plm_ssh_agent", "ip netns exec",
                                    "--mca", "pydvm_seal", mode, "--bind", master,
                                    "--log-dir", str(tmp / f"logs-{mode}")],
                           env=self.env, capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            raise SystemExit(f"pydvm start ({mode}) failed: {p.stderr}")
        self.uri = p.stdout.strip().splitlines()[-1]
        self.env["PYDVM_URI"] = self.uri
        import pydvm.jobs
        self.api = pydvm.jobs.connect(self.uri)

    def stop(self) -> None:
        try:
            self.api.close()
        finally:
            subprocess.run(PYDVM + ["stop"], env=self.env, capture_output=True, timeout=120)

    def run(self, *args: str, timeout: float = 300) -> tuple[float, str]:
        t0 = time.perf_counter()
        p = subprocess.run(PYDVM + ["run", *args], env=self.env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
        took = time.perf_counter() - t0
        if p.returncode != 0:
            raise SystemExit(f"[{self.mode}] pydvm run {' '.join(args)} failed "
                             f"({p.returncode}): {p.stderr.decode()[-500:]}")
        return took, p.stdout.decode(errors="replace")

    def output(self) -> float:
        """Wall seconds of ``pydvm run`` carrying 100 MB of a daemon node's output."""
        t0 = time.perf_counter()
        p = subprocess.run(PYDVM + ["run", "--host", self.hosts[0], "-n", "1", "head", "-c",
                                    str(OUTPUT_BYTES), "/dev/zero"],
                           env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=300)
        took = time.perf_counter() - t0
        if p.returncode != 0 or len(p.stdout) != OUTPUT_BYTES:
            raise SystemExit(f"[{self.mode}] the output run failed ({p.returncode}, "
                             f"{len(p.stdout)} bytes): {p.stderr.decode()[-500:]}")
        return took

    def jobs_per_second(self, n: int) -> float:
        from concurrent.futures import wait
        t0 = time.perf_counter()
        jobs = [self.api.submit("true", hosts=self.hosts[i % 2]) for i in range(n)]
        wait(jobs)
        took = time.perf_counter() - t0
        bad = [j for j in jobs if j.exception() or not j.result().ok]
        if bad:
            raise SystemExit(f"[{self.mode}] {len(bad)} jobs failed: {bad[0].exception()}")
        return n / took

    def round_trip(self, n: int) -> float:
        _, out = self.run("--host", f"{self.hosts[0]}:1,{self.hosts[1]}:1", "-n", "2",
                          sys.executable, "-c", PINGPONG, str(n))
        line = [ln for ln in out.splitlines() if ln.startswith("RTT ")]
        if not line:
            raise SystemExit(f"[{self.mode}] no round trip measured: {out[-500:]}")
        return float(line[0].split()[1])

    def mpi_init(self, exe: Path) -> float:
        _, out = self.run("--pmix", "--host", ",".join(f"{h}:2" for h in self.hosts), "-n",
                          "4", str(exe))
        line = [ln for ln in out.splitlines() if ln.startswith("INIT ")]
        if not line:
            raise SystemExit(f"[{self.mode}] MPI_Init not measured: {out[-500:]}")
        return float(line[0].split()[1])


def mpi_program(tmp: Path) -> tuple[Path | None, str]:
    if not shutil.which("mpicc"):
        return None, "mpicc is not installed"
    try:
        from pydvm.pmix import _lib  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        return None, f"libpmix unusable: {exc}"
    (tmp / "init.c").write_text(INIT_C)
    exe = tmp / "init"
    p = subprocess.run(["mpicc", "-O1", "-o", str(exe), str(tmp / "init.c")],
                       capture_output=True, text=True)
    if p.returncode != 0:
        return None, f"mpicc failed: {p.stderr[-300:]}"
    return exe, ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer samples")
    ap.add_argument("--rounds", type=int, default=None)
    args = ap.parse_args()
    rounds = args.rounds or (3 if args.quick else 9)
    jobs = 60 if args.quick else 200
    pings = 200 if args.quick else 500

    from hostnet import HostNet, unavailable_reason
    why = unavailable_reason()
    if why:
        raise SystemExit(f"bench/security/seal.py needs test hosts: {why}")
    tmp = Path(tempfile.mkdtemp(prefix="pydvm-bench-seal-"))
    # both DVMs' secrets in one state directory: the job API reads ours
    os.environ["PYDVM_STATE_DIR"] = str(tmp / "state")
    exe, no_mpi = mpi_program(tmp)
    samples: dict[tuple[str, str], list[float]] = {}
    with HostNet(4, tag=TAG) as net:
        dvms = {"network": Dvm("network", net.names[:2], net.master_addr, tmp),
                "off": Dvm("off", net.names[2:], net.master_addr, tmp)}
        try:
            for d in dvms.values():  # warm up: caches, the first PMIx server, imports
                d.jobs_per_second(10)
                d.output()
                if exe is not None:
                    d.mpi_init(exe)
            measures = [("jobs", lambda d: d.jobs_per_second(jobs)),
                        ("rtt", lambda d: d.round_trip(pings)),
                        ("output", lambda d: d.output())]
            if exe is not None:
                measures.append(("mpi", lambda d: d.mpi_init(exe)))
            for r in range(rounds):
                # each measurement on both DVMs back to back, the order
                # swapped every round; a pause first, so that neither
                # inherits the other's work still in flight
                order = ["network", "off"] if r % 2 == 0 else ["off", "network"]
                for key, measure in measures:
                    for mode in order:
                        time.sleep(SETTLE)
                        samples.setdefault((key, mode), []).append(measure(dvms[mode]))
                print(f"round {r + 1}/{rounds} done", file=sys.stderr, flush=True)
        finally:
            for d in dvms.values():
                d.stop()
    report(samples, jobs, pings, no_mpi)


#: (key, label, unit, scale, higher is better)
ROWS = [
    ("jobs", "job API, 1-process jobs over 2 nodes", "jobs/s", 1.0, True),
    ("rtt", "publish/lookup round trip across nodes", "us", 1e6, False),
    ("output", "100 MB of output through pydvm run", "s", 1.0, False),
    ("mpi", "MPI_Init, 4 processes over 2 nodes (slowest)", "ms", 1e3, False),
]


def report(samples: dict, jobs: int, pings: int, no_mpi: str) -> None:
    print(f"\n{'measurement':48} {'clear':>10} {'sealed':>10} {'unit':>7} {'cost':>7}")
    ratios = []
    for key, label, unit, scale, higher in ROWS:
        if (key, "off") not in samples:
            print(f"{label:48} {'-':>10} {'-':>10} {unit:>7} {'-':>7}  ({no_mpi})")
            continue
        clear = statistics.median(samples[(key, "off")])
        sealed = statistics.median(samples[(key, "network")])
        cost = clear / sealed if higher else sealed / clear
        ratios.append((key, cost))
        print(f"{label:48} {clear * scale:>10.1f} {sealed * scale:>10.1f} {unit:>7} "
              f"{cost:>6.3f}x")
    n = len(samples.get(("jobs", "off"), []))
    print(f"\n(medians of {n} rounds: {jobs} jobs, {pings} round trips, one 100 MB run and "
          "one MPI job per round and DVM; cost = sealed/clear time, or clear/sealed rate)")
    worst = max(c for _, c in ratios)
    print("seal cost: " + ", ".join(f"{k} {c:.3f}x" for k, c in ratios)
          + f"; worst {worst:.3f}x (target <= 1.10)")


if __name__ == "__main__":
    main()
