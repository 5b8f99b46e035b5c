"""Job throughput of a persistent DVM: the job API against ``mpirun``, ``pydvm run`` and PSI/J.

    python bench/launch/throughput.py [--jobs 2000] [--jobs4 500] [--seq 100] [--psij 500]
                               [--hosts HOSTS] [--soak 0]

Side by side in one run, on one DVM started here (``pydvm.jobs.start``;
default: this machine, its node served by the master process):

* **the job API**, one-rank ``true`` jobs (``--jobs``) and four-rank ones
  (``--jobs4``), output discarded, on one connection: one ``submit`` per
  job (all in flight at once), one ``submit_many`` for all (bulk), and one
  at a time (submit, wait for the end, next: the latency of an idle DVM);
* a loop of ``mpirun -n 1 true`` and a loop of ``pydvm run -n 1 true``
  (``--seq`` jobs each, one after the other, as a script would);
* PSI/J's ``local`` executor (``--psij`` jobs submitted at once, then
  waited for), when psij-python is installed.

For each: jobs per second (first submit to last end), the submit-to-end
latency p50 and p99, and for the DVM's rows the master's CPU time per job
(``/proc``: user + system of the master process; with ``--hosts`` naming
daemons, the daemons' too, in their own column).  The master's resident
memory is read before and after everything, each time once the DVM has
been idle long enough to return freed heap; ``--soak N`` adds a run of N
one-rank jobs in batches of 1,000 and prints the master's memory after
each batch (records of ended jobs are not kept: it must stay flat).

The last line is ``throughput J jobs/s R x mpirun``: J is the better of
the API's one-submit-per-job and bulk rates for one-rank jobs, R is J over
the ``mpirun`` loop's rate measured in this run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import wait
from pathlib import Path

import pydvm.jobs

PYDVM = [sys.executable, "-m", "pydvm"]
TICK = os.sysconf("SC_CLK_TCK")


def cpu_of(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_of(pid: int) -> int:
    """Resident memory of ``pid``, in KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def children_of(pid: int) -> list[int]:
    """The direct children of ``pid`` (the DVM's daemons, for a DVM of local daemons)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(d))
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def idle_rss(pid: int) -> int:
    """``pid``'s resident memory once its DVM has been idle long enough to
    hand freed heap back (``pydvm.runtime.node.heap``)."""
    from pydvm.runtime.node.heap import IDLE_DELAY

    time.sleep(IDLE_DELAY + 0.5)
    return rss_of(pid)


class Row:
    def __init__(self, what: str, n: int, wall: float, lat: list[float],
                 master_cpu: float | None = None, daemon_cpu: float | None = None) -> None:
        self.what, self.n, self.wall, self.lat = what, n, wall, lat
        self.rate = n / wall
        self.master_cpu, self.daemon_cpu = master_cpu, daemon_cpu


def measured(what: str, n: int, body, master: int | None, daemons: list[int]) -> Row | None:
    """Run ``body()`` (returns the latencies) and measure it (None: a row of no jobs)."""
    if n <= 0:
        return None
    m0 = cpu_of(master) if master else None
    d0 = sum(cpu_of(p) for p in daemons)
    t0 = time.perf_counter()
    lat = body()
    wall = time.perf_counter() - t0
    mc = (cpu_of(master) - m0) / n if master else None
    dc = (sum(cpu_of(p) for p in daemons) - d0) / n if daemons else None
    return Row(what, n, wall, lat, mc, dc)


def api_each(dvm, n: int, ranks: int) -> list[float]:
    """One submit per job, all in flight; each job's submit-to-end latency."""
    t_sub: list[float] = []
    t_end = [0.0] * n
    jobs = []
    for i in range(n):
        t_sub.append(time.perf_counter())
        j = dvm.submit("true", ranks)
        j.add_done_callback(lambda _f, i=i: t_end.__setitem__(i, time.perf_counter()))
        jobs.append(j)
    wait(jobs)
    check(jobs)
    return [e - s for s, e in zip(t_sub, t_end)]


def api_bulk(dvm, n: int, ranks: int) -> list[float]:
    """One submit_many for all; latency from the batch's submit to each end."""
    t_end = [0.0] * n
    spec = pydvm.jobs.JobSpec("true", ranks)
    t0 = time.perf_counter()
    jobs = dvm.submit_many([spec] * n)
    for i, j in enumerate(jobs):
        j.add_done_callback(lambda _f, i=i: t_end.__setitem__(i, time.perf_counter()))
    wait(jobs)
    check(jobs)
    return [e - t0 for e in t_end]


def api_serial(dvm, n: int) -> list[float]:
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = dvm.submit("true").result()
        lat.append(time.perf_counter() - t0)
        if not r.ok:
            raise SystemExit(f"a job failed: {r.returncode} {r.reason}")
    return lat


def check(jobs) -> None:
    bad = [j for j in jobs if j.exception() is not None or not j.result().ok]
    if bad:
        j = bad[0]
        raise SystemExit(f"{len(bad)} of {len(jobs)} jobs failed, e.g. "
                         f"{j.exception() or (j.result().returncode, j.result().reason)}")


def command_loop(argv: list[str], env: dict, n: int) -> list[float]:
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        p = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, timeout=300)
        lat.append(time.perf_counter() - t0)
        if p.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed: {p.stderr.decode()[-300:]}")
    return lat


def psij_local(n: int) -> list[float]:
    import psij

    ex = psij.JobExecutor.get_instance("local")
    t_sub: dict[str, float] = {}
    t_end: dict[str, float] = {}
    done = threading.Event()
    lock = threading.Lock()

    def changed(job, status) -> None:
        if status.final:
            with lock:
                t_end[job.id] = time.perf_counter()
                if len(t_end) == n:
                    done.set()
    ex.set_job_status_callback(changed)
    jobs = []
    for _ in range(n):
        j = psij.Job(psij.JobSpec(executable="true"))
        t_sub[j.id] = time.perf_counter()
        ex.submit(j)
        jobs.append(j)
    for j in jobs:
        j.wait()
    done.wait(60)
    bad = [j for j in jobs if j.status.exit_code != 0]
    if bad:
        raise SystemExit(f"{len(bad)} PSI/J jobs failed: {bad[0].status}")
    return [t_end[i] - t_sub[i] for i in t_sub if i in t_end]


def master_pid(uri) -> int:
    dvmid = str(uri).rstrip("/").rsplit("/", 1)[1]
    state = Path(os.environ.get("PYDVM_STATE_DIR") or Path.home() / ".pydvm")
    return int(json.loads((state / f"{dvmid}.json").read_text())["pid"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2000, help="one-rank jobs per API row")
    ap.add_argument("--jobs4", type=int, default=500, help="four-rank jobs per API row")
    ap.add_argument("--seq", type=int, default=100, help="jobs of each command loop")
    ap.add_argument("--psij", type=int, default=500, help="jobs through PSI/J's local executor")
    ap.add_argument("--hosts", default=None, help="pydvm start --hosts (default: this machine)")
    ap.add_argument("--soak", type=int, default=0, help="then N more one-rank jobs, memory read")
    a = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "PYDVM_URI"}
    mpi_env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PYDVM_", "PMIX_", "OMPI_", "SLURM_"))}
    mpirun = shutil.which("mpirun")
    rows: list[Row] = []
    with pydvm.jobs.start(hosts=a.hosts) as dvm:
        pid = master_pid(dvm.uri)
        daemons = [p for p in children_of(pid)
                   if b"daemon" in Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")]
        env["PYDVM_URI"] = str(dvm.uri)
        api_serial(dvm, 20)  # warm up (the topology, the PMIx server's first namespace)
        rss0 = idle_rss(pid)
        rows.append(measured(f"API, {a.jobs} x -n 1, one submit each", a.jobs,
                             lambda: api_each(dvm, a.jobs, 1), pid, daemons))
        rows.append(measured(f"API, {a.jobs} x -n 1, bulk (submit_many)", a.jobs,
                             lambda: api_bulk(dvm, a.jobs, 1), pid, daemons))
        rows.append(measured(f"API, {a.jobs4} x -n 4, one submit each", a.jobs4,
                             lambda: api_each(dvm, a.jobs4, 4), pid, daemons))
        rows.append(measured(f"API, {a.jobs4} x -n 4, bulk (submit_many)", a.jobs4,
                             lambda: api_bulk(dvm, a.jobs4, 4), pid, daemons))
        rows.append(measured(f"API, {a.seq} x -n 1, one at a time", a.seq,
                             lambda: api_serial(dvm, a.seq), pid, daemons))
        rows.append(measured(f"pydvm run -n 1 true, {a.seq} in a row", a.seq,
                             lambda: command_loop(PYDVM + ["run", "-n", "1", "true"], env, a.seq),
                             pid, daemons))
        rss1 = idle_rss(pid)
        soak = []
        for done in range(0, a.soak, 1000):
            api_bulk(dvm, min(1000, a.soak - done), 1)
            soak.append(idle_rss(pid))
    mpi_row = None
    if mpirun:
        argv = [mpirun, "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0
                                              else []) + ["-n", "1", "true"]
        mpi_row = measured(f"mpirun -n 1 true, {a.seq} in a row", a.seq,
                           lambda: command_loop(argv, mpi_env, a.seq), None, [])
        rows.append(mpi_row)
    try:
        import psij  # noqa: F401
        rows.append(measured(f"PSI/J local executor, {a.psij} x true at once", a.psij,
                             lambda: psij_local(a.psij), None, []))
    except ImportError:
        print("(PSI/J row skipped: psij-python is not installed)", file=sys.stderr)
    rows = [r for r in rows if r is not None]
    dcol = bool(daemons)
    print(f"{'what':<44} | {'jobs/s':>8} | {'p50 ms':>8} | {'p99 ms':>8} | "
          f"{'master CPU/job':>14}" + (f" | {'daemons CPU/job':>15}" if dcol else ""))
    print("-" * (92 + (18 if dcol else 0)))
    for r in rows:
        mc = f"{r.master_cpu * 1e3:.2f} ms" if r.master_cpu is not None else "-"
        dc = f"{r.daemon_cpu * 1e3:.2f} ms" if r.daemon_cpu is not None else "-"
        print(f"{r.what:<44} | {r.rate:>8.0f} | {pct(r.lat, .5) * 1e3:>8.1f} | "
              f"{pct(r.lat, .99) * 1e3:>8.1f} | {mc:>14}" + (f" | {dc:>15}" if dcol else ""))
    print(f"master memory: {rss0 / 1024:.1f} MiB after warm-up, {rss1 / 1024:.1f} MiB after "
          f"the rows above" + (f"; soak of {a.soak}: " + ", ".join(
              f"{m / 1024:.1f}" for m in soak) + " MiB after each 1,000" if soak else ""))
    j = max((r.rate for r in rows if "x -n 1," in r.what and "at a time" not in r.what),
            default=0.0)
    if mpi_row is not None:
        print(f"throughput {j:.0f} jobs/s {j / mpi_row.rate:.1f} x mpirun")
    else:
        print(f"throughput {j:.0f} jobs/s (no mpirun here: no ratio)")


if __name__ == "__main__":
    main()
