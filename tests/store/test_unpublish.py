"""unpublish(keys) and unpublish(): ownership decides, nothing else (SPEC 4)."""

from __future__ import annotations

import pytest

from storekit import (
    GID_A, GID_B, UID_A, UID_B, Persistence as P, Range, Status, alice, alice2, bob,
    caller, item_with_key, keys_in_store, snapshot, usage,
)


def test_unpublish_removes_key_from_every_owned_item(store):
    """unpublish(k) removes k from each item of the caller's uid, whatever process or range published it."""
    store.publish(alice, {"k": 1}, range=Range.SESSION)
    store.publish(alice2, {"k": 2}, range=Range.GLOBAL)
    store.publish(caller(nspace="ns-q", node="node9"), {"k": 3}, range=Range.NAMESPACE)
    assert store.unpublish(alice, ["k"]).status is Status.SUCCESS
    assert len(store) == 0
    assert usage(store, UID_A) == 0


def test_unpublish_leaves_other_uid_items(store):
    """Items of another uid holding the same key stay."""
    store.publish(alice, {"k": 1})
    store.publish(bob, {"k": 2})
    store.unpublish(alice, ["k"])
    assert item_with_key(store, "k").owner == bob


def test_unpublish_requires_same_gid_when_both_known(store):
    """Same uid with another known gid is not the owner: the item stays (still SUCCESS)."""
    store.publish(alice, {"k": 1})
    before = snapshot(store)
    r = store.unpublish(caller(nspace="ns-g", gid=GID_B), ["k"])
    assert r.status is Status.SUCCESS
    assert snapshot(store) == before


@pytest.mark.parametrize("pub_gid,req_gid", [(None, GID_B), (GID_A, None), (None, None)])
def test_unpublish_gid_unknown_either_side_compares_uid_alone(store, pub_gid, req_gid):
    """With a gid unknown on either side ownership is by uid alone."""
    store.publish(caller(gid=pub_gid), {"k": 1})
    store.unpublish(caller(nspace="ns-r", gid=req_gid), ["k"])
    assert len(store) == 0


def test_accessor_list_never_confers_removal(store):
    """B named in A's access lists can read A's item, but B's unpublish leaves it."""
    store.publish(alice, {"k": "v"}, access_uids=[UID_B], access_gids=[GID_B])
    assert store.lookup(bob, ["k"]).status is Status.SUCCESS
    assert store.unpublish(bob, ["k"]).status is Status.SUCCESS
    assert keys_in_store(store) == {"k"}
    assert store.lookup(bob, ["k"]).status is Status.SUCCESS


def test_owner_excluded_by_own_accessor_list_can_unpublish(store):
    """An owner its own list excludes cannot read (NO_PERMISSIONS) but can remove."""
    store.publish(alice, {"k": "v"}, access_uids=[UID_B])
    assert store.lookup(alice, ["k"]).status is Status.ERR_NO_PERMISSIONS
    assert store.unpublish(alice, ["k"]).status is Status.SUCCESS
    assert len(store) == 0
    assert store.lookup(bob, ["k"]).status is Status.ERR_NOT_FOUND


@pytest.mark.parametrize("rng", list(Range), ids=lambda r: r.name)
def test_unpublish_consults_no_range(store, rng):
    """The owner removes an item of any range, even one it cannot see (other process, node)."""
    publisher = caller(nspace="ns-p", rank=5, node="node7")
    store.publish(publisher, {"k": 1}, range=rng)
    remover = caller(nspace="ns-x", rank=0, node="node1")
    store.unpublish(remover, ["k"])
    assert len(store) == 0


def test_unpublish_after_publishing_process_gone(store):
    """The publishing process need not exist: after its PROC purge a same-uid process removes its NSPACE item."""
    store.publish(alice, {"k": 1})
    store.purge(P.PROC, nspace="ns-a", rank=0)
    assert keys_in_store(store) == {"k"}
    store.unpublish(caller(nspace="ns-later", rank=0), ["k"])
    assert len(store) == 0


def test_unpublish_nothing_matched_is_success_and_unchanged(store):
    """unpublish of absent keys succeeds and changes nothing."""
    store.publish(alice, {"k": 1})
    before = snapshot(store)
    assert store.unpublish(alice, ["absent", "other"]).status is Status.SUCCESS
    assert store.unpublish(bob, ["k"]).status is Status.SUCCESS
    assert snapshot(store) == before


def test_unpublish_one_key_of_several_shrinks_item(store):
    """unpublish of some keys of an item keeps the rest, with nbytes and usage recomputed."""
    store.publish(alice, {"a": "xx", "b": "yyy"})
    store.unpublish(alice, ["a"])
    it = item_with_key(store, "b")
    assert it.pairs == {"b": "yyy"}
    assert it.nbytes == 1 + 3 + 128 == usage(store, UID_A)


def test_unpublish_counts_no_eviction_or_expiry(store):
    """Unpublished items count as neither evictions, expiries nor consumption."""
    store.publish(alice, {"k": 1}, persistence=P.INDEF)
    store.unpublish(alice, ["k"])
    st = store.stats()
    assert (st.evictions, st.expiries, st.consumed) == (0, 0, 0)


def test_unpublish_last_idle_item_disarms_sweep(store):
    """Unpublishing the last INDEF item disarms the sweep timer."""
    store.publish(alice, {"k": 1}, persistence=P.INDEF)
    assert store.sweep_armed
    store.unpublish(alice, ["k"])
    assert not store.sweep_armed


# ---------------------------------------------------------------------------
# unpublish() without keys
# ---------------------------------------------------------------------------


def test_unpublish_all_removes_everything_the_process_published_any_persistence(store):
    """unpublish() removes every item of the calling process, INDEF, FIRST_READ and SESSION included."""
    for p in (P.INDEF, P.FIRST_READ, P.PROC, P.APP, P.NSPACE, P.SESSION):
        store.publish(alice, {f"k-{p.name}": 1}, persistence=p)
    store.publish(alice, {"ranged": 1}, range=Range.PROC_LOCAL, persistence=P.INDEF)
    assert len(store) == 7
    assert store.unpublish_all(alice).status is Status.SUCCESS
    assert len(store) == 0
    assert store.stats().bytes_by_uid == {}
    assert not store.sweep_armed


def test_unpublish_all_leaves_other_processes_of_same_uid(store):
    """unpublish() names the process, not the uid: another rank's items stay."""
    store.publish(alice, {"a": 1}, persistence=P.SESSION)
    store.publish(alice2, {"b": 2}, persistence=P.INDEF)
    store.publish(caller(nspace="ns-other", rank=0), {"c": 3})
    store.unpublish_all(alice)
    assert keys_in_store(store) == {"b", "c"}


def test_unpublish_all_with_nothing_published_is_success(store):
    """unpublish() of a process that published nothing is SUCCESS and changes nothing."""
    store.publish(bob, {"b": 1})
    before = snapshot(store)
    assert store.unpublish_all(alice).status is Status.SUCCESS
    assert snapshot(store) == before
