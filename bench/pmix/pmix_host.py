"""PMIx_Publish / PMIx_Lookup latency through the pydvm.pmix binding.

A C client (bench/pmix/pmix_bench_client.c, built here with gcc -lpmix) talks to
the test host of tests/pmix/harness.py: a PmixServer whose in-memory store
answers every request on its asyncio event loop.  The client first holds N
names, then times ITERS publishes of fresh names and ITERS lookups of held
ones.  Prints a table and a final summary line.

    python bench/pmix/pmix_host.py [--iters 2000] [--held 10,5000]

Rows ``publish-now`` / ``lookup-now`` (at the first number of names held)
are the same host answering inside libpmix's upcall, on its progress thread
(the binding's ``answer_now``, under the host's lock: what pydvm's runtime
does for requests a store of its process can answer at once).  A last row,
``floor``, times publishes answered inside the upcall with nothing done at
all (bench/pmix/_pmix_floor.py: nothing stored, no Python beyond the upcall's
entry): libpmix's client/server round trip alone.
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

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "tests" / "pmix" / "harness.py"
CLIENT = Path(__file__).resolve().parent / "pmix_bench_client.c"


def build(tmp: Path) -> str:
    exe = tmp / "pmix_bench_client"
    try:
        flags = subprocess.run(["pkg-config", "--cflags", "--libs", "pmix"], check=True,
                               capture_output=True, text=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        flags = ["-I/usr/lib/x86_64-linux-gnu/pmix2/include", "-lpmix"]
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(CLIENT), *flags], check=True)
    return str(exe)


FLOOR = Path(__file__).resolve().parent / "_pmix_floor.py"


def run(exe: str, tmp: Path, held: int, iters: int, floor: bool = False, now: bool = False
        ) -> dict[str, list[float]]:
    argv = [exe, str(held), str(iters)] + (["publish"] if floor else [])
    spec = {"tmpdir": str(tmp / "srv"), "timeout": 600, "clients": [{"rank": 0, "argv": argv}],
            "answer_now": now}
    path = tmp / f"spec-{held}.json"
    path.write_text(json.dumps(spec))
    r = subprocess.run([sys.executable, str(FLOOR if floor else HARNESS), str(path)],
                       capture_output=True, text=True, timeout=900)
    rep = next(l for l in r.stdout.splitlines() if l.startswith("REPORT "))
    client = json.loads(rep[7:])["clients"][0]
    if client["rc"] != 0:
        raise SystemExit(f"bench client failed: {client['stderr']}")
    out = {}
    for line in client["stdout"].splitlines():
        op, *samples = line.split()
        out[op] = [float(s) for s in samples]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--held", default="10,5000")
    a = ap.parse_args()
    from pydvm import pmix
    ok, why, path = pmix.available()
    if not ok:
        print(f"libpmix unusable: {why}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        exe = build(tmp)
        rows = []
        for held in [int(x) for x in a.held.split(",")]:
            res = run(exe, tmp, held, a.iters)
            for op in ("PUBLISH", "LOOKUP"):
                s = sorted(res[op])
                rows.append((held, op.lower(), statistics.median(s),
                             s[int(len(s) * 0.9)], len(s)))
        held = int(a.held.split(",")[0])
        res = run(exe, tmp, held, a.iters, now=True)
        for op in ("PUBLISH", "LOOKUP"):
            s = sorted(res[op])
            rows.append((held, op.lower() + "-now", statistics.median(s),
                         s[int(len(s) * 0.9)], len(s)))
        s = sorted(run(exe, tmp, 0, a.iters, floor=True)["PUBLISH"])
        rows.append((0, "floor", statistics.median(s), s[int(len(s) * 0.9)], len(s)))
    print(f"# {why} ({path}); host answers on its asyncio loop (-now: in the upcall); "
          f"{os.cpu_count()} cpus")
    print(f"{'names held':>10}  {'op':<11} {'median us':>10} {'p90 us':>9} {'n':>6}")
    for held, op, med, p90, n in rows:
        print(f"{held:>10}  {op:<11} {med:>10.1f} {p90:>9.1f} {n:>6}")
    summ = ", ".join(f"{op} {med:.0f} us @{held}" for held, op, med, _, _ in rows)
    print(f"pmix_host median: {summ}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
