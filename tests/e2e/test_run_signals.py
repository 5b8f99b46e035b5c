"""``pydvm run`` and the signals a batch system or a terminal sends it.

SIGTERM and SIGHUP sent to a real ``pydvm run`` -- of a persistent DVM (the
blocking tool) and of a one-shot DVM (the master in the tool's own process)
-- whose job's processes ignore SIGTERM: the tool exits with 128 + the
signal within ``SIGNAL_EXIT`` (1 s) plus slack, well before the DVM's kill
grace (3 s) would have let it, and no process of the job is left once the
DVM has ended them.  SIGINT (Ctrl-C) waits for the job's end, as it always
did (so its report is whole), and a second one exits at once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from dvmkit import CMD_TIMEOUT, PYDVM, LineReader, pid_alive, wait_for

pytestmark = pytest.mark.e2e

#: What the exit may take beyond the tool's own bound (1 s), on a loaded machine.
SLACK = 1.5
#: The tool's bound: pydvm.cli.toolcommon.SIGNAL_EXIT.
SIGNAL_EXIT = 1.0
#: Bound on the DVM ending processes that ignore SIGTERM (kill grace 3 s + purge).
GONE_TIMEOUT = 20

#: Ignores SIGTERM (so does its sleep: an ignored signal stays ignored across exec).
JOB = 'trap "" TERM; echo "UP $$"; while :; do sleep 0.2; done'
#: Outlives SIGTERM too, but says when it got it (its sleep dies of it).
JOB_SAYS = 'trap "echo TERMED" TERM; echo "UP $$"; while :; do sleep 0.2; done'

SIGNALS = [signal.SIGTERM, signal.SIGHUP, signal.SIGINT]
#: After SIGINT the tool waits for the job: the kill grace (3 s) and slack.
SIGINT_BOUND = 15


def _start(dvm, tmp_path, one_shot: bool, n: int, job: str) -> subprocess.Popen:
    args = ["-n", str(n), "sh", "-c", job]
    if not one_shot:
        return dvm.run_bg(*args)
    env = dict(os.environ, PYDVM_STATE_DIR=str(tmp_path / "oneshot-state"))
    env.pop("PYDVM_URI", None)
    return subprocess.Popen(PYDVM + ["run", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("one_shot", [False, True], ids=["persistent", "one-shot"])
@pytest.mark.parametrize("sig", SIGNALS, ids=[s.name for s in SIGNALS])
def test_signal_ends_run_promptly_and_leaves_no_process(dvm, tmp_path, sig, one_shot):
    n = 2
    proc = _start(dvm, tmp_path, one_shot, n, JOB_SAYS if sig == signal.SIGINT else JOB)
    out = LineReader(proc.stdout)
    try:
        pids = []
        for _ in range(n):
            line = out.wait_line("UP ", timeout=CMD_TIMEOUT)
            out.lines.remove(line)
            pids.append(int(line.split()[1]))
        t0 = time.monotonic()
        proc.send_signal(sig)
        if sig == signal.SIGINT:
            # waits for the job (its processes outlive SIGTERM): a second
            # Ctrl-C, once they got their SIGTERM, exits at once
            out.wait_line("TERMED", timeout=SIGINT_BOUND)
            assert proc.poll() is None, "pydvm run did not wait for its job after SIGINT"
            t0 = time.monotonic()
            proc.send_signal(sig)
        try:
            rc = proc.wait(timeout=GONE_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"pydvm run still running {GONE_TIMEOUT}s after {sig.name}")
        took = time.monotonic() - t0
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    print(f"{'one-shot' if one_shot else 'persistent'} pydvm run exited {took:.2f}s "
          f"after {sig.name}")
    assert rc == 128 + sig, (rc, err)
    assert took < SIGNAL_EXIT + SLACK, f"exited {took:.2f}s after {sig.name}; stderr: {err}"
    wait_for(lambda: not any(pid_alive(p) for p in pids), timeout=GONE_TIMEOUT,
             what=f"the job's processes {pids} to be ended")
    if not one_shot:  # the DVM is still serving, and holds no trace of the job
        wait_for(lambda: len(dvm.cmd("ps").stdout.strip().splitlines()) <= 1,
                 timeout=GONE_TIMEOUT, what="the job to leave 'pydvm ps'")
        assert dvm.run("-n", "1", "true").returncode == 0
