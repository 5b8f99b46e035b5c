"""A machine that stalls loses no node and kills no job (issue 46).

A whole DVM -- master, daemons, job processes and the job's ``pydvm run``
-- stopped together (SIGSTOP, then SIGCONT: what a machine whose CPUs did
not run for seconds looks like to its processes) comes back with every
node up and its job going on.  A peer really gone is still found: a
SIGKILLed daemon at once, a daemon frozen alone within three heartbeat
periods.  A master frozen alone is waited for by its daemons for
``pydvm_master_grace`` seconds, their jobs running on; past that they end
their jobs and exit.  A relay and its data server likewise: stopped
together (or the relay alone), the link and a waiting lookup on it
survive; a data server frozen alone is given up within three periods and
used again when it answers.

The stalls are real stopped time (``time.sleep`` while every process of
the DVM is stopped): that is the condition under test, not a wait for an
event.  Everything after the wake is waited for by its event.
"""

from __future__ import annotations

import os
import signal
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from dvmkit import LineReader, finish, lines, pid_alive, start_dvm, wait_for

pytestmark = pytest.mark.e2e

HB = 0.5
#: three heartbeat periods: the bound within which a silent peer is lost.
BOUND = 3 * HB
STALLED = "did not run for"


def _tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (read from /proc)."""
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            kids.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        if p not in out:
            out.append(p)
            todo.extend(kids.get(p, []))
    return out


def _roots(*dvms) -> list[int]:
    """The masters' and daemons' pids of ``dvms``."""
    return [p for d in dvms for p in (d.pid, *d.daemon_pids.values())]


@contextmanager
def stopped(roots, tree: bool = True):
    """SIGSTOP the process trees under ``roots`` (only ``roots`` themselves
    if not ``tree``) for the block -- parents first, again until no new
    child appears: nothing forks once stopped --; SIGCONT them all after it."""
    held: list[int] = []
    try:
        while True:
            new = [p for r in roots for p in (_tree(r) if tree else [r]) if p not in held]
            if not new:
                break
            for p in new:
                try:
                    os.kill(p, signal.SIGSTOP)
                    held.append(p)
                except ProcessLookupError:
                    pass  # a short-lived child that ended meanwhile
        yield held
    finally:
        for p in held:
            try:
                os.kill(p, signal.SIGCONT)
            except ProcessLookupError:
                pass


def _wait_log(dvm, name: str, text: str, timeout: float = 20) -> float:
    t0 = time.monotonic()
    wait_for(lambda: text in dvm.log(name), timeout=timeout,
             what=f"{text!r} in the {name} log")
    return time.monotonic() - t0


def _judged_after_wake(dvm, name: str, loss: str) -> None:
    """Wait until ``name``'s first judgement after a stall is in its log:
    the stall it saw, or the loss it declared (then fail, saying so)."""
    wait_for(lambda: STALLED in dvm.log(name) or loss in dvm.log(name),
             what=f"the {name} log to show its stall (or a loss)")
    assert loss not in dvm.log(name), dvm.log(name)


def _job(dvm, go: Path, hosts: str = "a,b"):
    """A 2-rank job (one per node) that runs until ``go`` exists, then exits 0."""
    job = dvm.run_bg("--host", hosts, "-n", "2", "sh", "-c",
                     f'echo UP $PYDVM_RANK; while [ ! -e "{go}" ]; do sleep 0.05; done; '
                     'echo DONE $PYDVM_RANK')
    out = LineReader(job.stdout)
    wait_for(lambda: len([ln for ln in out.lines if ln.startswith("UP")]) == 2,
             what="both ranks to start")
    return job, out


def _both_nodes_serve(dvm) -> None:
    p = dvm.run("--host", "a,b", "-n", "2", "sh", "-c", "echo ON $PYDVM_RANK")
    assert p.returncode == 0, p.stderr
    assert sorted(lines(p, "ON")) == ["ON 0", "ON 1"], p.stdout


@pytest.mark.parametrize("seconds", [10, 30])
def test_a_whole_dvm_stopped_together_loses_no_node_and_no_job(make_dvm, tmp_path, seconds):
    """Master, both daemons, the job and its run stopped for 10 s (30 s), then
    resumed together: each process sees its own stall and condemns nobody;
    the job finishes with status 0 and both nodes take the next job."""
    dvm = make_dvm("a,b", pydvm_heartbeat_interval=str(HB))
    go = tmp_path / "go"
    job, out = _job(dvm, go)
    try:
        with stopped(_roots(dvm) + [job.pid]):
            time.sleep(seconds)
        _judged_after_wake(dvm, "master", "lost node")
        for name in ("a", "b"):
            _judged_after_wake(dvm, name, "lost the master")
        go.touch()
        rc = finish(job)
        assert rc == 0, job.stderr.read()
        assert sorted(ln for ln in out.join() if ln.startswith("DONE")) == ["DONE 0", "DONE 1"]
        _both_nodes_serve(dvm)
        for name in ("master", "a", "b"):
            log = dvm.log(name)
            assert "no heartbeat" not in log and "lost" not in log, log
    finally:
        go.touch()
        if job.poll() is None:
            job.kill()
            job.wait(10)


def test_a_sigkilled_daemon_is_lost_at_once(make_dvm, tmp_path):
    """kill -9 of b's daemon: the master finds b lost well within three periods
    (its connection closes), the job's run fails naming b, a keeps serving."""
    dvm = make_dvm("a,b", pydvm_heartbeat_interval=str(HB))
    go = tmp_path / "go"
    job, _ = _job(dvm, go)
    try:
        os.kill(dvm.daemon_pids["b"], signal.SIGKILL)
        took = _wait_log(dvm, "master", "lost node b")
        assert took < BOUND, f"a closed connection took {took:.1f}s to be noticed"
        assert finish(job) != 0
        assert "node b" in job.stderr.read()
        assert dvm.run("--host", "a", "-n", "1", "true").returncode == 0
    finally:
        go.touch()


def test_a_daemon_frozen_alone_is_lost_within_three_periods(make_dvm, tmp_path):
    """SIGSTOP b's daemon alone (the master runs): b is lost after three
    heartbeat periods of silence, within a fourth (its judge's cadence) and
    some slack; after SIGCONT b's daemon and its job process are gone."""
    dvm = make_dvm("a,b", pydvm_heartbeat_interval=str(HB))
    go = tmp_path / "go"
    job, _ = _job(dvm, go)
    bpid = dvm.daemon_pids["b"]
    left = _tree(bpid)
    try:
        with stopped([bpid]):
            took = _wait_log(dvm, "master", "lost node b")
        assert took < 4 * HB + 1.0, f"a frozen daemon took {took:.1f}s to be found"
        assert "no heartbeat from daemon b" in dvm.log("master")
        assert finish(job) != 0
        wait_for(lambda: not any(pid_alive(p) for p in left), timeout=20,
                 what="b's daemon and job process to end after SIGCONT")
        assert dvm.run("--host", "b", "-n", "1", "true").returncode != 0
        assert dvm.run("--host", "a", "-n", "1", "true").returncode == 0
    finally:
        go.touch()


def test_a_master_frozen_alone_within_the_grace_finds_its_jobs_running(make_dvm, tmp_path):
    """The master alone stopped past three periods (the daemons running): the
    daemons say it is silent and keep their jobs; it comes back, sees its
    own stall, and the job finishes with status 0 on nodes that are up."""
    dvm = make_dvm("a,b", pydvm_heartbeat_interval=str(HB), pydvm_master_grace="20")
    go = tmp_path / "go"
    job, out = _job(dvm, go)
    try:
        with stopped([dvm.pid], tree=False):
            for name in ("a", "b"):
                _wait_log(dvm, name, "the master has been silent")
        _wait_log(dvm, "master", STALLED)
        for name in ("a", "b"):
            _wait_log(dvm, name, "the master is heard again")
        go.touch()
        assert finish(job) == 0, job.stderr.read()
        _both_nodes_serve(dvm)
        assert all(pid_alive(p) for p in dvm.daemon_pids.values())
        assert "lost" not in dvm.log("master") + dvm.log("a") + dvm.log("b")
    finally:
        go.touch()


def test_a_master_frozen_past_the_grace_is_given_up_and_the_jobs_end(make_dvm, tmp_path):
    """Past ``pydvm_master_grace`` of silence (never sooner), each daemon ends
    its jobs and exits; the master, resumed, finds its nodes lost."""
    grace = 3.0
    dvm = make_dvm("a,b", pydvm_heartbeat_interval=str(HB), pydvm_master_grace=str(grace))
    go = tmp_path / "go"
    job, _ = _job(dvm, go)
    left = [p for d in dvm.daemon_pids.values() for p in _tree(d)]
    try:
        with stopped([dvm.pid], tree=False):
            t0 = time.monotonic()
            wait_for(lambda: not any(pid_alive(p) for p in left), timeout=30,
                     what="the daemons and their job processes to end")
            took = time.monotonic() - t0
        assert took > grace - HB, f"the daemons gave up after {took:.1f}s, before the grace"
        for name in ("a", "b"):
            assert "lost the master (no heartbeat" in dvm.log(name), dvm.log(name)
        assert finish(job) != 0
        _wait_log(dvm, "master", "lost node a")
        _wait_log(dvm, "master", "lost node b")
    finally:
        go.touch()


# ---------------------------------------------------------------------------
# a relay and its data server
# ---------------------------------------------------------------------------


@pytest.fixture
def relayed(tmp_path):
    """S (a data server, node s1) and C relaying to it (node p1), heartbeat 0.5 s."""
    state = tmp_path / "state"
    made = []
    mca = {"pydvm_heartbeat_interval": str(HB)}
    try:
        made.append(start_dvm(tmp_path / "S", "s1", mca, state_dir=state))
        made.append(start_dvm(tmp_path / "C", "p1", mca, state_dir=state,
                              extra=["--data-server-uri", made[0].uri]))
        yield made[0], made[1]
    finally:
        for d in made:
            d.stop()


@pytest.mark.parametrize("who", ["both", "relay"])
def test_a_relay_stopped_with_or_without_its_data_server_keeps_the_link(relayed, who):
    """A lookup from C waits in S; then both DVMs (or C alone) stop for 5 s.
    Resumed, the relay keeps its link: a publish in S answers the lookup."""
    s, c = relayed
    waiter = c.run_bg("-n", "1", "pydvm", "lookup", "after", "--wait")
    try:
        wait_for(lambda: s.store()["master"]["parked"] == 1, timeout=30,
                 what="the relayed lookup to park in S")
        with stopped(_roots(c, s) if who == "both" else _roots(c)):
            time.sleep(5)
        _judged_after_wake(c, "master", "lost the data server")
        p = s.run("-n", "1", "pydvm", "publish", "after=stall", "--persistence", "session")
        assert p.returncode == 0, p.stderr
        got, err = waiter.communicate(timeout=30)
        assert waiter.returncode == 0, (got, err)
        assert "FOUND after stall" in got, got
        assert "lost the data server" not in c.log("master"), c.log("master")
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait(10)


def test_a_data_server_frozen_alone_is_given_up_within_three_periods(relayed):
    """S alone stopped: C's relay closes the link within three periods and a
    fourth, answers at once with UNREACH meanwhile, and uses S again after it resumes."""
    s, c = relayed
    with stopped(_roots(s)):
        took = _wait_log(c, "master", "lost the data server")
        assert took < 4 * HB + 1.0, f"a frozen data server took {took:.1f}s to be found"
        assert "no heartbeat from data server" in c.log("master")
        p = c.run("-n", "1", "pydvm", "publish", "k=1")
        assert "STATUS PMIX_ERR_UNREACH" in p.stdout, (p.stdout, p.stderr)

    def published() -> bool:
        r = c.run("-n", "1", "pydvm", "publish", "back=1", "--persistence", "session")
        return r.returncode == 0

    wait_for(published, timeout=30, interval=0.5, what="the relay to reconnect")
    assert s.store()["master"]["keys"] == ["back"]
