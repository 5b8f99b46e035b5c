"""The store's counters: every removal counted once, under the rule that made it.

These counters are what the metrics endpoint exports as
``pydvm_store_removed_keys_total`` / ``pydvm_store_removed_items_total`` and
the sweep counters; an operator reads them to learn which rule removed an
item.  ``check_invariants`` (run after every test by the fixture) also ties
them to what is stored: items ever stored minus items removed is the live
count, and the same for keys.
"""

from __future__ import annotations

import pytest

from pydvm.store import Reason
from pydvm.store.results import PURGE_REASON
from pydvm.store.lifetimes import SWEEP_BUDGET
from storekit import Persistence as P, Status, alice, alice2, bob


def _nonzero(counts) -> dict:
    return {r: n for r, n in counts.items() if n}


def test_stats_has_a_counter_for_every_reason_from_the_start(store):
    """A fresh store reports every reason at 0 (so a scrape shows each series)."""
    st = store.stats()
    assert set(st.removed_keys) == set(Reason.ALL) == set(st.removed_items)
    assert not _nonzero(st.removed_keys) and not _nonzero(st.removed_items)
    assert (st.sweep_passes, st.sweep_budget_exhausted) == (0, 0)


def test_unpublish_of_keys_counts_keys_and_items_that_left(store):
    """unpublish(keys): each key counts as unpublished; the item only when its last key went."""
    store.publish(alice, {"a": 1, "b": 2})
    store.unpublish(alice, ["a"])
    st = store.stats()
    assert _nonzero(st.removed_keys) == {Reason.UNPUBLISHED: 1}
    assert _nonzero(st.removed_items) == {}
    store.unpublish(alice, ["b"])
    st = store.stats()
    assert _nonzero(st.removed_keys) == {Reason.UNPUBLISHED: 2}
    assert _nonzero(st.removed_items) == {Reason.UNPUBLISHED: 1}


def test_unpublish_of_everything_counts_as_unpublished_not_purged(store):
    """unpublish() of a process is an explicit unpublish, whatever the persistence."""
    store.publish(alice, {"a": 1}, persistence=P.PROC)
    store.publish(alice, {"b": 1}, persistence=P.INDEF)
    store.unpublish_all(alice)
    st = store.stats()
    assert _nonzero(st.removed_keys) == {Reason.UNPUBLISHED: 2}
    assert _nonzero(st.removed_items) == {Reason.UNPUBLISHED: 2}


def test_replace_counts_the_taken_over_keys_as_replaced(store):
    """A replacing publish removes the owner's prior key: one key 'replaced'."""
    store.publish(alice, {"k": 1, "other": 2})
    assert store.publish(alice, {"k": 3}, replace=True).status is Status.SUCCESS
    st = store.stats()
    assert _nonzero(st.removed_keys) == {Reason.REPLACED: 1}
    assert _nonzero(st.removed_items) == {}  # "other" keeps the old item alive


def test_first_read_counts_each_returned_key_as_consumed(store):
    """A FIRST_READ item's keys count as consumed as a lookup returns them."""
    store.publish(alice, {"x": 1, "y": 2}, persistence=P.FIRST_READ)
    store.lookup(alice2, ["x"])
    assert store.stats().consumed == 1
    store.lookup(alice2, ["y"])
    st = store.stats()
    assert _nonzero(st.removed_keys) == {Reason.CONSUMED: 2} and st.consumed == 2
    assert _nonzero(st.removed_items) == {Reason.CONSUMED: 1}


@pytest.mark.parametrize("horizon", [P.PROC, P.APP, P.NSPACE, P.SESSION], ids=lambda h: h.name)
def test_each_purge_horizon_counts_under_its_own_reason(store, horizon):
    """A purge records purged_<horizon>, so an operator can tell which lifetime ended."""
    store.publish(alice, {"k": 1}, persistence=horizon)
    target = {"nspace": alice.nspace}
    if horizon is P.PROC:
        target["rank"] = alice.rank
    if horizon is P.APP:
        target["app_idx"] = alice.app_idx
    if horizon is P.SESSION:
        target = {"session_id": alice.session_id}
    assert store.purge(horizon, **target) == 1
    st = store.stats()
    assert _nonzero(st.removed_items) == {PURGE_REASON[horizon]: 1}
    assert PURGE_REASON[horizon] == f"purged_{horizon.name.lower()}"


def test_expiry_by_sweep_and_lazily_on_read_both_count_as_expired(env, sched):
    """Idle removal counts as expired whether the sweep or a read found the item stale."""
    store = env.make(timeout=8)  # sweep interval 2 s
    store.publish(alice, {"swept": 1}, persistence=P.INDEF)
    sched.advance(10)  # the sweep at +10 finds it 10 s idle
    st = store.stats()
    assert st.removed_items[Reason.EXPIRED] == 1 == st.expiries
    store.publish(alice, {"lazy": 1}, persistence=P.INDEF)  # sweeps at +2, +4, ... from here
    sched.advance(8.5)  # stale, and the sweep at +8 saw it exactly 8 s idle
    assert "lazy" in {k for it in store.items() for k in it.pairs}
    assert store.lookup(alice, ["lazy"]).status is Status.ERR_NOT_FOUND
    st = store.stats()
    assert _nonzero(st.removed_items) == {Reason.EXPIRED: 2}
    assert _nonzero(st.removed_keys) == {Reason.EXPIRED: 2}


def test_eviction_counts_each_evicted_item_for_its_uid_only(env):
    """A flood at a small cap: every evicted item counts once as evicted."""
    store = env.make(max_size=1000)
    store.publish(bob, {"bob": "x"})
    for i in range(20):
        assert store.publish(alice, {f"k{i}": "v" * 100}).status is Status.SUCCESS
    st = store.stats()
    held = sum(1 for it in store.items() if it.uid == alice.uid)
    assert st.removed_items == {**dict.fromkeys(Reason.ALL, 0), Reason.EVICTED: 20 - held}
    assert st.evictions == 20 - held > 0
    assert any(it.uid == bob.uid for it in store.items())


def test_refused_publish_counts_nothing(env):
    """A refusal (too big, duplicate, bad) leaves every counter as it was."""
    store = env.make(max_size=200)
    store.publish(alice, {"k": 1})
    before = store.stats()
    store.publish(alice, {"big": "x" * 500})
    store.publish(alice, {"k": 2})
    store.publish(alice, {})
    assert store.stats() == before


def test_sweep_counts_its_passes_and_those_that_ran_out_of_budget(env, sched):
    """Each pass counts; one that stops at its budget with stale items left counts as exhausted."""
    store = env.make(timeout=8)
    for i in range(SWEEP_BUDGET + 5):
        store.publish(alice, {f"k{i}": i}, persistence=P.INDEF)
    sched.advance(9)  # the timer's passes at +2 .. +8 found nothing stale yet
    timer_passes = store.stats().sweep_passes
    assert timer_passes == 4 and store.stats().sweep_budget_exhausted == 0
    assert store.sweep() == (SWEEP_BUDGET, False)
    st = store.stats()
    assert (st.sweep_passes, st.sweep_budget_exhausted) == (timer_passes + 1, 1)
    assert store.sweep() == (5, True)
    st = store.stats()
    assert (st.sweep_passes, st.sweep_budget_exhausted) == (timer_passes + 2, 1)
    assert st.removed_items[Reason.EXPIRED] == SWEEP_BUDGET + 5


def test_sweep_with_timeout_disabled_is_not_a_pass(env):
    """With the timeout at 0 nothing is swept and no pass is counted."""
    store = env.make(timeout=0)
    assert store.sweep() == (0, True)
    assert store.stats().sweep_passes == 0


def test_stats_is_a_snapshot(store):
    """A StoreStats taken earlier does not change as the store does."""
    store.publish(alice, {"k": 1})
    st = store.stats()
    store.unpublish(alice, ["k"])
    store.publish(bob, {"j": 1})
    assert st.items == 1 and st.removed_keys[Reason.UNPUBLISHED] == 0
    assert dict(st.bytes_by_uid) == {alice.uid: st.bytes_by_uid[alice.uid]}
