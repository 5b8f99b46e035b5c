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
        """:func:`time.monotonic` plus the offset."""
        return time.monotonic() + self.offset


#: Cancelled handles a FakeScheduler tolerates beyond twice its pending count.
HEAP_SLACK = 32


def max_heap_entries(pending: int) -> int:
    """The most heap entries a FakeScheduler with ``pending`` callbacks holds."""
    return 2 * pending + HEAP_SLACK


class _FakeHandle:
    __slots__ = ("deadline", "callback", "cancelled", "_sched")

    def __init__(
        self, deadline: float, callback: Callable[[], object], sched: FakeScheduler
    ) -> None:
        self.deadline = deadline
        self.callback = callback
        self.cancelled = False
        #: the scheduler while this handle is pending there, else None.
        self._sched: FakeScheduler | None = sched

    def cancel(self) -> None:
        if self.cancelled:
            return  # already cancelled, or already ran
        self.cancelled = True
        sched, self._sched = self._sched, None
        if sched is not None:
            sched._one_fewer_pending()


class FakeScheduler:
    """A clock and a timer that move only when told to.

    ``advance(dt)`` moves time forward by ``dt`` seconds, running every
    callback whose deadline falls within the step (including ones that
    callbacks schedule along the way).  It never moves backwards.

    A cancelled handle stays in the heap (lazy deletion) until it reaches
    the top, or until the pending count drops -- by a cancel, or by a
    callback running -- and leaves the heap holding more than
    ``max_heap_entries(pending)`` entries, which rebuilds it from the
    pending handles.  So the heap stays within that bound after every call,
    even while time stands still (a store that keeps arming and cancelling
    timers -- the sweep, parked lookups' timeouts -- cannot grow it) and
    when the callbacks that run are the pending ones among many cancelled.
    Each call stays amortised O(1) plus the heap's O(log n): a rebuild
    costs O(n) and runs only when more than half of the n entries are
    cancelled ones, each of which one ``cancel()`` made and the rebuild
    drops for good.
    """

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._heap: list[tuple[float, int, _FakeHandle]] = []
        self._seq = itertools.count()
        #: handles in the heap that are neither cancelled nor run.
        self._pending = 0

    # Clock
    def now(self) -> float:
        """The fake time: where the last :meth:`advance` left it."""
        return self._now

    # Timer
    def call_later(self, delay: float, callback: Callable[[], object]) -> _FakeHandle:
        """Schedule ``callback()`` ``delay`` seconds of fake time from now (a
        negative delay counts as 0); it runs inside a later :meth:`advance`.
        Returns a handle whose ``cancel()`` unschedules it."""
        if delay < 0:
            delay = 0.0
        handle = _FakeHandle(self._now + delay, callback, self)
        heapq.heappush(self._heap, (handle.deadline, next(self._seq), handle))
        self._pending += 1
        return handle

    def pending(self) -> int:
        """Number of scheduled, uncancelled callbacks."""
        return self._pending

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, running every callback that falls
        due on the way, in deadline order, with :meth:`now` at its deadline.
        Raises ValueError for a negative step: this clock never goes back."""
        if seconds < 0:
            raise ValueError("FakeScheduler cannot go backwards")
        target = self._now + seconds
        while self._heap and self._heap[0][0] <= target:
            deadline, _, handle = heapq.heappop(self._heap)
            if handle.cancelled:
                continue
            self._now = max(self._now, deadline)
            handle.cancelled = True  # a handle fires at most once
            handle._sched = None
            self._one_fewer_pending()
            handle.callback()
        self._now = target

    def check_invariants(self) -> None:
        """Assert the pending count and the heap bound (see the class docstring)."""
        heap = self._heap
        live = sum(1 for _, _, h in heap if not h.cancelled)
        assert live == self._pending, f"{self._pending} pending counted, {live} in the heap"
        assert len(heap) <= max_heap_entries(self._pending), (
            f"timer heap holds {len(heap)} entries for {self._pending} pending callbacks "
            f"(bound {max_heap_entries(self._pending)}): never compacted"
        )
        assert all(heap[(i - 1) // 2] <= heap[i] for i in range(1, len(heap))), "not a heap"

    def _one_fewer_pending(self) -> None:
        """A pending handle was cancelled or has left the heap to run;
        rebuild the heap if that left it over the bound."""
        self._pending -= 1
        if len(self._heap) > max_heap_entries(self._pending):
            self._heap = [e for e in self._heap if not e[2].cancelled]
            heapq.heapify(self._heap)
