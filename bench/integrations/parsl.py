"""Parsl on a DVM: a job per app (PydvmExecutor) against HTEX on DVM blocks and local ones.

    python bench/integrations/parsl.py [--tasks 200] [--mpi 20] [--workers 2]

Side by side in one run (needs ``pip install 'pydvm[parsl]'``; Parsl's
``interchange.py`` and ``process_worker_pool.py`` are found next to this
Python):

* ``--tasks`` no-op ``python_app``\\ s, then as many ``bash_app``\\ s
  (``true``), through

  - ``PydvmExecutor``: each app one DVM job (no worker pools), on a DVM of
    this machine started here;
  - the HighThroughputExecutor (``--workers`` workers in one block), its
    block started by ``PydvmProvider`` on that DVM, and by ``LocalProvider``;

  all submitted at once, then waited for;
* the same number of one-rank ``true`` jobs through the job API
  (``pydvm.jobs``), all in flight: the floor of a task that is a DVM job;
* ``--mpi`` MPI apps of 2 ranks over 2 nodes (``$PARSL_MPI_PREFIX true``)
  on a DVM of two local daemons: through ``PydvmExecutor``
  (``num_ranks=2, ranks_per_node=1``; all submitted at once, the DVM
  queueing them), through ``MPIExecutor`` with
  ``PydvmProvider(nodes_per_block=2, launcher=SimpleLauncher())``
  (``num_nodes=2, ranks_per_node=1``; one at a time, as the block's two
  nodes allow), and as many 2-rank jobs over the same two nodes through the
  job API, one at a time.

For each row: tasks per second (first submit to last result) and the
submit-to-result latency p50 and p99.  Blocks are started and their
workers connected before the clock starts (one warm-up task); so is the
executor's connection.  The last line is ``parsl P tasks/s R x
LocalProvider, MPI M apps/s; per-app executor E tasks/s, MPI X apps/s``:
P is the python_app rate of HTEX with PydvmProvider, R its ratio to
LocalProvider's, M the MPI apps' rate through MPIExecutor; E and X the
same through PydvmExecutor.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import wait

# This file is named like the package it measures: its directory, first on
# sys.path when it is run as a script, must not hide Parsl.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import pydvm.jobs  # noqa: E402

BIN = os.path.dirname(sys.executable)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def timed(submit, n: int) -> tuple[float, list[float]]:
    """Submit ``n`` tasks at once (``submit(i)`` -> a Future), wait for all;
    (tasks per second, latencies in ms)."""
    lat: list[float] = []
    t0 = time.perf_counter()
    futs = []
    for i in range(n):
        ts = time.perf_counter()
        f = submit(i)
        f.add_done_callback(lambda _f, ts=ts: lat.append((time.perf_counter() - ts) * 1e3))
        futs.append(f)
    wait(futs)
    elapsed = time.perf_counter() - t0
    for f in futs:
        f.result()  # a failed task fails the bench
    return n / elapsed, lat


def htex_rows(label: str, provider, n: int, workers: int) -> list[tuple]:
    import parsl
    from parsl.app.app import bash_app, python_app
    from parsl.config import Config
    from parsl.executors import HighThroughputExecutor

    @python_app
    def noop():
        return None

    @bash_app
    def true_app():
        return "true"

    config = Config(executors=[HighThroughputExecutor(
        label=f"htex_{label}", cores_per_worker=1e-6, max_workers_per_node=workers,
        provider=provider)], strategy="none")
    rows = []
    with parsl.load(config):
        noop().result()  # the block up, its workers connected
        rows.append((f"python_app, HTEX + {label}", *timed(lambda i: noop(), n)))
        rows.append((f"bash_app, HTEX + {label}", *timed(lambda i: true_app(), n)))
    return rows


def executor_rows(uri: str, n: int) -> list[tuple]:
    """No-op python_apps and bash_apps through PydvmExecutor: each a DVM job."""
    import parsl
    from parsl.app.app import bash_app, python_app
    from parsl.config import Config

    from pydvm.parsl import PydvmExecutor

    @python_app
    def noop():
        return None

    @bash_app
    def true_app():
        return "true"

    rows = []
    with parsl.load(Config(executors=[PydvmExecutor(uri=uri)], strategy="none")):
        noop().result()  # connected, the runner's files cached
        rows.append(("python_app, PydvmExecutor", *timed(lambda i: noop(), n)))
        rows.append(("bash_app, PydvmExecutor", *timed(lambda i: true_app(), n)))
    return rows


def mpi_rows(n: int, uri: str) -> list[tuple]:
    import parsl
    from parsl.app.app import bash_app
    from parsl.config import Config
    from parsl.executors import MPIExecutor
    from parsl.launchers import SimpleLauncher

    from pydvm.parsl import PydvmProvider

    @bash_app
    def mpi_true(parsl_resource_specification={}):
        return "$PARSL_MPI_PREFIX true"

    from pydvm.parsl import PydvmExecutor

    rank_spec = {"num_ranks": 2, "ranks_per_node": 1}
    with parsl.load(Config(executors=[PydvmExecutor(uri=uri)], strategy="none")):
        mpi_true(parsl_resource_specification=dict(rank_spec)).result()
        per_app = ("MPI app 2 ranks/2 nodes, PydvmExecutor",
                   *timed(lambda i: mpi_true(parsl_resource_specification=dict(rank_spec)),
                          n))
    spec = {"num_nodes": 2, "ranks_per_node": 1}
    config = Config(executors=[MPIExecutor(
        max_workers_per_block=1,
        provider=PydvmProvider(uri, nodes_per_block=2, launcher=SimpleLauncher()))],
        strategy="none")
    with parsl.load(config):
        mpi_true(parsl_resource_specification=dict(spec)).result()
        row = ("MPI app 2 ranks/2 nodes, MPIExecutor + PydvmProvider",
               *timed(lambda i: mpi_true(parsl_resource_specification=dict(spec)), n))
    with pydvm.jobs.connect(uri) as dvm:
        # one at a time, as the block's two nodes allow the apps above
        lat = []
        t0 = time.perf_counter()
        for _ in range(n):
            ts = time.perf_counter()
            dvm.submit("true", 2, npernode=1, hosts="a,b").result().check()
            lat.append((time.perf_counter() - ts) * 1e3)
        job_row = ("2-rank job over 2 nodes, job API, one at a time",
                   n / (time.perf_counter() - t0), lat)
    return [per_app, row, job_row]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--mpi", type=int, default=20)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    os.environ["PATH"] = BIN + os.pathsep + os.environ.get("PATH", "")
    from parsl.launchers import SimpleLauncher
    from parsl.providers import LocalProvider

    from pydvm.parsl import PydvmProvider

    rows: list[tuple] = []
    with tempfile.TemporaryDirectory(prefix="pydvm-bench-parsl-") as tmp:
        os.chdir(tmp)
        os.environ["PYDVM_STATE_DIR"] = os.path.join(tmp, "state")
        rows += htex_rows("LocalProvider", LocalProvider(launcher=SimpleLauncher()), a.tasks,
                          a.workers)
        with pydvm.jobs.start() as dvm:
            uri = str(dvm.uri)
            rows += executor_rows(uri, a.tasks)
            rows += htex_rows("PydvmProvider", PydvmProvider(uri), a.tasks, a.workers)
            rows.append(("one-rank job per task, job API",
                         *timed(lambda i: dvm.submit("true"), a.tasks)))
        with pydvm.jobs.start("a,b", pydvm_pmix="on") as dvm:
            rows += mpi_rows(a.mpi, str(dvm.uri))
    w = max(len(r[0]) for r in rows)
    print(f"{'':{w}}  {'tasks/s':>9}  {'p50 ms':>8}  {'p99 ms':>8}")
    for name, rate, lat in rows:
        print(f"{name:{w}}  {rate:9.1f}  {statistics.median(lat):8.1f}  {pct(lat, 0.99):8.1f}")
    rate = {r[0]: r[1] for r in rows}
    local = rate["python_app, HTEX + LocalProvider"]
    pyd = rate["python_app, HTEX + PydvmProvider"]
    per_app = rate["python_app, PydvmExecutor"]
    mpi = rate["MPI app 2 ranks/2 nodes, MPIExecutor + PydvmProvider"]
    mpi_per_app = rate["MPI app 2 ranks/2 nodes, PydvmExecutor"]
    print(f"parsl {pyd:.0f} tasks/s {pyd / local:.2f} x LocalProvider, MPI {mpi:.1f} apps/s; "
          f"per-app executor {per_app:.1f} tasks/s, MPI {mpi_per_app:.1f} apps/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
