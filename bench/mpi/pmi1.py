"""A PMI-1 job's launch and MPI_Init under pydvm, beside mpiexec.hydra, in one run.

    python bench/mpi/pmi1.py [--runs 10] [--mpi mpich-deb,mpich]

For each MPICH build (Debian's 4.0.2, ``mpich-deb``; PyPI's 5.0.2,
``mpich``: tests/mpifamily/kit.py makes its venv on first use) and each
layout -- 4 ranks on 2 nodes, 6 ranks on 3 nodes, 2 per node -- the same
``hello --timing`` (MPI_Init of the slowest rank, then an allreduce) is
launched ``--runs`` times, alternating:

* under **mpiexec.hydra** (the build's own, ``-launcher fork -hosts a,b[,c]
  -ppn 2``: every "node" on this machine);
* under **pydvm run** on a persistent DVM of local nodes a, b, c (2 slots
  each), the program's interface read off it (PMI-1): a new Python process
  per launch, as a job script runs it;
* through the **job API** (``pydvm.jobs``: one connection, ``submit`` and
  wait), the same job on the same DVM -- a workflow's launches.

Printed per row: the medians of launch-to-exit wall time and of MPI_Init,
and pydvm / Hydra for each.  The last line is ``pmi1 A x hydra launch (API),
R x (pydvm run), I x hydra MPI_Init``: the worst (largest) ratio over the
rows -- at most 1 is the goal.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tests"))

from mpifamily import kit  # noqa: E402

PYDVM = [sys.executable, "-m", "pydvm"]


def timed(res: kit.Result, n: int, who: str) -> tuple[float, float]:
    if res.returncode != 0 or sorted(kit.hello_ranks(res.stdout)) != list(range(n)):
        raise SystemExit(f"{who}: hello failed\n{res.describe()}")
    m = re.search(r"init_s=(\d+\.\d+)", res.stdout)
    return res.seconds, float(m.group(1)) if m else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--mpi", default="mpich-deb,mpich")
    a = ap.parse_args()
    state = tempfile.mkdtemp(prefix="pydvm-bench-pmi1-")
    os.environ["PYDVM_STATE_DIR"] = state  # the job API's connection finds it there
    env = {**os.environ, "PYDVM_STATE_DIR": state}
    env.pop("PYDVM_URI", None)
    uri = subprocess.run([*PYDVM, "start", "--daemonize", "--hosts", "a:2,b:2,c:2"],
                         capture_output=True, text=True, env=env, check=True,
                         timeout=120).stdout.strip().splitlines()[-1]
    rows = []
    import pydvm.jobs
    try:
        for name in a.mpi.split(","):
            mpi = kit.get(name)
            exe = str(mpi.build("hello"))
            for nodes in (2, 3):
                n, hosts = 2 * nodes, ["a", "b", "c"][:nodes]
                penv = {**mpi.environ("hello", base=env), "PYDVM_URI": uri}
                run = [*PYDVM, "run", "--host", ",".join(f"{h}:2" for h in hosts), "-n", str(n),
                       exe, "--timing"]
                ours, theirs, api = [], [], []
                kit.run_argv(run, penv, timeout=120)  # warm: programs, caches
                dvm = pydvm.jobs.connect(uri)
                try:
                    for _ in range(a.runs):
                        theirs.append(timed(kit.run_native(mpi, "hello", n=n, ppn=2,
                                                           hosts=hosts, args=["--timing"],
                                                           timeout=120), n, "hydra"))
                        ours.append(timed(kit.run_argv(run, penv, timeout=120), n, "pydvm"))
                        t0 = time.perf_counter()
                        r = dvm.submit([exe, "--timing"], n, hosts=",".join(
                            f"{h}:2" for h in hosts), env=penv, inherit_env=False,
                            stdout="capture").result(timeout=120)
                        wall = time.perf_counter() - t0
                        out = r.stdout.decode()
                        api.append(timed(kit.Result(r.returncode, out, "", wall, []), n, "api"))
                finally:
                    dvm.close()
                med = lambda xs, i: statistics.median(x[i] for x in xs)  # noqa: E731
                rows.append((f"{name} {mpi.version}", nodes, n, med(theirs, 0), med(ours, 0),
                             med(api, 0), med(theirs, 1), med(ours, 1)))
    finally:
        subprocess.run([*PYDVM, "stop"], env={**env, "PYDVM_URI": uri}, timeout=60,
                       capture_output=True)
    print(f"{'MPI':<16} {'nodes':>5} {'ranks':>5} {'hydra s':>8} {'pydvm run':>9} {'ratio':>6} "
          f"{'API s':>7} {'ratio':>6} {'init hydra':>10} {'init pydvm':>10} {'ratio':>6}")
    for mpi, nodes, n, lh, lp, la, ih, ip in rows:
        print(f"{mpi:<16} {nodes:>5} {n:>5} {lh:>8.3f} {lp:>9.3f} {lp / lh:>6.2f} "
              f"{la:>7.3f} {la / lh:>6.2f} {ih:>10.4f} {ip:>10.4f} {ip / ih:>6.2f}")
    worst_run = max(r[4] / r[3] for r in rows)
    worst_api = max(r[5] / r[3] for r in rows)
    worst_init = max(r[7] / r[6] for r in rows)
    print(f"pmi1 {worst_api:.2f} x hydra launch (API), {worst_run:.2f} x (pydvm run), "
          f"{worst_init:.2f} x hydra MPI_Init (worst of {len(rows)} rows, medians of "
          f"{a.runs} runs; seconds above)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
