"""The idle timeout and its sweep, on the fake clock (SPEC 5, design 8.9.2.7)."""

from __future__ import annotations

import pytest

from pydvm.store.rules import sweep_interval
from pydvm.store.lifetimes import SWEEP_BUDGET
from storekit import (
    Persistence as P, Status, alice, alice2, item_with_key, keys_in_store,
)


def _removal_time(store, sched, key, step, horizon):
    """Advance in `step`s until `key` leaves; return the elapsed time (or None)."""
    start = sched.now()
    while sched.now() - start <= horizon:
        if key not in keys_in_store(store):
            return sched.now() - start
        sched.advance(step)
    return None


@pytest.mark.parametrize("persist", [P.INDEF, P.FIRST_READ], ids=lambda p: p.name)
@pytest.mark.parametrize("timeout,step", [(0.5, 0.125), (2, 0.25), (8, 0.25), (300, 1.0),
                                          (1000, 4.0)])
def test_idle_item_expires_never_early_and_within_one_interval(env, sched, timeout, step, persist):
    """An idle item is present at exactly `timeout` and gone by `timeout + interval`."""
    store = env.make(timeout=timeout)
    store.publish(alice, {"k": 1}, persistence=persist)
    gone_after = _removal_time(store, sched, "k", step, timeout + 2 * sweep_interval(timeout))
    assert gone_after is not None
    assert timeout < gone_after <= timeout + sweep_interval(timeout)
    assert store.stats().expiries == 1


@pytest.mark.parametrize("offset", [0.25, 0.5, 1.0, 1.25, 1.75])
def test_idle_item_expires_within_one_interval_whatever_the_sweep_phase(env, sched, offset):
    """An item published between two sweeps (armed by an older item) still goes within one interval."""
    store = env.make(timeout=8)  # interval 2
    store.publish(alice, {"anchor": 1}, persistence=P.INDEF)
    sched.advance(offset)
    store.publish(alice, {"k": 1}, persistence=P.INDEF)
    gone_after = _removal_time(store, sched, "k", 0.125, 12)
    assert 8 < gone_after <= 8 + 2


def test_idle_item_at_exactly_timeout_stays(env, sched):
    """At now - last_access == timeout the item is not stale: a sweep then keeps it."""
    store = env.make(timeout=8)
    store.publish(alice, {"k": 1}, persistence=P.INDEF)
    sched.advance(8)  # sweeps ran at +2, +4, +6, +8
    assert keys_in_store(store) == {"k"}
    assert store.sweep() == (0, True)
    assert keys_in_store(store) == {"k"}
    assert store.lookup(alice, ["k"]).status is Status.SUCCESS


def test_sweep_armed_only_while_idle_item_exists(env, sched):
    """The sweep timer is armed by the first INDEF/FIRST_READ item and disarmed when the last goes."""
    store = env.make(timeout=8)
    store.publish(alice, {"n": 1}, persistence=P.NSPACE)
    store.publish(alice, {"s": 1}, persistence=P.SESSION)
    assert not store.sweep_armed and sched.pending() == 0
    store.publish(alice, {"i": 1}, persistence=P.INDEF)
    assert store.sweep_armed and sched.pending() == 1
    store.publish(alice, {"f": 1}, persistence=P.FIRST_READ)
    assert sched.pending() == 1  # one sweep per store, not one timer per item
    store.unpublish(alice, ["i"])
    assert store.sweep_armed
    assert store.lookup(alice, ["f"]).status is Status.SUCCESS  # consumed: last idle item
    assert not store.sweep_armed and sched.pending() == 0


def test_sweep_disarms_when_last_idle_item_expires_and_rearms_on_next(env, sched):
    """After the sweep expires the last idle item it is not re-armed; a new idle item re-arms it."""
    store = env.make(timeout=8)
    store.publish(alice, {"i": 1}, persistence=P.INDEF)
    store.publish(alice, {"n": 1})
    sched.advance(10)
    assert keys_in_store(store) == {"n"}
    assert not store.sweep_armed and sched.pending() == 0
    store.publish(alice, {"j": 1}, persistence=P.INDEF)
    assert store.sweep_armed
    sched.advance(10)
    assert keys_in_store(store) == {"n"}
    assert store.stats().expiries == 2


def test_timeout_zero_disables_expiry_and_never_arms(env, sched):
    """timeout=0: no sweep is ever armed and INDEF/FIRST_READ items never expire."""
    store = env.make(timeout=0)
    store.publish(alice, {"i": 1}, persistence=P.INDEF)
    store.publish(alice, {"f": 1}, persistence=P.FIRST_READ)
    assert not store.sweep_armed and sched.pending() == 0
    sched.advance(10**7)
    assert keys_in_store(store) == {"i", "f"}
    assert store.sweep() == (0, True)
    assert store.lookup(alice, ["i", "f"]).status is Status.SUCCESS
    assert store.stats().expiries == 0


@pytest.mark.parametrize("persist", [P.PROC, P.APP, P.NSPACE, P.SESSION], ids=lambda p: p.name)
def test_lifetime_persistences_never_expire(env, sched, persist):
    """The idle timeout never applies to PROC, APP, NSPACE or SESSION items."""
    store = env.make(timeout=2)
    store.publish(alice, {"k": 1}, persistence=persist)
    store.publish(alice, {"idle": 1}, persistence=P.INDEF)  # keeps the sweep running
    sched.advance(3)
    store.publish(alice, {"idle2": 1}, persistence=P.INDEF)
    sched.advance(100)
    assert keys_in_store(store) == {"k"}
    assert store.sweep() == (0, True)
    assert store.lookup(alice, ["k"]).status is Status.SUCCESS


def test_lookup_restamps_and_postpones_expiry(env, sched):
    """A lookup restamps last_access, so the item lives `timeout` past its last read."""
    store = env.make(timeout=8)
    store.publish(alice, {"k": 1}, persistence=P.INDEF)
    sched.advance(6)
    assert store.lookup(alice, ["k"]).status is Status.SUCCESS
    assert item_with_key(store, "k").last_access == sched.now()
    sched.advance(7)  # 13 s after publish, 7 s after the read
    assert keys_in_store(store) == {"k"}
    sched.advance(3)  # 10 s after the read
    assert keys_in_store(store) == set()


def test_stale_item_not_yet_swept_reads_not_found(env, sched):
    """Lazy expiry: an item past its timeout reads NOT_FOUND before any sweep removes it."""
    store = env.make(timeout=8)
    store.publish(alice, {"k": 1}, persistence=P.INDEF)
    sched.advance(9)  # stale; last sweep at +8 kept it, next at +10
    assert len(store) == 1
    r = store.lookup(alice, ["k"])
    assert r.status is Status.ERR_NOT_FOUND
    assert len(store) == 0
    assert store.stats().expiries == 1
    assert not store.sweep_armed


def test_stale_item_does_not_answer_parked_lookup(env, sched):
    """A parked lookup is not answered from an item that has gone stale."""
    store = env.make(timeout=8)
    store.publish(alice2, {"a": 1}, persistence=P.INDEF)
    store.lookup(alice, ["a", "b"], wait=0, ticket="T")
    sched.advance(9)
    store.publish(alice2, {"b": 2})
    assert env.answers == []
    assert keys_in_store(store) == {"b"}


def test_expiry_counter_counts_each_expired_item(env, sched):
    """stats().expiries counts every item the timeout removed, swept or lazily."""
    store = env.make(timeout=8)
    for i in range(3):
        store.publish(alice, {f"k{i}": 1}, persistence=P.INDEF)
    store.publish(alice, {"multi1": 1, "multi2": 2}, persistence=P.FIRST_READ)
    sched.advance(11)
    assert store.stats().expiries == 4  # items, not keys
    store.publish(alice, {"late": 1}, persistence=P.INDEF)
    sched.advance(9)
    store.lookup(alice, ["late"])
    assert store.stats().expiries == 5


def test_sweep_removes_only_stale_items(env, sched):
    """A sweep pass removes the stale idle items and keeps the fresh ones."""
    store = env.make(timeout=8)
    store.publish(alice, {"old": 1}, persistence=P.INDEF)
    sched.advance(5)
    store.publish(alice, {"new": 1}, persistence=P.INDEF)
    sched.advance(4)  # old 9 s (stale, unswept), new 4 s
    assert store.sweep() == (1, True)
    assert keys_in_store(store) == {"new"}


def test_sweep_budget_returns_unfinished_when_more_are_stale(env, sched):
    """sweep(budget=n) removes n and returns (n, False) while more stale items remain."""
    store = env.make(timeout=8)
    for i in range(5):
        store.publish(alice, {f"k{i}": i}, persistence=P.INDEF)
    store.publish(alice, {"fresh": 1}, persistence=P.SESSION)
    sched.advance(9)
    assert len(store) == 6
    assert store.sweep(budget=2) == (2, False)
    assert store.sweep(budget=2) == (2, False)
    assert store.sweep(budget=2) == (1, True)
    assert store.sweep(budget=2) == (0, True)
    assert keys_in_store(store) == {"fresh"}
    assert store.stats().expiries == 5


def test_sweep_budget_exactly_exhausted_is_finished(env, sched):
    """sweep(budget=n) with exactly n stale items returns (n, True)."""
    store = env.make(timeout=8)
    for i in range(3):
        store.publish(alice, {f"k{i}": i}, persistence=P.INDEF)
    sched.advance(9)
    assert store.sweep(budget=3) == (3, True)


def test_sweep_timer_continues_when_budget_runs_out(env, sched):
    """More stale items than one pass's budget are all removed within the interval."""
    store = env.make(timeout=8)
    n = SWEEP_BUDGET + 7
    for i in range(n):
        store.publish(alice, {f"k{i}": 1}, persistence=P.INDEF)
    sched.advance(10)
    assert len(store) == 0
    assert store.stats().expiries == n
    assert not store.sweep_armed


def test_sweep_leaves_parked_lookups_alone(env, sched):
    """The sweep removes items only; parked lookups keep waiting."""
    store = env.make(timeout=8)
    store.publish(alice, {"i": 1}, persistence=P.INDEF)
    store.lookup(alice, ["x"], wait=0, ticket="T")
    sched.advance(20)
    assert store.stats().parked == 1 and len(store) == 0
