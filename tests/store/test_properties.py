"""Property-based tests: random operation sequences against independent oracles.

The state machine drives one store through publishes (several uids, gids,
processes, every range and persistence, accessor lists, replace, caps from
one item to about a hundred so eviction happens), bursts of publishes that
give one job's processes dozens of items, immediate and waiting lookups (a
few keys, a span of many, or many processes waiting for one key), unpublish
by keys and of a whole process, purges of every horizon and target shape --
one process, an application, a whole namespace, a session, or many
processes of a job ending in one step -- cancels and time steps on a
FakeScheduler.  Each example draws how many distinct keys exist (4: dense
collisions and replaces; 16 or 64: stores of a hundred items and more), and
runs are long (100 steps), so it reaches the states where lazily-deleted
bookkeeping -- the LRU and idle queues, the timer heap -- must be compacted
by removals (issue 8, item 10); with that compaction reverted it fails,
typically within its first twenty examples.  After every step it runs
``check_invariants()`` on the store and on the scheduler and recomputes the
per-uid usage from the items itself.  Outcomes are checked against oracles
written from the SPEC (the horizon table, the duplicate/cap decision, the
lookup answer) using the separately tested predicates of
:mod:`pydvm.store.rules`.
"""

from __future__ import annotations

import math

from hypothesis import HealthCheck, event, given, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pydvm.store import (DataStore, FakeScheduler, Pending, Reply, StoreParams, Typed,
                         item_nbytes, value_size)
from pydvm.store.rules import ReadVerdict, may_read, owns, sweep_interval
from storekit import (
    GID_A, GID_B, GID_C, UID_A, UID_B, UID_C, Persistence as P, Range, Status, caller, snapshot,
)

CALLERS = [
    caller("ns-0", 0, uid=UID_A, gid=GID_A, node="n1", app_idx=0, session_id=1),
    caller("ns-0", 1, uid=UID_A, gid=GID_A, node="n2", app_idx=1, session_id=1),
    caller("ns-0", 2, uid=UID_A, gid=None, node="n1", app_idx=1, session_id=1),
    caller("ns-1", 0, uid=UID_B, gid=GID_B, node="n1", app_idx=0, session_id=1),
    caller("ns-1", 1, uid=UID_A, gid=GID_B, node=None, app_idx=None, session_id=1),
    caller("ns-2", 0, uid=UID_B, gid=GID_B, node="n2", app_idx=0, session_id=2),
    caller("ns-2", 1, uid=UID_C, gid=GID_C, node="n2", app_idx=0, session_id=2),
    caller("ns-3", 0, uid=UID_A, gid=GID_A, node="n1", app_idx=None, session_id=None),
    caller("pydvm", 0, uid=UID_A, gid=GID_A, node="n1", app_idx=None, session_id=None),
]
# Larger jobs, so that one uid holds many items in many processes and a
# namespace, application or session purge takes dozens of them at once.
CALLERS += [
    caller("ns-0", r, uid=UID_A, gid=GID_A, node=f"n{r % 3 + 1}", app_idx=r % 2, session_id=1)
    for r in range(3, 16)
]
CALLERS += [
    caller("ns-2", r, uid=UID_B if r % 3 else UID_C, gid=GID_B if r % 3 else GID_C,
           node=f"n{r % 2 + 1}", app_idx=r % 2, session_id=2)
    for r in range(2, 12)
]
CALLERS += [
    caller("ns-3", r, uid=UID_A, gid=GID_A, node="n2", app_idx=None, session_id=None)
    for r in range(1, 6)
]
NSPACES = sorted({c.nspace for c in CALLERS})
RANKS = {ns: sorted(c.rank for c in CALLERS if c.nspace == ns) for ns in NSPACES}
BY_PROC = {c.proc: c for c in CALLERS}
#: The key pool.  Each example uses only its first ``nkeys`` (drawn at setup);
#: rules draw key indexes, mapped into the pool with ``StoreMachine._key``.
KEYS = [f"k{i}" for i in range(64)]
key_st = st.integers(0, len(KEYS) - 1)

values = st.one_of(
    st.text(max_size=30),
    st.binary(max_size=30),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False),
    st.booleans(),
)
pairs_st = st.lists(st.tuples(key_st, values), min_size=1, max_size=3)  # see _pairs
persist_st = st.sampled_from(
    [None, P.INVALID, P.INDEF, P.FIRST_READ, P.PROC, P.APP, P.NSPACE, P.SESSION]
)
#: ranges, biased towards the always-admitting ones so that lookups often succeed
range_st = st.sampled_from([Range.SESSION, Range.SESSION, Range.GLOBAL, Range.UNDEF] + list(Range))
uids_st = st.lists(st.sampled_from([UID_A, UID_B, UID_C]), max_size=2)
gids_st = st.lists(st.sampled_from([GID_A, GID_B, GID_C]), max_size=2)

#: operands of updates: counters (ints, decimal text), what they are compared
#: with, what is appended -- and values of every other kind, which add refuses.
update_values = st.one_of(
    st.integers(-3, 3), st.integers(-(2**63), 2**64 - 1), st.sampled_from(["1", b"2", "-4", b"+1"]),
    st.sampled_from([b"", "", b"a", "a", b"ab", 0, 1, True, 1.0]),
    st.builds(Typed, st.integers(0, 255), st.just(12)),
    values,
)
expected_st = st.one_of(st.none(), st.sampled_from([b"", "", b"a", "a", 0, 1, True]), values)
update_op_st = st.sampled_from(["add", "add", "cas", "cas", "append"])
prefix_st = st.sampled_from(["", "k", "k1", "k2", "k3", "k4", "k63", "x"])

#: horizon -> persistences it removes (literal SPEC 5 table)
REMOVES = {
    P.PROC: {P.PROC},
    P.APP: {P.PROC, P.APP},
    P.NSPACE: {P.PROC, P.APP, P.NSPACE},
    P.SESSION: {P.PROC, P.APP, P.NSPACE, P.SESSION},
    P.INVALID: {P.INDEF, P.FIRST_READ, P.PROC, P.APP, P.NSPACE, P.SESSION},
}
IDLE = {P.INDEF, P.FIRST_READ}

purge_st = st.one_of(
    st.builds(lambda c: (P.PROC, dict(nspace=c.nspace, rank=c.rank)), st.sampled_from(CALLERS)),
    st.builds(lambda c: (P.INVALID, dict(nspace=c.nspace, rank=c.rank)), st.sampled_from(CALLERS)),
    st.builds(lambda ns, a: (P.APP, dict(nspace=ns, app_idx=a)), st.sampled_from(NSPACES),
              st.sampled_from([0, 1])),
    st.builds(lambda ns: (P.NSPACE, dict(nspace=ns)), st.sampled_from(NSPACES)),
    st.builds(lambda ns: (P.SESSION, dict(nspace=ns)), st.sampled_from(NSPACES)),
    st.builds(lambda s: (P.SESSION, dict(nspace=None, session_id=s)), st.sampled_from([1, 2, 3])),
    st.builds(lambda s, a: (P.APP, dict(nspace=None, session_id=s, app_idx=a)),
              st.sampled_from([1, 2]), st.sampled_from([0, 1])),
)

BAD_PUBLISHES = [
    dict(pairs={}),
    dict(pairs={"k0": None}),
    dict(pairs={"k0": [1]}),
    dict(pairs={"": 1}),
    dict(pairs={"k0": 2**64}),
    dict(pairs={"k0": 1}, range=42),
    dict(pairs={"k0": 1}, range=True),
    dict(pairs={"k0": 1}, persistence=9),
    dict(pairs={"k0": 1}, access_uids=[-5]),
    dict(pairs={"k0": 1}, access_gids="x"),
]


def _covers(target: dict, who) -> bool:
    """Does a purge target cover this process (owner or requestor)?"""
    if target.get("nspace") is not None and who.nspace != target["nspace"]:
        return False
    if target.get("rank") is not None and who.rank != target["rank"]:
        return False
    if target.get("app_idx") is not None and who.app_idx != target["app_idx"]:
        return False
    if target.get("session_id") is not None and who.session_id != target["session_id"]:
        return False
    return True


def _plain(v):
    return v.value if isinstance(v, Typed) else v


def _oracle_update(op, current, operand, expected):
    """(status, new value or None) of an update, written from the rules
    stated in DataStore.update's docstring, independently of its code."""
    def as_int(v):
        v = _plain(v)
        if type(v) is int:
            return v
        if type(v) in (str, bytes):
            t = v.decode("latin-1") if type(v) is bytes else v
            body = t[1:] if t[:1] in ("+", "-") else t
            if body and all(c in "0123456789" for c in body) and len(t) <= 40:
                return int(t)
        return None

    if op == "add" and as_int(operand) is None:
        return Status.ERR_BAD_PARAM, None
    if op == "append" and type(_plain(operand)) not in (str, bytes):
        return Status.ERR_BAD_PARAM, None
    if op == "cas":
        if current is None:
            ok = expected is None or (type(_plain(expected)) in (str, bytes)
                                      and len(_plain(expected)) == 0)
        else:
            ok = (expected is not None and type(_plain(current)) is type(_plain(expected))
                  and _plain(current) == _plain(expected))
        return Status.SUCCESS, operand if ok else None
    if current is None:
        return Status.SUCCESS, operand
    if op == "add":
        base = as_int(current)
        if base is None:
            return Status.ERR_BAD_PARAM, None
        total = base + as_int(operand)
        if isinstance(current, Typed):
            return (Status.SUCCESS, Typed(total, current.pmix_type)) if 0 <= total <= 255 \
                else (Status.ERR_BAD_PARAM, None)
        if not -(2**63) <= total <= 2**64 - 1:
            return Status.ERR_BAD_PARAM, None
        if type(current) is int:
            return Status.SUCCESS, total
        return Status.SUCCESS, (str(total).encode() if type(current) is bytes else str(total))
    cur, extra = _plain(current), _plain(operand)
    if type(cur) is not type(extra) or type(cur) not in (str, bytes):
        return Status.ERR_BAD_PARAM, None
    return Status.SUCCESS, (Typed(cur + extra, current.pmix_type) if isinstance(current, Typed)
                            else cur + extra)


def _item_state(it):
    return (dict(it.pairs), it.last_access, it.nbytes)


class StoreMachine(RuleBasedStateMachine):
    """A DataStore under random operations, checked step by step."""

    @initialize(timeout=st.sampled_from([0, 4, 6, 8]),
                cap=st.sampled_from([0, 0, 180, 250, 400, 700, 3000, 12000, 12000]),
                nkeys=st.sampled_from([4, 4, 16, 64, 64]))
    def setup(self, timeout, cap, nkeys):
        self.sched = FakeScheduler()
        self.answers: list = []
        self.timeout = timeout
        self.cap = cap
        self.nkeys = nkeys
        self.store = DataStore(
            name="prop", clock=self.sched, timer=self.sched,
            on_answer=lambda t, r: self.answers.append((t, r)),
            params=StoreParams(timeout=timeout, max_size=cap),
            on_holder=self._holder_changed,
        )
        #: the uids on_holder says own something, as it reported them.
        self.holders: set[int] = set()
        self.pending: dict[int, dict] = {}
        self.next_ticket = 0
        self.drained = 0

    # -- helpers ------------------------------------------------------------

    def _holder_changed(self, uid: int, holds: bool) -> None:
        # Each report is a change: a uid reported holding is not reported again.
        assert (uid in self.holders) != holds, (uid, holds, self.holders)
        (self.holders.add if holds else self.holders.discard)(uid)

    def _key(self, i: int) -> str:
        return KEYS[i % self.nkeys]

    def _keys(self, idxs) -> list[str]:
        return [self._key(i) for i in idxs]

    def _pairs(self, drawn) -> dict:
        return {self._key(i): v for i, v in drawn}

    def _stale(self, it, now) -> bool:
        return bool(self.timeout) and it.persistence in IDLE and now - it.last_access > self.timeout

    def _drain(self, *, allow_timeout: bool) -> list:
        """Check answers delivered since the last drain against what was parked."""
        new = self.answers[self.drained:]
        self.drained = len(self.answers)
        now = self.sched.now()
        for ticket, reply in new:
            assert ticket in self.pending, f"answer for a ticket not parked: {ticket!r}"
            p = self.pending.pop(ticket)
            if reply.status is Status.ERR_TIMEOUT:
                assert allow_timeout, "TIMEOUT outside a time step"
                assert p["deadline"] is not None and p["deadline"] <= now
                assert reply.found == ()
            else:
                assert reply.status in (Status.SUCCESS, Status.ERR_PARTIAL_SUCCESS), reply
                got = [f.key for f in reply.found]
                assert len(got) == len(set(got)) and set(got) <= set(p["keys"])
                assert len(got) >= p["need"]
                assert (reply.status is Status.SUCCESS) == (len(got) == len(p["keys"]))
        return new

    def _expected_lookup(self, req, keys, rng):
        """Oracle: SPEC 4's answer, computed from the items before the lookup."""
        now = self.sched.now()
        klist = list(dict.fromkeys(keys))
        items = sorted(self.store.items(), key=lambda it: it.id)  # publish order
        hits, refused = [], False
        for k in klist:
            for it in items:
                if k not in it.pairs or self._stale(it, now):
                    continue
                verdict = may_read(req, it, rng, self.store.dvm_nspace)
                if verdict is ReadVerdict.OK:
                    hits.append((k, it))
                    break
                if verdict is ReadVerdict.NO_ACCESS:
                    refused = True
        if len(hits) == len(klist):
            status = Status.SUCCESS
        elif hits:
            status = Status.ERR_PARTIAL_SUCCESS
        elif refused:
            status = Status.ERR_NO_PERMISSIONS
        else:
            status = Status.ERR_NOT_FOUND
        found = [(k, it.pairs[k], it.owner.proc) for k, it in hits]
        return klist, hits, status, found

    def _check_answered(self, reply, hits, status, found, now):
        assert reply.status is status, (reply, status)
        assert [(f.key, f.value, f.publisher) for f in reply.found] == found
        live = {it.id: it for it in self.store.items()}
        for k, it in hits:
            if it.persistence is P.FIRST_READ:
                assert it.id not in live or k not in live[it.id].pairs, "FIRST_READ key survived"
            else:
                assert live[it.id].last_access == now, "answered item not restamped"

    # -- rules --------------------------------------------------------------

    @rule(who=st.sampled_from(CALLERS), pairs=pairs_st, rng=range_st,
          persistence=persist_st, uids=uids_st, gids=gids_st, replace=st.booleans())
    def publish(self, who, pairs, rng, persistence, uids, gids, replace):
        self._publish(who, self._pairs(pairs), rng, persistence, uids, gids, replace)

    @rule(who=st.sampled_from(CALLERS[:2]), pairs=pairs_st, rng=range_st,
          persistence=persist_st, replace=st.booleans())
    def publish_as_main_user(self, who, pairs, rng, persistence, replace):
        self._publish(who, self._pairs(pairs), rng, persistence, [], [], replace)

    @rule(nspace=st.sampled_from(NSPACES), first=st.integers(0, 15), n=st.integers(4, 48),
          key0=key_st, persistence=persist_st, replace=st.booleans())
    def publish_burst(self, nspace, first, n, key0, persistence, replace):
        """A job's processes publish ``n`` one-key items in turn (distinct keys
        as far as the pool allows), each checked like a single publish."""
        ranks = RANKS[nspace]
        for j in range(n):
            who = BY_PROC[(nspace, ranks[(first + j) % len(ranks)])]
            self._publish(who, {self._key(key0 + j): j}, Range.SESSION, persistence, [], [],
                          replace)
        event(f"burst: store holds {'>= 40' if len(self.store) >= 40 else '< 40'} items")

    @rule(who=st.sampled_from(CALLERS), key=key_st,
          size=st.integers(min_value=0, max_value=800), persistence=persist_st,
          replace=st.booleans())
    def publish_big(self, who, key, size, persistence, replace):
        self._publish(who, {self._key(key): "x" * size}, Range.SESSION, persistence, [], [],
                      replace)

    def _publish(self, who, pairs, rng, persistence, uids, gids, replace):
        store = self.store
        now = self.sched.now()
        before = snapshot(store)
        pre = {it.id: (it, _item_state(it)) for it in store.items()}
        timers = self.sched.pending()
        persist = P.NSPACE if persistence in (None, P.INVALID) else persistence
        uids_n, gids_n = tuple(dict.fromkeys(uids)), tuple(dict.fromkeys(gids))
        nbytes = item_nbytes(pairs, uids_n, gids_n)

        # oracle: duplicate rule, then the cap
        foreign = own = False
        for it, _ in pre.values():
            if it.range is not rng or not (set(it.pairs) & set(pairs)) or self._stale(it, now):
                continue
            if may_read(who, it, rng, store.dvm_nspace) is not ReadVerdict.OK:
                continue
            if owns(who, it):
                own = True
            else:
                foreign = True
        if foreign or (own and not replace):
            expected = Status.ERR_DUPLICATE_KEY
        elif self.cap and nbytes > self.cap:
            expected = Status.ERR_OUT_OF_RESOURCE
        else:
            expected = Status.SUCCESS

        reply = store.publish(who, pairs, range=rng, persistence=persistence,
                              access_uids=uids, access_gids=gids, replace=replace)
        assert reply.status is expected, (reply, expected)
        event(f"publish {reply.status.name}")
        if reply.status is not Status.SUCCESS:
            assert snapshot(store) == before, "refused publish changed the store"
            assert self.sched.pending() == timers
            assert len(self.answers) == self.drained, "refused publish answered a lookup"
            return

        new_answers = self._drain(allow_timeout=False)
        after = snapshot(store)
        if new_answers:
            event("publish answered a parked lookup")
        if after["evictions"] > before["evictions"]:
            event("publish evicted")
        if self.cap:
            assert after["bytes_by_uid"].get(who.uid, 0) <= self.cap
        if new_answers:
            return  # parked lookups may have consumed FIRST_READ keys anywhere
        stored = [it for it in store.items() if it.id not in pre]
        assert len(stored) == 1
        new = stored[0]
        assert (new.owner, new.pairs, new.range, new.persistence) == (who, pairs, rng, persist)
        assert (new.access_uids, new.access_gids) == (uids_n, gids_n)
        assert new.last_access == now and new.nbytes == nbytes
        # other uids' items are untouched by eviction
        live = {it.id: it for it in store.items()}
        for iid, (it, state) in pre.items():
            if it.uid != who.uid and not self._stale(it, now):
                assert iid in live and _item_state(live[iid]) == state
        # eviction takes the uid's least recently used items, and only as many as needed
        if not replace and after["expiries"] == before["expiries"]:
            gone = [pre[i][0] for i in pre if i not in live]
            assert len(gone) == after["evictions"] - before["evictions"]
            assert all(it.uid == who.uid for it in gone)
            if gone:
                survivors = [live[i] for i in pre if i in live and live[i].uid == who.uid]
                newest_gone = max(pre[it.id][1][1] for it in gone)
                assert all(s.last_access >= newest_gone for s in survivors)
                freed = sum(pre[it.id][1][2] for it in gone)
                used = before["bytes_by_uid"].get(who.uid, 0)
                assert used - freed + nbytes <= self.cap
                assert any(used - freed + pre[it.id][1][2] + nbytes > self.cap for it in gone)

    @rule(who=st.sampled_from(CALLERS), bad=st.sampled_from(BAD_PUBLISHES))
    def publish_bad(self, who, bad):
        before = snapshot(self.store)
        kw = dict(bad)
        reply = self.store.publish(who, kw.pop("pairs"), **kw)
        assert reply.status is Status.ERR_BAD_PARAM and reply.message
        assert snapshot(self.store) == before

    @rule(who=st.sampled_from(CALLERS), keys=st.lists(key_st, min_size=1, max_size=3),
          rng=range_st)
    def lookup(self, who, keys, rng):
        self._lookup(who, self._keys(keys), rng)

    @rule(who=st.sampled_from(CALLERS), key0=key_st, n=st.integers(4, 64), rng=range_st)
    def lookup_span(self, who, key0, n, rng):
        """One lookup of many consecutive keys: many touches (dead queue
        entries) and, for FIRST_READ items, many consumptions at once."""
        self._lookup(who, [self._key(key0 + j) for j in range(n)], rng)

    def _lookup(self, who, keys, rng):
        now = self.sched.now()
        klist, hits, status, found = self._expected_lookup(who, keys, rng)
        reply = self.store.lookup(who, keys, range=rng)
        assert isinstance(reply, Reply)
        event(f"lookup {reply.status.name}")
        self._check_answered(reply, hits, status, found, now)
        assert len(self.answers) == self.drained

    @rule(who=st.sampled_from(CALLERS), keys=st.lists(key_st, min_size=1, max_size=3),
          rng=range_st, wait=st.integers(0, 3),
          timeout=st.sampled_from([None, 0, 1, 3, 7, 60]))
    def lookup_wait(self, who, keys, rng, wait, timeout):
        self._lookup_wait(who, self._keys(keys), rng, wait, timeout)

    @rule(nspace=st.sampled_from(NSPACES), first=st.integers(0, 15), n=st.integers(4, 40),
          key=key_st, timeout=st.sampled_from([None, 7, 60, 3600]))
    def lookups_wait_many(self, nspace, first, n, key, timeout):
        """Many processes of a job wait for the same key: one publish, purge
        or time step later ends dozens of parked lookups (and their timers)."""
        ranks = RANKS[nspace]
        for j in range(n):
            who = BY_PROC[(nspace, ranks[(first + j) % len(ranks)])]
            self._lookup_wait(who, [self._key(key)], Range.SESSION, 0, timeout)

    def _lookup_wait(self, who, keys, rng, wait, timeout):
        now = self.sched.now()
        klist, hits, status, found = self._expected_lookup(who, keys, rng)
        need = len(klist) if wait == 0 else min(wait, len(klist))
        pre = {it.id: (it, _item_state(it)) for it in self.store.items()}
        ticket = self.next_ticket
        self.next_ticket += 1
        reply = self.store.lookup(who, keys, range=rng, wait=wait, timeout=timeout, ticket=ticket)
        if len(hits) >= need:
            assert isinstance(reply, Reply)
            self._check_answered(reply, hits, status, found, now)
        else:
            assert reply == Pending(ticket)
            event("lookup parked")
            self.pending[ticket] = dict(
                keys=klist, need=need, requestor=who,
                deadline=(now + timeout) if timeout else None,
            )
            # parking consumes and touches nothing (stale items may be lazily expired)
            live = {it.id: it for it in self.store.items()}
            for iid, (it, state) in pre.items():
                if not self._stale(it, now):
                    assert iid in live and _item_state(live[iid]) == state
        assert len(self.answers) == self.drained

    @rule(who=st.sampled_from(CALLERS), key=key_st, op=update_op_st, value=update_values,
          expected=expected_st, rng=range_st, persistence=persist_st, uids=uids_st)
    def update(self, who, key, op, value, expected, rng, persistence, uids):
        self._update(who, self._key(key), op, value, expected, rng, persistence, uids)

    @rule(nspace=st.sampled_from(NSPACES), first=st.integers(0, 15), n=st.integers(4, 40),
          key=key_st, delta=st.integers(-2, 5), rng=st.sampled_from([Range.SESSION,
                                                                       Range.NAMESPACE]))
    def counter_burst(self, nspace, first, n, key, delta, rng):
        """A job's processes add to one counter in turn, as ranks do."""
        ranks = RANKS[nspace]
        for j in range(n):
            who = BY_PROC[(nspace, ranks[(first + j) % len(ranks)])]
            self._update(who, self._key(key), "add", delta, None, rng, None, [])

    def _update(self, who, key, op, value, expected, rng, persistence, uids):
        store = self.store
        now = self.sched.now()
        before = snapshot(store)
        pre = {it.id: (it, _item_state(it)) for it in store.items()}
        persist = P.NSPACE if persistence in (None, P.INVALID) else persistence
        uids_n = tuple(dict.fromkeys(uids))
        # oracle: the duplicate rule picks the key's item; then the operation; then the cap
        colliders = [it for it, _ in sorted(pre.values(), key=lambda p: p[0].id)
                     if it.range is rng and key in it.pairs and not self._stale(it, now)
                     and may_read(who, it, rng, store.dvm_nspace) is ReadVerdict.OK]
        valid_values = not isinstance(value, (list, dict, type(None))) and not (
            isinstance(value, int) and not isinstance(value, bool)
            and not -(2**63) <= value <= 2**64 - 1)
        target = next((it for it in colliders if owns(who, it)), None)
        # refusals in the order the docstring gives: the arguments, the owner, the value
        operand_status, _ = _oracle_update(op, None, value, None)
        if not valid_values or operand_status is Status.ERR_BAD_PARAM:
            expected_status, new = Status.ERR_BAD_PARAM, None
        elif any(not owns(who, it) for it in colliders):
            expected_status, new = Status.ERR_NO_PERMISSIONS, None
        else:
            expected_status, new = _oracle_update(op, target.pairs[key] if target else None,
                                                  value, expected)
        if expected_status is Status.SUCCESS and new is not None and self.cap:
            size = (target.nbytes - value_size(target.pairs[key]) + value_size(new)
                    if target is not None else item_nbytes({key: new}, uids_n, ()))
            if size > self.cap:
                expected_status = Status.ERR_OUT_OF_RESOURCE

        reply = store.update(who, key, op, value, expected=expected, range=rng,
                             persistence=persistence, access_uids=uids)
        assert reply.status is expected_status, (reply, expected_status, op, value, target)
        event(f"update {op} {reply.status.name}{' changed' if reply.count else ''}")
        if reply.status is not Status.SUCCESS:
            assert snapshot(store) == before, "refused update changed the store"
            assert len(self.answers) == self.drained, "refused update answered a lookup"
            return
        assert reply.count == (0 if new is None else 1)
        if new is None:  # a compare-and-set that did not match: a read, nothing else
            assert reply.found == (() if target is None else
                                   ((key, target.pairs[key], target.owner.proc),))
            assert len(self.answers) == self.drained
            live = {it.id: it for it in store.items()}
            for iid, (it, state) in pre.items():
                if iid in live and iid != getattr(target, "id", None):
                    assert _item_state(live[iid]) == state, "a cas miss changed another item"
            return
        owner = target.owner if target is not None else who
        assert [tuple(f) for f in reply.found] == [(key, new, owner.proc)]
        if self._drain(allow_timeout=False):
            event("update answered a parked lookup")
            return  # parked lookups may have consumed FIRST_READ keys anywhere
        live = {it.id: it for it in store.items()}
        if target is not None:
            it = live[target.id]
            assert it.pairs[key] == new and type(it.pairs[key]) is type(new)
            assert (it.owner, it.range, it.persistence) == (target.owner, target.range,
                                                            target.persistence)
            assert it.last_access == now
            kept = {k: v for k, v in pre[target.id][1][0].items() if k != key}
            assert {k: v for k, v in it.pairs.items() if k != key} == kept
        else:
            made = [it for iid, it in live.items() if iid not in pre]
            assert len(made) == 1
            assert (made[0].owner, made[0].pairs, made[0].range, made[0].persistence,
                    made[0].access_uids) == (who, {key: new}, rng, persist, uids_n)
        for iid, (it, state) in pre.items():
            if iid not in live:  # evicted (the uid's, never the target) or stale
                assert self._stale(it, now) or (it.uid == who.uid and iid != target.id
                                                if target is not None else it.uid == who.uid)
            elif it.uid != who.uid and iid != getattr(target, "id", None):
                assert _item_state(live[iid]) == state

    @rule(who=st.sampled_from(CALLERS), prefix=prefix_st, rng=range_st,
          limit=st.sampled_from([None, 0, 1, 3]))
    def keys(self, who, prefix, rng, limit):
        now = self.sched.now()
        before = snapshot(self.store)
        expected = sorted({k for it in self.store.items() if not self._stale(it, now)
                           for k in it.pairs if k.startswith(prefix)
                           and may_read(who, it, rng, self.store.dvm_nspace) is ReadVerdict.OK})
        reply = self.store.keys(who, prefix, range=rng, limit=limit)
        assert reply.status is Status.SUCCESS
        assert reply.count == len(expected)
        assert list(reply.keys) == (expected if limit is None else expected[:limit])
        assert snapshot(self.store) == before, "keys changed the store"
        event(f"keys counted {'some' if expected else 'none'}")

    @rule(who=st.sampled_from(CALLERS), keys=st.lists(key_st, min_size=1, max_size=3))
    def unpublish(self, who, keys):
        keys = self._keys(keys)
        pre = {it.id: (it, set(it.pairs)) for it in self.store.items()}
        parked = self.store.stats().parked
        reply = self.store.unpublish(who, keys)
        assert reply.status is Status.SUCCESS
        assert reply.count == sum(len(ks & set(keys)) for it, ks in pre.values()
                                  if owns(who, it)), "unpublish miscounted what it removed"
        live = {it.id: it for it in self.store.items()}
        for iid, (it, ks) in pre.items():
            left = ks - set(keys) if owns(who, it) else ks
            if left:
                assert iid in live and set(live[iid].pairs) == left
            else:
                assert iid not in live
        assert self.store.stats().parked == parked

    @rule(who=st.sampled_from(CALLERS))
    def unpublish_all(self, who):
        pre = {it.id: (it, _item_state(it)) for it in self.store.items()}
        parked = self.store.stats().parked
        reply = self.store.unpublish_all(who)
        assert reply.status is Status.SUCCESS
        assert reply.count == sum(len(state[0]) for it, state in pre.values()
                                  if it.owner.proc == who.proc)
        live = {it.id: it for it in self.store.items()}
        for iid, (it, state) in pre.items():
            if it.owner.proc == who.proc:
                assert iid not in live
            else:
                assert iid in live and _item_state(live[iid]) == state
        assert self.store.stats().parked == parked

    @rule(purge=purge_st)
    def purge(self, purge):
        self._purge(*purge)

    @rule(nspace=st.sampled_from(NSPACES), first=st.integers(0, 15), n=st.integers(2, 16),
          horizon=st.sampled_from([P.PROC, P.PROC, P.INVALID]))
    def processes_end(self, nspace, first, n, horizon):
        """Many processes of a job end (or unpublish everything) in one step:
        one purge per process, as the runtime sends them."""
        ranks = RANKS[nspace]
        for j in range(min(n, len(ranks))):
            self._purge(horizon, dict(nspace=nspace, rank=ranks[(first + j) % len(ranks)]))

    def _purge(self, horizon, target):
        pre = {it.id: (it, _item_state(it)) for it in self.store.items()}
        doomed = {iid for iid, (it, _) in pre.items()
                  if _covers(target, it.owner) and it.persistence in REMOVES[horizon]}
        n = self.store.purge(horizon, **target)
        assert n == len(doomed)
        event(f"purge {horizon.name} removed {'>= 30' if n >= 30 else 'some' if n else 'none'}")
        live = {it.id: it for it in self.store.items()}
        assert set(live) == set(pre) - doomed
        for iid, it in live.items():
            assert _item_state(it) == pre[iid][1]
        if horizon is not P.INVALID:
            for t in [t for t, p in self.pending.items() if _covers(target, p["requestor"])]:
                del self.pending[t]
        assert len(self.answers) == self.drained, "a purge answered a lookup"

    @precondition(lambda self: bool(self.pending))
    @rule(data=st.data())
    def cancel(self, data):
        ticket = data.draw(st.sampled_from(sorted(self.pending)))
        assert self.store.cancel(ticket) is True
        del self.pending[ticket]
        assert self.store.cancel(ticket) is False

    @rule(dt=st.sampled_from([0.5, 1, 1.5, 2, 3, 5, 10]))
    def advance(self, dt):
        pre = {it.id: (it, _item_state(it)) for it in self.store.items()}
        self.sched.advance(dt)
        now = self.sched.now()
        if self._drain(allow_timeout=True):
            event("advance timed out a lookup")
        live = {it.id: it for it in self.store.items()}
        if set(pre) - set(live):
            event("advance expired items")
        for iid, (it, state) in pre.items():
            if iid in live:
                assert _item_state(live[iid]) == state, "time alone changed an item"
            else:
                assert it.persistence in IDLE, "a lifetime item vanished with time"
                assert self.timeout and now - state[1] > self.timeout, "expired early"
        if self.timeout:
            limit = self.timeout + sweep_interval(self.timeout)
            for it in live.values():
                if it.persistence in IDLE:
                    assert now - it.last_access <= limit, "idle item outlived timeout + interval"
        for t, p in self.pending.items():
            assert p["deadline"] is None or p["deadline"] > now, f"ticket {t} not timed out"

    # -- after every step ---------------------------------------------------

    @invariant()
    def store_is_consistent(self):
        if not hasattr(self, "store"):
            return
        self.store.check_invariants()
        self.sched.check_invariants()
        items = self.store.items()
        owners = {it.uid for it in items}
        assert self.holders == owners, (self.holders, owners)
        assert all(self.store.holds(u) for u in owners) and not self.store.holds(-1)
        usage: dict[int, int] = {}
        for it in items:
            assert it.pairs
            assert it.nbytes == item_nbytes(it.pairs, it.access_uids, it.access_gids)
            usage[it.uid] = usage.get(it.uid, 0) + it.nbytes
        stats = self.store.stats()
        assert dict(stats.bytes_by_uid) == usage
        assert stats.items == len(items)
        if self.cap:
            assert all(v <= self.cap for v in usage.values())
        assert stats.parked == len(self.pending)
        has_idle = any(it.persistence in IDLE for it in items)
        assert self.store.sweep_armed == bool(self.timeout and has_idle)


# Nothing here reads a clock: time is the FakeScheduler's, ``deadline=None``
# turns off Hypothesis's per-example wall-clock limit, and the suite's
# per-test limit cannot interrupt a step (tests/conftest.py gives Hypothesis
# tests pytest-timeout's thread method and a pure one a hang-only limit), so
# a verdict -- teardown included -- depends on the steps alone.
StoreMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=100,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


class TestStoreKeepsEveryRuleUnderRandomOperations(StoreMachine.TestCase):
    """Random publish/lookup/unpublish/purge/cancel/advance sequences never break a rule."""


# ---------------------------------------------------------------------------
# smaller properties
# ---------------------------------------------------------------------------


@settings(max_examples=200, deadline=None, database=None)
@given(pairs=st.dictionaries(st.text(min_size=1, max_size=8), values, max_size=5),
       extra_key=st.text(min_size=1, max_size=8), extra=values, uids=uids_st, gids=gids_st)
def test_nbytes_is_monotone_in_what_was_stored(pairs, extra_key, extra, uids, gids):
    """Adding a pair or an accessor never lowers nbytes (no type choice evades the cap)."""
    base = item_nbytes(pairs, tuple(uids), tuple(gids))
    if extra_key not in pairs:
        assert item_nbytes({**pairs, extra_key: extra}, tuple(uids), tuple(gids)) >= base
    assert item_nbytes(pairs, tuple(uids) + (1,), tuple(gids)) == base + 4
    expected = 128 + 4 * (len(uids) + len(gids))
    for k, v in pairs.items():
        expected += len(k.encode()) + (
            1 if isinstance(v, bool) else 8 if isinstance(v, (int, float))
            else len(v.encode()) if isinstance(v, str) else len(v)
        )
    assert base == expected


@settings(max_examples=100, deadline=None, database=None)
@given(t=st.floats(min_value=0.01, max_value=10_000, allow_nan=False))
def test_sweep_interval_is_clamped_quarter_of_timeout(t):
    """sweep_interval(t) == min(60, max(1, t/4)), always within [1, 60]."""
    iv = sweep_interval(t)
    assert 1.0 <= iv <= 60.0
    assert math.isclose(iv, min(60.0, max(1.0, t / 4)))
