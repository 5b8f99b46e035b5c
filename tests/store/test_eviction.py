"""The per-uid cap and LRU eviction (SPEC 4 step 4, SPEC 5 'Cap')."""

from __future__ import annotations

import logging
import re

import pytest

from pydvm.store import item_nbytes
from storekit import (
    UID_A, UID_B, Persistence as P, Range, Status, alice, alice2, bob, caller, keys_in_store,
    snapshot, usage,
)

#: every item below is {"kN": "x"}: 2 + 1 + 128 bytes
ITEM = item_nbytes({"k0": "x"}, (), ())
CAP = 3 * ITEM


@pytest.fixture
def capped(env):
    return env.make(max_size=CAP)


def _fill(store, who, keys, sched=None, step=0.0, **kw):
    for k in keys:
        assert store.publish(who, {k: "x"}, **kw).status is Status.SUCCESS
        if sched is not None:
            sched.advance(step)


def _warnings(caplog):
    return [r for r in caplog.records if r.name == "pydvm.store" and r.levelno == logging.WARNING]


def test_item_size_used_by_these_tests():
    """The fixture cap holds exactly three one-char items of two-char keys."""
    assert ITEM == 131 and CAP == 393


def test_eviction_removes_least_recently_used_item_of_uid(capped, sched):
    """Over the cap, the uid's oldest-last_access item goes first."""
    _fill(capped, alice, ["k0", "k1", "k2"], sched, 1)
    _fill(capped, alice, ["k3"])
    assert keys_in_store(capped) == {"k1", "k2", "k3"}
    assert usage(capped, UID_A) == CAP
    assert capped.stats().evictions == 1


def test_lookup_changes_eviction_order(capped, sched):
    """A read item becomes most recently used and survives; the next-oldest goes."""
    _fill(capped, alice, ["k0", "k1", "k2"], sched, 1)
    assert capped.lookup(alice, ["k0"]).status is Status.SUCCESS
    _fill(capped, alice, ["k3"])
    assert keys_in_store(capped) == {"k0", "k2", "k3"}
    assert capped.keys_of_uid(UID_A) == ["k2", "k0", "k3"]


def test_lookup_by_another_uid_also_refreshes(env, sched):
    """A read through an accessor list by another uid also counts as a use."""
    capped = env.make(max_size=CAP + 4)  # k0 carries one accessor uid (+4 bytes)
    _fill(capped, alice, ["k0"], sched, 1, access_uids=[UID_B])
    _fill(capped, alice, ["k1", "k2"], sched, 1)
    assert capped.lookup(bob, ["k0"]).status is Status.SUCCESS
    _fill(capped, alice, ["k3"])
    assert keys_in_store(capped) == {"k0", "k2", "k3"}
    assert capped.stats().evictions == 1


def test_eviction_order_follows_last_access_not_publish_order(capped, sched):
    """Several reads reorder the LRU; evictions follow the last_access order."""
    _fill(capped, alice, ["k0", "k1", "k2"], sched, 1)
    for k in ("k2", "k0", "k1"):
        capped.lookup(alice, [k])
        sched.advance(1)
    _fill(capped, alice, ["n1"])
    assert "k2" not in keys_in_store(capped)
    _fill(capped, alice, ["n2"])
    assert keys_in_store(capped) == {"k1", "n1", "n2"}


def test_eviction_never_crosses_uid(capped, sched):
    """A uid over its cap evicts only its own items, even when another uid's are older."""
    _fill(capped, bob, ["b0", "b1", "b2"], sched, 1)
    _fill(capped, alice, ["a0", "a1", "a2", "a3", "a4"], sched, 1)
    assert keys_in_store(capped) >= {"b0", "b1", "b2"}
    assert {k for k in keys_in_store(capped) if k.startswith("a")} == {"a2", "a3", "a4"}
    assert usage(capped, UID_B) == CAP and usage(capped, UID_A) == CAP


def test_eviction_cap_is_per_uid_across_processes(capped, sched):
    """All processes of one uid share its cap; eviction takes the uid's oldest whoever published it."""
    _fill(capped, alice, ["k0"], sched, 1)
    _fill(capped, alice2, ["k1"], sched, 1)
    _fill(capped, caller(nspace="ns-z"), ["k2"], sched, 1)
    _fill(capped, alice2, ["k3"])
    assert keys_in_store(capped) == {"k1", "k2", "k3"}


def test_eviction_ignores_persistence(capped, sched):
    """INDEF, SESSION and FIRST_READ items are evicted by age alike."""
    capped.publish(alice, {"k0": "x"}, persistence=P.SESSION)
    sched.advance(1)
    capped.publish(alice, {"k1": "x"}, persistence=P.INDEF)
    sched.advance(1)
    capped.publish(alice, {"k2": "x"}, persistence=P.FIRST_READ)
    sched.advance(1)
    for k in ("n0", "n1", "n2"):
        capped.publish(alice, {k: "x"})
    assert keys_in_store(capped) == {"n0", "n1", "n2"}
    assert capped.stats().evictions == 3


def test_big_publish_evicts_as_many_items_as_needed(capped, sched):
    """A publish needing the room of several items evicts oldest first until it fits."""
    _fill(capped, alice, ["k0", "k1", "k2"], sched, 1)
    big = {"big": "y" * 100}  # nbytes = 3 + 100 + 128 = 231: more than one item's room
    assert capped.publish(alice, big).status is Status.SUCCESS
    assert keys_in_store(capped) == {"k2", "big"}
    assert capped.stats().evictions == 2
    assert usage(capped, UID_A) == ITEM + item_nbytes(big, (), ())


def test_publish_exactly_cap_size_evicts_everything_of_uid(capped):
    """An item of exactly max_size is accepted and displaces every other item of its uid."""
    _fill(capped, alice, ["k0", "k1"])
    _fill(capped, bob, ["b0"])
    pairs = {"k": "z" * (CAP - 128 - 1)}
    assert item_nbytes(pairs, (), ()) == CAP
    assert capped.publish(alice, pairs).status is Status.SUCCESS
    assert keys_in_store(capped) == {"k", "b0"}
    assert usage(capped, UID_A) == CAP


def test_too_large_publish_refused_out_of_resource_evicts_nothing(capped):
    """nbytes > max_size -> OUT_OF_RESOURCE naming the cap; nothing stored, nothing evicted."""
    _fill(capped, alice, ["k0", "k1", "k2"])
    before = snapshot(capped)
    pairs = {"k": "z" * (CAP - 128)}  # one byte over
    r = capped.publish(alice, pairs)
    assert r.status is Status.ERR_OUT_OF_RESOURCE
    assert re.search(rf"{CAP + 1}.*prte_data_server_max_size={CAP}", r.message)
    assert snapshot(capped) == before


def test_accessor_overhead_counts_toward_cap(capped):
    """Accessor uids add 4 bytes each and can push an item over the cap."""
    pairs = {"k": "z" * (CAP - 128 - 1)}  # exactly CAP without accessors
    r = capped.publish(alice, pairs, access_uids=[UID_A])
    assert r.status is Status.ERR_OUT_OF_RESOURCE
    assert len(capped) == 0


def test_max_size_zero_disables_cap(env):
    """max_size=0: no refusal and no eviction, whatever the volume."""
    store = env.make(max_size=0)
    for i in range(50):
        assert store.publish(alice, {f"k{i}": "x" * 10_000}).status is Status.SUCCESS
    assert len(store) == 50
    assert store.stats().evictions == 0
    assert usage(store, UID_A) == 50 * (len("kNN") + 10_000 + 128) - 10 * 1


def test_first_eviction_per_uid_logs_one_warning_naming_cap_and_parameter(capped, caplog):
    """Exactly one warning per uid, at its first eviction, naming the cap and prte_data_server_max_size."""
    caplog.set_level(logging.DEBUG, logger="pydvm.store")
    _fill(capped, alice, ["k0", "k1", "k2"])
    assert _warnings(caplog) == []
    _fill(capped, alice, ["k3", "k4", "k5", "k6"])
    warns = _warnings(caplog)
    assert len(warns) == 1
    msg = warns[0].getMessage()
    assert str(CAP) in msg and "prte_data_server_max_size" in msg
    assert str(UID_A) in msg
    _fill(capped, bob, ["b0", "b1", "b2", "b3", "b4"])
    warns = _warnings(caplog)
    assert len(warns) == 2
    assert str(UID_B) in warns[1].getMessage()
    assert "prte_data_server_max_size" in warns[1].getMessage()
    assert capped.stats().evictions == 4 + 2


def test_no_warning_without_eviction(capped, caplog):
    """Filling up to the cap exactly, or a refused too-large publish, logs no warning."""
    caplog.set_level(logging.DEBUG, logger="pydvm.store")
    _fill(capped, alice, ["k0", "k1", "k2"])
    capped.publish(alice, {"k": "z" * CAP})
    assert _warnings(caplog) == []


def test_every_eviction_is_traced_at_verbosity_1(env, caplog):
    """With verbose=1 each evicted item is traced (info) with the 'evicted' reason."""
    store = env.make(max_size=CAP, verbose=1)
    caplog.set_level(logging.INFO, logger="pydvm.store")
    _fill(store, alice, ["k0", "k1", "k2", "k3", "k4"])
    traced = [r.getMessage() for r in caplog.records
              if r.levelno == logging.INFO and "evicted" in r.getMessage()]
    assert len(traced) == 2
    assert any("k0" in m for m in traced) and any("k1" in m for m in traced)


def test_eviction_counter_counts_evicted_items(capped):
    """stats().evictions counts evicted items and nothing else."""
    _fill(capped, alice, [f"k{i}" for i in range(10)])
    capped.unpublish(alice, ["k9"])
    assert capped.stats().evictions == 7
    assert capped.stats().expiries == 0


def test_evicted_key_reads_not_found_and_is_republishable(capped):
    """An evicted key reads NOT_FOUND and may be published again at once."""
    _fill(capped, alice, ["k0", "k1", "k2", "k3"])
    assert capped.lookup(alice, ["k0"]).status is Status.ERR_NOT_FOUND
    assert capped.publish(alice, {"k0": "again"}).status is Status.SUCCESS
    assert capped.lookup(alice, ["k0"]).status is Status.SUCCESS


def test_duplicate_refusal_under_pressure_evicts_nothing(capped):
    """A publish refused as duplicate at the cap leaves every item (decide before removing)."""
    _fill(capped, alice, ["k0", "k1", "k2"])
    before = snapshot(capped)
    assert capped.publish(alice, {"k2": "y", "new": "x"}).status is Status.ERR_DUPLICATE_KEY
    assert snapshot(capped) == before


def test_replace_frees_own_bytes_before_evicting(capped, sched):
    """Replacing an own key releases its bytes first, so a same-size replace evicts nothing."""
    _fill(capped, alice, ["k0", "k1", "k2"], sched, 1)
    assert capped.publish(alice, {"k2": "y"}, replace=True).status is Status.SUCCESS
    assert keys_in_store(capped) == {"k0", "k1", "k2"}
    assert capped.stats().evictions == 0


def test_parked_lookups_not_counted_against_cap(capped):
    """Parked lookups hold no bytes: usage stays at zero however many wait."""
    for i in range(20):
        capped.lookup(alice, [f"w{i}" * 50], wait=0, ticket=i)
    assert capped.stats().bytes_by_uid == {}
    _fill(capped, alice, ["k0", "k1", "k2"])
    assert capped.stats().evictions == 0


def test_eviction_applies_to_local_range_items_alike(capped, sched):
    """Eviction does not look at range either."""
    capped.publish(alice, {"k0": "x"}, range=Range.LOCAL)
    sched.advance(1)
    _fill(capped, alice, ["k1", "k2", "k3"], range=Range.GLOBAL)
    assert keys_in_store(capped) == {"k1", "k2", "k3"}
