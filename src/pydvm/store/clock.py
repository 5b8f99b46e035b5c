"""Time, injected: the store never reads a clock or arms a timer on its own.

Two small protocols describe everything the store needs from the outside
world's notion of time:

* :class:`Clock` -- ``now()`` in seconds on a monotonic scale.  Durations
  (idle timeouts, parked-lookup timeouts) are measured on it; wall-clock time
  is for display only, so setting the system clock back cannot make an item
  live forever or die early.
* :class:`Timer` -- ``call_later(delay, fn)`` returning a handle with
  ``cancel()``.  An asyncio event loop *is* a Timer, which is how the runtime
  wires a store into its loop without the store importing asyncio.

:class:`FakeScheduler` implements both for tests and benchmarks: time moves
only through :meth:`FakeScheduler.advance`, which refuses to go backwards and
runs the callbacks that fall due, in deadline order, with ``now()`` reading
each callback's own deadline while it runs.
"""

from __future__ import annotations

import heapq
import itertools
import time
from typing import Callable, Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic scale (arbitrary origin)."""
        ...


class TimerHandle(Protocol):
    def cancel(self) -> None:
        """Stop the callback from running; harmless if it already ran."""
        ...


class Timer(Protocol):
    def call_later(self, delay: float, callback: Callable[[], object]) -> TimerHandle:
        """Run ``callback()`` once, ``delay`` seconds from now."""
        ...


class MonotonicClock:
    """The real clock: :func:`time.monotonic` plus an optional offset.

    Tests may give a large random offset so that code mixing this clock with
    a stray ``time.monotonic()`` call produces absurd durations at once.
    """

    __slots__ = ("offset",)

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset

    def now(self) -> float:
        return time.monotonic() + self.offset


class _FakeHandle:
    __slots__ = ("deadline", "callback", "cancelled")

    def __init__(self, deadline: float, callback: Callable[[], object]) -> None:
        self.deadline = deadline
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeScheduler:
    """A clock and a timer that move only when told to.

    ``advance(dt)`` moves time forward by ``dt`` seconds, running every
    callback whose deadline falls within the step (including ones that
    callbacks schedule along the way).  It never moves backwards.
    """

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._heap: list[tuple[float, int, _FakeHandle]] = []
        self._seq = itertools.count()

    # Clock
    def now(self) -> float:
        return self._now

    # Timer
    def call_later(self, delay: float, callback: Callable[[], object]) -> _FakeHandle:
        if delay < 0:
            delay = 0.0
        handle = _FakeHandle(self._now + delay, callback)
        heapq.heappush(self._heap, (handle.deadline, next(self._seq), handle))
        return handle

    def pending(self) -> int:
        """Number of scheduled, uncancelled callbacks."""
        return sum(1 for _, _, h in self._heap if not h.cancelled)

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("FakeScheduler cannot go backwards")
        target = self._now + seconds
        while self._heap and self._heap[0][0] <= target:
            deadline, _, handle = heapq.heappop(self._heap)
            if handle.cancelled:
                continue
            self._now = max(self._now, deadline)
            handle.cancelled = True  # a handle fires at most once
            handle.callback()
        self._now = target
