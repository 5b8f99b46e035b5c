"""keys (count and list by prefix), what unpublish says it removed, and the key index."""

from __future__ import annotations

import random

import pytest

from pydvm.store.keyindex import LOAD, KeyIndex
from storekit import (
    UID_B, Persistence as P, Range, Status, alice, alice2, bob, caller, item_with_key,
    snapshot,
)


def test_keys_counts_and_lists_the_readable_keys_under_a_prefix_in_order(store):
    store.publish(alice, {"job/b": 1, "job/a": 2, "jobless": 3, "other/x": 4})
    store.publish(alice2, {"job/c": b"", "job/": 5})
    r = store.keys(alice, "job/")
    assert r.status is Status.SUCCESS
    assert (r.count, r.keys) == (4, ("job/", "job/a", "job/b", "job/c"))
    assert store.keys(alice, "").count == 6
    assert store.keys(alice, "zzz") .count == 0


def test_keys_counts_what_a_lookup_in_that_range_could_return(store):
    """Another user's unreadable item, and items outside the range, are not counted."""
    store.publish(alice, {"p/mine": 1})
    store.publish(bob, {"p/bobs": 1})
    store.publish(bob, {"p/shared": 1}, access_uids=[1000, UID_B])
    store.publish(caller(nspace="ns-z"), {"p/ns": 1}, range=Range.NAMESPACE)
    assert store.keys(alice, "p/").keys == ("p/mine", "p/shared")
    assert store.keys(caller(nspace="ns-z"), "p/").keys == ("p/mine", "p/ns", "p/shared")
    assert store.keys(alice, "p/", range=Range.NAMESPACE).keys == ("p/mine",)


def test_a_key_held_by_two_items_counts_once(store):
    store.publish(alice, {"k": 1}, range=Range.SESSION)
    store.publish(alice, {"k": 2}, range=Range.NAMESPACE)
    assert len(store) == 2 and store.keys(alice, "k").count == 1


def test_limit_and_max_bytes_bound_the_list_never_the_count(store):
    store.publish(alice, {f"k{i}": i for i in range(10)})
    assert store.keys(alice, "k", limit=3).keys == ("k0", "k1", "k2")
    r = store.keys(alice, "k", limit=0)
    assert (r.count, r.keys) == (10, ())
    r = store.keys(alice, "k", max_bytes=5)
    assert (r.count, r.keys) == (10, ("k0", "k1"))


def test_keys_touches_consumes_and_expires_nothing(env, sched):
    store = env.make(timeout=10)
    store.publish(alice, {"f": 1}, persistence=P.FIRST_READ)
    store.publish(alice, {"old": 1}, persistence=P.INDEF)
    sched.advance(6)
    store.publish(alice, {"new": 1}, persistence=P.INDEF)
    sched.advance(5)  # "f" and "old" are past the timeout now (unless swept)
    before = snapshot(store)
    r = store.keys(alice, "")
    assert (r.count, r.keys) == (1, ("new",))
    assert snapshot(store) == before


@pytest.mark.parametrize("kw,needle", [(dict(prefix=3), "prefix"), (dict(range=77), "range"),
                                       (dict(limit=-1), "limit"), (dict(limit=True), "limit"),
                                       (dict(max_bytes="x"), "max_bytes")])
def test_bad_keys_arguments_are_bad_param(store, kw, needle):
    r = store.keys(alice, **kw)
    assert r.status is Status.ERR_BAD_PARAM and needle in r.message, r


def test_unpublish_counts_the_keys_it_removed(store):
    store.publish(alice, {"a": 1, "b": 2}, range=Range.SESSION)
    store.publish(alice, {"a": 3}, range=Range.NAMESPACE)
    store.publish(bob, {"c": 1})
    assert store.unpublish(alice, ["a", "c", "nope"]).count == 2  # a twice; c is bob's
    assert store.unpublish(alice, ["a"]).count == 0
    assert store.unpublish(alice2, ["b"]).count == 1  # same uid: owner
    assert item_with_key(store, "c").owner == bob


def test_unpublish_all_counts_the_keys_of_the_process(store):
    store.publish(alice, {"a": 1, "b": 2})
    store.publish(alice, {"c": 3})
    store.publish(alice2, {"d": 4})
    assert store.unpublish_all(alice).count == 3
    assert store.unpublish_all(alice).count == 0


# -- the index itself -------------------------------------------------------


def test_key_index_stays_sorted_and_bounded_through_adds_and_removals():
    """Random adds and removals past several chunk splits and merges; the
    prefix runs are those of a plain sorted list."""
    rng = random.Random(7)
    idx, model = KeyIndex(), set()
    pool = [f"{rng.choice('abc')}/{rng.randrange(5 * LOAD)}" for _ in range(8 * LOAD)]
    for step in range(20 * LOAD):
        key = rng.choice(pool)
        if key in model and rng.random() < 0.55:
            idx.discard(key)
            model.discard(key)
        elif key not in model:
            idx.add(key)
            model.add(key)
        if step % 997 == 0:
            idx.check_invariants()
            assert list(idx) == sorted(model)
    idx.check_invariants()
    for prefix in ("", "a", "a/1", "b/", "c/99", "d"):
        assert list(idx.prefixed(prefix)) == sorted(k for k in model if k.startswith(prefix))
    assert all(k in idx for k in model) and "zz" not in idx
    for key in sorted(model):
        idx.discard(key)
    idx.check_invariants()
    assert len(idx) == 0 and list(idx.prefixed("")) == []


def test_describe_and_keys_of_a_uid_by_prefix_are_sorted_and_only_that_uids(store, sched):
    store.publish(alice, {"t/b": 1, "t/a": b"xy", "u": 1})
    store.publish(bob, {"t/bob": 1})
    store.publish(alice2, {"t/c": "z"}, range=Range.NAMESPACE)
    assert store.keys_of_uid(alice.uid, "t/") == ["t/a", "t/b", "t/c"]
    assert store.keys_of_uid(bob.uid, "t/") == ["t/bob"]
    rows = store.describe_uid(alice.uid, prefix="t/", limit=2)
    assert [(r.key, r.size) for r in rows] == [("t/a", 5), ("t/b", 11)]
    assert store.describe_uid(alice.uid, prefix="none") == []
