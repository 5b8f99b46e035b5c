"""Give freed heap back to the system once a burst of jobs has drained.

A node process that ran hundreds of jobs at once (a bulk submission, all
started together) holds their memory at the peak: the C heap of libpmix's
namespaces and of the jobs' pipes and buffers is freed, but glibc keeps
the free pages for the next allocation -- the process stayed at five
times its size at start long after its jobs had ended.  When the node has
been without jobs for :data:`IDLE_DELAY` seconds, :class:`IdleTrim` calls
glibc's ``malloc_trim(0)``, which returns every whole free page.  It costs
a few milliseconds and runs only on an idle node, at most once per idle
spell; elsewhere (no glibc) it does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
from typing import Callable

log = logging.getLogger(__name__)

#: Seconds without jobs before the heap is trimmed.
IDLE_DELAY = 1.0


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


class IdleTrim:
    """Trim the heap once the owner has stayed idle for ``delay`` seconds.

    The owner calls :meth:`idle` when its last job is gone, passing a
    predicate that is still true if it is idle when the delay has passed."""

    def __init__(self, delay: float = IDLE_DELAY) -> None:
        self.delay = delay
        self.trims = 0
        self._fn = _malloc_trim()
        self._due: asyncio.TimerHandle | None = None

    def idle(self, still_idle: Callable[[], bool]) -> None:
        if self._fn is None or self._due is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._due = loop.call_later(self.delay, self._fire, still_idle)

    def _fire(self, still_idle: Callable[[], bool]) -> None:
        self._due = None
        if still_idle() and self._fn is not None:
            self._fn(0)
            self.trims += 1

    def close(self) -> None:
        if self._due is not None:
            self._due.cancel()
            self._due = None
