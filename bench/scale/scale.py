"""How the master's work grows with the number of nodes, by simulation.

No process is started: the master's pure core
(:class:`pydvm.runtime.master.core.LifetimeCore`) is driven with simulated nodes
-- 1,000 to 10,000 -- and what the master's shell does per node is done for
real on stand-in channels that encode every message they are given (the
msgpack frames a daemon would be sent), so the figures are the master's
own CPU time:

* heartbeat: one period of the master's heartbeat over every node (check
  each link's last message, encode a ping);
* launch: a job with one rank on every node is submitted and every node's
  launch answer is fed back (the launch messages encoded, one per node);
* job end: every rank's exit fed in, the namespace purge broadcast encoded
  for every node, their acknowledgements fed back;
* memory: what one such job and the node records cost, per node
  (tracemalloc).

Each is printed per node; the last line is ``scale ratio R``: the worst,
over the measures, of (cost per node at 10,000 nodes) / (cost per node at
1,000 nodes).  The runtime scales linearly while R stays near 1.

    python bench/scale/scale.py [--nodes 1000,2000,5000,10000] [--reps 5]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from pydvm.runtime.master.core import (  # noqa: E402
    DEFAULT_SESSION, JobSubmitted, LaunchAnswered, LifetimeCore, NamespacePurged, ProcExited,
    PurgeNodes,
)
from pydvm.runtime.shared.jobs import HostSpec, build_job  # noqa: E402
from pydvm.wire import judge, pack  # noqa: E402


class StandInChannel:
    """What the master's shell holds per node: a link it encodes frames for."""

    __slots__ = ("name", "last_rx", "closed", "sent")

    def __init__(self, name: str) -> None:
        self.name = name
        self.last_rx = time.monotonic()
        self.closed = False
        self.sent = 0

    def send(self, msg: dict) -> None:
        self.sent += len(pack(msg))


def heartbeat_period(channels: list[StandInChannel], interval: float = 2.0) -> None:
    """One period of the master's heartbeat (wire.heartbeat's loop body, the
    same function: each link's silence less this process's stalls, a ping)."""
    judge(channels, time.monotonic(), interval)


def one_rank_per_node(core: LifetimeCore, names: list[str], seq: int):
    ns = f"pydvm-bench@{seq}"
    return build_job(ns, DEFAULT_SESSION, [(["prog"], len(names), [HostSpec(n) for n in names])])


def launch(core: LifetimeCore, channels: dict[str, StandInChannel], job) -> None:
    core.handle(JobSubmitted(job))
    for p in job.procs.values():
        channels[p.node].send({"t": "launch", "nspace": job.nspace, "session_id": 0,
                               "job_size": job.size, "procs": [{
                                   "rank": p.rank, "app_idx": 0, "argv": ["prog"],
                                   "env": {}, "cwd": "/"}]})
    for name in channels:
        core.handle(LaunchAnswered(job.nspace, name, True))


def end(core: LifetimeCore, channels: dict[str, StandInChannel], job) -> None:
    broadcasts = []
    for p in list(job.procs.values()):
        for e in core.handle(ProcExited(job.nspace, p.rank, p.node, 0)):
            if isinstance(e, PurgeNodes):
                broadcasts.append(e)
    for e in broadcasts:
        msg = {"t": "purge", "horizon": int(e.horizon), "nspace": e.nspace, "session_id": None}
        for name, ch in channels.items():
            if e.nodes is None or name in e.nodes:
                ch.send(msg)
        core.handle(e.then)
    assert job.nspace not in core.jobs


def measure(n: int, reps: int) -> dict[str, float]:
    names = [f"node{i:05d}" for i in range(n)]
    channels = {name: StandInChannel(name) for name in names}
    core = LifetimeCore()
    core.new_session(DEFAULT_SESSION, [HostSpec(x) for x in names])
    out: dict[str, list[float]] = {"heartbeat": [], "launch": [], "job end": []}
    for rep in range(reps):
        gc.collect()
        t0 = time.process_time()
        heartbeat_period(list(channels.values()))
        out["heartbeat"].append(time.process_time() - t0)
        job = one_rank_per_node(core, names, rep)
        t0 = time.process_time()
        launch(core, channels, job)
        out["launch"].append(time.process_time() - t0)
        t0 = time.process_time()
        end(core, channels, job)
        out["job end"].append(time.process_time() - t0)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    core2 = LifetimeCore()
    core2.new_session(DEFAULT_SESSION, [HostSpec(x) for x in names])
    chans2 = [StandInChannel(x) for x in names]
    job = one_rank_per_node(core2, names, 0)
    core2.handle(JobSubmitted(job))
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    mem = sum(s.size_diff for s in after.compare_to(before, "filename"))
    del core2, chans2, job
    res = {k: statistics.median(v) / n for k, v in out.items()}
    res["memory"] = mem / n
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default="1000,2000,5000,10000")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    sizes = [int(x) for x in args.nodes.split(",")]
    rows = {n: measure(n, args.reps) for n in sizes}
    cols = ["heartbeat", "launch", "job end", "memory"]
    print(f"{'nodes':>7} | {'heartbeat µs/node':>17} | {'launch µs/node':>14} | "
          f"{'job end µs/node':>15} | {'memory B/node':>13}")
    print("-" * 79)
    for n in sizes:
        r = rows[n]
        print(f"{n:>7,} | {r['heartbeat'] * 1e6:>17.2f} | {r['launch'] * 1e6:>14.2f} | "
              f"{r['job end'] * 1e6:>15.2f} | {r['memory']:>13,.0f}")
    lo, hi = rows[sizes[0]], rows[sizes[-1]]
    ratios = {c: hi[c] / lo[c] if lo[c] else float("inf") for c in cols}
    worst = max(ratios, key=ratios.get)
    print(f"per-node cost at {sizes[-1]:,} nodes / at {sizes[0]:,}: " +
          ", ".join(f"{c} {ratios[c]:.2f}" for c in cols))
    print(f"scale ratio R {ratios[worst]:.2f} ({worst})")


if __name__ == "__main__":
    main()
