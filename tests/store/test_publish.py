"""publish: defaults, stamping, the duplicate rule and replace (SPEC 4)."""

from __future__ import annotations


from storekit import (
    GID_A, GID_B, UID_A, UID_B, Persistence as P, Range, Status, alice, alice2, bob,
    caller, found_map, item_with_key, keys_in_store, snapshot, usage,
)


def test_publish_default_persistence_is_nspace(store):
    """No persistence given stores the item as NSPACE."""
    assert store.publish(alice, {"k": 1}).status is Status.SUCCESS
    assert item_with_key(store, "k").persistence is P.NSPACE


def test_publish_persist_invalid_reads_as_nspace(store):
    """PMIX_PERSIST_INVALID on a publish means 'not given': NSPACE."""
    assert store.publish(alice, {"k": 1}, persistence=P.INVALID).status is Status.SUCCESS
    assert item_with_key(store, "k").persistence is P.NSPACE


def test_publish_default_range_is_session(store):
    """No range given stores the item with range SESSION."""
    store.publish(alice, {"k": 1})
    assert item_with_key(store, "k").range is Range.SESSION


def test_publish_accepts_plain_int_range_and_persistence(store):
    """Range and persistence may be given as their PMIx numbers."""
    assert store.publish(alice, {"k": 1}, range=3, persistence=0).status is Status.SUCCESS
    it = item_with_key(store, "k")
    assert it.range is Range.NAMESPACE and it.persistence is P.INDEF


def test_publish_stamps_last_access_with_store_clock(store, sched):
    """last_access is the clock reading at publish."""
    sched.advance(12.25)
    store.publish(alice, {"k": 1})
    assert item_with_key(store, "k").last_access == sched.now()


def test_publish_records_owner_identity_and_accessor_lists(store):
    """The item keeps the publisher Caller (uid, gid, proxy node) and its accessor lists."""
    store.publish(alice, {"k": 1}, access_uids=[UID_B], access_gids=[GID_B])
    it = item_with_key(store, "k")
    assert it.owner == alice
    assert (it.uid, it.gid, it.proxy) == (UID_A, GID_A, "node1")
    assert it.access_uids == (UID_B,) and it.access_gids == (GID_B,)


def test_one_publish_is_one_item(store):
    """All pairs of a publish are one item; each publish is a new item."""
    store.publish(alice, {"a": 1, "b": 2})
    store.publish(alice, {"c": 3})
    assert len(store) == 2
    assert item_with_key(store, "a") is item_with_key(store, "b")


# ---------------------------------------------------------------------------
# duplicate rule
# ---------------------------------------------------------------------------


def test_own_collision_without_replace_is_duplicate_key(store):
    """Republishing one's own key without replace -> DUPLICATE_KEY, store unchanged."""
    store.publish(alice, {"k": "old"})
    before = snapshot(store)
    r = store.publish(alice, {"k": "new"})
    assert r.status is Status.ERR_DUPLICATE_KEY
    assert "k" in r.message
    assert snapshot(store) == before


def test_own_collision_from_another_process_of_same_uid_is_own(store):
    """Another process of the same uid collides as 'own': DUPLICATE_KEY without replace, ok with."""
    store.publish(alice, {"k": "old"})
    assert store.publish(alice2, {"k": "new"}).status is Status.ERR_DUPLICATE_KEY
    assert store.publish(alice2, {"k": "new"}, replace=True).status is Status.SUCCESS
    assert item_with_key(store, "k").owner == alice2


def test_replace_removes_own_prior_keys_and_stores_new(store):
    """replace=True drops the colliding own keys; the new item holds the key."""
    store.publish(alice, {"k": "old", "other": "x"})
    old = item_with_key(store, "k")
    assert store.publish(alice, {"k": "new"}, replace=True).status is Status.SUCCESS
    new = item_with_key(store, "k")
    assert new is not old
    assert new.pairs == {"k": "new"}
    assert old.pairs == {"other": "x"}  # shrunk, still stored
    assert old.nbytes == 5 + 1 + 128
    assert usage(store, UID_A) == old.nbytes + new.nbytes
    assert found_map(store.lookup(alice, ["k"])) == {"k": ("new", alice.proc)}


def test_replace_item_left_empty_leaves_store(store):
    """An own item whose every key is replaced leaves the store."""
    store.publish(alice, {"k": "old"})
    store.publish(alice, {"j": "old2"})
    store.publish(alice, {"k": "new", "j": "new2"}, replace=True)
    assert len(store) == 1
    assert item_with_key(store, "k").pairs == {"k": "new", "j": "new2"}
    assert usage(store, UID_A) == item_with_key(store, "k").nbytes


def test_foreign_collision_is_duplicate_key_even_with_replace(store):
    """A colliding item of another uid whose list admits the publisher refuses the publish, replace or not."""
    store.publish(bob, {"k": "bob's"}, access_uids=[UID_A])
    before = snapshot(store)
    for rep in (False, True):
        r = store.publish(alice, {"k": "mine"}, replace=rep)
        assert r.status is Status.ERR_DUPLICATE_KEY
        assert snapshot(store) == before
    assert found_map(store.lookup(alice, ["k"])) == {"k": ("bob's", bob.proc)}


def test_foreign_collision_same_uid_other_gid_is_duplicate_key_with_replace(store):
    """Same uid but another known gid is a foreign owner: replace does not help."""
    store.publish(alice, {"k": 1}, access_gids=[GID_A, GID_B])
    other_gid = caller(nspace="ns-g", gid=GID_B)
    r = store.publish(other_gid, {"k": 2}, replace=True)
    assert r.status is Status.ERR_DUPLICATE_KEY
    assert item_with_key(store, "k").pairs == {"k": 1}


def test_foreign_collision_among_several_keys_refuses_whole_publish(store):
    """One foreign collision among many keys refuses everything, own collisions included."""
    store.publish(alice, {"mine": 1})
    store.publish(bob, {"theirs": 2}, access_uids=[UID_A])
    before = snapshot(store)
    r = store.publish(alice, {"mine": 3, "fresh": 4, "theirs": 5}, replace=True)
    assert r.status is Status.ERR_DUPLICATE_KEY
    assert snapshot(store) == before


def test_items_of_another_range_word_do_not_collide(store):
    """The same key under another range word is no collision."""
    store.publish(alice, {"k": "session"}, range=Range.SESSION)
    assert store.publish(alice, {"k": "global"}, range=Range.GLOBAL).status is Status.SUCCESS
    assert store.publish(alice, {"k": "ns"}, range=Range.NAMESPACE).status is Status.SUCCESS
    assert len(store) == 3


def test_unreadable_foreign_item_does_not_collide(store):
    """An item of another uid with no accessor list (publisher cannot read it) does not collide."""
    store.publish(bob, {"k": "bob's"})
    assert store.publish(alice, {"k": "alice's"}).status is Status.SUCCESS
    assert found_map(store.lookup(alice, ["k"])) == {"k": ("alice's", alice.proc)}
    assert found_map(store.lookup(bob, ["k"])) == {"k": ("bob's", bob.proc)}


def test_out_of_range_item_does_not_collide(store):
    """A same-uid NAMESPACE item of another namespace is out of the publisher's reach: no collision."""
    other_ns = caller(nspace="ns-other")
    store.publish(other_ns, {"k": 1}, range=Range.NAMESPACE)
    assert store.publish(alice, {"k": 2}, range=Range.NAMESPACE).status is Status.SUCCESS
    assert len(store) == 2


def test_stale_colliding_item_does_not_block_publish(env, sched):
    """An idle-expired item not yet swept does not collide; it is expired as the publish proceeds."""
    store = env.make(timeout=8)
    store.publish(alice, {"k": "old"}, persistence=P.INDEF)
    sched.advance(9)  # stale (9 > 8) but the sweep (every 2 s) last ran at +8
    assert len(store) == 1
    assert store.publish(alice, {"k": "new"}).status is Status.SUCCESS
    assert item_with_key(store, "k").pairs == {"k": "new"}
    assert store.stats().expiries == 1


def test_duplicate_refusal_does_not_expire_stale_items(env, sched):
    """A publish refused as duplicate leaves even stale colliders alone (store unchanged)."""
    store = env.make(timeout=8)
    store.publish(alice, {"stale": 1}, persistence=P.INDEF)
    sched.advance(5)
    store.publish(alice, {"live": 1}, persistence=P.SESSION)
    sched.advance(4)  # 'stale' is 9 s old and unswept
    before = snapshot(store)
    r = store.publish(alice, {"stale": 2, "live": 2})
    assert r.status is Status.ERR_DUPLICATE_KEY
    assert snapshot(store) == before


def test_removed_key_is_republishable_at_once(store):
    """After an unpublish the same key can be published again immediately."""
    store.publish(alice, {"k": 1})
    store.unpublish(alice, ["k"])
    assert store.publish(alice, {"k": 2}).status is Status.SUCCESS
    assert keys_in_store(store) == {"k"}
