"""How a DVM scales with its number of nodes.

    sudo python bench/scale/nodes.py          # test hosts (network namespaces) when root
    python bench/scale/nodes.py --local       # local daemons only
    python bench/scale/nodes.py --sizes 2,4   # fewer sizes

For DVMs of 2, 4, 8 and 16 daemons it measures:

* **start-up**: ``pydvm start --daemonize`` until every daemon has reported in;
* **job**: launch-to-exit of a job with one process per node (``pydvm run``
  wall time, median of several jobs);
* **far lookup**: median latency of ``Client.lookup`` from a process on the
  last node for a key published by a process on the first.

With root and iproute2 each daemon runs on its own test host (network
namespace on a bridge, launched by the ssh launcher through
``ip netns exec``); otherwise all daemons are local processes.  Prints a
table and, last, ``growth 2->16: start Ax, job Bx, lookup Cx``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tests" / "multinode"))
PYDVM = [sys.executable, "-m", "pydvm"]

LOOKUP_CODE = """
import json, statistics, time
from pydvm import Client
c = Client()
r = c.lookup(["far-key"], wait=True, timeout=60)
s = []
for _ in range({n}):
    t0 = time.perf_counter_ns(); c.lookup(["far-key"]); s.append((time.perf_counter_ns() - t0) / 1000)
print(json.dumps(statistics.median(s)))
"""


def run(args, env, timeout=300) -> subprocess.CompletedProcess:
    p = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {p.stderr}")
    return p


def measure(n: int, use_net: bool, jobs: int, lookups: int) -> dict[str, float]:
    env = dict(os.environ)
    env["PYDVM_STATE_DIR"] = tempfile.mkdtemp(prefix="pydvm-bench-nodes-")
    env.pop("PYDVM_URI", None)
    net = None
    if use_net:
        from hostnet import HostNet

        net = HostNet(n, tag=240).__enter__()
        names = net.names
        extra = ["--launcher", "ssh", "--mca", "plm_ssh_agent", "ip netns exec",
                 "--bind", net.master_addr]
    else:
        names = [f"n{i}" for i in range(1, n + 1)]
        extra = []
    try:
        t0 = time.perf_counter()
        uri = run(PYDVM + ["start", "--daemonize", "--hosts", ",".join(names), *extra],
                  env).stdout.strip()
        start = time.perf_counter() - t0
        env["PYDVM_URI"] = uri
        try:
            walls = []
            for _ in range(jobs):
                t0 = time.perf_counter()
                run(PYDVM + ["run", "-n", str(n), "true"], env)
                walls.append(time.perf_counter() - t0)
            pub = subprocess.Popen(
                PYDVM + ["run", "--host", names[0], "-n", "1", "pydvm", "publish", "far-key=v",
                         "--hold", "120"], env=env, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL)
            try:
                p = run(PYDVM + ["run", "--host", names[-1], "-n", "1", sys.executable, "-c",
                                 LOOKUP_CODE.format(n=lookups)], env)
                lookup = json.loads(p.stdout.strip().splitlines()[-1])
            finally:
                pub.kill()
                pub.wait()
        finally:
            subprocess.run(PYDVM + ["stop"], env=env, capture_output=True, timeout=120)
    finally:
        if net is not None:
            net.__exit__(None, None, None)
    return {"start": start, "job": statistics.median(walls), "lookup": lookup}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--local", action="store_true", help="local daemons even when root")
    ap.add_argument("--sizes", default="2,4,8,16")
    ap.add_argument("--jobs", type=int, default=5)
    ap.add_argument("--lookups", type=int, default=2000)
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    use_net = False
    if not a.local:
        from hostnet import unavailable_reason

        why = unavailable_reason()
        use_net = not why
        if why:
            print(f"(local daemons: {why})")
    rows = {n: measure(n, use_net, a.jobs, a.lookups) for n in sizes}
    kind = "test hosts (netns, ssh launcher)" if use_net else "local daemons"
    print(f"DVM of N daemons on {kind}")
    print(f"{'daemons':>8} {'start s':>9} {'job s':>9} {'far lookup µs':>14}")
    for n, r in rows.items():
        print(f"{n:>8} {r['start']:>9.2f} {r['job']:>9.3f} {r['lookup']:>14.1f}")
    lo, hi = rows[sizes[0]], rows[sizes[-1]]
    print(f"growth {sizes[0]}->{sizes[-1]}: start {hi['start'] / lo['start']:.2f}x, "
          f"job {hi['job'] / lo['job']:.2f}x, lookup {hi['lookup'] / lo['lookup']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
