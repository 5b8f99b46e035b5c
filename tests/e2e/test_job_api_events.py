"""Jobs from Python with the master's task-engine requests (issue 32): job
events (``subscribe``), queued jobs (``run`` with ``queue``) and batches
(``run_many``), through ``pydvm.jobs`` against real DVMs."""

from __future__ import annotations

import asyncio
import threading

import pytest

import pydvm.jobs as pj
from pydvm.errors import BadParamError, OutOfResourceError

pytestmark = pytest.mark.e2e

HOLD = "echo READY; exec sleep 120"


@pytest.fixture
def connect(monkeypatch):
    """``connect(dvm)``: a job-API connection to a dvmkit DVM, closed at the end."""
    made = []

    def connect(d) -> pj.Dvm:
        monkeypatch.setenv("PYDVM_STATE_DIR", d.env["PYDVM_STATE_DIR"])
        made.append(pj.connect(d.uri))
        return made[-1]

    yield connect
    for c in made:
        c.close()


def _ready() -> tuple[threading.Event, object]:
    ready = threading.Event()
    return ready, lambda rank, line: ready.set()


def test_a_jobs_events_come_in_order_and_end_with_its_report(dvm, connect):
    api = connect(dvm)
    with api.events() as sub:  # every job we may see
        job = api.submit(["sh", "-c", "exit 2"], n=2, hosts="a,b")
        r = job.result(60)
        kinds = []
        for ev in sub:
            if ev.nspace != job.nspace:
                continue
            kinds.append(ev.kind)
            if ev.kind == "started":
                assert ev.size == 2 and sorted(ev.nodes) == ["a", "b"]
            elif ev.kind == "proc_exit":
                assert ev.status == 2 and ev.node in ("a", "b")
            elif ev.kind == "ended":
                assert ev.exit == r.returncode == 2 and ev.failed == 2
                break
        assert kinds == ["started", "proc_exit", "proc_exit", "ended"]


def test_events_of_one_job_and_a_callback_for_all(dvm, connect):
    api = connect(dvm)
    seen: list = []
    cv = threading.Condition()

    def on_event(ev):
        with cv:
            seen.append((ev.nspace, ev.kind))
            cv.notify_all()

    sub = api.on_event(on_event)
    ready, on_line = _ready()
    job = api.submit(["sh", "-c", HOLD], stdout=on_line)
    assert ready.wait(30)
    one = api.events(job.nspace)
    job.kill()
    kinds = [ev.kind for ev in one]  # ends by itself after the job's end
    assert kinds[-1] == "ended" and "started" not in kinds  # subscribed after the start
    with cv:
        assert cv.wait_for(lambda: (job.nspace, "ended") in seen, 30)
    assert (job.nspace, "started") in seen
    sub.close()
    assert sub.closed and sub.get(0) is None


def test_queued_jobs_wait_for_slots_and_can_be_killed_while_queued(make_dvm, connect):
    d = make_dvm("a:1")
    api = connect(d)
    ready, on_line = _ready()
    first = api.submit(["sh", "-c", HOLD], queue=True, stdout=on_line)
    assert ready.wait(30) and first.state == "running"
    with api.events() as sub:
        second = api.submit("echo second", queue=True, stdout="capture")
        third = api.submit("true", queue=True)
        events = [sub.get(30), sub.get(30)]
        assert [(ev.kind, ev.nspace, ev.position) for ev in events] == [
            ("queued", second.nspace, 1), ("queued", third.nspace, 2)]
    # what the job says is what the connection has read: by now the queued answers too
    assert (second.state, second.position, third.state) == ("queued", 1, "queued")
    rows = {i.nspace: i.state for i in api.jobs()}
    assert rows[second.nspace] == rows[third.nspace] == "queued"
    third.kill()
    r = third.result(30)
    assert r.returncode != 0 and r.reason == "killed while queued: killed by its submitter"
    first.kill()
    assert second.result(60).stdout == b"second\n"
    with pytest.raises(OutOfResourceError):  # larger than the DVM: refused, not queued
        api.submit("true", n=5, queue=True).result(30)


def test_submit_many_is_one_request(dvm, connect):
    api = connect(dvm)
    specs = [pj.JobSpec(["sh", "-c", f"echo {i}"], stdout="capture") for i in range(50)]
    jobs = api.submit_many(specs + [pj.JobSpec("true", hosts="nosuch")])
    assert [j.result(60).stdout for j in jobs[:50]] == [f"{i}\n".encode() for i in range(50)]
    with pytest.raises(BadParamError, match="nosuch"):
        jobs[50].result(60)
    assert api._run_many is True


def test_asyncio_events(dvm, monkeypatch):
    monkeypatch.setenv("PYDVM_STATE_DIR", dvm.env["PYDVM_STATE_DIR"])
    from pydvm.aio import jobs as aj

    async def main():
        async with await aj.connect(dvm.uri) as d:
            async with await d.events() as events:
                job = d.submit("true")
                kinds = []
                async for ev in events:
                    if ev.nspace == job.nspace:
                        kinds.append(ev.kind)
                        if ev.kind == "ended":
                            break
            assert kinds == ["started", "proc_exit", "ended"]
            assert (await job).ok
            assert await events.get(1) is None  # closed
    asyncio.run(main())
