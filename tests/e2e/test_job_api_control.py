"""Controlling and looking at running jobs from the job API, against real DVMs.

Signals chosen by the caller (``Job.kill(signal=...)``, ``Dvm.kill(ns,
signal=...)``, ``pydvm kill --signal``), a job's nodes and processes (real
pids of real processes), and the DVM's nodes (``Dvm.nodes()``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import pytest

import pydvm.jobs as pj
from pydvm.errors import BadParamError, NotFoundError

from dvmkit import wait_for

pytestmark = pytest.mark.e2e

#: Prints READY, then a line per SIGUSR1 it gets; SIGTERM ends it as usual.
TRAP = ("trap 'echo USR1 $PYDVM_RANK' USR1; trap 'echo TERM $PYDVM_RANK; exit 7' TERM; "
        "echo READY; while :; do sleep 30 & wait $!; done")


@pytest.fixture
def api(dvm, monkeypatch):
    monkeypatch.setenv("PYDVM_STATE_DIR", dvm.env["PYDVM_STATE_DIR"])
    monkeypatch.setenv("PYDVM_URI", dvm.uri)
    with pj.connect() as d:
        yield d


class Lines:
    """A ``stdout=`` callback keeping (rank, line); ``wait`` for a line to come."""

    def __init__(self) -> None:
        self.lines: list[tuple[int, str]] = []
        self.cv = threading.Condition()

    def __call__(self, rank: int, line: str) -> None:
        with self.cv:
            self.lines.append((rank, line))
            self.cv.notify_all()

    def count(self, text: str) -> int:
        with self.cv:
            return sum(1 for _, ln in self.lines if ln == text)

    def wait(self, text: str, count: int = 1, timeout: float = 30) -> None:
        with self.cv:
            assert self.cv.wait_for(
                lambda: sum(1 for _, ln in self.lines if ln == text) >= count, timeout), \
                (text, self.lines)


def _trapping(api, n=2, hosts="a,b") -> tuple[pj.Job, Lines]:
    seen = Lines()
    job = api.submit(["sh", "-c", TRAP], n=n, hosts=hosts, stdout=seen)
    seen.wait("READY", n)
    return job, seen


# ----------------------------------------------------------------------
# signals
# ----------------------------------------------------------------------


def test_a_signal_reaches_every_process_and_the_job_goes_on(api):
    job, seen = _trapping(api)
    job.kill(signal=signal.SIGUSR1)
    seen.wait("USR1 0")
    seen.wait("USR1 1")
    assert not job.done() and job.state == "running"
    # again, by name and by the signal's name; answered once every node delivered it
    assert api.kill(job.nspace, signal="USR1") is None
    seen.wait("USR1 0", 2)
    seen.wait("USR1 1", 2)
    assert not job.done() and api.job(job.nspace).state == "running"
    # SIGTERM ends it as 'pydvm kill' does, and the report says who
    job.kill(signal="SIGTERM")
    r = job.result(60)
    assert seen.count("TERM 0") == 1 and seen.count("TERM 1") == 1
    assert r.killed == 2 and r.failed == 0
    assert r.reason == "killed by its submitter (SIGTERM)", r.reason


def test_sigkill_ends_the_job_at_once_without_its_sigterm_handler(api):
    job, seen = _trapping(api)
    job.kill(signal=signal.SIGKILL)
    r = job.result(60)
    assert seen.count("TERM 0") == 0 and seen.count("TERM 1") == 0, seen.lines
    assert r.killed == 2 and r.reason == "killed by its submitter (SIGKILL)", r.reason


def test_another_connection_signals_by_name_and_the_report_names_it(api):
    job, seen = _trapping(api, n=1, hosts="b")
    with pj.connect() as other:
        other.kill(job.nspace, signal=signal.SIGUSR1)
        seen.wait("USR1 0")
        assert other.kill(job.nspace, signal=signal.SIGKILL, wait=True) is not None
        with pytest.raises(NotFoundError):
            other.kill(job.nspace, signal=signal.SIGUSR1)
    r = job.result(60)
    assert r.reason.startswith("killed by 'pydvm kill' (SIGKILL) from "), r.reason


def test_a_bad_signal_is_refused_and_the_job_is_unharmed(api):
    job, seen = _trapping(api, n=1, hosts="a")
    with pytest.raises(ValueError, match="signal"):
        job.kill(signal="SIGNOPE")
    with pytest.raises(ValueError, match="signal"):
        api.kill(job.nspace, signal=0)
    # what a client library does not check, the DVM refuses
    for bad in (0, -1, 4096, "USR1", True):
        with pytest.raises(BadParamError, match="signal"):
            api._call({"t": "signal_job", "nspace": job.nspace, "signal": bad})
    with pytest.raises(NotFoundError):
        api.kill("pydvm-nope@1", signal=signal.SIGUSR1)
    assert not job.done()
    job.kill(signal=signal.SIGUSR1)
    seen.wait("USR1 0")
    job.kill()
    assert job.result(60).reason == "killed by its submitter"


def test_a_queued_job_signalled_is_simply_removed(make_dvm, tmp_path, monkeypatch):
    dvm = make_dvm("a:1", pydvm_queue="on")
    monkeypatch.setenv("PYDVM_STATE_DIR", dvm.env["PYDVM_STATE_DIR"])
    with pj.connect(dvm.uri) as api:
        hold, seen = _trapping(api, n=1, hosts="a")
        waiting = api.submit("echo never")
        wait_for(lambda: waiting.state == "queued", what="the second job queued")
        waiting.kill(signal=signal.SIGUSR1)
        r = waiting.result(60)
        assert r.returncode == 143 and r.size is None
        assert r.reason == "killed while queued: killed by its submitter (SIGUSR1)", r.reason
        assert seen.count("USR1 0") == 0  # the running job heard nothing
        assert not hold.done()
        hold.kill()
        hold.result(60)


def test_pydvm_kill_signal_on_the_command_line(api, dvm):
    job, seen = _trapping(api, n=1, hosts="c")
    p = dvm.cmd("kill", "--signal", "USR1", job.nspace)
    assert p.returncode == 0, p.stderr
    seen.wait("USR1 0")
    assert not job.done()
    p = dvm.cmd("kill", "--signal", "NOPE", job.nspace)
    assert p.returncode == 2 and "signal" in p.stderr, p.stderr
    p = dvm.cmd("kill", "-s", "KILL", job.nspace)
    assert p.returncode == 0, p.stderr
    r = job.result(60)
    assert "'pydvm kill' (SIGKILL) from" in r.reason and seen.count("TERM 0") == 0


def test_asyncio_twin_signals(dvm, monkeypatch):
    from pydvm.aio import jobs as aj

    monkeypatch.setenv("PYDVM_STATE_DIR", dvm.env["PYDVM_STATE_DIR"])

    async def main() -> None:
        async with await aj.connect(dvm.uri) as d:
            seen = Lines()
            job = d.submit(["sh", "-c", TRAP], n=1, stdout=seen)
            await asyncio.get_running_loop().run_in_executor(None, seen.wait, "READY")
            await d.kill(job.nspace, signal=signal.SIGUSR1)
            await asyncio.get_running_loop().run_in_executor(None, seen.wait, "USR1 0")
            job.kill(signal=signal.SIGKILL)
            r = await job.wait(60)
            assert r.reason == "killed by its submitter (SIGKILL)"
            assert [n.name for n in await d.nodes()] == ["a", "b", "c"]
    asyncio.run(main())


# ----------------------------------------------------------------------
# a job's nodes and processes
# ----------------------------------------------------------------------


def _environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        items = f.read().split(b"\0")
    return dict(i.decode().split("=", 1) for i in items if b"=" in i)


def test_a_jobs_nodes_and_processes_once_started(api):
    seen = Lines()
    script = 'echo READY; if [ "$PYDVM_RANK" = 1 ]; then exit 3; fi; exec sleep 120'
    job = api.submit(["sh", "-c", script], n=3, hosts="b,c", abort_on_failure=False,
                     stdout=seen)
    seen.wait("READY", 3)
    assert job.nodes == ["b", "c"]  # in the order of their first rank
    # (each node reports its own: node c's report of rank 1's end can come
    # before node b's of its ranks' start, which can come after their output)
    wait_for(lambda: [p.state for _, p in sorted(job.processes().items())]
             == ["running", "ended", "running"], what="rank 1's end and the others' start "
             "at the master")
    procs = job.processes()
    assert sorted(procs) == [0, 1, 2]
    assert [procs[r].node for r in range(3)] == ["b", "c", "b"]
    assert procs[1].status == 3 and procs[1].signal == 0
    for r in (0, 2):
        p = procs[r]
        assert p.state == "running" and p.status is None and p.pid > 0
        # the real process of that rank; read once its `exec sleep` is through (while
        # the kernel builds the new image, /proc/PID/environ reads empty)
        wait_for(lambda: "PYDVM_NSPACE" in _environ(p.pid), what=f"rank {r}'s environment")
        env = _environ(p.pid)
        assert env["PYDVM_NSPACE"] == job.nspace and env["PYDVM_RANK"] == str(r)
    job.kill(signal=signal.SIGKILL)
    job.result(60)
    assert job.nodes == ["b", "c"]  # kept after the end
    assert job.processes() is None  # the DVM no longer has it


def test_a_queued_job_has_no_nodes_or_processes_yet(make_dvm, monkeypatch):
    dvm = make_dvm("a:1", pydvm_queue="on")
    monkeypatch.setenv("PYDVM_STATE_DIR", dvm.env["PYDVM_STATE_DIR"])
    with pj.connect(dvm.uri) as api:
        hold, _ = _trapping(api, n=1, hosts="a")
        waiting = api.submit("true")
        wait_for(lambda: waiting.state == "queued", what="the second job queued")
        assert waiting.nodes is None and waiting.processes() is None
        hold.kill(signal=signal.SIGKILL)
        assert waiting.result(60).ok and waiting.nodes == ["a"]
        with pytest.raises(NotFoundError):
            api._call({"t": "job_procs", "nspace": "pydvm-nope@9"})


# ----------------------------------------------------------------------
# the DVM's nodes
# ----------------------------------------------------------------------


def test_dvm_nodes_names_slots_and_states(make_dvm, monkeypatch):
    dvm = make_dvm("a:2,b:1,c:3")
    monkeypatch.setenv("PYDVM_STATE_DIR", dvm.env["PYDVM_STATE_DIR"])
    with pj.connect(dvm.uri) as api:
        nodes = api.nodes()
        assert [(n.name, n.slots, n.state) for n in nodes] == [
            ("a", 2, "up"), ("b", 1, "up"), ("c", 3, "up")]
        assert all(n.up and n.reason is None for n in nodes)
        os.kill(dvm.daemon_pids["b"], signal.SIGKILL)
        wait_for(lambda: api.nodes()[1].state == "lost", what="node b lost")
        b = api.nodes()[1]
        assert not b.up and b.reason, b


def test_psij_executor_uses_only_the_public_job_api():
    import pathlib

    import pydvm.psij.executor as ex
    text = pathlib.Path(ex.__file__).read_text()
    assert "._call(" not in text and "wait(min(" not in text

