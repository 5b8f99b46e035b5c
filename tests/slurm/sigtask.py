"""A long-lived Slurm task that records what happens to it.

Run as ``python sigtask.py LOGDIR [--stdin]``: appends to ``LOGDIR/<node>.log``
(node from ``SLURMD_NODENAME``) one line per event, ``<time> <event> ...``:
``start pid=P step=J.S``, ``stdin <line>`` (with ``--stdin``: one line read
first), ``signal <NAME>`` for every catchable signal it gets (it ignores
them all and keeps running, so only SIGKILL ends it).
"""

import os
import signal
import sys
import time

logdir = sys.argv[1]
node = os.environ.get("SLURMD_NODENAME", "unknown")
path = os.path.join(logdir, f"{node}.log")


def note(text: str) -> None:
    with open(path, "a") as f:
        f.write(f"{time.time():.6f} {text}\n")


def on_signal(num, frame) -> None:
    note(f"signal {signal.Signals(num).name}")


for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCONT, signal.SIGUSR1,
            signal.SIGUSR2, signal.SIGQUIT):
    signal.signal(sig, on_signal)
note(f"start pid={os.getpid()} step={os.environ.get('SLURM_JOB_ID')}."
     f"{os.environ.get('SLURM_STEP_ID')}")
if "--stdin" in sys.argv:
    note(f"stdin {sys.stdin.readline().strip()}")
while True:
    time.sleep(0.05)
