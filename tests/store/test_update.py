"""update: atomic add, compare-and-set and append, under every rule of the store."""

from __future__ import annotations

import pytest

from pydvm.store import ITEM_OVERHEAD, Pending, Typed
from storekit import (
    GID_A, UID_A, UID_B, Persistence as P, Range, Status, alice, alice2, bob, caller,
    found_map, item_with_key, keys_in_store, snapshot, usage,
)


def value_of(reply):
    """The value an update reply says the key holds afterwards (None: absent)."""
    assert reply.status is Status.SUCCESS, reply
    return reply.found[0].value if reply.found else None


# -- add -----------------------------------------------------------------


def test_add_creates_the_counter_at_the_operand_then_adds(store):
    """An absent key starts at the operand; each add returns the new value."""
    r = store.update(alice, "c", "add", 3)
    assert (value_of(r), r.count) == (3, 1)
    assert value_of(store.update(alice, "c", "add", -1)) == 2
    assert value_of(store.update(alice2, "c", "add", 40)) == 42
    assert found_map(store.lookup(alice, ["c"]))["c"] == (42, ("ns-a", 0))


@pytest.mark.parametrize("start,delta,expected", [
    (b"3", 2, b"5"), ("3", 2, "5"), (b"-7", b"10", b"3"), ("0", "+4", "4"), (5, b"1", 6),
    (Typed(250, 12), 5, Typed(255, 12)),
])
def test_add_keeps_the_form_the_integer_is_held_in(store, start, delta, expected):
    """Decimal text stays decimal text of its type, an int an int, a typed
    PMIx integer its type."""
    store.publish(alice, {"c": start})
    assert value_of(store.update(alice, "c", "add", delta)) == expected
    assert item_with_key(store, "c").pairs["c"] == expected


@pytest.mark.parametrize("value", [b"abc", "1.5", 2.0, True, b"", b" 3", "1_000", b"\xff"])
def test_add_to_a_value_that_is_not_an_integer_is_refused_and_changes_nothing(store, value):
    """BAD_PARAM naming the problem; the store is exactly as it was."""
    store.publish(alice, {"c": value})
    before = snapshot(store)
    r = store.update(alice, "c", "add", 1)
    assert r.status is Status.ERR_BAD_PARAM and "not an integer" in r.message, r
    assert snapshot(store) == before


@pytest.mark.parametrize("start,delta", [(2**64 - 1, 1), (b"-9223372036854775808", -1),
                                         (Typed(255, 12), 1)])
def test_add_whose_result_does_not_fit_is_refused(store, start, delta):
    """Outside the wire's 64-bit integers (or the typed value's width) is
    BAD_PARAM, nothing changed."""
    store.publish(alice, {"c": start})
    before = snapshot(store)
    r = store.update(alice, "c", "add", delta)
    assert r.status is Status.ERR_BAD_PARAM and "fit" in r.message, r
    assert snapshot(store) == before


@pytest.mark.parametrize("operand", ["x", 1.0, True, b"1e3", [1]])
def test_add_needs_an_integer_operand(store, operand):
    r = store.update(alice, "c", "add", operand)
    assert r.status is Status.ERR_BAD_PARAM, r
    assert len(store) == 0


# -- compare-and-set -------------------------------------------------------


@pytest.mark.parametrize("expected", [None, "", b""])
def test_cas_on_an_absent_key_with_none_or_empty_expected_stores_desired(store, expected):
    r = store.update(alice, "k", "cas", b"v1", expected=expected)
    assert (value_of(r), r.count) == (b"v1", 1)
    assert item_with_key(store, "k").pairs["k"] == b"v1"


def test_cas_on_an_absent_key_with_a_value_expected_stores_nothing(store):
    """Nothing to compare with: no change, no item, an empty answer."""
    r = store.update(alice, "k", "cas", b"v1", expected=b"old")
    assert r.status is Status.SUCCESS and r.found == () and r.count == 0
    assert len(store) == 0


def test_cas_swaps_only_on_a_match_and_answers_the_value_it_leaves(store, sched):
    store.publish(bob, {"other": 1})
    store.publish(alice, {"k": b"a"})
    sched.advance(5)
    miss = store.update(alice, "k", "cas", b"c", expected=b"b")
    assert (value_of(miss), miss.count) == (b"a", 0)
    assert item_with_key(store, "k").last_access == sched.now(), "a miss is a read: restamped"
    hit = store.update(alice2, "k", "cas", b"c", expected=b"a")
    assert (value_of(hit), hit.count) == (b"c", 1)
    assert item_with_key(store, "k").pairs["k"] == b"c"


@pytest.mark.parametrize("held,expected", [("1", b"1"), (1, True), (1, 1.0), (b"", None)])
def test_cas_compares_type_and_value(store, held, expected):
    """str never equals bytes, an int never a bool or float; None expects absence."""
    store.publish(alice, {"k": held})
    r = store.update(alice, "k", "cas", b"new", expected=expected)
    assert (value_of(r), r.count) == (held, 0)


def test_cas_with_empty_expected_also_matches_a_present_empty_value(store):
    store.publish(alice, {"k": b""})
    assert value_of(store.update(alice, "k", "cas", b"x", expected=b"")) == b"x"


def test_cas_ignores_the_pmix_type_code_of_what_it_compares(store):
    store.publish(alice, {"k": Typed(7, 12)})
    assert value_of(store.update(alice, "k", "cas", 8, expected=7)) == 8


# -- append ----------------------------------------------------------------


def test_append_creates_then_concatenates(store):
    assert value_of(store.update(alice, "log", "append", b"ab")) == b"ab"
    assert value_of(store.update(alice2, "log", "append", b"cd")) == b"abcd"
    assert value_of(store.update(alice, "s", "append", "x")) == "x"
    assert value_of(store.update(alice, "s", "append", "y")) == "xy"


@pytest.mark.parametrize("held,extra", [(b"a", "b"), ("a", b"b"), (5, b"1")])
def test_append_of_another_type_is_refused(store, held, extra):
    store.publish(alice, {"k": held})
    before = snapshot(store)
    r = store.update(alice, "k", "append", extra)
    assert r.status is Status.ERR_BAD_PARAM, r
    assert snapshot(store) == before


# -- ownership, ranges, lifetimes ------------------------------------------


@pytest.mark.parametrize("op,value,expected", [("add", 1, None), ("cas", b"x", b"v"),
                                               ("append", b"x", None)])
def test_updating_another_users_readable_item_is_refused_no_permissions(store, op, value,
                                                                        expected):
    """Bob may read Alice's item (accessor list) but not change it; nothing changes."""
    store.publish(alice, {"k": b"v"}, access_uids=[UID_A, UID_B])
    store.publish(alice, {"n": 1}, access_uids=[UID_A, UID_B])
    before = snapshot(store)
    key = "n" if op == "add" else "k"
    r = store.update(bob, key, op, value, expected=expected)
    assert r.status is Status.ERR_NO_PERMISSIONS and "owner" in r.message, r
    assert snapshot(store) == before


def test_same_uid_other_gid_is_not_the_owner(store):
    store.publish(caller(gid=GID_A), {"n": 1}, access_uids=[UID_A])
    other_group = caller(nspace="ns-x", gid=999)
    r = store.update(other_group, "n", "add", 1)
    assert r.status is Status.ERR_NO_PERMISSIONS, r


def test_a_key_the_caller_cannot_read_does_not_collide_a_new_item_is_made(store):
    """As publish's duplicate rule: an item bob cannot read is not his key."""
    store.publish(alice, {"n": 10})
    r = store.update(bob, "n", "add", 1)
    assert value_of(r) == 1 and r.found[0].publisher == bob.proc
    assert sorted(it.pairs["n"] for it in store.items()) == [1, 10]


def test_update_keeps_owner_range_persistence_and_accessors_of_the_item(store):
    """Another process of the same user updates in place: the item stays
    the publisher's, with its range, persistence and lists; the update's own
    are for a new item only."""
    store.publish(alice, {"n": 1, "other": "x"}, range=Range.NAMESPACE,
                  persistence=P.PROC, access_gids=[GID_A])
    r = store.update(alice2, "n", "add", 1, range=Range.NAMESPACE, persistence=P.SESSION,
                     access_uids=[UID_B])
    assert r.found[0].publisher == alice.proc
    it = item_with_key(store, "n")
    assert (it.owner, it.range, it.persistence) == (alice, Range.NAMESPACE, P.PROC)
    assert (it.access_uids, it.access_gids) == ((), (GID_A,))
    assert it.pairs == {"n": 2, "other": "x"}
    assert store.purge(P.PROC, nspace="ns-a", rank=0) == 1  # it dies with its publisher


def test_a_new_key_gets_the_updates_range_persistence_and_accessors(store):
    store.update(alice, "n", "add", 1, range=Range.NAMESPACE, persistence=P.SESSION,
                 access_uids=[UID_A, UID_B])
    it = item_with_key(store, "n")
    assert (it.owner, it.range, it.persistence, it.access_uids) == (
        alice, Range.NAMESPACE, P.SESSION, (UID_A, UID_B))


def test_update_sees_only_items_of_its_own_range(store):
    """A SESSION counter and a NAMESPACE counter of one name are two keys."""
    store.update(alice, "n", "add", 1, range=Range.SESSION)
    store.update(alice, "n", "add", 10, range=Range.NAMESPACE)
    assert value_of(store.update(alice, "n", "add", 1, range=Range.NAMESPACE)) == 11
    assert sorted(it.pairs["n"] for it in store.items()) == [1, 11]


def test_update_of_a_first_read_item_consumes_nothing(store):
    store.publish(alice, {"t": 1}, persistence=P.FIRST_READ)
    assert value_of(store.update(alice, "t", "add", 1)) == 2
    assert found_map(store.lookup(alice, ["t"]))["t"][0] == 2
    assert "t" not in keys_in_store(store)


def test_a_stale_item_is_expired_and_a_new_one_made(env, sched):
    store = env.make(timeout=10)
    store.publish(alice, {"n": 5}, persistence=P.INDEF)
    sched.advance(11)  # past the timeout; the sweep may or may not have run
    assert value_of(store.update(alice, "n", "add", 1)) == 1


def test_update_restamps_the_item(store, sched):
    store.publish(alice, {"n": 1})
    sched.advance(7)
    store.update(alice, "n", "add", 1)
    assert item_with_key(store, "n").last_access == sched.now()


# -- the cap and accounting ------------------------------------------------


def test_growth_is_accounted_and_evicts_the_uids_least_recently_used_other_items(env):
    """Appending past the cap evicts the uid's oldest items, never the item
    itself, never another uid's."""
    item = ITEM_OVERHEAD + 2 + 100
    store = env.make(max_size=3 * item + 50)
    store.publish(alice, {"k1": "x" * 100})
    store.publish(alice, {"k2": "x" * 100})
    store.publish(bob, {"b1": "x" * 100})
    store.update(alice, "lg", "append", "x" * 100)
    assert usage(store, UID_A) == 3 * item
    r = store.update(alice2, "lg", "append", "y" * 60)
    assert value_of(r) == "x" * 100 + "y" * 60
    assert usage(store, UID_A) == 2 * item + 60
    assert keys_in_store(store) == {"k2", "b1", "lg"}  # k1, the oldest, evicted
    assert store.stats().evictions == 1


def test_an_item_that_would_exceed_the_whole_cap_is_refused(env):
    store = env.make(max_size=ITEM_OVERHEAD + 1 + 20)
    store.publish(alice, {"a": b"x" * 10})
    store.publish(alice, {"k": b"0" * 19})
    before = snapshot(store)
    r = store.update(alice, "k", "append", b"12")
    assert r.status is Status.ERR_OUT_OF_RESOURCE, r
    assert snapshot(store) == before
    r = store.update(alice, "z", "append", b"x" * 30)
    assert r.status is Status.ERR_OUT_OF_RESOURCE, r
    assert snapshot(store) == before


def test_a_shrinking_or_same_size_update_evicts_nothing(env):
    store = env.make(max_size=2 * (ITEM_OVERHEAD + 1 + 8))
    store.publish(alice, {"a": 1})
    store.publish(alice, {"n": 1})
    for _ in range(3):
        store.update(alice, "n", "add", 1)
    store.update(alice, "a", "cas", b"", expected=1)
    assert keys_in_store(store) == {"a", "n"} and store.stats().evictions == 0


# -- parked lookups ----------------------------------------------------------


def test_update_wakes_lookups_waiting_for_its_key(store, env):
    assert store.lookup(alice2, ["n"], wait=0, ticket="t1") == Pending("t1")
    assert store.lookup(bob, ["n"], wait=0, ticket="t2") == Pending("t2")
    store.update(alice, "n", "add", 5)
    (r,) = env.answers_for("t1")
    assert found_map(r)["n"] == (5, alice.proc)
    assert env.answers_for("t2") == [] and store.stats().parked == 1


def test_a_cas_that_stores_nothing_wakes_nobody(store, env):
    store.lookup(alice2, ["k"], wait=0, ticket="t")
    store.update(alice, "k", "cas", b"x", expected=b"y")
    assert env.answers_for("t") == []


# -- bad input ---------------------------------------------------------------


@pytest.mark.parametrize("kw,needle", [
    (dict(key="", op="add", value=1), "empty"),
    (dict(key=5, op="add", value=1), "str"),
    (dict(key="k", op="mul", value=1), "unknown update operation"),
    (dict(key="k", op=None, value=1), "unknown update operation"),
    (dict(key="k", op="add", value=None), "unsupported value"),
    (dict(key="k", op="append", value=3), "str or bytes"),
    (dict(key="k", op="cas", value=b"x", expected=[1]), "expected"),
    (dict(key="k", op="cas", value=b"x", range=99), "range"),
    (dict(key="k", op="cas", value=b"x", persistence=42), "persistence"),
    (dict(key="k", op="add", value=1, access_uids="x"), "access uids"),
])
def test_bad_update_arguments_are_bad_param_and_change_nothing(store, kw, needle):
    store.publish(alice, {"k": b"v"})
    before = snapshot(store)
    r = store.update(alice, **kw)
    assert r.status is Status.ERR_BAD_PARAM and needle in r.message, r
    assert snapshot(store) == before
