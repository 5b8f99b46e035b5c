"""What a stalled reader costs the master: its memory growth per stalled job.

    python bench/memory/output_stall.py                 # 1 and 8 jobs, head node and daemon node
    python bench/memory/output_stall.py --jobs 1,4 --seconds 20

For each kind of node -- the head node (served inside the master process)
and a daemon node -- and each number of jobs, a fresh persistent DVM (nodes
``a``, the head node, and ``b``) runs that many ``pydvm run --host NODE -n 1
yes`` at once, each writing into a FIFO that is open but never read.  `yes`
writes 2-byte lines as fast as it may, the worst case for per-message
overheads.  The master's RSS (from /proc) is sampled for ``--seconds``
after a warm-up job; the table gives its peak growth over the baseline, per
job, against the bound docs/cli.md states (``pydvm_output_window`` per job
and node, 1 MiB by default).  Prints a table and, last,
``worst per stalled job: X MiB (window W MiB)``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PYDVM = [sys.executable, "-m", "pydvm"]
MiB = 1024 * 1024
NODES = {"head": "a", "daemon": "b"}


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def run(args: list[str], env: dict, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run(args, env=env, capture_output=True, timeout=timeout, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({p.returncode}): {p.stderr[-500:]!r}")
    return p


def jobs_running(env: dict) -> int | None:
    """How many jobs the DVM runs; None if it does not answer in time (busy)."""
    try:
        return len(json.loads(run(PYDVM + ["ps", "--json"], env, timeout=30).stdout)["jobs"])
    except (RuntimeError, subprocess.TimeoutExpired):
        return None


def measure(node: str, jobs: int, seconds: float, window: int) -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix="pydvm-bench-stall-"))
    env = dict(os.environ)
    env["PYDVM_STATE_DIR"] = str(tmp / "state")
    env.pop("PYDVM_URI", None)
    uri = run(PYDVM + ["start", "--daemonize", "--hosts", "a,b", "--log-dir", str(tmp / "logs"),
                       "--mca", "pydvm_head_node", "a",
                       "--mca", "pydvm_output_window", str(window)], env).stdout.decode().strip()
    env["PYDVM_URI"] = uri
    master = json.loads(run(PYDVM + ["dvms", "--json"], env).stdout)["dvms"]
    master_pid = next(d["pid"] for d in master if d["uri"] == uri)
    host = NODES[node]
    tools: list[subprocess.Popen] = []
    fifos: list[int] = []
    try:
        # The first job on a node loads code and sizes buffers: not what we measure.
        # It writes little, so that the stalled jobs' output does not fit in
        # memory it freed.
        run(PYDVM + ["run", "--host", host, "-n", "1", "seq", "1", "2000"], env)
        time.sleep(0.5)
        base = []
        for _ in range(5):
            base.append(rss_kib(master_pid))
            time.sleep(0.1)
        base = statistics.median(base)
        for i in range(jobs):
            path = tmp / f"out{i}"
            os.mkfifo(path)
            fifos.append(os.open(path, os.O_RDWR))  # open, never read
            out = os.open(path, os.O_WRONLY)
            tools.append(subprocess.Popen(PYDVM + ["run", "--host", host, "-n", "1", "yes"],
                                          env=env, stdout=out, stderr=subprocess.DEVNULL))
            os.close(out)
        peak = 0
        samples = []
        t_end = time.monotonic() + seconds
        while time.monotonic() < t_end:
            g = rss_kib(master_pid) - base
            samples.append(g)
            peak = max(peak, g)
            time.sleep(0.25)
        alive = sum(t.poll() is None for t in tools)
        return {"peak": peak / 1024, "end": statistics.median(samples[-8:]) / 1024,
                "alive": alive}
    finally:
        for t in tools:
            if t.poll() is None:
                t.send_signal(signal.SIGKILL)  # its job is killed: its pydvm run went away
            t.wait(30)
        for fd in fifos:
            os.close(fd)
        try:
            deadline = time.monotonic() + 180  # a master flooded with messages drains slowly
            while time.monotonic() < deadline and jobs_running(env) != 0:
                time.sleep(0.5)
        finally:
            subprocess.run(PYDVM + ["stop"], env=env, capture_output=True, timeout=180)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", default="1,8", help="numbers of stalled jobs (default 1,8)")
    ap.add_argument("--seconds", type=float, default=10.0, help="how long each stall lasts")
    ap.add_argument("--window", default="1m", help="pydvm_output_window (default 1m)")
    a = ap.parse_args()
    counts = [int(x) for x in a.jobs.split(",")]
    window = a.window.strip().lower()
    w_bytes = int(window[:-1]) * {"k": 1024, "m": MiB, "g": 1024 * MiB}[window[-1]] \
        if window[-1] in "kmg" else int(window)
    rows = []
    for node in NODES:
        for n in counts:
            r = measure(node, n, a.seconds, w_bytes)
            rows.append((node, n, r))
    print(f"master RSS growth with stalled readers (`pydvm run yes` into an unread FIFO, "
          f"{a.seconds:g} s; window {w_bytes / MiB:g} MiB per job and node)")
    print(f"{'node':>7} {'jobs':>5} {'peak MiB':>9} {'end MiB':>8} {'per job':>8} "
          f"{'bound':>6} {'running':>8}")
    worst = 0.0
    for node, n, r in rows:
        per = r["peak"] / n
        worst = max(worst, per)
        print(f"{node:>7} {n:>5} {r['peak']:>9.1f} {r['end']:>8.1f} {per:>8.2f} "
              f"{n * w_bytes / MiB:>6.1f} {r['alive']:>5}/{n}")
    print(f"worst per stalled job: {worst:.2f} MiB (window {w_bytes / MiB:g} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
