"""Immediate lookups: statuses, answers, access lists, touch, FIRST_READ (SPEC 4)."""

from __future__ import annotations

import pytest

from storekit import (
    GID_A, GID_B, UID_A, UID_B, UID_C, Persistence as P, Range, Status, alice, alice2, bob,
    caller, carol, found_map, item_with_key, keys_in_store, snapshot, usage,
)


def test_lookup_all_found_is_success_with_values_and_publishers(store):
    """All keys found -> SUCCESS, each FoundKey carrying its value and publisher (nspace, rank)."""
    store.publish(alice, {"a": "va"})
    store.publish(alice2, {"b": 2})
    r = store.lookup(alice, ["a", "b"])
    assert r.status is Status.SUCCESS
    assert found_map(r) == {"a": ("va", ("ns-a", 0)), "b": (2, ("ns-a", 1))}


def test_lookup_some_found_is_partial_success_carrying_found_values(store):
    """Some keys found -> PARTIAL_SUCCESS with exactly the found ones."""
    store.publish(alice, {"a": b"\x01"})
    r = store.lookup(alice, ["a", "missing"])
    assert r.status is Status.ERR_PARTIAL_SUCCESS
    assert found_map(r) == {"a": (b"\x01", alice.proc)}


def test_lookup_nothing_published_is_not_found(store):
    """No matching key at all -> NOT_FOUND with nothing found."""
    r = store.lookup(alice, ["nope"])
    assert r.status is Status.ERR_NOT_FOUND
    assert r.found == ()


def test_lookup_refused_by_access_is_no_permissions(store):
    """Every matching key refused by check (a) -> NO_PERMISSIONS."""
    store.publish(bob, {"k": 1})
    r = store.lookup(alice, ["k"])
    assert r.status is Status.ERR_NO_PERMISSIONS
    assert r.found == ()


def test_lookup_refused_by_range_is_not_found(store):
    """A key refused only by a range check reads as NOT_FOUND, not NO_PERMISSIONS."""
    store.publish(alice2, {"k": 1}, range=Range.PROC_LOCAL)
    assert store.lookup(alice, ["k"]).status is Status.ERR_NOT_FOUND


def test_lookup_access_refusal_of_one_key_and_missing_other_is_no_permissions(store):
    """None found, one key refused by access and one absent -> NO_PERMISSIONS."""
    store.publish(bob, {"k": 1})
    assert store.lookup(alice, ["k", "absent"]).status is Status.ERR_NO_PERMISSIONS


def test_lookup_access_refused_plus_found_is_partial_success(store):
    """A refused key beside a found one gives PARTIAL_SUCCESS with the found one."""
    store.publish(bob, {"k": 1})
    store.publish(alice, {"j": 2})
    r = store.lookup(alice, ["k", "j"])
    assert r.status is Status.ERR_PARTIAL_SUCCESS
    assert found_map(r) == {"j": (2, alice.proc)}


def test_lookup_gid_mismatch_without_lists_is_no_permissions(store):
    """Without lists, same uid but another known gid is refused by access."""
    store.publish(alice, {"k": 1})
    other_gid = caller(nspace="ns-g", uid=UID_A, gid=GID_B)
    assert store.lookup(other_gid, ["k"]).status is Status.ERR_NO_PERMISSIONS


@pytest.mark.parametrize("pub_gid,req_gid", [(None, GID_B), (GID_A, None), (None, None)])
def test_lookup_gid_unknown_either_side_compares_uid_alone(store, pub_gid, req_gid):
    """Without lists and a gid unknown on either side, the uid alone grants access."""
    store.publish(caller(gid=pub_gid), {"k": 1})
    r = store.lookup(caller(nspace="ns-r", gid=req_gid), ["k"])
    assert r.status is Status.SUCCESS


def test_accessor_list_lets_named_uid_read(store):
    """B named in A's access_uids can read A's item."""
    store.publish(alice, {"k": "v"}, access_uids=[UID_B])
    assert found_map(store.lookup(bob, ["k"])) == {"k": ("v", alice.proc)}


def test_accessor_gid_list_lets_member_read(store):
    """A requestor whose gid is in access_gids can read."""
    store.publish(alice, {"k": "v"}, access_gids=[GID_B])
    assert store.lookup(bob, ["k"]).status is Status.SUCCESS
    assert store.lookup(carol, ["k"]).status is Status.ERR_NO_PERMISSIONS


def test_accessor_lists_both_given_must_both_be_met(store):
    """With uid and gid lists a requestor must be in both."""
    store.publish(alice, {"k": "v"}, access_uids=[UID_B, UID_C], access_gids=[GID_B])
    assert store.lookup(bob, ["k"]).status is Status.SUCCESS
    assert store.lookup(carol, ["k"]).status is Status.ERR_NO_PERMISSIONS


def test_owner_excluded_by_own_accessor_list_cannot_read(store):
    """An owner its own access list excludes gets NO_PERMISSIONS."""
    store.publish(alice, {"k": "v"}, access_uids=[UID_B])
    assert store.lookup(alice, ["k"]).status is Status.ERR_NO_PERMISSIONS


def test_lookup_skips_unreadable_item_and_answers_from_readable_one(store):
    """With two items holding a key, the one the requestor may read answers."""
    store.publish(bob, {"k": "bob"})
    store.publish(alice, {"k": "alice"})
    assert found_map(store.lookup(alice, ["k"])) == {"k": ("alice", alice.proc)}
    assert found_map(store.lookup(bob, ["k"])) == {"k": ("bob", bob.proc)}


def test_lookup_duplicate_keys_in_request_answered_once(store):
    """A key named twice in one lookup is answered once, with SUCCESS."""
    store.publish(alice, {"k": 1})
    r = store.lookup(alice, ["k", "k"])
    assert r.status is Status.SUCCESS
    assert [f.key for f in r.found] == ["k"]


def test_lookup_restamps_last_access_of_answering_item(store, sched):
    """Each answered key restamps its item's last_access."""
    store.publish(alice, {"a": 1})
    store.publish(alice, {"b": 2})
    t0 = sched.now()
    sched.advance(7)
    store.lookup(alice, ["a"])
    assert item_with_key(store, "a").last_access == t0 + 7
    assert item_with_key(store, "b").last_access == t0


def test_refused_lookup_does_not_restamp(store, sched):
    """A lookup that is refused (NO_PERMISSIONS) or finds nothing touches nothing."""
    store.publish(alice, {"k": 1})
    before = snapshot(store)
    sched.advance(3)
    assert store.lookup(bob, ["k"]).status is Status.ERR_NO_PERMISSIONS
    assert store.lookup(alice, ["k"], range=Range.CUSTOM).status is Status.ERR_NOT_FOUND
    assert snapshot(store) == before


def test_lookup_of_non_first_read_items_leaves_store_contents(store):
    """Reading INDEF/PROC/APP/NSPACE/SESSION keys removes nothing."""
    for p in (P.INDEF, P.PROC, P.APP, P.NSPACE, P.SESSION):
        store.publish(alice, {f"k{p.name}": p.name}, persistence=p)
    keys = [f"k{p.name}" for p in (P.INDEF, P.PROC, P.APP, P.NSPACE, P.SESSION)]
    for _ in range(3):
        assert store.lookup(alice, keys).status is Status.SUCCESS
    assert keys_in_store(store) == set(keys)
    assert store.stats().consumed == 0


# ---------------------------------------------------------------------------
# FIRST_READ end to end
# ---------------------------------------------------------------------------


def test_first_read_second_read_is_not_found(store):
    """FIRST_READ: publish, first read SUCCESS, second read NOT_FOUND; item gone, usage 0."""
    store.publish(alice, {"tok": "secret"}, persistence=P.FIRST_READ)
    r1 = store.lookup(alice2, ["tok"])
    assert r1.status is Status.SUCCESS
    assert found_map(r1) == {"tok": ("secret", alice.proc)}
    r2 = store.lookup(alice2, ["tok"])
    assert r2.status is Status.ERR_NOT_FOUND
    assert len(store) == 0
    assert usage(store, UID_A) == 0
    assert store.stats().consumed == 1


def test_first_read_item_shrinks_key_by_key_and_leaves_with_last(store):
    """A two-key FIRST_READ item shrinks (nbytes, bytes_by_uid) as one key is read, leaves with the last."""
    store.publish(alice, {"k1": "aaaa", "k2": "bb"}, persistence=P.FIRST_READ)
    it = item_with_key(store, "k1")
    assert it.nbytes == (2 + 4) + (2 + 2) + 128
    assert store.lookup(alice, ["k1"]).status is Status.SUCCESS
    assert it.pairs == {"k2": "bb"}
    assert it.nbytes == (2 + 2) + 128
    assert store.stats().bytes_by_uid == {UID_A: (2 + 2) + 128}
    assert store.lookup(alice, ["k1"]).status is Status.ERR_NOT_FOUND
    assert store.lookup(alice, ["k2"]).status is Status.SUCCESS
    assert len(store) == 0
    assert store.stats().bytes_by_uid == {}
    assert store.stats().consumed == 2


def test_first_read_lookup_of_several_keys_consumes_each_returned_key(store):
    """One lookup returning several FIRST_READ keys (of one or more items) consumes all of them."""
    store.publish(alice, {"k1": 1, "k2": 2}, persistence=P.FIRST_READ)
    store.publish(alice2, {"k3": 3}, persistence=P.FIRST_READ)
    store.publish(alice2, {"keep": 4}, persistence=P.FIRST_READ)
    r = store.lookup(alice, ["k1", "k2", "k3"])
    assert found_map(r) == {"k1": (1, alice.proc), "k2": (2, alice.proc), "k3": (3, alice2.proc)}
    assert keys_in_store(store) == {"keep"}
    assert store.stats().consumed == 3
    assert store.lookup(alice, ["k1", "k2", "k3"]).status is Status.ERR_NOT_FOUND


def test_first_read_partial_lookup_consumes_only_returned_keys(store):
    """A PARTIAL_SUCCESS lookup consumes the FIRST_READ keys it returned and no others."""
    store.publish(alice, {"k1": 1, "k2": 2}, persistence=P.FIRST_READ)
    r = store.lookup(alice, ["k1", "zz"])
    assert r.status is Status.ERR_PARTIAL_SUCCESS
    assert keys_in_store(store) == {"k2"}


def test_first_read_refused_reader_consumes_nothing(store):
    """A requestor refused by access does not consume a FIRST_READ key."""
    store.publish(alice, {"tok": 1}, persistence=P.FIRST_READ)
    assert store.lookup(bob, ["tok"]).status is Status.ERR_NO_PERMISSIONS
    assert store.lookup(alice, ["tok"]).status is Status.SUCCESS


def test_first_read_consumed_key_is_republishable_at_once(store):
    """A consumed FIRST_READ key can be published again immediately, by anyone."""
    store.publish(alice, {"tok": 1}, persistence=P.FIRST_READ, access_uids=[UID_A, UID_B])
    assert store.lookup(bob, ["tok"]).status is Status.SUCCESS
    assert store.publish(bob, {"tok": 2}, persistence=P.FIRST_READ).status is Status.SUCCESS
    assert found_map(store.lookup(bob, ["tok"])) == {"tok": (2, bob.proc)}
