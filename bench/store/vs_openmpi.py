"""pydvm's data store against Open MPI 4.1's name service, side by side in one run.

    python bench/store/vs_openmpi.py            # 1,000 probes per level (a few minutes)
    python bench/store/vs_openmpi.py --quick    # 200 probes, smaller levels

Open MPI: mpi4py's ``MPI.Publish_name`` / ``Lookup_name`` /
``Unpublish_name`` in a 2-rank job under ``mpirun`` (loopback only), whose
data server lives inside ``mpirun`` -- the C runtime pydvm descends from.
pydvm: the blocking ``pydvm.Client`` in a 2-rank job on a persistent DVM.
Rank 0 holds N names (10, 1,000, 5,000, 20,000) and then times each
operation on a fresh name, PROBES times; medians are reported.  The two
sides run interleaved, level by level, so they share the machine's noise.

Three pydvm paths are timed: the **head node** (served by the master
process: one hop), a **daemon node** with the direct data path (its client
sends master-store requests straight to the master: one hop), and a daemon
node of a second DVM started with ``pydvm_direct_data off`` (every request
through the daemon: two hops).
Then the aggregate throughput of 8 concurrent clients (publish + lookup +
unpublish loops) on each side: five runs each, alternating, medians
compared (with the machine's CPU time per operation, from /proc/stat).

Prints one row per (operation, names held) with both figures and
pydvm / Open MPI, then ``worst ratio R`` (over every latency row, and the
throughput row as Open MPI / pydvm): R <= 1.0 means pydvm is at least as
fast everywhere.  Needs ``mpirun`` and mpi4py for the system Python
(Debian: openmpi-bin python3-mpi4py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROBE = str(HERE / "_ns_probe.py")
PYDVM = [sys.executable, "-m", "pydvm"]
SYSTEM_PYTHON = "/usr/bin/python3"
TP_ROUNDS = 5
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
          "--mca", "btl", "self,vader", "--mca", "oob_tcp_if_include", "lo"]


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def ompi(mode: str, args: list[str], n: int, out: Path) -> dict:
    p = subprocess.run(MPIRUN + ["-n", str(n), SYSTEM_PYTHON, PROBE, "ompi", mode, *args,
                                 str(out)], capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"mpirun failed: {p.stderr[-2000:]}")
    return _json(out)


def pydvm(uri: str, env: dict, host: str, mode: str, args: list[str], n: int, out: Path) -> dict:
    p = subprocess.run(PYDVM + ["run", "--dvm", uri, "--host", f"{host}:{n}", "-n", str(n),
                                sys.executable, PROBE, "pydvm", mode, *args, str(out)],
                       env=env, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"pydvm run failed: {p.stderr[-2000:]}")
    return _json(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--probes", type=int)
    a = ap.parse_args()
    if not shutil.which("mpirun") or subprocess.run(
            [SYSTEM_PYTHON, "-c", "import mpi4py"], capture_output=True).returncode != 0:
        print("needs mpirun and mpi4py for /usr/bin/python3 (apt-get install openmpi-bin "
              "python3-mpi4py)", file=sys.stderr)
        return 2
    probes = a.probes or (200 if a.quick else 1000)
    levels = [10, 1000, 5000] if a.quick else [10, 1000, 5000, 20000]
    tp_seconds = 2.0 if a.quick else 3.0

    tmp = Path(tempfile.mkdtemp(prefix="pydvm-vs-ompi-"))
    env = dict(os.environ)
    env["PYDVM_STATE_DIR"] = str(tmp / "state")
    env.pop("PYDVM_URI", None)
    head = socket.gethostname()
    # The head node is named like this machine; "far" is a daemon in front of it.
    p = subprocess.run(PYDVM + ["start", "--daemonize", "--hosts", f"{head}:8,far:8",
                                "--log-dir", str(tmp / "logs")],
                       env=env, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        print(p.stderr, file=sys.stderr)
        return 1
    uri = p.stdout.strip()
    # A second DVM, daemons only, without the direct path: the two-hop route.
    env_off = dict(env)
    env_off["PYDVM_STATE_DIR"] = str(tmp / "state-off")
    p = subprocess.run(PYDVM + ["start", "--daemonize", "--hosts", "relayed:8",
                                "--mca", "pydvm_direct_data", "off",
                                "--log-dir", str(tmp / "logs-off")],
                       env=env_off, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        subprocess.run(PYDVM + ["stop", "--dvm", uri], env=env, capture_output=True, timeout=120)
        print(p.stderr, file=sys.stderr)
        return 1
    uri_off = p.stdout.strip()
    rows = []
    try:
        for held in levels:
            n = probes if held < 20000 else max(100, probes // 3)  # Open MPI scans: slow
            o = ompi("latency", [str(held), str(n)], 2, tmp / "o.json")
            h = pydvm(uri, env, head, "latency", [str(held), str(probes)], 2, tmp / "h.json")
            f = pydvm(uri, env, "far", "latency", [str(held), str(probes)], 2, tmp / "f.json")
            r = pydvm(uri_off, env_off, "relayed", "latency", [str(held), str(probes)], 2,
                      tmp / "r.json")
            for op in ("publish", "lookup", "unpublish"):
                rows.append((op, held, o[op], h[op], f[op], r[op]))
                print(f"{op:<10} {held:>6} held: Open MPI {o[op]:8.0f} us  pydvm {h[op]:6.0f} us"
                      f"  ratio {h[op] / o[op]:5.2f}   daemon node {f[op]:6.0f} us "
                      f"({f[op] / h[op]:4.2f}x head)  direct off {r[op]:6.0f} us "
                      f"({r[op] / h[op]:4.2f}x head)", flush=True)
        # Throughput swings by tens of percent from one run to the next on a
        # VM, so the two sides alternate, TP_ROUNDS runs each, and the
        # medians are compared.
        ots, pts = [], []
        for _ in range(TP_ROUNDS):
            o = ompi("throughput", [str(tp_seconds)], 8, tmp / "ot.json")
            p = pydvm(uri, env, head, "throughput", [str(tp_seconds)], 8, tmp / "pt.json")
            ots.append(o["ops_per_s"])
            pts.append(p["ops_per_s"])
            print(f"8 clients: Open MPI {o['ops_per_s']:8,.0f} ops/s "
                  f"({o['cpu_us_per_op']:5.1f} µs CPU/op)  pydvm {p['ops_per_s']:8,.0f} ops/s "
                  f"({p['cpu_us_per_op']:5.1f} µs CPU/op)", flush=True)
        ot, pt = statistics.median(ots), statistics.median(pts)
    finally:
        subprocess.run(PYDVM + ["stop", "--dvm", uri], env=env, capture_output=True, timeout=120)
        subprocess.run(PYDVM + ["stop", "--dvm", uri_off], env=env_off, capture_output=True,
                       timeout=120)
        shutil.rmtree(tmp, ignore_errors=True)

    print()
    print("| operation | names held | Open MPI µs | pydvm µs | pydvm / Open MPI "
          "| daemon node (direct) µs | daemon / head | daemon node, direct off µs "
          "| off / head |")
    print("|---|---|---|---|---|---|---|---|---|")
    for op, held, o, h, f, r in rows:
        print(f"| {op} | {held:,} | {o:,.0f} | {h:,.0f} | {h / o:.2f} | {f:,.0f} | {f / h:.2f} "
              f"| {r:,.0f} | {r / h:.2f} |")
    print(f"| 8 clients, ops/s (median of {TP_ROUNDS}) | -- | {ot:,.0f} | {pt:,.0f} "
          f"| {ot / pt:.2f} (Open MPI / pydvm)"
          " | -- | -- | -- | -- |")
    worst = max([h / o for _, _, o, h, _, _ in rows] + [ot / pt])
    far = max(f / h for _, _, _, h, f, _ in rows)
    off = max(r / h for _, _, _, h, _, r in rows)
    print(f"\nworst ratio R {worst:.2f}; daemon node (direct) at most {far:.2f}x the head "
          f"node; with pydvm_direct_data off at most {off:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
