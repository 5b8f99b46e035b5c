"""Where the time of an MPI job's launch goes: ``pydvm run --pmix -n N ./hello``, phase by phase.

    python bench/launch/launch_phases.py [--reps 5] [--ranks 4,16]

Two persistent DVMs are started with ``PYDVM_LAUNCH_TRACE`` set -- one of
one node (the head node, in the master's process), one of two local daemons
(``--hosts a,b``: MPI_Init's fence then crosses the master) -- so the tool,
the master, the nodes and their PMIx servers each append a timestamp at
every point a job passes (``pydvm/_trace.py`` lists them).  For each rank
count and DVM, ``pydvm run --pmix -n N ./hello`` (C: MPI_Init,
MPI_Allreduce, MPI_Finalize, as in bench/launch/launch.py) runs ``--reps`` times,
alternating with ``mpirun -n N ./hello`` (one node); the table gives, per
phase, the median over the runs in milliseconds, then the totals and their
ratio.  The last line is ``phases total R``: the worst column's ratio.
On one node libpmix completes fences among its own clients itself: no
fence reaches pydvm.

Phases are differences of wall-clock timestamps taken in different
processes of one machine (one clock).  Needs mpicc and mpirun (Debian's
libopenmpi-dev, openmpi-bin) and libpmix.
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

sys.path.insert(0, str(Path(__file__).parent))
from launch import HELLO, PYDVM  # noqa: E402

ROWS = [
    "tool start-up: interpreter, imports",
    "tool: connect, authenticate, send the run",
    "run request reaches the master",
    "master: plan, send the launch",
    "launch reaches the (first) node",
    "node: bindings, PMIx registration of the ranks",
    "  of which planning the bindings (first node)",
    "node: start the processes (last node done)",
    "exec to the last PMIx_Init",
    "last PMIx_Init to last PMIx_Finalize (MPI)",
    "  of which MPI_Init's first fence, in to out",
    "  of which the last fence (MPI_Finalize's)",
    "last PMIx_Finalize to the last process reaped",
    "exit reported, job over at the master",
    "  of which the end-of-job purge broadcast",
    "    of which libpmix's deregistration (last node)",
    "report reaches the tool",
    "tool exits",
    "total (wall time of the pydvm run process)",
]


def read_trace(path: Path) -> dict[str, list[float]]:
    points: dict[str, list[float]] = {}
    for line in path.read_text().splitlines():
        t, _pid, point, _ns = line.split(" ", 3)
        points.setdefault(point, []).append(float(t))
    for ts in points.values():
        ts.sort()
    return points


def phases(pts: dict[str, list[float]], t0: float, t1: float, nodes: int) -> dict[str, float]:
    """Each row's milliseconds (rows whose points are missing are left out)."""
    def first(p):
        return pts[p][0] if pts.get(p) else None

    def last(p):
        return pts[p][-1] if pts.get(p) else None
    spans = {
        ROWS[0]: (t0, first("tool.start")),
        ROWS[1]: (first("tool.start"), first("tool.send")),
        ROWS[2]: (first("tool.send"), first("master.run")),
        ROWS[3]: (first("master.run"), first("master.launch")),
        ROWS[4]: (first("master.launch"), first("node.launch")),
        ROWS[5]: (first("node.launch"), last("node.registered")),
        ROWS[6]: (first("node.launch"), first("node.bound")),
        ROWS[7]: (last("node.registered"), last("node.started")),
        ROWS[8]: (last("node.started"), last("pmix.client_connected")),
        ROWS[9]: (last("pmix.client_connected"), last("pmix.client_finalized")),
        ROWS[12]: (last("pmix.client_finalized"), last("node.exit")),
        ROWS[13]: (last("node.exit"), first("master.over")),
        ROWS[14]: (first("master.purge"), first("master.purged")),
        ROWS[15]: (last("node.deregister"), last("node.deregistered")),
        ROWS[16]: (first("master.report"), first("tool.result")),
        ROWS[17]: (first("tool.result"), t1),
        ROWS[18]: (t0, t1),
    }
    fin, done = pts.get("pmix.fence", []), pts.get("pmix.fence_done", [])
    if len(fin) >= nodes and len(done) >= nodes:  # a fence upcall per node and round
        spans[ROWS[10]] = (fin[0], done[nodes - 1])
        if len(fin) >= 2 * nodes and len(done) >= 2 * nodes:
            spans[ROWS[11]] = (fin[-nodes], done[-1])
    return {k: (b - a) * 1000 for k, (a, b) in spans.items() if a is not None and b is not None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ranks", default="4,16")
    ap.add_argument("--true", action="store_true",
                    help="run `true` (no PMIx) instead of the MPI program")
    args = ap.parse_args()
    if not (shutil.which("mpirun") and shutil.which("mpicc")):
        raise SystemExit("needs mpicc and mpirun (apt-get install libopenmpi-dev openmpi-bin)")
    ranks = [int(x) for x in args.ranks.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="pydvm-bench-phases-"))
    trace = tmp / "trace"
    base_env = dict(os.environ, PYDVM_LAUNCH_TRACE=str(trace), OMPI_MCA_btl_tcp_if_include="lo")
    base_env.pop("PYDVM_URI", None)
    # as installed: bytecode written once and then read (where
    # PYTHONDONTWRITEBYTECODE is set, every process would compile what changed)
    base_env.pop("PYTHONDONTWRITEBYTECODE", None)
    mpi_env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PYDVM_", "PMIX_", "OMPI_", "SLURM_"))}
    mpirun = ["mpirun", "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0
                                              else [])
    hello = tmp / "hello"
    (tmp / "hello.c").write_text(HELLO)
    subprocess.run(["mpicc", "-O1", "-o", str(hello), str(tmp / "hello.c")], check=True)
    # one DVM of one node (the head node, in the master's process), one of
    # two local daemons (the fence crosses the master)
    dvms = {}
    for nodes, extra in ((1, []), (2, ["--hosts", f"a:{max(ranks)},b:{max(ranks)}"])):
        env = dict(base_env, PYDVM_STATE_DIR=str(tmp / f"state{nodes}"))
        p = subprocess.run(PYDVM + ["start", "--daemonize", *extra], env=env,
                           capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            raise SystemExit(f"pydvm start failed: {p.stderr}")
        env["PYDVM_URI"] = p.stdout.strip()
        dvms[nodes] = env
    configs = [(n, nodes) for nodes in (1, 2) for n in ranks]
    results: dict[tuple[int, int], dict] = {}
    try:
        for n, nodes in configs:
            env = dvms[nodes]
            where = ([] if nodes == 1 else ["--host", f"a:{n // 2},b:{n - n // 2}"]
                     if n > 1 else ["--host", "b"])  # one rank: on a daemon
            rows: dict[str, list[float]] = {r: [] for r in ROWS}
            peer, fences = [], set()
            for _ in range(args.reps):
                time.sleep(0.3)  # the previous job's purge and the tool's exit are over
                trace.write_text("")
                t0 = time.time()
                prog = ["true"] if args.true else ["--pmix", str(hello)]
                r = subprocess.run(PYDVM + ["run", "-n", str(n), *prog[:-1],
                                            *where, prog[-1]],
                                   env=env, stdin=subprocess.DEVNULL, capture_output=True,
                                   timeout=300)
                t1 = time.time()
                if r.returncode != 0:
                    raise SystemExit(f"pydvm run failed: {r.stderr.decode()[-500:]}")
                pts = read_trace(trace)
                fences.add(len(pts.get("pmix.fence", [])))
                for k, ms in phases(pts, t0, t1, nodes).items():
                    rows[k].append(ms)
                t0 = time.perf_counter()
                r = subprocess.run(mpirun + ["-n", str(n), prog[-1]], env=mpi_env,
                                   stdin=subprocess.DEVNULL, capture_output=True, timeout=300)
                if r.returncode != 0:
                    raise SystemExit(f"mpirun failed: {r.stderr.decode()[-500:]}")
                peer.append((time.perf_counter() - t0) * 1000)
            results[(n, nodes)] = {"rows": rows, "mpirun": statistics.median(peer),
                                   "fences": sorted(fences)}
    finally:
        for env in dvms.values():
            subprocess.run(PYDVM + ["stop"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(tmp, ignore_errors=True)
    cols = [f"-n {n} {nodes}node" for n, nodes in configs]
    head = f"{'phase (median ms)':<50}" + "".join(f" | {c:>10}" for c in cols)
    print(head)
    print("-" * len(head))

    def med(xs):
        return statistics.median(xs) if xs else None
    for row in ROWS:
        if row.startswith("total"):
            print("-" * len(head))
        cells = [med(results[c]["rows"][row]) for c in configs]
        print(f"{row:<50}" + "".join(f" | {x:10.1f}" if x is not None else f" | {'-':>10}"
                                     for x in cells))
    print(f"{'mpirun -n N ' + ('true' if args.true else './hello') + ' (one node)':<50}" +
          "".join(f" | {results[c]['mpirun']:10.1f}" for c in configs))
    ratios = [med(results[c]["rows"][ROWS[-1]]) / results[c]["mpirun"] for c in configs]
    print(f"{'pydvm / mpirun':<50}" + "".join(f" | {x:10.2f}" for x in ratios))
    print(f"{'fence upcalls per job (all nodes)':<50}" +
          "".join(f" | {'/'.join(map(str, results[c]['fences'])):>10}" for c in configs))
    print(f"phases total R {max(ratios):.2f} (pydvm / mpirun, worst column, medians of "
          f"{args.reps})")


if __name__ == "__main__":
    main()
