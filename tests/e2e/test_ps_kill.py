"""Jobs you can see and stop (issue 11): ``pydvm ps`` and ``pydvm kill``."""

from __future__ import annotations

import getpass
import json
import os
import sys

import pytest

from dvmkit import LineReader, finish, pid_alive, wait_for

pytestmark = pytest.mark.e2e

HOLD = ("import os, time; print('UP', os.environ['PYDVM_NSPACE'], os.getpid(), flush=True); "
        "time.sleep(120)")


def _hold(dvm, *args):
    """A running job (`args` before the command); returns (run, nspace, pids seen so far)."""
    bg = dvm.run_bg(*args, sys.executable, "-c", HOLD)
    out = LineReader(bg.stdout)
    first = out.wait_line("UP ", timeout=30).split()
    return bg, first[1], out


def _stop(bg):
    if bg.poll() is None:
        bg.kill()
        bg.wait(10)


def test_ps_lists_each_job_with_user_apps_ranks_per_node_state_and_start(dvm):
    """An MPMD job (2 ranks on a:2, 1 on c) shows up with its namespace, user, apps and layout."""
    bg, ns, out = _hold(dvm, "--host", "a:2", "-n", "2", sys.executable, "-c", HOLD, ":",
                        "--host", "c", "-n", "1")
    try:
        wait_for(lambda: len([ln for ln in out.lines if ln.startswith("UP ")]) == 3,
                 timeout=30, what="all three ranks up")
        p = dvm.cmd("ps", check=True)
        header, *rows = p.stdout.splitlines()
        assert header.split() == ["NSPACE", "USER", "SESSION", "STATE", "STARTED", "RANKS",
                                  "APPS"]
        (row,) = [r for r in rows if r.startswith(ns + " ")]
        assert f" {getpass.getuser()} " in row and " running " in row, row
        assert " a:2,c:1 " in row, row
        assert row.endswith(f"-n 2 {sys.executable} -c {json.dumps(HOLD)} : "
                            f"-n 1 {sys.executable} -c {json.dumps(HOLD)}"), row

        j = json.loads(dvm.cmd("ps", "--json", check=True).stdout)
        (job,) = [x for x in j["jobs"] if x["nspace"] == ns]
        assert job["uid"] == os.getuid() and job["session"] == 0 and job["state"] == "running"
        assert job["ranks_per_node"] == {"a": 2, "c": 1} and job["procs"] == 3
        assert [a["n"] for a in job["apps"]] == [2, 1] and job["started"] > 0
    finally:
        dvm.cmd("kill", ns)
        finish(bg, 30)
        _stop(bg)
    # A job that ended is no longer listed.
    assert ns not in dvm.cmd("ps", check=True).stdout


def test_kill_ends_the_job_returns_once_it_ended_and_leaves_others_running(dvm):
    """`pydvm kill NS`: NS's processes are gone when kill returns; another job runs on."""
    bg1, ns1, out1 = _hold(dvm, "--host", "a", "-n", "1")
    bg2, ns2, out2 = _hold(dvm, "--host", "b", "-n", "1")
    try:
        pid1 = int(out1.wait_line("UP ").split()[2])
        pid2 = int(out2.wait_line("UP ").split()[2])
        k = dvm.cmd("kill", ns1)
        assert k.returncode == 0 and k.stdout == "" and k.stderr == "", k
        assert not pid_alive(pid1), "pydvm kill returned before the job's process was gone"
        assert ns1 not in dvm.cmd("ps", check=True).stdout
        assert finish(bg1, 30) == 143
        assert pid_alive(pid2) and bg2.poll() is None
        assert ns2 in dvm.cmd("ps", check=True).stdout
    finally:
        dvm.cmd("kill", ns2)
        finish(bg2, 30)
        _stop(bg1)
        _stop(bg2)


def test_kill_of_an_unknown_job_exits_1_naming_it_and_harms_nothing(dvm):
    """`pydvm kill nosuch@1`: exit 1 with PMIX_ERR_NOT_FOUND naming it; the DVM runs jobs."""
    p = dvm.cmd("kill", "pydvm-nosuch@1")
    assert p.returncode == 1
    assert "PMIX_ERR_NOT_FOUND" in p.stderr and "pydvm-nosuch@1" in p.stderr, p.stderr
    assert dvm.run("-n", "1", "true").returncode == 0


def test_kill_without_a_namespace_is_a_usage_error(dvm):
    """`pydvm kill` alone: exit 2 and a usage line."""
    p = dvm.cmd("kill")
    assert p.returncode == 2 and "usage: pydvm kill" in p.stderr, p.stderr
