"""This process's own stalls: stretches of time in which its event loop did not run.

A machine can stop running its processes for seconds -- a virtual machine
whose vCPUs the host did not schedule, a laptop that slept, a stopped
process group -- and when they all run again, each finds its peers silent
for as long as it was itself stopped.  A timer that judges a peer by its
silence (the heartbeats of :func:`pydvm.wire.heartbeat`, a relayed
request's deadline) must not count that time against the peer: the peer
could not have been heard while this process was not listening.

Nothing here asks the kernel: a stall is seen from the loop's own timers.
A timer due at ``due`` that runs at ``now`` was held up for ``now - due``;
more than ``threshold`` of that (a second, or one heartbeat period if that
is shorter) is a stall -- far more than a loaded CPU delays a loop (tens of
milliseconds; 200 ms is not a stall) -- and is recorded from ``due`` to
``now``.  :meth:`Stalls.within` tells a judge how much of a silence fell in
recorded stalls, so that it judges only the time the process was running.
Stalls seen by several timers of the process are merged, never counted
twice.  A stall that a timer mistook for one (a loop delayed that long by
load alone) costs only that much delay in a judgement: detection slows, it
never stops.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("pydvm.stalls")

#: A timer held up by more than this many seconds marks a stall (judges
#: with a shorter period use their period).
STALL_MIN = 1.0
#: Recorded stalls kept (the oldest are dropped; a judge looks back a few
#: heartbeat periods, or a request's deadline).
KEEP = 64


class Stalls:
    """The process's record of its own stalls (see the module docstring)."""

    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        #: (start, end) in time.monotonic() seconds, disjoint, in order.
        self.spans: list[tuple[float, float]] = []
        #: stalls seen so far and their total length (for ``pydvm info``/logs).
        self.count = 0
        self.total = 0.0

    def check(self, due: float, now: float | None = None,
              threshold: float = STALL_MIN) -> float:
        """A timer due at ``due`` runs at ``now``: if it was held up by more
        than ``threshold`` seconds, record the stall and return its length
        (else 0.0)."""
        now = time.monotonic() if now is None else now
        late = now - due
        if late <= threshold:
            return 0.0
        if self.note(due, now) > 0:
            log.warning("this process did not run for %.1fs (a timer ran that late); "
                        "its peers' silence is judged without that time", late)
        return late

    def note(self, start: float, end: float) -> float:
        """Record that the process did not run from ``start`` to ``end``;
        return how much of that was not recorded already."""
        if end <= start:
            return 0.0
        new = end - start
        kept: list[tuple[float, float]] = []
        for s, e in self.spans:
            if e < start or s > end:
                kept.append((s, e))
            else:  # overlapping: merge into the new span
                new -= min(e, end) - max(s, start)
                start, end = min(s, start), max(e, end)
        kept.append((start, end))
        kept.sort()
        self.spans = kept[-self.keep:]
        if new > 0:
            self.count += 1
            self.total += new
        return max(new, 0.0)

    def within(self, since: float, until: float | None = None) -> float:
        """Seconds of recorded stall between ``since`` and ``until`` (now)."""
        until = time.monotonic() if until is None else until
        total = 0.0
        for s, e in reversed(self.spans):  # newest first: a judge looks back a little
            if e <= since:
                break
            total += max(0.0, min(e, until) - max(s, since))
        return total


#: The process's one record (every judge of the process reads and feeds it).
stalls = Stalls()
