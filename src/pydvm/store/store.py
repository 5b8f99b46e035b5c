"""The data store: publish, lookup, unpublish, update, keys, purge, sweep, evict.

A :class:`DataStore` is a plain object.  It performs no I/O, imports no
event loop, and reads time only through the injected clock; the runtime (or
a test) hands it a :class:`~pydvm.store.clock.Clock`, a
:class:`~pydvm.store.clock.Timer` and a callback for answers to parked
lookups.  Every operation reads the clock once and passes ``now`` down.

Shape of the data
-----------------
``Item.live`` says whether an item is still in the store.  Every question an
operation asks has an index, so no operation walks the whole store:

=====================  ====================================================
index                  used by
=====================  ====================================================
``_by_key``            lookup, publish's duplicate rule, unpublish(keys)
``_by_owner[ns][rank]`` PROC purges, ``unpublish()`` of a process; with
                       all ranks, APP and NSPACE purges
``_by_session[sid]``   SESSION purges (wildcard namespace): the namespaces
                       holding items of that session, with their item
                       counts (a job's items share its session, so this
                       stays small); items whose session is unknown (or
                       the never-purged default session, which the runtime
                       passes as unknown) are not counted here
``_lru[uid]``          eviction: a uid's items, least recently used first
                       (a :class:`TouchQueue`)
``_idle``              the idle sweep: INDEF/FIRST_READ items, oldest first
                       (a :class:`TouchQueue`)
``_keyindex``          ``keys`` by prefix: every key of ``_by_key``, sorted
                       (a :class:`~pydvm.store.keyindex.KeyIndex`)
=====================  ====================================================

Because every touch stamps ``last_access`` from a monotonic clock and
appends the item to ``_lru[uid]`` and ``_idle`` (older entries go dead),
their live order *is* ``last_access`` order: eviction takes the front of the
uid's queue and the sweep takes the front of ``_idle`` until it meets an
item that is not stale.  Removal leaves the item's entries where they are
(lazy deletion) and only lowers the queues' live counts, which keeps the
hottest path to the indexes a lookup needs anyway.  A queue compacts itself
whenever a touch *or a removal* leaves it holding more than
``max_entries(live)`` entries (``2 * live + COMPACT_SLACK``), so after every
operation its size is bounded by its live items, at amortised O(1) cost per
touch and removal (the argument is in :mod:`pydvm.store.touchqueue`).

Every removal -- unpublish, replace, first read, each purge, the sweep,
eviction -- goes through :meth:`DataStore._remove_keys`, which keeps every
index, the per-uid usage and the counters in step.

The store's read-only queries (``keys``, ``stats``, ``describe_uid`` ...) are
:class:`~pydvm.store.views.StoreViews`, its lifetime ends (``purge``, the
idle ``sweep``) :class:`~pydvm.store.lifetimes.StoreLifetimes`: parts of
:class:`DataStore`, which inherits them, kept in modules of their own.

Decide, then change
-------------------
``publish`` and ``update`` work out their whole outcome (bad parameters,
duplicates or ownership, the cap) before they touch anything; a refused one
returns with the store exactly as it found it.  Lazily expiring a stale collider, replacing own
keys and evicting happen only after the publish is certain to proceed.
"""

from __future__ import annotations

import logging
import math
from typing import Callable, Hashable, Iterable, Mapping

from ..enums import Persistence, Range
from ..errors import Status
from .clock import Clock, Timer, TimerHandle
from .keyindex import KeyIndex
from .model import Caller, Item, Value, item_nbytes, value_size
from .parked import ParkedLookups
from .results import FoundKey, Pending, Reason, Reply, StoreParams, bad_param
from .rules import ReadVerdict, may_read, owns
from .touchqueue import TouchQueue
from .updates import update_args, updated
from .validate import as_range, check_keys, check_pairs, item_args
from .lifetimes import StoreLifetimes
from .views import StoreViews

log = logging.getLogger("pydvm.store")

AnswerSink = Callable[[Hashable, Reply], None]


class DataStore(StoreLifetimes, StoreViews):
    """One store (the master's or a daemon's).

    Parameters
    ----------
    name:
        Used in logs and statistics (``"master"`` or the node name).
    clock, timer:
        Time, injected.  An asyncio loop serves as ``timer``.
    on_answer:
        Called as ``on_answer(ticket, reply)`` when a parked lookup is
        answered (satisfied by a publish, or timed out).  Dropped lookups
        (requestor terminated, :meth:`cancel`) are never answered.
    params:
        :class:`StoreParams`, read once.
    dvm_nspace:
        The namespace the DVM itself acts under; the RM range admits it.
    on_holder:
        Called as ``on_holder(uid, True)`` when a uid's first live item is
        stored and ``on_holder(uid, False)`` when its last one leaves,
        whatever removed it (a daemon tells the master which uids its node
        store holds: see :mod:`pydvm.runtime.master.direct`).  Never called for a
        uid whose holding did not change.
    """

    def __init__(
        self,
        *,
        name: str,
        clock: Clock,
        timer: Timer,
        on_answer: AnswerSink,
        params: StoreParams = StoreParams(),
        dvm_nspace: str = "pydvm",
        on_holder: Callable[[int, bool], None] | None = None,
    ) -> None:
        self.name = name
        self.params = params
        self.dvm_nspace = dvm_nspace
        self._clock = clock
        self._timer = timer
        self._on_answer = on_answer
        #: told ``(uid, True)`` when a uid's first live item arrives and
        #: ``(uid, False)`` when its last one leaves (see :meth:`holds`).
        self._on_holder = on_holder

        #: number of live items.
        self._count = 0
        #: the last touch sequence number given out (Item.seq).
        self._seq = 0
        #: key -> the one Item holding that key, or {id: Item} (publish order)
        #: when two or more do.  Most keys have one holder; storing it bare
        #: saves a dict per key and a cache miss per lookup.  See _holders.
        self._by_key: dict[str, Item | dict[int, Item]] = {}
        #: the keys of _by_key in sorted order (keys(), by prefix).
        self._keyindex = KeyIndex()
        #: nspace -> rank -> {id: Item} of the owner.  Nested so that a
        #: removal touches small dicts rather than one big one.
        self._by_owner: dict[str, dict[int, dict[int, Item]]] = {}
        #: session_id -> {nspace: live items of that nspace in that session}.
        self._by_session: dict[int, dict[str, int]] = {}
        #: uid -> its items, least recently used first (last_access order).
        #: Each queue holds at most touchqueue.max_entries(its live items).
        self._lru: dict[int, TouchQueue] = {}
        #: INDEF and FIRST_READ items, least recently used first (same bound).
        self._idle = TouchQueue()
        #: uid -> sum of nbytes of that uid's items; no entry for a uid at 0.
        self._usage: dict[int, int] = {}

        self._parked = ParkedLookups()
        self._sweep_handle: TimerHandle | None = None
        self._next_id = 0
        self._warned_uids: set[int] = set()
        #: reason -> keys / items removed for it (every Reason.ALL present).
        #: Counted in _remove_keys alone.  Items and keys ever stored, so
        #: that check_invariants can tie the counters to what is live.
        self._removed_keys: dict[str, int] = dict.fromkeys(Reason.ALL, 0)
        self._removed_items: dict[str, int] = dict.fromkeys(Reason.ALL, 0)
        self._stored_items = 0
        self._stored_keys = 0
        self._sweep_passes = 0
        self._sweep_budget_exhausted = 0

    # ------------------------------------------------------------------
    # publish
    # ------------------------------------------------------------------

    def publish(
        self,
        caller: Caller,
        pairs: Mapping[str, Value],
        range: Range | int = Range.SESSION,
        persistence: Persistence | int | None = None,
        access_uids: Iterable[int] = (),
        access_gids: Iterable[int] = (),
        replace: bool = False,
    ) -> Reply:
        """Store ``pairs`` as one item owned by ``caller`` (SPEC 4, publish).

        Returns SUCCESS, or a refusal that left the store unchanged:
        BAD_PARAM (message names the problem), DUPLICATE_KEY, or
        OUT_OF_RESOURCE (larger than the whole cap).  May evict the caller's
        uid's least recently used items, and may answer parked lookups
        through ``on_answer`` before returning.
        """
        # -- decide: validate -------------------------------------------
        problem, norm = check_pairs(pairs)
        if problem:
            return bad_param(problem)
        problem, rng, persist, uids, gids = item_args(range, persistence, access_uids,
                                                       access_gids)
        if problem:
            return bad_param(problem)
        if not isinstance(replace, bool):
            return bad_param("replace must be a bool")
        nbytes = item_nbytes(norm, uids, gids)
        now = self._clock.now()

        # -- decide: duplicate rule ---------------------------------------
        own, stale, foreign = self._colliders(caller, norm, rng, now)
        if foreign is not None:
            return Reply(
                Status.ERR_DUPLICATE_KEY,
                message=f"key {foreign!r} is held by another user's item",
            )
        if own and not replace:
            dup = next(iter(own.values()))[1][0]
            return Reply(
                Status.ERR_DUPLICATE_KEY,
                message=f"key {dup!r} already published (use replace to overwrite your own)",
            )

        # -- decide: cap ----------------------------------------------------
        refusal = self._over_cap(nbytes)
        if refusal is not None:
            return refusal

        # -- change: the publish is certain to proceed ----------------------
        self._expire(stale, now)
        for item, keys in own.values():
            if item.live:
                self._remove_keys(item, keys, Reason.REPLACED, now)
        self._store_new(caller, norm, rng, persist, uids, gids, nbytes, now, "publish")

        # -- answer parked lookups this publish may satisfy -----------------
        self._wake(norm, now)
        return Reply(Status.SUCCESS)

    def _colliders(self, caller: Caller, keys: Iterable[str], rng: Range, now: float
                   ) -> tuple[dict[int, tuple[Item, list[str]]], dict[int, Item], str | None]:
        """The duplicate rule's view of ``keys`` for ``caller`` in range
        ``rng``: the caller's own items holding them (with which keys), the
        stale items met (dead already, not yet swept), and the first key held
        by another owner's item the caller can read (None: none).  Items of
        another range, or that the caller cannot read, do not collide."""
        own: dict[int, tuple[Item, list[str]]] = {}
        stale: dict[int, Item] = {}
        for key in keys:
            for item in self._holders(key):
                if item.range is not rng:
                    continue
                if self._stale(item, now):
                    stale[item.id] = item
                    continue
                if may_read(caller, item, rng, self.dvm_nspace) is not ReadVerdict.OK:
                    continue
                if not owns(caller, item):
                    return own, stale, key
                own.setdefault(item.id, (item, []))[1].append(key)
        return own, stale, None

    def _over_cap(self, nbytes: int) -> Reply | None:
        """The refusal of an item of ``nbytes`` larger than the whole cap."""
        cap = self.params.max_size
        if cap and nbytes > cap:
            return Reply(
                Status.ERR_OUT_OF_RESOURCE,
                message=f"item of {nbytes} bytes exceeds prte_data_server_max_size={cap}",
            )
        return None

    def _expire(self, stale: Mapping[int, Item], now: float) -> None:
        for item in stale.values():
            if item.live:
                self._remove_item(item, Reason.EXPIRED, now)

    def _store_new(self, caller: Caller, norm: dict[str, Value], rng: Range,
                   persist: Persistence, uids: tuple[int, ...], gids: tuple[int, ...],
                   nbytes: int, now: float, what: str) -> Item:
        """Insert a new item (room made under the cap first)."""
        cap = self.params.max_size
        if cap:
            self._make_room(caller.uid, nbytes, cap, now)
        item = Item(self._new_id(), norm, caller, rng, persist, uids, gids, now, nbytes)
        self._insert(item)
        if self.params.verbose >= 2:
            log.info("[%s] %s %s by %s:%d uid=%d (%d bytes, %s, %s)", self.name, what,
                     list(norm), caller.nspace, caller.rank, caller.uid, nbytes,
                     rng.name, persist.name)
        return item

    def _wake(self, keys: Iterable[str], now: float) -> None:
        """Re-ask the parked lookups waiting on ``keys`` (a publish or an
        update stored them); answer those now satisfied."""
        for p in self._parked.wanting(keys):
            if p.ticket not in self._parked:
                continue  # answered earlier in this loop
            reply = self._try_answer(p.requestor, p.keys, p.range, p.need, now)
            if reply is not None:
                self._parked.remove(p.ticket)
                self._on_answer(p.ticket, reply)

    # ------------------------------------------------------------------
    # update: add, compare-and-set, append
    # ------------------------------------------------------------------

    def update(
        self,
        caller: Caller,
        key: str,
        op: str,
        value: Value,
        expected: Value | None = None,
        range: Range | int = Range.SESSION,
        persistence: Persistence | int | None = None,
        access_uids: Iterable[int] = (),
        access_gids: Iterable[int] = (),
    ) -> Reply:
        """Change the value of ``key`` atomically, as ``caller``.

        ``op`` is one of :data:`~pydvm.store.updates.UPDATE_OPS`:

        * ``"add"``: add the integer ``value`` to the key's value, an
          integer held as an int (or a typed PMIx integer) or as decimal
          text (str or bytes); the value keeps its form (``b"3"`` plus 2 is
          ``b"5"``).  An absent key is created holding ``value`` as given.
        * ``"cas"`` (compare-and-set): store ``value`` if the key holds
          ``expected`` (same plain Python type and equal; a PMIx type code
          is not compared), or if it is absent and ``expected`` is None or
          empty (``""``, ``b""``: an absent key reads as empty).
        * ``"append"``: append ``value`` (str to str, bytes to bytes); an
          absent key is created holding ``value``.

        The key is the one the duplicate rule of :meth:`publish` would see:
        held by an item of range ``range`` that ``caller`` can read.  One of
        ``caller``'s own items (same uid, and gid when both are known) is
        changed in place: it keeps its owner, range, persistence and
        accessor lists, is re-accounted (growing it may evict ``caller``'s
        uid's least recently used *other* items) and counts as accessed
        (restamped, as a lookup would).  A key held by another owner's item
        is refused ``NO_PERMISSIONS`` -- only its owner may change it, as
        only its owner may remove it.  An absent key is created as a new
        item of ``caller``'s with ``range``, ``persistence`` and the
        accessor lists (ignored otherwise).  Nothing is consumed:
        FIRST_READ keys go only when a lookup returns them.

        Returns SUCCESS with ``found`` holding the key's value afterwards
        (and its owner; empty when the key is absent afterwards: a
        compare-and-set that found no key and did not create it) and
        ``count`` 1 when the store changed, 0 when a compare-and-set did
        not match.  Refusals leave the store as it was: BAD_PARAM (message
        names the problem: an unknown op, a value of the wrong type, an
        ``add`` to a value that is not an integer or whose result does not
        fit), NO_PERMISSIONS, OUT_OF_RESOURCE (the item would be larger
        than the whole cap).  Wakes parked lookups waiting on the key.
        """
        # -- decide: validate -------------------------------------------
        problem, delta, rng, persist, uids, gids = update_args(
            op, key, value, expected, range, persistence, access_uids, access_gids)
        if problem:
            return bad_param(problem)
        operand = value
        now = self._clock.now()

        # -- decide: whose key, and its new value ---------------------------
        own, stale, foreign = self._colliders(caller, (key,), rng, now)
        if foreign is not None:
            return Reply(Status.ERR_NO_PERMISSIONS,
                         message=f"key {key!r} is held by another user's item; only its "
                                 "owner may change it")
        target = next(iter(own.values()))[0] if own else None
        current = target.pairs[key] if target is not None else None
        problem, new = updated(op, current, operand, expected, delta)
        if problem:
            return bad_param(f"{op} on {key!r}: {problem}")
        grown = 0
        if new is not None:
            grown = (target.nbytes + value_size(new) - value_size(current)
                     if target is not None else item_nbytes({key: new}, uids, gids))
            refusal = self._over_cap(grown)
            if refusal is not None:
                return refusal

        # -- change -----------------------------------------------------------
        self._expire(stale, now)
        if new is None:  # a compare-and-set that did not match: a read
            if target is None:
                return Reply(Status.SUCCESS)
            self._touch(target, now)
            return Reply(Status.SUCCESS, (FoundKey(key, current, target.owner.proc),))
        if target is not None:
            self._touch(target, now)  # first: the most recently used is evicted last
            cap = self.params.max_size
            if cap and grown > target.nbytes:
                # Room for the growth; the target itself, now the uid's most
                # recently used item and alone no larger than the cap, goes last.
                self._make_room(target.uid, grown - target.nbytes, cap, now)
            target.pairs[key] = new
            self._usage[target.uid] += grown - target.nbytes
            target.nbytes = grown
            owner = target.owner
            if self.params.verbose >= 2:
                log.info("[%s] %s %r of %s:%d by %s:%d (item now %d bytes)", self.name, op,
                         key, owner.nspace, owner.rank, caller.nspace, caller.rank, grown)
        else:
            owner = self._store_new(caller, {key: new}, rng, persist, uids, gids, grown, now,
                                    op).owner
        answer = Reply(Status.SUCCESS, (FoundKey(key, new, owner.proc),), count=1)
        self._wake((key,), now)
        return answer

    def _make_room(self, uid: int, nbytes: int, cap: int, now: float) -> None:
        """Evict ``uid``'s least recently used items until ``nbytes`` fits."""
        while self._usage.get(uid, 0) + nbytes > cap:
            victim = self._lru[uid].front()  # not None: usage > 0 means items exist
            assert victim is not None
            if uid not in self._warned_uids:
                self._warned_uids.add(uid)
                log.warning(
                    "[%s] uid %d reached the store cap of %d bytes; evicting its least "
                    "recently used items (raise prte_data_server_max_size to keep more)",
                    self.name, uid, cap,
                )
            self._remove_item(victim, Reason.EVICTED, now)

    # ------------------------------------------------------------------
    # lookup
    # ------------------------------------------------------------------

    def lookup(
        self,
        caller: Caller,
        keys: Iterable[str],
        range: Range | int = Range.SESSION,
        wait: int | None = None,
        timeout: float | None = None,
        ticket: Hashable | None = None,
    ) -> Reply | Pending:
        """Look ``keys`` up as ``caller`` (SPEC 4, lookup).

        Without ``wait``: a :class:`Reply` at once -- SUCCESS,
        PARTIAL_SUCCESS (with what was found), NO_PERMISSIONS, NOT_FOUND or
        BAD_PARAM.  With ``wait`` (N keys; 0 means all): the reply if
        already satisfiable, else :class:`Pending` -- the answer (all keys
        at once, or TIMEOUT after ``timeout`` seconds; ``None`` or 0 waits
        without limit) goes to ``on_answer(ticket, reply)``.  ``ticket``
        must be unique among this store's parked lookups; one is made up if
        not given.
        """
        problem, klist = check_keys(keys)
        if problem:
            return bad_param(problem)
        rng = as_range(range)
        if rng is None:
            return bad_param(f"unknown range {range!r}")
        if wait is not None and (isinstance(wait, bool) or not isinstance(wait, int) or wait < 0):
            return bad_param(f"wait must be a non-negative integer, not {wait!r}")
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
                return bad_param(f"timeout must be a number of seconds, not {timeout!r}")
            if math.isnan(timeout) or timeout < 0:
                return bad_param(f"timeout must be non-negative, not {timeout!r}")
        if wait is not None and ticket is not None and ticket in self._parked:
            return bad_param(f"ticket {ticket!r} is already waiting")
        now = self._clock.now()
        if wait is None:
            need = 0
        else:
            need = len(klist) if wait == 0 else min(wait, len(klist))
        reply = self._try_answer(caller, klist, rng, need, now)
        if reply is not None:
            return reply
        if ticket is None:
            ticket = ("auto", self._new_id())
        p = self._parked.add(ticket, caller, klist, rng, need)
        if timeout:
            p.timer = self._timer.call_later(float(timeout), lambda t=ticket: self._time_out(t))
        if self.params.verbose >= 2:
            log.info("[%s] parked lookup %s for %s:%d (need %d)", self.name, list(klist),
                     caller.nspace, caller.rank, need)
        return Pending(ticket)

    def _try_answer(
        self, requestor: Caller, keys: tuple[str, ...], rng: Range, need: int, now: float
    ) -> Reply | None:
        """The one answering path, for immediate and parked lookups alike.

        Finds, for each key, the first item (in publish order) that passes
        checks (a), (b), (c).  If fewer than ``need`` keys are found, returns
        ``None`` having consumed nothing.  Otherwise touches every answering
        item, removes returned FIRST_READ keys, and returns the reply.
        """
        hits: list[tuple[str, Item]] = []
        refused = False
        stale: list[Item] = []
        for key in keys:
            for item in self._holders(key):
                if self._stale(item, now):
                    stale.append(item)
                    continue
                verdict = may_read(requestor, item, rng, self.dvm_nspace)
                if verdict is ReadVerdict.OK:
                    hits.append((key, item))
                    break
                if verdict is ReadVerdict.NO_ACCESS:
                    refused = True
        for item in stale:  # lazy expiry: reads never see a dead item
            if item.live:
                self._remove_item(item, Reason.EXPIRED, now)
        if len(hits) < need:
            return None
        found = []
        consumed: dict[int, tuple[Item, list[str]]] = {}
        for key, item in hits:
            found.append(FoundKey(key, item.pairs[key], item.owner.proc))
            self._touch(item, now)
            if item.persistence is Persistence.FIRST_READ:
                consumed.setdefault(item.id, (item, []))[1].append(key)
        for item, ckeys in consumed.values():
            self._remove_keys(item, ckeys, Reason.CONSUMED, now)
        if len(found) == len(keys):
            return Reply(Status.SUCCESS, tuple(found))
        if found:
            return Reply(Status.ERR_PARTIAL_SUCCESS, tuple(found))
        if refused:
            return Reply(Status.ERR_NO_PERMISSIONS, message="not readable by this requestor")
        return Reply(Status.ERR_NOT_FOUND)

    def _time_out(self, ticket: Hashable) -> None:
        p = self._parked.remove(ticket)
        if p is not None:
            if self.params.verbose >= 2:
                log.info("[%s] parked lookup %s timed out", self.name, list(p.keys))
            self._on_answer(ticket, Reply(Status.ERR_TIMEOUT, message="lookup timed out"))

    def cancel(self, ticket: Hashable) -> bool:
        """Drop a parked lookup without answering it (its caller went away).

        Returns True if it was parked.
        """
        return self._parked.remove(ticket) is not None

    # ------------------------------------------------------------------
    # unpublish
    # ------------------------------------------------------------------

    def unpublish(self, caller: Caller, keys: Iterable[str]) -> Reply:
        """Remove each named key from every item ``caller`` owns.

        Ownership alone decides (:func:`~pydvm.store.rules.owns`); range and
        accessor lists are not consulted.  SUCCESS whether or not anything
        matched, with ``count`` the keys removed (a key held by two of the
        caller's items counts twice); BAD_PARAM for a malformed or empty
        key list.
        """
        problem, klist = check_keys(keys)
        if problem:
            return bad_param(problem)
        now = self._clock.now()
        removed = 0
        for key in klist:
            for item in list(self._holders(key)):
                if owns(caller, item):
                    self._remove_keys(item, [key], Reason.UNPUBLISHED, now)
                    removed += 1
        return Reply(Status.SUCCESS, count=removed)

    def unpublish_all(self, caller: Caller) -> Reply:
        """``unpublish()`` with no keys: everything ``caller``'s process published.

        Only what ``caller`` also owns (:func:`~pydvm.store.rules.owns`): a
        process's items all carry its uid, so for a real process this is all
        of them, while a relayed claim naming somebody else's process can
        never remove what its uid could not.  ``count`` is the keys removed.
        """
        _, keys = self._purge(Persistence.INVALID, caller.nspace, caller.rank, None, None,
                              caller)
        return Reply(Status.SUCCESS, count=keys)

    # ------------------------------------------------------------------
    # the index keepers: insert, touch, and the one removal helper
    # ------------------------------------------------------------------

    def _holders(self, key: str):
        """The items holding ``key``, in publish order."""
        held = self._by_key.get(key)
        if held is None:
            return ()
        if held.__class__ is dict:
            return held.values()  # type: ignore[union-attr]
        return (held,)

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _insert(self, item: Item) -> None:
        iid = item.id
        item.live = True
        self._count += 1
        self._stored_items += 1
        self._stored_keys += len(item.pairs)
        for key in item.pairs:
            held = self._by_key.get(key)
            if held is None:
                self._by_key[key] = item
                self._keyindex.add(key)
            elif held.__class__ is dict:
                held[iid] = item  # type: ignore[index]
            else:
                self._by_key[key] = {held.id: held, iid: item}  # type: ignore[union-attr]
        owner = item.owner
        self._by_owner.setdefault(owner.nspace, {}).setdefault(owner.rank, {})[iid] = item
        if owner.session_id is not None:
            counts = self._by_session.setdefault(owner.session_id, {})
            counts[owner.nspace] = counts.get(owner.nspace, 0) + 1
        self._seq += 1
        item.seq = self._seq
        lru = self._lru.get(owner.uid)
        if lru is None:
            lru = self._lru[owner.uid] = TouchQueue()
            if self._on_holder is not None:
                self._on_holder(owner.uid, True)
        lru.add(item)
        self._usage[owner.uid] = self._usage.get(owner.uid, 0) + item.nbytes
        if item.idle_expires:
            self._idle.add(item)
            self._arm_sweep()

    def _touch(self, item: Item, now: float) -> None:
        item.last_access = now
        self._seq += 1
        item.seq = self._seq
        self._lru[item.uid].touched(item)
        if item.idle_expires:
            self._idle.touched(item)

    def _remove_item(self, item: Item, reason: str, now: float) -> None:
        self._remove_keys(item, list(item.pairs), reason, now)

    def _remove_keys(self, item: Item, keys: list[str], reason: str, now: float) -> None:
        """The one removal path: drop ``keys`` from ``item``.

        Reached by unpublish, replace, first read, every purge, the sweep
        (and lazy expiry), and eviction.  Keeps ``_by_key`` in step, and
        either re-charges the shrunken item to its uid or, when it is left
        empty, unlinks it from every index and releases its usage.  Counts
        the keys under ``reason`` (a :class:`Reason`), and the item too when
        it leaves.
        """
        iid = item.id
        self._removed_keys[reason] += len(keys)
        for key in keys:
            del item.pairs[key]
            held = self._by_key[key]
            if held is item:
                del self._by_key[key]
                self._keyindex.discard(key)
            else:
                del held[iid]  # type: ignore[union-attr]
                if len(held) == 1:  # type: ignore[arg-type]
                    self._by_key[key] = next(iter(held.values()))  # type: ignore[union-attr]
        uid = item.uid
        if item.pairs:
            new = item_nbytes(item.pairs, item.access_uids, item.access_gids)
            self._usage[uid] += new - item.nbytes
            item.nbytes = new
            if self.params.verbose >= 1:
                log.info("[%s] %s %s of %s:%d (item now %d bytes)", self.name, reason, keys,
                         item.owner.nspace, item.owner.rank, new)
            return
        item.live = False
        self._count -= 1
        owner = item.owner
        ranks = self._by_owner[owner.nspace]
        _unindex(ranks, owner.rank, iid)
        if not ranks:
            del self._by_owner[owner.nspace]
        if owner.session_id is not None:
            counts = self._by_session[owner.session_id]
            if counts[owner.nspace] == 1:
                del counts[owner.nspace]
                if not counts:
                    del self._by_session[owner.session_id]
            else:
                counts[owner.nspace] -= 1
        lru = self._lru[uid]
        lru.discard()
        if not lru.live:
            del self._lru[uid]
            if self._on_holder is not None:
                self._on_holder(uid, False)
        left = self._usage[uid] - item.nbytes
        if left:
            self._usage[uid] = left
        else:
            del self._usage[uid]
        if item.idle_expires:
            self._idle.discard()
            if not self._idle.live and self._sweep_handle:
                self._sweep_handle.cancel()
                self._sweep_handle = None
        self._removed_items[reason] += 1
        if self.params.verbose >= 1:
            log.info("[%s] %s item %s of %s:%d uid=%d (%d bytes)", self.name, reason, keys,
                     owner.nspace, owner.rank, uid, item.nbytes)

    def check_invariants(self) -> None:
        """Assert every rule that spans the store's structures."""
        items = {item.id: item for item in self.items()}
        assert len(items) == self._count, "an item is in two LRU dicts, or the count is off"
        usage: dict[int, int] = {}
        session_counts: dict[int, dict[str, int]] = {}
        for iid, item in items.items():
            assert item.live
            assert item.pairs, f"empty item {iid} left in the store"
            assert item.nbytes == item_nbytes(item.pairs, item.access_uids, item.access_gids)
            usage[item.uid] = usage.get(item.uid, 0) + item.nbytes
            for key in item.pairs:
                assert any(h is item for h in self._holders(key)), f"{key!r} not indexed"
            assert self._by_owner[item.owner.nspace][item.owner.rank][iid] is item
            if item.owner.session_id is not None:
                sc = session_counts.setdefault(item.owner.session_id, {})
                sc[item.owner.nspace] = sc.get(item.owner.nspace, 0) + 1
            assert item.seq <= self._seq
        assert usage == self._usage, f"usage {self._usage} != sum of nbytes {usage}"
        assert self._stored_items - sum(self._removed_items.values()) == self._count, \
            "removed-item counters disagree with the items stored and live"
        live_keys = sum(len(item.pairs) for item in items.values())
        assert self._stored_keys - sum(self._removed_keys.values()) == live_keys, \
            "removed-key counters disagree with the keys stored and live"
        assert session_counts == self._by_session, "session index disagrees with the items"
        self._keyindex.check_invariants()
        assert list(self._keyindex) == sorted(self._by_key), "key index disagrees with _by_key"
        cap = self.params.max_size
        if cap:
            assert all(v <= cap for v in usage.values()), f"a uid is over the cap: {usage}"
        owner_buckets = [b for ranks in self._by_owner.values() for b in ranks.values()]
        assert all(self._by_owner.values()), "empty namespace left in _by_owner"
        for key, held in self._by_key.items():
            if held.__class__ is dict:
                assert len(held) >= 2, f"_by_key[{key!r}] is a dict of fewer than two"
            else:
                assert items.get(held.id) is held and key in held.pairs
        for index in (dict(enumerate(owner_buckets)),):
            for bucket in index.values():
                assert bucket, "empty bucket left in an index"
                for iid, item in bucket.items():
                    assert items.get(iid) is item, f"index holds removed item {iid}"
        by_uid: dict[int, set[int]] = {}
        for iid, item in items.items():
            by_uid.setdefault(item.uid, set()).add(iid)
        assert set(self._lru) == set(by_uid), "LRU queues do not match the uids holding items"
        for uid, lru in self._lru.items():
            queued = list(lru)
            assert [it.id for it in queued if it.uid == uid] == [it.id for it in queued]
            assert {it.id for it in queued} == by_uid[uid] and len(queued) == lru.live, \
                f"LRU queue of uid {uid} does not hold exactly its live items"
            stamps = [it.last_access for it in queued]
            assert stamps == sorted(stamps), f"LRU order of uid {uid} is not last_access order"
            lru.check_invariants()  # live count, and entries <= max_entries(live)
        idle = list(self._idle)
        assert {it.id for it in idle} == {i for i, it in items.items() if it.idle_expires}
        assert len(idle) == self._idle.live
        stamps = [it.last_access for it in idle]
        assert stamps == sorted(stamps), "idle queue is not in last_access order"
        self._idle.check_invariants()  # the same bound as the LRU queues
        if self._idle.live and self.params.timeout:
            assert self._sweep_handle is not None, "idle items held but no sweep armed"
        if not self._idle.live:
            assert self._sweep_handle is None, "sweep armed with no idle item"
        self._parked.check_invariants()


# ----------------------------------------------------------------------
# index helper
# ----------------------------------------------------------------------


def _unindex(index: dict, key, iid: int) -> None:
    bucket = index[key]
    del bucket[iid]
    if not bucket:
        del index[key]
