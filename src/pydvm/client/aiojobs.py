"""Jobs from asyncio: the twin of :mod:`pydvm.client.jobs` (``pydvm.aio.jobs``).

::

    from pydvm.aio import jobs

    async with await jobs.connect() as dvm:
        job = dvm.submit("hostname", n=2, stdout="capture")
        r = await job                       # a JobResult
        async with await dvm.events() as events:
            async for ev in events:
                ...

The same connection machinery as the blocking API (one connection, one
reader thread that reads the master's messages as they come -- what flow
control needs whether or not the loop is busy); what waits is awaitable
here, and resolves on the caller's event loop.  Submitting sends at once
and returns a :class:`Job` without awaiting anything.  Output callbacks
still run on the reader thread; event callbacks (:meth:`Dvm.on_event`) on
the loop.
"""

from __future__ import annotations

import asyncio

from . import jobs as _jobs
from .jobspec import (App, JobEvent, JobFailedError, JobInfo, JobResult, JobSpec,  # noqa: F401
                      NodeInfo, ProcessFailure, ProcessInfo, UnsupportedError)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

__all__ = ["App", "Dvm", "EventStream", "Job", "JobEvent", "JobFailedError", "JobInfo", "JobResult",
           "JobSpec", "NodeInfo", "ProcessFailure", "ProcessInfo", "UnsupportedError", "connect",
           "start"]


async def connect(uri: str | None = None) -> "Dvm":
    """Connect to the DVM at ``uri`` (default ``$PYDVM_URI``): as
    :func:`pydvm.jobs.connect`, without blocking the loop."""
    loop = asyncio.get_running_loop()
    return Dvm(await loop.run_in_executor(None, _jobs.connect, uri))


async def start(hosts: "str | list[str] | None" = None, **kw: Any) -> "Dvm":
    """Start a persistent DVM and connect to it (:func:`pydvm.jobs.start`,
    the same arguments); closing the :class:`Dvm` stops it."""
    loop = asyncio.get_running_loop()
    return Dvm(await loop.run_in_executor(None, lambda: _jobs.start(hosts, **kw)))


class Job:
    """A job: ``await job`` gives its :class:`JobResult` (or raises as the
    blocking :class:`pydvm.jobs.Job`'s ``result()`` does).  ``state``,
    ``nspace``, ``size``, ``nodes``, ``position``, :meth:`kill`,
    :meth:`cancel`, :meth:`done` are the blocking job's, :meth:`processes`
    its awaitable twin; ``future`` is it (a
    :class:`concurrent.futures.Future`)."""

    __slots__ = ("future",)

    def __init__(self, future: _jobs.Job) -> None:
        self.future = future

    def __await__(self):
        return asyncio.wrap_future(self.future).__await__()

    async def wait(self, timeout: float | None = None) -> JobResult:
        """The job's result, waiting at most ``timeout`` seconds
        (:class:`TimeoutError`; the job goes on)."""
        return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(self.future)),
                                      timeout)

    @property
    def state(self) -> str:
        """``submitted``, ``queued``, ``running`` or ``ended``."""
        return self.future.state

    @property
    def nspace(self) -> str | None:
        """The job's namespace, once queued or started."""
        return self.future.nspace

    @property
    def size(self) -> int | None:
        """Its process count, once started."""
        return self.future.size

    @property
    def nodes(self) -> list[str] | None:
        """The names of the nodes it runs on, once started (kept after its end)."""
        return self.future.nodes

    @property
    def position(self) -> int | None:
        """Its place in the DVM's queue while queued."""
        return self.future.position

    def done(self) -> bool:
        """The job has ended (or failed, or was cancelled)."""
        return self.future.done()

    def kill(self, signal: "int | str | None" = None) -> None:
        """Kill the job, or send its processes ``signal``; awaiting it gives
        the report (see :meth:`pydvm.jobs.Job.kill`)."""
        self.future.kill(signal)

    async def processes(self) -> "dict[int, ProcessInfo] | None":
        """Its processes by rank, as the DVM knows them now
        (:meth:`pydvm.jobs.Job.processes`); None unless it runs."""
        return await asyncio.get_running_loop().run_in_executor(None, self.future.processes)

    def cancel(self) -> bool:
        """Kill the job and cancel it (see :meth:`pydvm.jobs.Job.cancel`)."""
        return self.future.cancel()

    async def info(self) -> JobInfo | None:
        """The DVM's view of the job now (``pydvm ps``); None once ended."""
        return await asyncio.get_running_loop().run_in_executor(None, self.future.info)

    def __repr__(self) -> str:
        return repr(self.future)


class Dvm:
    """An asyncio connection to a DVM carrying any number of jobs: the
    blocking :class:`pydvm.jobs.Dvm` (``sync``) with awaitable waits."""

    def __init__(self, sync: _jobs.Dvm) -> None:
        self.sync = sync
        self.uri = sync.uri

    async def __aenter__(self) -> "Dvm":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        """The connection is closed or lost."""
        return self.sync.closed

    def submit(self, command: Any, n: int | None = 1, **options: Any) -> Job:
        """Submit a job (arguments as :meth:`pydvm.jobs.Dvm.submit`'s); its
        :class:`Job` at once -- await it for the result."""
        return Job(self.sync.submit(command, n, **options))

    def submit_many(self, specs: list) -> list[Job]:
        """Several jobs at once (:meth:`pydvm.jobs.Dvm.submit_many`)."""
        return [Job(j) for j in self.sync.submit_many(specs)]

    async def _run(self, fn: Callable, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    async def jobs(self) -> list[JobInfo]:
        """Every job of the DVM (``pydvm ps``)."""
        return await self._run(self.sync.jobs)

    async def job(self, nspace: str) -> JobInfo | None:
        """The job ``nspace`` as ``pydvm ps`` lists it; None if not there."""
        return await self._run(self.sync.job, nspace)

    async def kill(self, nspace: str, wait: bool = False,
                   signal: "int | str | None" = None) -> int | None:
        """Kill a job by name, or send its processes ``signal``
        (:meth:`pydvm.jobs.Dvm.kill`)."""
        return await self._run(self.sync.kill, nspace, wait, signal)

    async def release(self, nspace: str) -> list[str]:
        """Release a job started stopped in PMIx_Init (:meth:`pydvm.jobs.Dvm.release`)."""
        return await self._run(self.sync.release, nspace)

    async def processes(self, nspace: str) -> "dict[int, ProcessInfo] | None":
        """A running job's processes by name (:meth:`pydvm.jobs.Dvm.processes`)."""
        return await self._run(self.sync.processes, nspace)

    async def nodes(self) -> list[NodeInfo]:
        """The DVM's nodes (:meth:`pydvm.jobs.Dvm.nodes`)."""
        return await self._run(self.sync.nodes)

    async def events(self, nspace: str | None = None, session: int | None = None
                     ) -> "EventStream":
        """Subscribe to job events (as :meth:`pydvm.jobs.Dvm.events`): once
        this returns, the DVM sends them; ``async for`` over the
        :class:`EventStream` (it ends with the job ``nspace``'s ``ended``,
        or when closed)::

            async with await dvm.events() as events:
                job = dvm.submit("true")
                async for ev in events:
                    ...
        """
        loop = asyncio.get_running_loop()
        stream = EventStream(loop)
        stream.sub = await self._run(lambda: self.sync.on_event(
            stream._put, nspace, session, on_end=lambda: stream._put(EventStream._END)))
        return stream

    async def on_event(self, callback: Callable[[JobEvent], Any], nspace: str | None = None,
                       session: int | None = None) -> Any:
        """Call ``callback(event)`` on this loop for each job event, from
        when this returns; returns the :class:`pydvm.jobs.Subscription`
        (close it to stop)."""
        loop = asyncio.get_running_loop()
        return await self._run(lambda: self.sync.on_event(
            lambda ev: loop.call_soon_threadsafe(callback, ev), nspace, session))

    async def wait(self) -> None:
        """Wait until every job submitted on this connection has ended."""
        await self._run(self.sync.wait)

    async def close(self, wait: bool = False) -> None:
        """Close the connection (:meth:`pydvm.jobs.Dvm.close`)."""
        await self._run(self.sync.close, wait)


class EventStream:
    """Job events as an asynchronous iterator (:meth:`Dvm.events`); leave
    it with :meth:`aclose` or ``async with``.  The iteration raises what
    ended the subscription, if not a close (a lost connection, the DVM
    dropping a subscriber that reads too slowly)."""

    _END = object()

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: asyncio.Queue = asyncio.Queue()
        self.sub: Any = None

    def _put(self, item: Any) -> None:
        self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    def __aiter__(self) -> "EventStream":
        return self

    async def __anext__(self) -> JobEvent:
        item = await self._queue.get()
        if item is self._END:
            self._queue.put_nowait(item)  # every later call ends too
            if self.sub.error is not None:
                raise self.sub.error
            raise StopAsyncIteration
        return item

    async def get(self, timeout: float | None = None) -> JobEvent | None:
        """The next event (None once ended), waiting at most ``timeout``
        seconds (:class:`TimeoutError`)."""
        try:
            return await asyncio.wait_for(self.__anext__(), timeout)
        except StopAsyncIteration:
            return None

    async def aclose(self) -> None:
        """Unsubscribe."""
        self.sub.close()

    async def __aenter__(self) -> "EventStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()
