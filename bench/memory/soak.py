"""Soak: a DVM that runs many jobs ends holding only what the retention rules keep.

    python bench/memory/soak.py              # 1,000 jobs (a few minutes)
    python bench/memory/soak.py --jobs 150   # the size the test suite runs

One persistent DVM (daemons ``a`` and ``b``) runs the jobs one after
another (see ``soak_job.py`` for what each job publishes): items of every
lifetime, a first-read handover from each job to the next, an INDEF item
every tenth job, a session opened and ended every hundred jobs (with ten
jobs publishing SESSION items in it), an extra application on node ``b``
every fifth job, and a failing job (exit 3) every 97th.

At the end every store must hold exactly the INDEF items and the one unread
first-read token (the last job's), nothing parked; the master's records
(``pydvm info`` ``records``) must be back to what an idle DVM holds; and the
master's RSS must be within 10 % of its value after the first 100 jobs.

Prints a row every ``--every`` jobs and a final summary line starting with
``soak:``; exits 1 if a check failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PYDVM = [sys.executable, "-m", "pydvm"]
JOB = [sys.executable, str(HERE / "soak_job.py")]
#: Records an idle DVM holds: its default session, and the soak's own tool connection.
IDLE_RECORDS = {"jobs": 0, "job_waiters": 0, "job_tools": 0, "sessions": 1,
                "session_history": 0, "caller_cache": 0}


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def _drive(uri: str, jobs: int, every: int, rows: list, env: dict) -> dict:
    from pydvm.cli.tool import open_tool, resolve_uri

    ch = await open_tool(resolve_uri(uri))
    info = await ch.call({"t": "info"})
    master_pid, daemons = info["pid"], info["daemon_pids"]
    t0 = time.monotonic()
    session = None
    failures = []
    rss_100 = None
    base_env = {**env, "PYDVM_URI": uri}
    for i in range(jobs):
        if i % 100 == 50:
            r = await ch.call({"t": "session_new", "hosts": None})
            session = r["session"]
        in_session = session is not None and 50 <= i % 100 < 60
        argv = JOB + [str(i)] + (["session"] if in_session else [])
        apps = [{"argv": argv, "n": 1, "hosts": [["a", 1]]}]
        if i % 5 == 0:
            apps.append({"argv": ["sh", "-c", "exit 0"], "n": 1, "hosts": [["b", 1]]})
        r = await ch.call({"t": "run", "apps": apps, "session": session if in_session else None,
                           "env": base_env, "cwd": "/"})
        want = 3 if i % 97 == 0 else 0
        if r.get("status") != 0 or r.get("exit") != want:
            failures.append(f"job {i}: status {r.get('status')} exit {r.get('exit')} "
                            f"(wanted {want}) {r.get('msg') or ''}")
        if i % 100 == 59 and session is not None:
            await ch.call({"t": "session_end", "session": session})
            session = None
        done = i + 1
        if done == 100:
            rss_100 = rss_mib(master_pid)
        if done % every == 0 or done == jobs:
            info = await ch.call({"t": "info"})
            st = await ch.call({"t": "store"})
            master = next(s for s in st["stores"] if s["store"] == "master")
            rows.append((done, time.monotonic() - t0, rss_mib(master_pid),
                         max(rss_mib(p) for p in daemons.values()), master["items"],
                         info["records"]["jobs"], info["records"]["sessions"],
                         info["records"]["session_history"]))
            print("%6d %8.1f %12.1f %12.1f %8d %6d %9d %8d" % rows[-1], flush=True)
    info = await ch.call({"t": "info"})
    st = await ch.call({"t": "store"})
    ch.close("done")
    return {"failures": failures, "records": info["records"], "stores": st["stores"],
            "rss_100": rss_100, "rss_end": rss_mib(master_pid), "seconds": time.monotonic() - t0}


def soak(jobs: int = 1000, every: int = 100, workdir: str | None = None) -> dict:
    """Run the soak; returns the figures and ``problems`` (empty when all checks pass)."""
    tmp = Path(workdir or tempfile.mkdtemp(prefix="pydvm-soak-"))
    env = dict(os.environ)
    env["PYDVM_STATE_DIR"] = str(tmp / "state")
    env.pop("PYDVM_URI", None)
    p = subprocess.run(PYDVM + ["start", "--daemonize", "--hosts", "a,b", "--log-dir",
                                str(tmp / "logs")], env=env, capture_output=True, text=True,
                       timeout=120)
    if p.returncode != 0:
        raise RuntimeError(f"pydvm start failed: {p.stderr}")
    uri = p.stdout.strip()
    rows: list = []
    print("%6s %8s %12s %12s %8s %6s %9s %8s" % ("jobs", "seconds", "master MiB",
                                                 "daemon MiB", "items", "jobs", "sessions",
                                                 "history"), flush=True)
    try:
        from pydvm.cli import run_async

        old = os.environ.get("PYDVM_STATE_DIR")
        os.environ["PYDVM_STATE_DIR"] = env["PYDVM_STATE_DIR"]
        try:
            out = run_async(_drive(uri, jobs, every, rows, env))
        finally:
            if old is None:
                os.environ.pop("PYDVM_STATE_DIR", None)
            else:
                os.environ["PYDVM_STATE_DIR"] = old
    finally:
        subprocess.run(PYDVM + ["stop", "--dvm", uri], env=env, capture_output=True,
                       timeout=120)
    expected_master = len(range(0, jobs, 10)) + 1  # INDEF items + the last unread token
    problems = list(out["failures"])
    for s in out["stores"]:
        want = expected_master if s["store"] == "master" else 0
        if s.get("items") != want or s.get("parked") != 0:
            problems.append(f"store {s['store']}: {s.get('items')} items, {s.get('parked')} "
                            f"parked (expected {want} and 0)")
    for k, v in IDLE_RECORDS.items():
        if out["records"].get(k) != v:
            problems.append(f"master records: {k}={out['records'].get(k)} (idle DVM: {v})")
    growth = None
    if out["rss_100"]:
        growth = (out["rss_end"] - out["rss_100"]) / out["rss_100"]
        if growth > 0.10:
            problems.append(f"master RSS grew {growth:+.1%} after the first 100 jobs")
    out.update(rows=rows, problems=problems, growth=growth, expected_master=expected_master)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--every", type=int, default=100)
    a = ap.parse_args()
    out = soak(a.jobs, a.every)
    for p in out["problems"]:
        print("PROBLEM:", p)
    growth = f"{out['growth']:+.1%}" if out["growth"] is not None else "n/a"
    rss100 = f"{out['rss_100']:.1f}" if out["rss_100"] else "n/a"
    print(f"soak: {a.jobs} jobs in {out['seconds']:.0f}s; master RSS {rss100} MiB after 100 "
          f"-> {out['rss_end']:.1f} MiB at the end ({growth}); stores hold "
          f"{out['expected_master']} INDEF/unread items as expected: "
          f"{'yes' if not any('store' in p for p in out['problems']) else 'NO'}; records "
          f"{json.dumps(out['records'])}; {'OK' if not out['problems'] else 'FAILED'}")
    return 0 if not out["problems"] else 1


if __name__ == "__main__":
    sys.exit(main())
