"""PMIx requests of another user on a multi-user DVM: through that user's own PMIx server.

    sudo python bench/pmix/pmix_users.py [--iters 2000] [--rounds 4]

On a root-started ``pydvm start --multi-user`` DVM (one node, the head
node), the C client of bench/pmix/pmix.py (``pmix_bench_client``: holds 10
names, then times PMIx_Publish of fresh names and PMIx_Lookup of held ones)
runs as root -- served by the node's own libpmix server, inside the master
process, answered in libpmix's upcall -- and as a throw-away user, whose
processes connect to a PMIx server of that user's own (an agent process
running as the user, relaying each upcall to the node over a socket pair:
runtime/pmixhost/users.py).  The two alternate, ``--rounds`` client runs each,
samples pooled; medians are compared.

Prints a table and, last, ``users ratio R``: the other user's median over
the owner's, worst operation.  Needs root, useradd/userdel, runuser, gcc,
libpmix and a system Python with venv (other users cannot run an
interpreter under /root); the DVM runs from a venv made here.
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from pmix import samples  # noqa: E402

USER = "pdvmbench"
SYSTEM_PYTHON = "/usr/bin/python3"
RUNUSER = shutil.which("runuser") or "/usr/sbin/runuser"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=4)
    a = ap.parse_args()
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("runuser"):
        print("needs root, useradd and runuser", file=sys.stderr)
        return 2
    base = Path(tempfile.mkdtemp(prefix="pydvm-bench-users-"))
    os.chmod(base, 0o755)
    made_user = False
    uri = None
    try:
        venv = base / "venv"
        subprocess.run([SYSTEM_PYTHON, "-m", "venv", str(venv)], check=True, timeout=300)
        src = base / "src"
        shutil.copytree(HERE.parents[1], src, ignore=shutil.ignore_patterns(
            ".venv", ".git", "__pycache__", "*.egg-info", "build"))
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(src)], check=True,
                       timeout=600)
        flags = subprocess.run(["pkg-config", "--cflags", "--libs", "pmix"], check=True,
                               capture_output=True, text=True).stdout.split()
        exe = base / "pmix_bench_client"
        subprocess.run(["gcc", "-O2", "-o", str(exe), str(HERE / "pmix_bench_client.c"),
                        *flags], check=True)
        for d, _, _ in os.walk(base):
            os.chmod(d, 0o755)
        os.chmod(exe, 0o755)
        try:
            pwd.getpwnam(USER)
        except KeyError:
            subprocess.run(["useradd", "-M", "-s", "/bin/sh", USER], check=True, timeout=30)
            made_user = True
        python = str(venv / "bin" / "python")
        env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8",
               "PYDVM_STATE_DIR": str(base / "state")}
        # the owner's jobs on the node's own server (in the master): the
        # fastest path, which another user's server process is measured against
        p = subprocess.run([python, "-m", "pydvm", "start", "--daemonize", "--multi-user",
                            "--mca", "pydvm_pmix_isolate", "off"],
                           env=env, capture_output=True, text=True, timeout=120, cwd="/tmp")
        if p.returncode != 0:
            print(p.stderr, file=sys.stderr)
            return 1
        uri = p.stdout.strip()
        run_env = {k: v for k, v in env.items() if k != "PYDVM_STATE_DIR"}
        run_env["PYDVM_URI"] = uri

        def client(user: str | None, n: int) -> dict:
            cmd = [python, "-m", "pydvm", "run", "--pmix", "-n", "1", str(exe), "10", str(n)]
            if user is not None:
                cmd = [RUNUSER, "-u", user, "--", "env",
                       *[f"{k}={v}" for k, v in run_env.items()], *cmd]
            r = subprocess.run(cmd, env=run_env, capture_output=True, text=True, timeout=1800,
                               cwd="/tmp")
            if r.returncode != 0 or r.stderr:
                raise SystemExit(f"run as {user or 'root'} failed ({r.returncode}): "
                                 f"{r.stderr[-2000:]}")
            return samples(r.stdout)

        owner: dict = {"publish": [], "lookup": []}
        other: dict = {"publish": [], "lookup": []}
        client(USER, 50)  # the user's PMIx server starts at the user's first job
        rounds = max(1, a.rounds)
        for r in range(rounds):
            n = a.iters // rounds + (1 if r < a.iters % rounds else 0)
            for side, user in ((owner, None), (other, USER)):
                got = client(user, n)
                for op in side:
                    side[op] += got[op]
    finally:
        if uri is not None:
            subprocess.run([str(base / "venv" / "bin" / "python"), "-m", "pydvm", "stop",
                            "--dvm", uri], capture_output=True, timeout=120, cwd="/tmp")
        if made_user:
            subprocess.run(["pkill", "-KILL", "-u", USER], capture_output=True, timeout=30)
            subprocess.run(["userdel", USER], capture_output=True, timeout=30)
        shutil.rmtree(base, ignore_errors=True)
    print(f"# {a.iters} samples per operation and side, {rounds} alternating rounds; medians")
    print("| operation (10 names held) | DVM owner (root) µs | another user µs | ratio |")
    print("|---|---|---|---|")
    worst = 0.0
    for op in ("publish", "lookup"):
        om, xm = statistics.median(owner[op]), statistics.median(other[op])
        worst = max(worst, xm / om)
        print(f"| {op} | {om:.1f} | {xm:.1f} | {xm / om:.2f} |")
    print(f"users ratio R {worst:.2f} (another user's PMIx request through its own server "
          "over the owner's, worst operation)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
