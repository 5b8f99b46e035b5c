"""A failing job says why (issue 11): each failed process on stderr, and who ended a job.

``pydvm run`` reports every process that failed on its own -- its rank, its
node, and its exit status or the signal that killed it -- one line each, as
``mpirun`` does; a job ended from outside (``pydvm kill``, ``session end``,
``stop``, ``--abort-on-failure``) is reported once, naming who ended it.
"""

from __future__ import annotations

import re
import sys

import pytest

from dvmkit import LineReader, finish, wait_for

pytestmark = pytest.mark.e2e

FAILED = re.compile(r"^pydvm run: process \[(?P<ns>pydvm-\w+@\d+),(?P<rank>\d+)\] on node "
                    r"(?P<node>\w+) (?P<how>exited with status \d+|was killed by signal \w+ \(\d+\))$")


def _failures(stderr: str) -> dict[int, tuple[str, str]]:
    """rank -> (node, how) for every per-process failure line on stderr."""
    out = {}
    for ln in stderr.splitlines():
        m = FAILED.match(ln)
        if m:
            out[int(m["rank"])] = (m["node"], m["how"])
    return out


def test_each_failed_process_is_reported_with_rank_node_and_exit_status(dvm):
    """`-n 3 sh -c 'exit $((PYDVM_RANK+5))'`: three lines naming rank, node and status (5, 6, 7)."""
    p = dvm.run("-n", "3", "sh", "-c", "exit $((PYDVM_RANK+5))")
    assert p.returncode in (5, 6, 7), p.stderr
    got = _failures(p.stderr)
    assert got == {0: ("a", "exited with status 5"), 1: ("b", "exited with status 6"),
                   2: ("c", "exited with status 7")}, p.stderr
    # The job's exit status is the first failure's, and stderr says which that was.
    first = [ln for ln in p.stderr.splitlines() if "the first to fail" in ln]
    assert len(first) == 1 and f"status {p.returncode}" in first[0], p.stderr


def test_a_process_killed_by_a_signal_is_reported_with_the_signal_name(dvm):
    """A process that kills itself with SIGKILL: `was killed by signal SIGKILL (9)`, exit 137."""
    p = dvm.run("--host", "b", "-n", "1", "sh", "-c", "kill -9 $$")
    assert p.returncode == 137, p.stderr
    assert _failures(p.stderr) == {0: ("b", "was killed by signal SIGKILL (9)")}, p.stderr


def test_a_successful_job_prints_nothing_on_stderr(dvm):
    """Reporting adds nothing when every process exits 0."""
    p = dvm.run("-n", "3", "true")
    assert p.returncode == 0 and p.stderr == "", p.stderr


def test_a_failing_process_does_not_abort_its_siblings_by_default(dvm, tmp_path):
    """Rank 0 fails at once; rank 1 goes on to finish its work (SPEC: no abort by default)."""
    done = tmp_path / "done"
    p = dvm.run("--host", "a,b", "-n", "2", "sh", "-c",
                f'if [ $PYDVM_RANK = 0 ]; then exit 3; fi; sleep 1; touch {done}')
    assert p.returncode == 3, p.stderr
    assert done.exists(), "rank 1 was killed although --abort-on-failure was not given"
    assert set(_failures(p.stderr)) == {0}, p.stderr


def test_abort_on_failure_kills_the_rest_at_the_first_failure_and_says_so(dvm, tmp_path):
    """`--abort-on-failure`: rank 0 exits 4, rank 1 (sleeping) is killed; run exits 4 promptly."""
    p = dvm.run("--abort-on-failure", "--host", "a,b", "-n", "2", "sh", "-c",
                'if [ $PYDVM_RANK = 0 ]; then exit 4; fi; exec sleep 60', timeout=40)
    assert p.returncode == 4, p.stderr
    assert _failures(p.stderr) == {0: ("a", "exited with status 4")}, p.stderr
    assert re.search(r"--abort-on-failure.*1 other process was killed", p.stderr), p.stderr


def _start_long_job(dvm, *extra):
    bg = dvm.run_bg(*extra, "-n", "2", sys.executable, "-c",
                    "import os, time; print('UP', os.environ['PYDVM_NSPACE'], flush=True); "
                    "time.sleep(120)")
    out = LineReader(bg.stdout)
    line = out.wait_line("UP ", timeout=30)
    return bg, line.split()[1]


def test_a_job_ended_by_pydvm_kill_says_it_was_killed_by_pydvm_kill(dvm):
    """`pydvm kill NS` ends a running job; its `pydvm run` names `pydvm kill` on stderr."""
    bg, ns = _start_long_job(dvm)
    try:
        k = dvm.cmd("kill", ns)
        assert k.returncode == 0, k.stderr
        rc = finish(bg, 30)
    finally:
        if bg.poll() is None:
            bg.kill()
            bg.wait(10)
    err = bg.stderr.read()
    assert rc == 128 + 15, err
    assert re.search(rf"^pydvm run: {re.escape(ns)}: killed by 'pydvm kill'", err, re.M), err
    assert err.rstrip().endswith("; 2 processes were killed"), err
    assert _failures(err) == {}, err  # killed processes are not reported one by one


def test_a_job_ended_by_session_end_says_which_session_was_ended(dvm):
    """A job in session S, then `pydvm session end S`: its run names the session end."""
    sid = dvm.cmd("session", "new", check=True).stdout.strip()
    bg, ns = _start_long_job(dvm, "--session", sid)
    try:
        e = dvm.cmd("session", "end", sid)
        assert e.returncode == 0, e.stderr
        finish(bg, 30)
    finally:
        if bg.poll() is None:
            bg.kill()
            bg.wait(10)
    err = bg.stderr.read()
    assert re.search(rf"^pydvm run: {re.escape(ns)}: killed because session {sid} was ended "
                     r"\('pydvm session end'\)", err, re.M), err


def test_a_job_ended_by_stop_says_the_dvm_was_stopped(tmp_path):
    """`pydvm stop` while a job runs: its run says the DVM was stopped."""
    from dvmkit import start_dvm

    dvm = start_dvm(tmp_path)
    try:
        bg, ns = _start_long_job(dvm)
        try:
            s = dvm.cmd("stop")
            assert s.returncode == 0, s.stderr
            finish(bg, 30)
        finally:
            if bg.poll() is None:
                bg.kill()
                bg.wait(10)
    finally:
        dvm.stop()
    err = bg.stderr.read()
    assert re.search(rf"^pydvm run: {re.escape(ns)}: killed because the DVM was stopped "
                     r"\('pydvm stop'\)", err, re.M), err


def test_ctrl_c_on_run_prints_no_kill_report(dvm):
    """The run's own Ctrl-C ends the job quietly (exit 130), as before."""
    import os
    import signal

    bg, ns = _start_long_job(dvm)
    try:
        os.kill(bg.pid, signal.SIGINT)
        rc = finish(bg, 30)
    finally:
        if bg.poll() is None:
            bg.kill()
            bg.wait(10)
    assert rc == 130
    err = bg.stderr.read()
    assert "killed" not in err and _failures(err) == {}, err
    wait_for(lambda: ns not in dvm.cmd("ps").stdout, timeout=20, what=f"{ns} to leave ps")
