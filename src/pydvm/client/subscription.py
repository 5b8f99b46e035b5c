"""A job-event subscription of the blocking job API (:mod:`pydvm.client.jobs`).

:meth:`pydvm.jobs.Dvm.events` and :meth:`~pydvm.jobs.Dvm.on_event` make
one; the connection's reader thread hands it each ``job_event`` pushed.
"""

from __future__ import annotations

import threading

from .jobspec import JobEvent

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Iterator


class Subscription:
    """Job events pushed by the DVM (``subscribe``): iterate over it
    (:class:`JobEvent`; the iteration ends when it is closed, or -- for one
    job's events -- after its ``ended``), or give it a callback
    (:meth:`Dvm.on_event`).  :meth:`close` unsubscribes.  A subscriber that
    reads too slowly is dropped by the DVM (which holds a bounded backlog
    per connection): the iteration then raises
    :class:`~pydvm.errors.OutOfResourceError`, and ``error`` says so; so
    does a lost connection (:class:`~pydvm.errors.UnreachableError`)."""

    def __init__(self, dvm: Any, rid: int, callback: Callable[[JobEvent], Any] | None,
                 nspace: str | None, on_end: Callable[[], Any] | None = None) -> None:
        import collections

        self._on_end = on_end
        self.dvm = dvm
        self.id = rid
        self.nspace = nspace
        self._callback = callback
        self._queue: Any = collections.deque()
        self._cv = threading.Condition()
        self.closed = False
        self.error: BaseException | None = None

    def _event(self, msg: dict) -> None:
        ev = JobEvent(msg)
        if ev.kind == "dropped":  # we read too slowly: the DVM ended the subscription
            from ..errors import OutOfResourceError

            self.dvm._subs.pop(self.id, None)
            self._end(OutOfResourceError(f"the DVM dropped the subscription: "
                                         f"{ev.fields.get('reason') or 'not read in time'}"))
            return
        if self._callback is not None:
            self._callback(ev)
        else:
            with self._cv:
                self._queue.append(ev)
                self._cv.notify_all()
        if ev.kind == "ended" and self.nspace is not None and ev.nspace == self.nspace:
            self.close()

    def _end(self, error: BaseException | None) -> None:
        with self._cv:
            if self.closed:
                return
            self.closed = True
            self.error = self.error or error
            self._cv.notify_all()
        if self._on_end is not None:
            self._on_end()

    def get(self, timeout: float | None = None) -> JobEvent | None:
        """The next event (None once closed and drained); TimeoutError if
        none comes within ``timeout`` seconds."""
        with self._cv:
            if not self._cv.wait_for(lambda: self._queue or self.closed, timeout):
                raise TimeoutError("no job event in time")
            if self._queue:
                return self._queue.popleft()
            if self.error is not None:
                raise self.error
            return None

    def __iter__(self) -> Iterator[JobEvent]:
        while True:
            ev = self.get()
            if ev is None:
                return
            yield ev

    def close(self) -> None:
        """Unsubscribe (events already received stay to be read)."""
        if self.closed:
            return
        self._end(None)
        if self.dvm._subs.pop(self.id, None) is not None:
            self.dvm._post({"t": "unsubscribe", "id": self.dvm._new_id(), "ref": self.id})

    def __enter__(self) -> "Subscription":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
