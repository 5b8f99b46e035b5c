"""What ``pydvm_pmix_isolate=on`` costs the DVM owner's jobs: their PMIx server
in a process of its own on each node, against the node process's own server.

    python bench/pmix/pmix_isolate.py [--iters 2000] [--rounds 4] [--jobs 500]

Two DVMs on this machine (one node each, the head node), started here side by
side, one with each setting; measured alternately, in one run:

* PMIx_Publish / PMIx_Lookup latency: the C client of bench/pmix/pmix.py
  (``pmix_bench_client``: holds 10 names, then times publishes of fresh names
  and lookups of held ones), ``--rounds`` runs per side, samples pooled;
* one-rank ``true`` jobs through the job API (``submit_many``, output
  discarded): every job is registered with the node's PMIx server, so with
  isolation each registration is a request to the server's process;
* the first PMIx job after the server process went idle (``pydvm_pmix_user_idle``
  1 s here): it starts a new server process.

Prints a table of medians (and jobs/s) per side with their ratio, and last
``isolate ratio R`` -- isolated over in-node, the worst of publish and lookup.
Needs libpmix (libpmix2 libpmix-dev) and gcc.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from pmix import samples  # noqa: E402

import pydvm.jobs  # noqa: E402


def client(dvm, exe: str, iters: int) -> dict:
    r = dvm.submit([exe, "10", str(iters)], 1, stdout="capture", stderr="capture",
                   pmix=True).result(timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"client failed ({r.returncode}): {r.stderr[-2000:]!r}")
    return samples(r.stdout.decode())


def jobs_rate(dvm, n: int) -> float:
    spec = pydvm.jobs.JobSpec("true", 1)
    t0 = time.perf_counter()
    jobs = dvm.submit_many([spec] * n)
    for j in jobs:
        if j.result(timeout=600).returncode != 0:
            raise SystemExit("a true job failed")
    return n / (time.perf_counter() - t0)


def first_job(dvm, exe: str) -> float:
    """Wall time of a PMIx job started after the owner's server process went idle."""
    time.sleep(2.5)  # pydvm_pmix_user_idle=1: an isolated server has stopped by now
    t0 = time.perf_counter()
    client(dvm, exe, 1)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=500)
    a = ap.parse_args()
    from pydvm import pmix
    ok, why, _ = pmix.available()
    if not ok or not shutil.which("gcc"):
        print(f"needs libpmix (libpmix2 libpmix-dev) and gcc: {why}", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="pydvm-bench-isolate-"))
    try:
        flags = subprocess.run(["pkg-config", "--cflags", "--libs", "pmix"], check=True,
                               capture_output=True, text=True).stdout.split()
        exe = str(tmp / "pmix_bench_client")
        subprocess.run(["gcc", "-O2", "-o", exe, str(HERE / "pmix_bench_client.c"), *flags],
                       check=True)
        sides = {"in the node": "off", "isolated": "on"}
        got = {s: {"publish": [], "lookup": [], "jobs/s": [], "first": []} for s in sides}
        dvms = {s: pydvm.jobs.start(pydvm_pmix_isolate=v, pydvm_pmix_user_idle="1")
                for s, v in sides.items()}
        try:
            for s, dvm in dvms.items():
                client(dvm, exe, 50)  # warm-up (starts the isolated server)
            rounds = max(1, a.rounds)
            for r in range(rounds):
                n = a.iters // rounds + (1 if r < a.iters % rounds else 0)
                for s, dvm in dvms.items():
                    for op, vals in client(dvm, exe, n).items():
                        got[s][op] += vals
                for s, dvm in dvms.items():
                    got[s]["jobs/s"].append(jobs_rate(dvm, max(1, a.jobs // rounds)))
            for _ in range(3):
                for s, dvm in dvms.items():
                    got[s]["first"].append(first_job(dvm, exe))
        finally:
            for dvm in dvms.values():
                dvm.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    a_, b_ = got["in the node"], got["isolated"]
    print(f"# {a.iters} PMIx samples per operation and side, {a.rounds} alternating rounds; "
          f"{a.jobs} one-rank jobs per side; medians")
    print("| measure | owner's server in the node | isolated (own process) | ratio |")
    print("|---|---|---|---|")
    worst = 0.0
    for op in ("publish", "lookup"):
        x, y = statistics.median(a_[op]), statistics.median(b_[op])
        worst = max(worst, y / x)
        print(f"| PMIx {op} µs (10 names held) | {x:.1f} | {y:.1f} | {y / x:.2f} |")
    x, y = statistics.median(a_["jobs/s"]), statistics.median(b_["jobs/s"])
    print(f"| one-rank jobs/s (bulk) | {x:.0f} | {y:.0f} | {y / x:.2f} |")
    x, y = statistics.median(a_["first"]) * 1e3, statistics.median(b_["first"]) * 1e3
    print(f"| first PMIx job after idle, ms | {x:.0f} | {y:.0f} | {y / x:.2f} |")
    print(f"isolate ratio R {worst:.2f} (the owner's PMIx request with its server in a process "
          "of its own over in the node, worst operation)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
