"""Items in the order they were last touched, with lazy deletion.

Eviction wants a uid's least recently used item and the sweep wants the
store's least recently used idle-expiring item.  Keeping an ordered map of
items (an ``OrderedDict`` moved-to-end on every touch) makes each removal
touch that map too -- at 100k items, one more cache miss on the hottest path
(unpublish, purge).  This queue instead appends ``(seq, item)`` on every
touch and never deletes in the middle:

* an entry is *live* while ``item.live`` and ``item.seq == seq`` (a later
  touch gave the item a newer entry; removal cleared ``item.live``);
* :meth:`TouchQueue.front` pops dead entries until a live one is at the
  front.

The bound
---------
After every public method returns, ``entries <= max_entries(live)``, that
is ``2 * live + COMPACT_SLACK`` (:func:`max_entries` is the one statement of
it; :meth:`TouchQueue.check_invariants` asserts it).  Both ways an entry can
die keep it: a touch appends (the item's older entry dies) and a removal
lowers ``live`` (the item's entry dies), so :meth:`TouchQueue.touched` *and*
:meth:`TouchQueue.discard` compact -- rebuild the queue from its live
entries -- whenever the count exceeds the bound.  Compacting only on
appends is not enough: purge 90 of a uid's 100 items and nothing would
shrink its queue until that uid next published or was read.

Why every operation stays amortised O(1)
----------------------------------------
A compaction scans ``entries = live + dead`` entries, and it runs only when
``entries > 2 * live + COMPACT_SLACK``, i.e. when ``dead > live``; so it
costs less than twice the dead entries it drops.  Every dead entry was made
dead by exactly one touch or one removal (each kills at most one entry),
and is dropped exactly once (by a compaction or by :meth:`front`).  Charging
each touch and each removal a constant for "its" dead entry therefore pays
for every compaction and every front-pop; ``add`` kills nothing.  After a
compaction ``entries == live``, so the next one needs at least
``live + COMPACT_SLACK`` further deaths.

Because every touch stamps a non-decreasing clock reading, live entries are
in ``last_access`` order.
"""

from __future__ import annotations

from collections import deque
from typing import Iterator

from .model import Item

#: Dead entries tolerated beyond twice the live count before a compaction.
COMPACT_SLACK = 32


def max_entries(live: int) -> int:
    """The most entries a queue of ``live`` items may hold between calls."""
    return 2 * live + COMPACT_SLACK


class TouchQueue:
    """Live items in last-touch order.  The store sets ``item.seq`` and
    ``item.live``; this class only keeps the order.

    Invariant (between calls): ``live`` equals the number of live entries
    and ``entries <= max_entries(live)``.
    """

    __slots__ = ("_q", "live")

    def __init__(self) -> None:
        self._q: deque[tuple[int, Item]] = deque()
        #: number of live items in the queue.
        self.live = 0

    def add(self, item: Item) -> None:
        """A new item (already stamped with ``item.seq``)."""
        self.live += 1
        self._q.append((item.seq, item))
        # live and entries both grew by one: the bound still holds.

    def touched(self, item: Item) -> None:
        """``item`` got a new ``seq``; its older entry is dead from now on."""
        q = self._q
        q.append((item.seq, item))
        if len(q) > max_entries(self.live):
            self._compact()

    def discard(self) -> None:
        """One of the queue's items left the store (``item.live`` is False)."""
        self.live -= 1
        if not self.live:
            self._q.clear()
        elif len(self._q) > max_entries(self.live):
            self._compact()

    def front(self) -> Item | None:
        """The least recently touched live item, or None."""
        q = self._q
        while q:
            seq, item = q[0]
            if item.live and item.seq == seq:
                return item
            q.popleft()
        return None

    def __iter__(self) -> Iterator[Item]:
        """Live items, least recently touched first."""
        for seq, item in self._q:
            if item.live and item.seq == seq:
                yield item

    def __len__(self) -> int:
        return self.live

    @property
    def entries(self) -> int:
        """Entries held, dead ones included (for invariant checks)."""
        return len(self._q)

    def check_invariants(self) -> None:
        """Assert the live count and the bound (see the module docstring)."""
        alive = sum(1 for seq, item in self._q if item.live and item.seq == seq)
        assert alive == self.live, f"queue counts {self.live} live items but holds {alive}"
        assert len(self._q) <= max_entries(self.live), (
            f"queue holds {len(self._q)} entries for {self.live} live items "
            f"(bound {max_entries(self.live)}): never compacted"
        )

    def _compact(self) -> None:
        """Keep only the live entries, in order.  Costs < 2 * dead dropped."""
        self._q = deque([e for e in self._q if e[1].live and e[1].seq == e[0]])
