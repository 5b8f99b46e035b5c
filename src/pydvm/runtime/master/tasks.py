"""The master's background tasks: every one held, every failure logged, no request left unanswered.

The master handles each message synchronously; what must wait for daemons
(launching a job, a purge broadcast, a failure announcement, a PMIx spawn,
stopping) runs as a task started here.  One :class:`Tasks` is made by the
master and given to each component that starts tasks.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Coroutine

from ...errors import Status
from ...wire import Channel, reply

log = logging.getLogger("pydvm.master")


class Tasks:
    """The set of running background tasks (counted in ``pydvm info``'s records)."""

    def __init__(self) -> None:
        self._running: set[asyncio.Task] = set()

    def __len__(self) -> int:
        return len(self._running)

    def start(self, coro: Coroutine, answer: tuple[Channel, Any] | None = None) -> asyncio.Task:
        """Run ``coro`` as a task.  If it fails and ``answer`` names a request
        (channel, id), that request is answered with the failure, so its
        caller is never left waiting."""
        task = asyncio.ensure_future(coro)
        self._running.add(task)
        task.add_done_callback(lambda t: self._done(t, answer))
        return task

    def _done(self, task: asyncio.Task, answer: tuple[Channel, Any] | None) -> None:
        self._running.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        log.error("internal error", exc_info=task.exception())
        if answer is not None:
            ch, rid = answer
            ch.send(reply(rid, Status.ERR_UNREACH, f"internal error: {task.exception()!r}"))
