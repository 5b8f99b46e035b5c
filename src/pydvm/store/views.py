"""The store's read-only side: ``keys`` by prefix, statistics, what a uid holds.

:class:`StoreViews` is the part of :class:`~pydvm.store.DataStore` that only
reads: nothing here touches an item, consumes a key, expires an item or
moves an index, so asking never changes what the store holds or when it
lets it go (an item already past its idle timeout is left out of every
answer, as a lookup would not see it, but stays for the sweep).  The
structures it reads are the store's own, set up and documented in
:class:`~pydvm.store.DataStore` and :mod:`pydvm.store.store`; the store
inherits these methods, so callers use them as ``store.keys(...)``,
``store.stats()``.
"""

from __future__ import annotations

from ..enums import Range
from ..errors import Status
from .model import Caller, Item, value_size
from .results import KeyInfo, Reason, Reply, StoreStats, bad_param
from .rules import ReadVerdict, may_read
from .validate import as_range


class StoreViews:
    """Read-only queries over a :class:`~pydvm.store.DataStore`'s indexes."""

    __slots__ = ()

    # ------------------------------------------------------------------
    # keys: count and list by prefix
    # ------------------------------------------------------------------

    def keys(
        self,
        caller: Caller,
        prefix: str = "",
        range: Range | int = Range.SESSION,
        limit: int | None = None,
        max_bytes: int | None = None,
    ) -> Reply:
        """Count and list the keys starting with ``prefix`` that a lookup by
        ``caller`` in ``range`` could return.

        Returns SUCCESS with ``count`` (every such key, counted once however
        many items hold it) and ``keys``: the first ``limit`` of them in
        sorted order (None: all; 0: count only), stopping early once their
        UTF-8 lengths add up to more than ``max_bytes`` (``count`` still
        says how many there are).  Read-only, like :meth:`stats`: touches,
        consumes and expires nothing; an item past its idle timeout is not
        counted.  BAD_PARAM for a prefix that is not a str, an unknown
        range or a bad limit.  Costs ``O(log n + keys under the prefix)``.
        """
        if not isinstance(prefix, str):
            return bad_param(f"prefix must be a str, not {type(prefix).__name__}")
        rng = as_range(range)
        if rng is None:
            return bad_param(f"unknown range {range!r}")
        for name, v in (("limit", limit), ("max_bytes", max_bytes)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                return bad_param(f"{name} must be a non-negative integer, not {v!r}")
        now = self._clock.now()
        count = 0
        listed: list[str] = []
        room = max_bytes
        full = limit == 0
        for key in self._keyindex.prefixed(prefix):
            for item in self._holders(key):
                if self._stale(item, now):
                    continue
                if may_read(caller, item, rng, self.dvm_nspace) is ReadVerdict.OK:
                    count += 1
                    if not full:
                        size = len(key.encode("utf-8"))
                        if room is not None and size > room:
                            full = True
                        else:
                            listed.append(key)
                            if room is not None:
                                room -= size
                            full = limit is not None and len(listed) >= limit
                    break
        return Reply(Status.SUCCESS, count=count, keys=tuple(listed))

    # ------------------------------------------------------------------
    # inspection
    # ------------------------------------------------------------------

    @property
    def evictions(self) -> int:
        """Items evicted under the cap so far."""
        return self._removed_items[Reason.EVICTED]

    @property
    def expiries(self) -> int:
        """Items removed by the idle timeout (sweep or lazy) so far."""
        return self._removed_items[Reason.EXPIRED]

    @property
    def consumed(self) -> int:
        """FIRST_READ keys removed by the lookup that returned them so far."""
        return self._removed_keys[Reason.CONSUMED]

    def stats(self) -> StoreStats:
        """A :class:`StoreStats` snapshot (copies; later operations do not
        change it).  O(uids holding items); reads no clock."""
        return StoreStats(
            items=self._count,
            bytes_by_uid=dict(self._usage),
            parked=len(self._parked),
            evictions=self.evictions,
            expiries=self.expiries,
            consumed=self.consumed,
            removed_keys=dict(self._removed_keys),
            removed_items=dict(self._removed_items),
            sweep_passes=self._sweep_passes,
            sweep_budget_exhausted=self._sweep_budget_exhausted,
        )

    def holds(self, uid: int) -> bool:
        """Whether ``uid`` owns at least one live item here."""
        return uid in self._lru

    def keys_of_uid(self, uid: int, prefix: str | None = None) -> list[str]:
        """Key names held by ``uid``'s items, least recently used first; with
        ``prefix``, only those starting with it, in sorted order."""
        if prefix is not None:
            return [key for key, _item in self._uid_keys(uid, prefix)]
        return [k for item in self._lru.get(uid, ()) for k in item.pairs]

    def _uid_keys(self, uid: int, prefix: str):
        """(key, item) of ``uid``'s items, for the keys under ``prefix`` in
        sorted order (the key index: O(log n + keys under the prefix))."""
        for key in self._keyindex.prefixed(prefix):
            for item in self._holders(key):
                if item.uid == uid:
                    yield key, item

    def describe_uid(self, uid: int, now: float | None = None,
                     limit: int | None = None, prefix: str | None = None) -> list[KeyInfo]:
        """The keys of ``uid``'s items, least recently used first, as
        :class:`KeyInfo` rows (``pydvm store``); at most ``limit`` of them;
        with ``prefix``, only keys starting with it, in sorted order.

        Read-only: touches nothing, so asking does not keep an item alive;
        an item already past its idle timeout (not yet swept) is left out,
        as a lookup would not see it.  ``now`` defaults to the store clock's
        reading.  Costs O(rows returned + stale items skipped), plus the
        keys under ``prefix`` of other uids when a prefix is given.
        """
        if now is None:
            now = self._clock.now()
        timeout = self.params.timeout
        rows: list[KeyInfo] = []
        if prefix is None:
            pairs = ((key, item) for item in self._lru.get(uid, ()) for key in item.pairs)
        else:
            pairs = self._uid_keys(uid, prefix)
        for key, item in pairs:
            if self._stale(item, now):
                continue
            if limit is not None and len(rows) >= limit:
                return rows
            idle = max(0.0, now - item.last_access)
            expires = max(0.0, timeout - idle) if timeout and item.idle_expires else None
            rows.append(KeyInfo(key, item.persistence, item.range, idle, expires,
                                len(key.encode("utf-8")) + value_size(item.pairs[key]),
                                item.nbytes, item.owner.proc))
        return rows

    def __len__(self) -> int:
        return self._count

    def items(self) -> list[Item]:
        """A snapshot list of the items (for tests and inspection)."""
        return [item for ranks in self._by_owner.values() for bucket in ranks.values()
                for item in bucket.values()]
