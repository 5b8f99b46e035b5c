"""A node process's heap under bursts of jobs: collection paced, freed memory returned.

Two costs grew with the number of jobs in flight, measured with 3,000
one-rank jobs submitted at once to a one-machine DVM:

* **Garbage collection.**  Each job in flight keeps a few hundred tracked
  objects alive (its records, PMIx arrays, futures), so with the default
  thresholds (a young collection every 700 allocations) the collector ran
  about 1,700 times and traversed the whole growing heap 13 times: 0.9 ms
  of the node's 2.8 ms per job.  :func:`tune` freezes what exists at
  start-up (modules, the runtime's own tables: never garbage, never
  traversed again) and makes young collections 30 times rarer
  (:data:`YOUNG`); the same run then spent 0.26 ms per job collecting.
  Full collections still come on their own, and once more when idle.
* **Memory at the peak.**  Freed C heap (libpmix's namespaces, the jobs'
  buffers) stayed with the process: five times its size at start, long
  after its jobs had ended.  When the node has been without jobs for
  :data:`IDLE_DELAY` seconds, :class:`IdleTrim` collects and calls glibc's
  ``malloc_trim(0)``, which returns every whole free page (a few
  milliseconds, once per idle spell; nothing without glibc).
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
from typing import Callable

#: Net allocations between young collections (CPython's default: 700).
YOUNG = 20_000
#: Seconds without jobs before the heap is collected and trimmed.
IDLE_DELAY = 1.0

_tuned = False


def tune() -> None:
    """Freeze the start-up heap and space young collections (once per
    process; call when the process is about to serve)."""
    global _tuned
    if _tuned:
        return
    _tuned = True
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG, older, oldest)


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


class IdleTrim:
    """Collect and trim the heap once the owner has stayed idle ``delay`` seconds.

    The owner calls :meth:`idle` when its last job is gone, passing a
    predicate that is still true if it is idle when the delay has passed."""

    def __init__(self, delay: float = IDLE_DELAY) -> None:
        self.delay = delay
        self.trims = 0
        self._fn = _malloc_trim()
        self._due: asyncio.TimerHandle | None = None

    def idle(self, still_idle: Callable[[], bool]) -> None:
        if self._due is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._due = loop.call_later(self.delay, self._fire, still_idle)

    def _fire(self, still_idle: Callable[[], bool]) -> None:
        self._due = None
        if not still_idle():
            return
        gc.collect()
        if self._fn is not None:
            self._fn(0)
        self.trims += 1

    def close(self) -> None:
        if self._due is not None:
            self._due.cancel()
            self._due = None
