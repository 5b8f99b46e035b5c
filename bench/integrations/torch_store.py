"""PydvmStore against TCPStore, side by side in one run.

    python bench/integrations/torch_store.py            # 2,000 probes per operation, 7 init rounds
    python bench/integrations/torch_store.py --quick    # 400 probes, 3 rounds

Latency: a 2-rank job on a daemon node of a persistent DVM.  Rank 0 hosts a
TCPStore, as torchrun's rank 0 does; rank 1 is a client of both it and a
PydvmStore (the daemon node's direct path to the master, one hop) and times
``set``, ``get``, ``add`` and ``compare_set`` on each, in alternating blocks
of 50, so both see the same machine noise.  Medians and 90th percentiles.

Init: a 4-rank job on two daemon nodes; each round times, on every rank and
from a common start, ``init_process_group("gloo")`` + one ``all_reduce``:
with ``init_method="pydvm://"``, then torchrun-style (``env://`` with the
agent's store: every rank connects to a TCPStore that was up before the
round, as torchrun's agent hosts it).  A round's figure is its slowest
rank; medians over the rounds.  Each side's connection setup is inside
what is timed, except pydvm's, which ``import pydvm.torch`` starts in the
background inside a job (as a real job imports it long before it inits).

Prints a table, then one summary line with the pydvm / TCPStore ratios and
whether they meet the targets: get and add at most 2x TCPStore's, init at
most 1.2x.  A ratio is paired: the median, over the blocks (or init rounds)
the two stores ran back to back, of pydvm's figure over TCPStore's -- on a
shared machine whose load comes and goes, a ratio of overall medians
swings with it.  Needs torch (``pip install 'pydvm[torch]'``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROBE = str(HERE / "_torch_probe.py")
PYDVM = [sys.executable, "-m", "pydvm"]
OPS = ("set", "get", "add", "compare_set")
#: probes per block; the job alternates the two stores block by block.
BLOCK = 50
TARGETS = {"get": 2.0, "add": 2.0, "init": 1.2}


def job(uri: str, env: dict, hosts: str, n: int, args: list[str]) -> None:
    p = subprocess.run(PYDVM + ["run", "--dvm", uri, "--host", hosts, "-n", str(n),
                                sys.executable, PROBE, *args],
                       env=env, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"pydvm run failed ({p.returncode}):\n{p.stdout[-2000:]}\n"
                           f"{p.stderr[-4000:]}")


def paired(t: list[float], d: list[float], block: int) -> float:
    """The median, over the blocks both stores ran back to back, of pydvm's
    block median over TCPStore's: each pair shares the machine's load of
    the moment, so a load that comes and goes cancels out of the ratio."""
    return statistics.median(
        statistics.median(d[i:i + block]) / statistics.median(t[i:i + block])
        for i in range(0, min(len(t), len(d)), block))


def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer probes and rounds")
    ap.add_argument("--probes", type=int, help="probes per operation and store")
    ap.add_argument("--rounds", type=int, help="init rounds per store")
    a = ap.parse_args()
    try:
        import torch.distributed  # noqa: F401
    except ImportError:
        print("needs torch: pip install 'pydvm[torch]'", file=sys.stderr)
        return 2
    probes = a.probes or (400 if a.quick else 2000)
    rounds = a.rounds or (3 if a.quick else 7)

    tmp = Path(tempfile.mkdtemp(prefix="pydvm-torch-bench-"))
    env = dict(os.environ)
    env["PYDVM_STATE_DIR"] = str(tmp / "state")
    env.pop("PYDVM_URI", None)
    p = subprocess.run(PYDVM + ["start", "--daemonize", "--hosts", "a:4,b:4",
                                "--log-dir", str(tmp / "logs")],
                       env=env, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        print(p.stderr, file=sys.stderr)
        return 1
    uri = p.stdout.strip()
    try:
        job(uri, env, "a:2", 2, ["latency", str(probes), str(tmp / "lat.json")])
        lat = json.loads((tmp / "lat.json").read_text())
        job(uri, env, "a:2,b:2", 4, ["init", str(rounds), str(tmp / "init.json")])
        ini = json.loads((tmp / "init.json").read_text())
    finally:
        subprocess.run(PYDVM + ["stop", "--dvm", uri], env=env, capture_output=True,
                       timeout=120)
    for name in ("pydvm", "tcpstore"):
        assert lat[name]["check_cas"] == [1.0], f"{name}: compare_set chain broken"

    rows = []
    for op in OPS:
        t, d = lat["tcpstore"][op], lat["pydvm"][op]
        rows.append((op, "µs", statistics.median(t), pct(t, 0.9), statistics.median(d),
                     pct(d, 0.9), paired(t, d, BLOCK)))
    t, d = [v / 1000 for v in ini["tcpstore"]], [v / 1000 for v in ini["pydvm"]]
    rows.append(("init", "ms", statistics.median(t), max(t), statistics.median(d), max(d),
                 paired(t, d, 1)))

    print(f"PydvmStore vs TCPStore, torch {__import__('torch').__version__}: {probes} probes "
          f"per operation (2 ranks, one daemon node), {rounds} init rounds (4 ranks, 2 nodes)\n")
    print("| operation | TCPStore median | TCPStore p90/max | pydvm median | pydvm p90/max "
          "| pydvm / TCPStore (paired) | target |")
    print("|---|---|---|---|---|---|---|")
    ratios = {}
    for op, unit, tm, tp, dm, dp, ratio in rows:
        ratios[op] = ratio
        target = f"<= {TARGETS[op]}" if op in TARGETS else "--"
        label = "4-rank init + all_reduce" if op == "init" else op
        print(f"| {label} | {tm:,.1f} {unit} | {tp:,.1f} {unit} | {dm:,.1f} {unit} | "
              f"{dp:,.1f} {unit} | {ratio:.2f} | {target} |")
    met = all(ratios[op] <= limit for op, limit in TARGETS.items())
    print(f"\npydvm / TCPStore: set {ratios['set']:.2f}, get {ratios['get']:.2f}, add "
          f"{ratios['add']:.2f}, compare_set {ratios['compare_set']:.2f}, init "
          f"{ratios['init']:.2f}; targets (get, add <= 2, init <= 1.2) "
          f"{'met' if met else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
