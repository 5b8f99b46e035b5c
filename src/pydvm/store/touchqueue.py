"""Items in the order they were last touched, with lazy deletion.

Eviction wants a uid's least recently used item and the sweep wants the
store's least recently used idle-expiring item.  Keeping an ordered map of
items (an ``OrderedDict`` moved-to-end on every touch) makes each removal
touch that map too -- at 100k items, one more cache miss on the hottest path
(unpublish, purge).  This queue instead appends ``(seq, item)`` on every
touch and never deletes in the middle:

* an entry is *live* while ``item.live`` and ``item.seq == seq`` (a later
  touch gave the item a newer entry; removal cleared ``item.live``);
* :meth:`front` pops dead entries until a live one is at the front;
* when dead entries outnumber live ones (plus a constant), the queue is
  rebuilt from its live entries, so its length stays within
  ``2 * live + COMPACT_SLACK`` and every operation is amortised O(1).

Because every touch stamps a non-decreasing clock reading, live entries are
in ``last_access`` order.  The same idea as trio's deadline heap, which also
leaves stale entries in place and prunes them by count.
"""

from __future__ import annotations

from collections import deque
from typing import Iterator

from .model import Item

#: Dead entries tolerated beyond the live count before a rebuild.
COMPACT_SLACK = 32


class TouchQueue:
    """Live items in last-touch order.  The store sets ``item.seq`` and
    ``item.live``; this class only keeps the order."""

    __slots__ = ("_q", "live")

    def __init__(self) -> None:
        self._q: deque[tuple[int, Item]] = deque()
        #: number of live items in the queue.
        self.live = 0

    def add(self, item: Item) -> None:
        """A new item (already stamped with ``item.seq``)."""
        self.live += 1
        self._push(item)

    def touched(self, item: Item) -> None:
        """``item`` got a new ``seq``; its older entry is dead from now on."""
        self._push(item)

    def discard(self) -> None:
        """One of the queue's items left the store (``item.live`` is False)."""
        self.live -= 1
        if not self.live:
            self._q.clear()

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

    def _push(self, item: Item) -> None:
        q = self._q
        q.append((item.seq, item))
        if len(q) > 2 * self.live + COMPACT_SLACK:
            self._q = deque(e for e in q if e[1].live and e[1].seq == e[0])
