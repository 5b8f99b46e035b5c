"""Jobs per second through the job API (``pydvm.jobs``), and what each costs the client.

    python bench/launch/jobs_api.py [--jobs 500] [--hosts a] [--batch] [--rounds 3]

Starts a DVM of local daemons (``pydvm.jobs.start``), submits ``--jobs``
one-rank ``true`` jobs on one connection (one ``submit`` each, or one
``submit_many`` with ``--batch``), output discarded, and waits for them
all; prints, per round, the jobs per second from the first submit to the
last end, and the client's CPU time per job (this process: the submitting
thread and the connection's reader).
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import wait

import pydvm.jobs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=500)
    ap.add_argument("--hosts", default="a")
    ap.add_argument("--batch", action="store_true", help="one submit_many for all")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    with pydvm.jobs.start(hosts=a.hosts) as dvm:
        dvm.submit("true").result()  # warm up
        for r in range(a.rounds):
            t0, c0 = time.perf_counter(), time.process_time()
            if a.batch:
                jobs = dvm.submit_many(["true"] * a.jobs)
            else:
                jobs = [dvm.submit("true") for _ in range(a.jobs)]
            wait(jobs)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            bad = sum(1 for j in jobs if j.exception() or not j.result().ok)
            print(f"round {r + 1}: {a.jobs} jobs in {wall:.2f} s = {a.jobs / wall:.0f} jobs/s; "
                  f"client CPU {cpu / a.jobs * 1e6:.0f} us/job; {bad} failed")


if __name__ == "__main__":
    main()
