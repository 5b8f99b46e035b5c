"""Instructions per data request, counted by valgrind: a figure that noise cannot move.

    python bench/store/instructions.py            # ~2 minutes
    python bench/store/instructions.py --quick    # fewer calls (~1 minute)

Timings on a shared VM drift by tens of percent from one run to the next;
instruction counts do not.  Two sides of a head-node request are counted,
each by difference between a run with N calls and one with N + CALLS, so
start-up costs cancel out:

* **client** -- one blocking ``pydvm.Client`` call (publish, lookup,
  unpublish) against a socket that already holds its answer: everything
  the client does for a call, its two system calls included (their
  user-space side; the kernel is not counted).
* **master** -- the master of a one-node DVM serving a one-rank job's
  publish + lookup + unpublish loop, per request (the mean of the three),
  with ``pydvm_master_poll_us`` 0 (a poll's turns depend on timing).

Prints a table, then ``instructions per head-node request: client X,
master Y``.  Needs valgrind (Debian: apt-get install valgrind).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PYDVM = [sys.executable, "-m", "pydvm"]
OPS = ("publish", "lookup", "unpublish")

#: The client side: Client wired to one end of a socketpair whose other end
#: has the answer written before each call.
CLIENT_PROG = r'''
import socket, sys, threading
from pydvm.client import direct as _direct
from pydvm.client.mux import Mux
from pydvm.client.data import Client
from pydvm.errors import UnreachableError
from pydvm.channel import BlockingChannel
from pydvm.wire import pack

op, n = sys.argv[1], int(sys.argv[2])
a, b = socket.socketpair()
c = Client.__new__(Client)
c.server, c.nspace, c.rank, c.node = "bench", "bench-ns", 0, "bench"
c._ch = BlockingChannel(a)
c._mux, c._dmux, c._opening = Mux(c._ch, UnreachableError), None, threading.Lock()
c._direct_info, c._direct_state = None, _direct.OFF
found = [["k", "tcp://127.0.0.1:1", "bench-ns", 0]]
answers = [pack({"t": "reply", "id": i, "status": 0, "msg": "",
                 **({"found": found} if op == "lookup" else {})}) for i in range(1, n + 1)]
call = {"publish": lambda: c.publish({"k": "tcp://127.0.0.1:1"}),
        "lookup": lambda: c.lookup(["k"]),
        "unpublish": lambda: c.unpublish(["k"])}[op]
for i in range(n):
    b.sendall(answers[i])
    call()
    b.recv(65536)
'''

#: The master side: a one-rank job's loop.
JOB_PROG = r'''
import sys
from pydvm import Client
n = int(sys.argv[1])
with Client() as c:
    for i in range(10):
        c.publish({f"held-{i}": "x"})
    for i in range(n):
        k = f"probe-{i}"
        c.publish({k: "tcp://127.0.0.1:1"})
        c.lookup([k])
        c.unpublish([k])
'''

#: The client side's loop alone, to subtract: the harness's own send/recv.
HARNESS_PROG = r'''
import socket, sys
n = int(sys.argv[2])
a, b = socket.socketpair()
for i in range(n):
    b.sendall(b"x" * 40)
    a.recv(65536)
    a.sendall(b"y" * 60)
    b.recv(65536)
'''


def _total(out_file: Path) -> int:
    for line in out_file.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError(f"no instruction total in {out_file}")


def _under_callgrind(argv: list[str], out: Path) -> list[str]:
    return ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *argv]


def _callgrind(argv: list[str], out: Path) -> int:
    p = subprocess.run(_under_callgrind(argv, out), capture_output=True, text=True,
                       timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"valgrind {argv[:3]} failed: {p.stderr[-2000:]}")
    return _total(out)


def client_side(tmp: Path, base: int, calls: int) -> dict[str, float]:
    prog, harness = tmp / "client_prog.py", tmp / "harness_prog.py"
    prog.write_text(CLIENT_PROG)
    harness.write_text(HARNESS_PROG)
    out = {}
    for name, script in [(op, prog) for op in OPS] + [("harness", harness)]:
        op = name if name != "harness" else "publish"
        a = _callgrind([sys.executable, str(script), op, str(base)], tmp / "cg.a")
        b = _callgrind([sys.executable, str(script), op, str(base + calls)], tmp / "cg.b")
        out[name] = (b - a) / calls
    harness_cost = out.pop("harness")
    return {op: v - harness_cost for op, v in out.items()}


def master_side(tmp: Path, base: int, calls: int) -> float:
    job = tmp / "job_prog.py"
    job.write_text(JOB_PROG)
    env = dict(os.environ)
    env["PRTE_MCA_pydvm_master_poll_us"] = "0"
    env.pop("PYDVM_URI", None)
    host = socket.gethostname()
    totals = []
    for n in (base, base + calls):
        env["PYDVM_STATE_DIR"] = str(tmp / f"state-{n}")
        out = tmp / f"master-{n}.cg"
        uri_file = tmp / f"uri-{n}"
        with open(uri_file, "w") as uf:
            master = subprocess.Popen(
                _under_callgrind(PYDVM + ["start", "--hosts", f"{host}:2"], out),
                stdout=uf, stderr=subprocess.DEVNULL, env=env)
        try:
            deadline = time.monotonic() + 300
            while not uri_file.read_text().strip():
                if master.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the master under valgrind did not start")
                time.sleep(0.5)
            uri = uri_file.read_text().split()[0]
            p = subprocess.run(PYDVM + ["run", "--dvm", uri, "--host", f"{host}:1", "-n", "1",
                                        sys.executable, str(job), str(n)],
                               env=env, capture_output=True, text=True, timeout=1800)
            if p.returncode != 0:
                raise RuntimeError(f"pydvm run failed: {p.stderr[-2000:]}")
            subprocess.run(PYDVM + ["stop", "--dvm", uri], env=env, capture_output=True,
                           timeout=300)
            master.wait(timeout=300)
        finally:
            if master.poll() is None:
                master.kill()
                master.wait()
        # The master forks a guardian (its own, smaller file): the largest is the master's.
        files = sorted(tmp.glob(f"master-{n}.cg*"), key=lambda f: f.stat().st_size)
        totals.append(_total(files[-1]))
    return (totals[1] - totals[0]) / (3 * calls)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if not shutil.which("valgrind"):
        print("needs valgrind (apt-get install valgrind)", file=sys.stderr)
        return 2
    calls = 300 if a.quick else 1000
    tmp = Path(tempfile.mkdtemp(prefix="pydvm-instr-"))
    try:
        client = client_side(tmp, 100, calls)
        master = master_side(tmp, 100, calls)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("| side | operation | instructions per call |")
    print("|---|---|---|")
    for op in OPS:
        print(f"| client | {op} | {client[op]:,.0f} |")
    print(f"| master | publish + lookup + unpublish, per request | {master:,.0f} |")
    mean_client = sum(client.values()) / len(client)
    print(f"\ninstructions per head-node request: client {mean_client:,.0f}, "
          f"master {master:,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
