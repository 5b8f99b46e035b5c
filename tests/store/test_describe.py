"""describe_uid: what ``pydvm store`` shows of a user's own keys (issue 11).

Per key: persistence, range, idle time since the last access, time left
before the idle timeout (None when a lifetime removes it), size and
publisher -- read-only, never another user's, on the fake clock.
"""

from __future__ import annotations

from pydvm.store import KeyInfo
from storekit import UID_A, UID_B, Persistence as P, Range as R, alice, alice2, bob, snapshot


def test_describe_shows_each_own_key_with_persistence_range_size_and_publisher(store):
    """Two items of alice's, one of bob's: alice sees her three keys, bob's are not hers."""
    store.publish(alice, {"addr": "tcp://x:1", "port": 5555}, persistence=P.APP)
    store.publish(alice2, {"tok": b"\x00\x01"}, range=R.NAMESPACE, persistence=P.FIRST_READ)
    store.publish(bob, {"secret": "b"})
    rows = {r.key: r for r in store.describe_uid(UID_A)}
    assert set(rows) == {"addr", "port", "tok"}
    assert rows["addr"] == KeyInfo("addr", P.APP, R.SESSION, 0.0, None,
                                   len("addr") + len("tcp://x:1"),
                                   rows["addr"].item_bytes, ("ns-a", 0))
    assert rows["port"].size == len("port") + 8
    assert rows["addr"].item_bytes == rows["port"].item_bytes == 128 + 4 + 9 + 4 + 8
    assert rows["tok"].range is R.NAMESPACE and rows["tok"].persistence is P.FIRST_READ
    assert rows["tok"].publisher == ("ns-a", 1) and rows["tok"].size == 5
    assert [r.key for r in store.describe_uid(UID_B)] == ["secret"]
    assert store.describe_uid(4242) == []


def test_describe_idle_is_time_since_last_access_and_expires_in_counts_down(env, sched):
    """INDEF item, timeout 100: idle 30 s -> expires in 70 s; a lookup restamps both."""
    store = env.make(timeout=100)
    store.publish(alice, {"k": "v"}, persistence=P.INDEF)
    store.publish(alice, {"n": "v"}, persistence=P.NSPACE)
    sched.advance(30)
    rows = {r.key: r for r in store.describe_uid(UID_A)}
    assert rows["k"].idle == 30 and rows["k"].expires_in == 70
    assert rows["n"].idle == 30 and rows["n"].expires_in is None  # a lifetime removes it
    store.lookup(alice2, ["k"])
    rows = {r.key: r for r in store.describe_uid(UID_A)}
    assert rows["k"].idle == 0 and rows["k"].expires_in == 100


def test_describe_is_read_only_and_keeps_nothing_alive(env, sched):
    """Asking changes nothing: the store is as it was, and the item still expires on time."""
    store = env.make(timeout=10)
    store.publish(alice, {"k": "v"}, persistence=P.INDEF)
    sched.advance(6)
    before = snapshot(store)
    assert len(store.describe_uid(UID_A)) == 1
    assert snapshot(store) == before
    sched.advance(5)  # 11 s idle: past the timeout, whether or not the sweep ran yet
    assert store.describe_uid(UID_A) == []


def test_describe_with_the_timeout_off_gives_no_expiry(env, sched):
    """prte_data_server_timeout 0: nothing idles out, so no key shows a time left."""
    store = env.make(timeout=0)
    store.publish(alice, {"k": "v"}, persistence=P.INDEF)
    sched.advance(1000)
    (row,) = store.describe_uid(UID_A)
    assert row.idle == 1000 and row.expires_in is None


def test_describe_lists_least_recently_used_first(env, sched):
    """Order follows last access, as eviction would take them."""
    store = env.make()
    store.publish(alice, {"a": "1"}, persistence=P.INDEF)
    sched.advance(1)
    store.publish(alice, {"b": "1"}, persistence=P.INDEF)
    sched.advance(1)
    store.lookup(alice, ["a"])
    assert [r.key for r in store.describe_uid(UID_A)] == ["b", "a"]
    assert [r.key for r in store.describe_uid(UID_A, now=sched.now() + 5)] == ["b", "a"]


def test_describe_stops_at_its_limit_least_recently_used_first(env, sched):
    """limit=N: the N least recently used keys, so a reply stays bounded."""
    store = env.make()
    for i in range(5):
        store.publish(alice, {f"k{i}": "v"}, persistence=P.INDEF)
        sched.advance(1)
    assert [r.key for r in store.describe_uid(UID_A, limit=2)] == ["k0", "k1"]
    assert len(store.describe_uid(UID_A, limit=10)) == 5
