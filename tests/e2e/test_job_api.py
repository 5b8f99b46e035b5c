"""Jobs from Python (issue 32): ``pydvm.jobs`` against real DVMs.

One :class:`pydvm.jobs.Dvm` connection carries many jobs; each is a
Future resolving to its report.  These tests run the API in the test
process (it is a library), against DVMs of local daemons a, b, c.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from concurrent.futures import FIRST_COMPLETED, CancelledError, wait

import pytest

import pydvm
import pydvm.jobs as pj
from pydvm.errors import BadParamError, NoPermissionsError, NotFoundError, UnreachableError

from dvmkit import JOBS, wait_for

pytestmark = pytest.mark.e2e

PY = sys.executable


@pytest.fixture
def api(dvm, monkeypatch):
    """A job-API connection to the ``dvm`` fixture's DVM (this user's secret)."""
    monkeypatch.setenv("PYDVM_STATE_DIR", dvm.env["PYDVM_STATE_DIR"])
    monkeypatch.setenv("PYDVM_URI", dvm.uri)
    with pj.connect() as d:
        yield d


class Lines:
    """A ``stdout=`` callback that keeps (rank, line) and wakes who waits for a line."""

    def __init__(self) -> None:
        self.lines: list[tuple[int, str]] = []
        self.cv = threading.Condition()

    def __call__(self, rank: int, line: str) -> None:
        with self.cv:
            self.lines.append((rank, line))
            self.cv.notify_all()

    def wait(self, text: str, count: int = 1, timeout: float = 30) -> None:
        with self.cv:
            assert self.cv.wait_for(
                lambda: sum(1 for _, ln in self.lines if ln == text) >= count, timeout), \
                (text, self.lines)


HOLD = "echo READY; exec sleep 120"


def test_names_are_public_and_import_pydvm_stays_light():
    assert pydvm.Dvm is pj.Dvm and pydvm.Job is pj.Job and pydvm.Executor is pj.Executor
    assert pydvm.JobSpec is pj.JobSpec and pydvm.JobResult is pj.JobResult
    from pydvm import aio
    assert aio.jobs.Dvm is aio.Dvm and aio.jobs.connect is not pj.connect
    assert issubclass(pj.Job, __import__("concurrent.futures").futures.Future)


def test_submit_returns_a_future_of_the_jobs_report(api):
    job = api.submit("echo hello", n=2, stdout="capture")
    r = job.result(60)
    assert r.returncode == 0 and r.ok and r.failures == [] and r.reason is None
    assert r.stdout == b"hello\nhello\n" and r.stderr is None
    assert r.nspace == job.nspace and r.size == job.size == 2
    assert job.state == "ended" and job.done() and not job.running()


def test_exit_codes_and_failures_name_the_process(api):
    r = api.submit(["sh", "-c", 'exit $((PYDVM_RANK + 3))'], n=2, hosts="a,b").result(60)
    assert r.returncode in (3, 4) and r.failed == 2  # the first to fail
    assert sorted((f.rank, f.node, f.status, f.signal) for f in r.failures) == \
        [(0, "a", 3, 0), (1, "b", 4, 0)]
    with pytest.raises(pj.JobFailedError, match=f"exited {r.returncode}"):
        r.check()
    r = api.submit(["sh", "-c", "kill -9 $$"]).result(60)
    assert r.returncode == 137 and r.failures[0].signal == 9


def test_a_job_the_dvm_refuses_fails_its_future_and_bad_options_raise_at_once(api):
    with pytest.raises(BadParamError, match="nosuch"):
        api.submit("true", hosts="nosuch").result(60)
    with pytest.raises(ValueError, match="map-by"):
        api.submit("true", map_by="diagonal")
    with pytest.raises(TypeError, match="unknown job option"):
        api.submit("true", colour="blue")
    with pytest.raises(ValueError, match="empty command"):
        api.submit([])
    assert api.submit("true").result(60).ok  # the connection is fine


def test_kill_reports_who_ended_the_job_and_cancel_cancels_the_future(api, dvm):
    seen = Lines()
    job = api.submit(["sh", "-c", HOLD], stdout=seen)
    seen.wait("READY")
    assert job.state == "running" and job.running() and job.nspace and job.size == 1
    info = job.info()
    assert info.nspace == job.nspace and info.procs == 1 and len(info.nodes) == 1
    job.kill()
    r = job.result(60)
    assert r.returncode != 0 and r.killed == 1 and r.reason == "killed by its submitter"

    # another connection kills it by name: the report says so
    seen = Lines()
    job = api.submit(["sh", "-c", HOLD], stdout=seen)
    seen.wait("READY")
    with pj.connect() as other:
        assert other.kill(job.nspace, wait=True) is not None
        with pytest.raises(NotFoundError):
            other.kill(job.nspace)
    assert "pydvm kill" in job.result(60).reason

    seen = Lines()
    job = api.submit(["sh", "-c", HOLD], stdout=seen)
    seen.wait("READY")
    assert job.cancel() and job.cancelled()
    done, _ = wait([job], timeout=5)
    assert job in done
    with pytest.raises(CancelledError):
        job.result(0)
    wait_for(lambda: job.state == "ended", timeout=30, what="the cancelled job's end")
    assert api.job(job.nspace) is None
    assert not job.cancel()  # ended


def test_output_capture_callback_file_and_discard(api, tmp_path):
    script = [PY, str(JOBS / "output_lines.py")]
    r = api.submit(script, n=2, stdout="capture", stderr="capture").result(60)
    out = r.stdout.decode().splitlines()
    assert sorted(out) == sorted(f"out {rk} {i} tail" for rk in (0, 1) for i in range(20))
    assert len(r.stderr.decode().splitlines()) == 40

    seen = Lines()
    api.submit(script, n=2, stdout=seen).result(60)
    assert sorted(seen.lines) == sorted((rk, f"out {rk} {i} tail")
                                        for rk in (0, 1) for i in range(20))

    path = tmp_path / "both.txt"
    r = api.submit(script, stdout=path, stderr=path).result(60)
    assert r.stdout is None
    text = path.read_text().splitlines()
    assert len(text) == 40 and "err 0 19" in text and "out 0 19 tail" in text

    r = api.submit(script, n=2).result(60)  # discarded
    assert r.ok and r.stdout is None and r.stderr is None


def test_stdin_bytes_and_file_reach_rank_0_past_the_window(api, tmp_path):
    data = os.urandom(700_000)  # more than the DVM's stdin window
    r = api.submit("cat", stdin=data, stdout="capture").result(60)
    assert r.stdout == data
    f = tmp_path / "in"
    f.write_bytes(b"line one\nline two\n")
    assert api.submit("wc -l", stdin=f, stdout="capture").result(60).stdout.strip() == b"2"
    # without stdin, rank 0 reads /dev/null
    assert api.submit("cat", stdout="capture").result(60).stdout == b""


def test_env_is_added_to_ours_or_replaces_it_and_cwd_is_where_it_runs(api, tmp_path,
                                                                      monkeypatch):
    monkeypatch.setenv("JOBAPI_OURS", "ours")
    cmd = ["sh", "-c", 'echo "$JOBAPI_OURS/$JOBAPI_ADDED/$HOME"; pwd']
    r = api.submit(cmd, env={"JOBAPI_ADDED": "added", "HOME": None}, cwd=tmp_path,
                   stdout="capture").result(60)
    assert r.stdout.decode().splitlines() == ["ours/added/", str(tmp_path)]
    r = api.submit(["/usr/bin/env"], env={"ONLY": "1"}, inherit_env=False,
                   stdout="capture").result(60)
    names = {ln.split("=", 1)[0] for ln in r.stdout.decode().splitlines()}
    assert "ONLY" in names and "JOBAPI_OURS" not in names and "PATH" not in names


def test_placement_options_and_mpmd_apps(api):
    r = api.submit(["sh", "-c", "echo $PYDVM_NODE"], n=None, npernode=1,
                   stdout="capture").result(60)
    assert sorted(r.stdout.decode().split()) == ["a", "b", "c"]
    r = api.submit([pj.App("echo first", hosts="a"), pj.App(["sh", "-c", "echo $PYDVM_NODE"],
                                                            n=2, hosts=["b", "c"])],
                   map_by="node", stdout="capture").result(60)
    assert sorted(r.stdout.decode().split()) == ["b", "c", "first"] and r.size == 3


def test_states_and_two_hundred_jobs_in_flight_on_one_connection(api, tmp_path):
    go = tmp_path / "go"
    wait_go = f'while [ ! -e {go} ]; do sleep 0.1; done; echo $JOB'
    jobs = [api.submit(["sh", "-c", wait_go], env={"JOB": str(i)}, stdout="capture")
            for i in range(200)]
    assert {j.state for j in jobs} <= {"submitted", "running"}
    wait_for(lambda: all(j.state == "running" for j in jobs), timeout=120,
             what="200 jobs started")
    assert len({j.nspace for j in jobs}) == 200
    running = {i.nspace for i in api.jobs()}
    assert {j.nspace for j in jobs} <= running
    go.touch()
    done, not_done = wait(jobs, timeout=120)
    assert not not_done
    assert [j.result().stdout for j in jobs] == [f"{i}\n".encode() for i in range(200)]
    assert all(j.state == "ended" for j in jobs)


def test_submit_from_many_threads_and_submit_many(api):
    out: list = []

    def worker(k: int) -> None:
        out.extend(api.submit(["sh", "-c", f"echo {k}"], stdout="capture") for _ in range(10))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(j.result(60).stdout for j in out) == sorted(
        f"{k}\n".encode() for k in range(8) for _ in range(10))
    specs = [pj.JobSpec(["sh", "-c", f"exit {k}"]) for k in range(5)]
    specs.append(pj.JobSpec("true", hosts="nosuch"))
    jobs = api.submit_many(specs)
    assert [j.result(60).returncode for j in jobs[:5]] == [0, 1, 2, 3, 4]
    with pytest.raises(BadParamError):
        jobs[5].result(60)


def test_callbacks_run_on_the_reader_thread_and_may_not_wait_there(api):
    got: list = []
    ready = threading.Event()

    def on_done(job):
        try:
            job2 = api.submit("true")
            got.append(job2)
            job2.result()
        except RuntimeError as exc:
            got.append(exc)
        ready.set()

    api.submit("true").add_done_callback(on_done)
    assert ready.wait(30)
    assert isinstance(got[1], RuntimeError) and "reader thread" in str(got[1])
    assert got[0].result(60).ok  # a job submitted from a callback runs


def test_executor_with_concurrent_futures_wait_and_map(dvm, api, monkeypatch):
    with pj.Executor(api, stdout="capture") as ex:
        futures = [ex.submit("echo", i) for i in range(20)]
        done, not_done = wait(futures, timeout=60)
        assert not not_done
        assert [f.result().stdout for f in futures] == [f"{i}\n".encode() for i in range(20)]
        assert [r.stdout for r in ex.map("echo", ["x", "y"])] == [b"x\n", b"y\n"]
        first = ex.submit(["sh", "-c", HOLD])
        quick = ex.submit("true")
        done, _ = wait([first, quick], timeout=60, return_when=FIRST_COMPLETED)
        assert quick in done and first not in done
        ex.shutdown(wait=True, cancel_futures=True)
        assert first.cancelled()
        with pytest.raises(RuntimeError):
            ex.submit("true")
    assert not api.closed  # a Dvm given to the Executor stays open
    ex = pj.Executor(dvm.uri)  # its own connection: closed at shutdown
    assert ex.submit("true").result(60).ok
    ex.shutdown()
    assert ex.dvm.closed


def test_asyncio_twin(dvm, monkeypatch):
    monkeypatch.setenv("PYDVM_STATE_DIR", dvm.env["PYDVM_STATE_DIR"])
    from pydvm.aio import jobs as aj

    async def main():
        async with await aj.connect(dvm.uri) as d:
            results = await asyncio.gather(*(d.submit(["sh", "-c", f"echo {i}; exit {i}"],
                                                      stdout="capture") for i in range(5)))
            assert [r.returncode for r in results] == list(range(5))
            assert [r.stdout for r in results] == [f"{i}\n".encode() for i in range(5)]
            job = d.submit(["sh", "-c", HOLD])
            with pytest.raises(asyncio.TimeoutError):
                await job.wait(0.2)
            job.kill()
            r = await job
            assert r.killed == 1
            infos = await d.jobs()
            assert job.nspace not in {i.nspace for i in infos}
            with pytest.raises(BadParamError):
                await d.submit("true", hosts="nosuch")
    asyncio.run(main())


def test_losing_the_connection_fails_every_pending_job(make_dvm, monkeypatch):
    d = make_dvm("a,b")
    monkeypatch.setenv("PYDVM_STATE_DIR", d.env["PYDVM_STATE_DIR"])
    dvm = pj.connect(d.uri)
    seen = Lines()
    jobs = [dvm.submit(["sh", "-c", HOLD], stdout=seen) for _ in range(3)]
    seen.wait("READY", 3)
    os.kill(d.pid, signal.SIGKILL)  # the master dies
    done, not_done = wait(jobs, timeout=30)
    assert not not_done
    for j in jobs:
        with pytest.raises(UnreachableError, match="closed the connection|lost"):
            j.result()
        assert j.state == "ended"
    with pytest.raises(UnreachableError):
        dvm.submit("true")
    with pytest.raises(UnreachableError):
        dvm.jobs()
    dvm.close()


def test_closing_the_connection_ends_its_jobs(api, dvm):
    seen = Lines()
    with pj.connect() as mine:
        job = mine.submit(["sh", "-c", HOLD], stdout=seen)
        seen.wait("READY")
        ns = job.nspace
    with pytest.raises(UnreachableError, match="closed"):
        job.result(10)
    wait_for(lambda: api.job(ns) is None, timeout=30, what="the job of a closed connection "
             "to end")


def test_connect_without_a_dvm_says_so(monkeypatch, tmp_path):
    monkeypatch.delenv("PYDVM_URI", raising=False)
    with pytest.raises(UnreachableError, match="no DVM given"):
        pj.connect()
    monkeypatch.setenv("PYDVM_STATE_DIR", str(tmp_path))
    with pytest.raises(UnreachableError):
        pj.connect("tcp://127.0.0.1:1/deadbeef")


def test_start_runs_a_dvm_for_the_block_and_stops_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PYDVM_STATE_DIR", str(tmp_path / "state"))
    with pj.start(hosts="x,y", args=["--log-dir", str(tmp_path / "logs")],
                  pydvm_output_window=1 << 16) as dvm:
        assert dvm.owned
        r = dvm.submit(["sh", "-c", "echo $PYDVM_NODE"], n=2, map_by="node",
                       stdout="capture").result(60)
        assert sorted(r.stdout.decode().split()) == ["x", "y"]
        uri = str(dvm.uri)
    with pytest.raises(UnreachableError):  # stopped: answered once the DVM was down
        pj.connect(uri)
    with pytest.raises(RuntimeError, match="pydvm_no_such_parameter"):  # start's own words
        pj.start(hosts="x", pydvm_no_such_parameter=1)
