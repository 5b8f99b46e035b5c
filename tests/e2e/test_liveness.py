"""Nothing outlives what it is tied to: connections, processes, sockets, waits, buffers.

Issue 8 of the tracker, items 3, 4, 6, 8 and 9, each against real DVMs with
local daemons.  Every test here failed on the code before that issue.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from dvmkit import (PYDVM, LineReader, finish, job_script, pid_alive, start_dvm, status,
                    wait_for)

pytestmark = pytest.mark.e2e


def _socket_dirs(dvm) -> list[Path]:
    base = Path(tempfile.gettempdir()) / f"pydvm-{os.getuid()}"
    dvmid = dvm.uri.rsplit("/", 1)[1]
    return sorted(base.glob(f"{dvmid}-*")) if base.is_dir() else []


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


# ---------------------------------------------------------------------------
# item 3: a connection acts for a process only while that process lives
# ---------------------------------------------------------------------------


def test_a_lingering_child_cannot_act_for_its_reaped_process(dvm, tmp_path):
    """Issue 8.3: rank 0 exits leaving a connected child; after the reap the child's
    held connection is closed (UNREACH), a new hello is refused (NO_PERMISSIONS),
    and nothing it tried is stored -- while the job itself still runs."""
    go, report = tmp_path / "go", tmp_path / "child.out"
    job = dvm.run_bg("--host", "a", "-n", "1", *job_script("lingering_child"), str(go),
                     str(report), ":", "--host", "b", "-n", "1", "sh", "-c",
                     f'while [ ! -e "{go}.done" ]; do sleep 0.05; done')
    reader = LineReader(job.stdout)
    try:
        parent = int(reader.wait_line("PARENT EXITING").split()[2])
        wait_for(lambda: not pid_alive(parent), what="rank 0 to exit")
        time.sleep(1.0)  # generous: the daemon reaps and closes its connections
        go.touch()
        got = wait_for(lambda: report.exists() and report.read_text().count("\n") == 2
                       and report.read_text(), what="the child's two attempts")
        assert "HELD PMIX_ERR_UNREACH" in got, got
        assert "NEW PMIX_ERR_NO_PERMISSIONS" in got, got
        keys = dvm.store()["master"]["keys"]
        assert not any(k.startswith("late-") for k in keys), keys
    finally:
        Path(f"{go}.done").touch()
        finish(job)


def test_lingering_children_are_ended_with_their_job(dvm, tmp_path):
    """Issue 8.3/8.4: a background child left by a job process dies when the job
    ends on its node (as a resource manager ends a step), even with its output
    detached."""
    p = dvm.run("--host", "b", "-n", "1", "sh", "-c",
                "sleep 300 >/dev/null 2>&1 </dev/null & echo CHILD $!")
    assert p.returncode == 0, p.stderr
    child = int(p.stdout.split()[1])
    wait_for(lambda: not pid_alive(child), timeout=10, what="the lingering child to be killed")


def test_a_job_ends_even_if_a_child_keeps_its_output_open(dvm):
    """A child holding the job's stdout does not keep its process 'running':
    the exit is reported after a short idle wait, and the job ends."""
    t0 = time.monotonic()
    p = dvm.run("--host", "a", "-n", "1", "sh", "-c", "sleep 300 & echo STARTED", timeout=30)
    assert p.returncode == 0, p.stderr
    assert "STARTED" in p.stdout
    assert time.monotonic() - t0 < 20


# ---------------------------------------------------------------------------
# item 4: no orphans
# ---------------------------------------------------------------------------


def test_sigkilled_daemon_takes_its_job_processes_and_their_children_along(dvm):
    """Issue 8.4: kill -9 of node b's daemon mid-job: the job process, its own
    child (same process group) and b's socket directory are all gone soon after."""
    job = dvm.run_bg("--host", "b", "-n", "1", "sh", "-c",
                     'sleep 300 & echo PIDS $$ $!; wait')
    reader = LineReader(job.stdout)
    try:
        _, sh_pid, sleep_pid = reader.wait_line("PIDS").split()
        pids = [int(sh_pid), int(sleep_pid)]
        b_dirs = [d for d in _socket_dirs(dvm) if f"-b-" in d.name]
        assert len(b_dirs) == 1, b_dirs
        os.kill(dvm.daemon_pids["b"], signal.SIGKILL)
        wait_for(lambda: not any(pid_alive(p) for p in pids), timeout=10,
                 what="the job process and its child to die with their daemon")
        wait_for(lambda: not b_dirs[0].exists(), timeout=10,
                 what="the dead daemon's socket directory to go")
    finally:
        finish(job)


def _children(pid: int) -> list[int]:
    kids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(d.name))
    return kids


def test_a_process_that_left_its_group_dies_with_its_daemon_too(dvm):
    """kill -9 of node b's daemon: a job process's child that made a session
    of its own (``setsid``: no group kill, no parent-death signal reaches
    it) still dies -- the guardian also ends whatever carries the node's
    client socket in its environment."""
    job = dvm.run_bg("--host", "b", "-n", "1", "sh", "-c",
                     'setsid sleep 300 & echo PIDS $$ $!; wait')
    reader = LineReader(job.stdout)
    try:
        _, sh_pid, away = reader.wait_line("PIDS").split()
        wait_for(lambda: os.getsid(int(away)) == int(away),
                 what="the child to be in a session of its own")
        os.kill(dvm.daemon_pids["b"], signal.SIGKILL)
        wait_for(lambda: not pid_alive(int(sh_pid)) and not pid_alive(int(away)), timeout=10,
                 what="the job process and the child that left its group to die")
    finally:
        finish(job)


def test_a_job_process_dies_with_its_daemon_even_without_the_guardian(make_dvm):
    """With ``pydvm_death_signal on``, the parent-death signal alone ends a
    job process whose daemon is killed with SIGKILL: here node b's guardian
    is killed first, so nothing else can.  (Its own children are the
    guardian's part: they live on.)"""
    dvm = make_dvm("a,b", pydvm_death_signal="on")
    job = dvm.run_bg("--host", "b", "-n", "1", "sh", "-c", 'echo PID $$; exec sleep 300')
    reader = LineReader(job.stdout)
    try:
        pid = int(reader.wait_line("PID").split()[1])
        daemon = dvm.daemon_pids["b"]
        guardians = [k for k in _children(daemon) if k != pid
                     and os.readlink(f"/proc/{k}/exe") == os.readlink(f"/proc/{daemon}/exe")
                     and b"pmixagent" not in open(f"/proc/{k}/cmdline", "rb").read()]
        assert len(guardians) == 1, guardians
        os.kill(guardians[0], signal.SIGKILL)
        wait_for(lambda: not pid_alive(guardians[0]), what="the guardian to die")
        assert pid_alive(pid)
        os.kill(daemon, signal.SIGKILL)
        wait_for(lambda: not pid_alive(pid), timeout=10,
                 what="the job process to die with its daemon")
    finally:
        finish(job)


def test_sigkilled_master_leaves_no_daemon_and_no_job_process(tmp_path):
    """Issue 8.4: kill -9 of the master: every daemon and job process is gone
    within a bounded time (the link drops; the heartbeat would catch a silent one)."""
    dvm = start_dvm(tmp_path, "a,b", {"pydvm_heartbeat_interval": "0.5"})
    job = dvm.run_bg("-n", "2", "sh", "-c", 'sleep 300 & echo PIDS $$ $!; wait')
    reader = LineReader(job.stdout)
    try:
        wait_for(lambda: len([ln for ln in reader.lines if ln.startswith("PIDS")]) == 2,
                 what="both ranks to start")
        pids = [int(x) for ln in reader.lines if ln.startswith("PIDS") for x in ln.split()[1:]]
        daemons = list(dvm.daemon_pids.values())
        os.kill(dvm.pid, signal.SIGKILL)
        wait_for(lambda: not any(pid_alive(p) for p in pids + daemons), timeout=15,
                 what="daemons and job processes to exit after the master died")
        assert not _socket_dirs(dvm)
    finally:
        finish(job)
        dvm.stop()


def test_a_new_daemon_removes_socket_directories_of_dead_dvms(dvm, tmp_path):
    """Issue 8.4: a socket directory whose daemon died with its guardian (nothing
    could clean up) is removed by the next daemon that starts on the machine."""
    base = Path(tempfile.gettempdir()) / f"pydvm-{os.getuid()}"
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = base / "deadbeef-x-stale"
    stale.mkdir(parents=True)
    (stale / "owner").write_text(f"{dead.pid} 12345")
    (stale / "client.sock").write_text("")
    young = base / "deadbeef-y-young"  # no owner file yet, and recent: left alone
    young.mkdir()
    try:
        (tmp_path / "second").mkdir()
        other = start_dvm(tmp_path / "second", "z")
        try:
            assert not stale.exists()
            assert young.exists()
            assert all(d.exists() for d in _socket_dirs(dvm)), "a live DVM's directory went"
        finally:
            other.stop()
    finally:
        for d in (stale, young):
            if d.exists():
                import shutil
                shutil.rmtree(d)


# ---------------------------------------------------------------------------
# item 6: one DVM per id
# ---------------------------------------------------------------------------


def test_a_second_dvm_with_a_running_id_is_refused_naming_the_first(tmp_path):
    """Issue 8.6: `pydvm start --dvm-id X` while X runs fails (naming X's URI) and
    leaves X reachable and stoppable -- its secret is not overwritten."""
    for sub in ("one", "two"):
        (tmp_path / sub).mkdir()
    first = start_dvm(tmp_path / "one", "a", extra=["--dvm-id", "samename"])
    try:
        env = dict(first.env)
        p = subprocess.run(PYDVM + ["start", "--daemonize", "--hosts", "b", "--dvm-id",
                                    "samename"], env=env, capture_output=True, text=True,
                           timeout=60)
        assert p.returncode != 0
        assert "already running" in p.stderr and first.uri in p.stderr, p.stderr
        q = first.run("-n", "1", "pydvm", "publish", "still=here")
        assert status(q) == "PMIX_SUCCESS", q.stdout + q.stderr
    finally:
        first.stop()
    # Once it is stopped, the id is free again.
    again = start_dvm(tmp_path / "two", "a", extra=["--dvm-id", "samename"],
                      state_dir=tmp_path / "one" / "state")
    again.stop()


# ---------------------------------------------------------------------------
# item 8: bounded memory under a slow reader; a closed stdout
# ---------------------------------------------------------------------------


def test_a_stopped_pydvm_run_bounds_master_and_daemon_memory(tmp_path):
    """Issue 8.8: a job writing as fast as it can while its `pydvm run` is stopped
    (SIGSTOP): master and daemon memory stay within a few output windows, because
    the daemon stops reading the job's pipes."""
    dvm = start_dvm(tmp_path, "a")
    tool = subprocess.Popen(PYDVM + ["run", "-n", "1", *job_script("chatty")],
                            env={**dvm.env, "PYDVM_URI": dvm.uri},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        time.sleep(1.0)
        os.kill(tool.pid, signal.SIGSTOP)
        time.sleep(0.5)
        base = {p: _rss_kib(p) for p in (dvm.pid, dvm.daemon_pids["a"])}
        time.sleep(5.0)
        grown = {p: _rss_kib(p) - base[p] for p in base}
        # Window 1 MiB per node, plus socket buffers and allocator slack.
        assert all(g < 48 * 1024 for g in grown.values()), f"RSS grew by {grown} KiB"
    finally:
        os.kill(tool.pid, signal.SIGCONT)
        tool.send_signal(signal.SIGTERM)
        finish(tool)
        dvm.stop()


def test_a_closed_stdout_ends_pydvm_run_quietly_and_kills_the_job(dvm):
    """Issue 8.8: `pydvm run ... | head -1` prints one line, no traceback, and
    the job is killed (no BrokenPipeError flood, nothing left running)."""
    p = subprocess.run(
        ["sh", "-c", f"{' '.join(PYDVM)} run -n 1 {' '.join(job_script('chatty'))} | head -c 10"],
        env={**dvm.env, "PYDVM_URI": dvm.uri}, capture_output=True, timeout=60)
    assert p.stdout == b"x" * 10
    assert b"Error" not in p.stderr and b"Traceback" not in p.stderr, p.stderr[-2000:]
    assert len(p.stderr) < 200, p.stderr[-2000:]
    wait_for(lambda: _jobs(dvm) == [], what="the job to be killed")


def test_pydvm_info_into_head_prints_no_traceback(dvm):
    """Issue 8.8: a reader that stops early is not an error worth a traceback."""
    p = subprocess.run(["sh", "-c", f"{' '.join(PYDVM)} info | head -1"],
                       env={**dvm.env, "PYDVM_URI": dvm.uri}, capture_output=True, text=True,
                       timeout=60)
    assert p.stdout.startswith("DVM ")
    assert "Traceback" not in p.stderr and "Error" not in p.stderr, p.stderr


def _jobs(dvm) -> list:
    code = ("import asyncio, json; from pydvm.cli.tool import call, resolve_uri;"
            "print(json.dumps(asyncio.run(call(resolve_uri(None), {'t': 'info'}))['jobs']))")
    q = subprocess.run([sys.executable, "-c", code], env={**dvm.env, "PYDVM_URI": dvm.uri},
                       capture_output=True, text=True, timeout=60, check=True)
    return json.loads(q.stdout)


# ---------------------------------------------------------------------------
# item 9: cancelled calls leave nothing behind; a cap per connection
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("rng,store", [("session", "master"), ("local", "a")])
def test_a_cancelled_waiting_lookup_is_withdrawn_from_its_store(dvm, tmp_path, rng, store):
    """Issue 8.9: cancelling an asyncio lookup (task.cancel or wait_for's timeout)
    leaves no parked lookup in the store and no pending entry on the connection,
    while the connection stays open."""
    go = tmp_path / "go"
    job = dvm.run_bg("--host", "a", "-n", "1", *job_script("cancel_wait"), rng, str(go))
    reader = LineReader(job.stdout)
    try:
        assert reader.wait_line("PENDING") == "PENDING 0"
        stores = dvm.store()
        assert stores[store]["parked"] == 0, stores
        assert all(s.get("parked", 0) == 0 for s in stores.values()), stores
    finally:
        go.touch()
        finish(job)


def test_one_connection_may_hold_at_most_its_cap_of_waiting_lookups(make_dvm):
    """Issue 8.9: with pydvm_max_outstanding 5, a sixth waiting lookup on the same
    connection is refused OUT_OF_RESOURCE; the five others stay parked."""
    dvm = make_dvm("a", pydvm_max_outstanding="5")
    p = dvm.run("-n", "1", *job_script("park_many"), "6")
    assert p.returncode == 0, p.stderr
    assert "PARKED 5" in p.stdout, p.stdout
    assert p.stdout.count("REFUSED PMIX_ERR_OUT_OF_RESOURCE") == 1, p.stdout
    assert dvm.store()["master"]["parked"] == 0  # withdrawn with the connection


def test_a_socket_directory_whose_owner_file_is_still_being_written_is_left_alone(tmp_path):
    """Daemons a, b, c start together: one's sweep of stale directories must not
    take another's directory in the moment between creating its ``owner`` file
    and writing it (seen as a daemon failing with FileNotFoundError at start)."""
    from pydvm.runtime.shared.sockdir import remove_stale_socket_dirs

    young = tmp_path / "cafe-a-young"
    young.mkdir()
    (young / "owner").write_text("")  # created, not yet written
    torn = tmp_path / "cafe-b-torn"
    torn.mkdir()
    (torn / "owner").write_text("12")  # half written
    assert remove_stale_socket_dirs(tmp_path) == []
    assert young.exists() and torn.exists()
