"""Size accounting (SPEC 3, 9): nbytes of an item and the per-uid usage."""

from __future__ import annotations

import pytest

from pydvm.store import ACCESSOR_OVERHEAD, ITEM_OVERHEAD, item_nbytes, value_size
from storekit import (
    UID_A, UID_B, Persistence as P, Status, alice, alice2, bob, item_with_key, usage,
)


def test_item_overhead_constants_match_spec():
    """ITEM_OVERHEAD is 128 and each accessor uid/gid adds 4 (SPEC 9)."""
    assert ITEM_OVERHEAD == 128
    assert ACCESSOR_OVERHEAD == 4


@pytest.mark.parametrize(
    "value,size",
    [
        ("", 0),
        ("abc", 3),
        ("é", 2),            # U+00E9: 2 bytes of utf-8
        ("日本", 6),          # 3 bytes each
        ("🎉x", 5),          # 4-byte code point plus ASCII
        (b"", 0),
        (b"\x00\xff\x10", 3),
        (0, 8),
        (-1, 8),
        (2**64 - 1, 8),
        (-(2**63), 8),
        (0.0, 8),
        (3.5e300, 8),
        (True, 1),
        (False, 1),
    ],
    ids=repr,
)
def test_value_size_per_type(value, size):
    """str counts utf-8 bytes, bytes its length, int/float 8, bool 1."""
    assert value_size(value) == size


@pytest.mark.parametrize("bad", [None, [1], {"a": 1}, (1,), object()],
                         ids=lambda v: "object()" if type(v) is object else repr(v))
def test_value_size_rejects_unsupported_types(bad):
    """Values other than str/bytes/int/float/bool are not accountable."""
    with pytest.raises(TypeError):
        value_size(bad)


def test_item_nbytes_sums_keys_values_overhead_and_accessors():
    """nbytes = sum(len(key utf-8) + value size) + 128 + 4 per accessor uid/gid."""
    pairs = {"ké": "日本", "b": b"xyz", "i": 7, "f": 1.5, "t": True}
    expected_pairs = (3 + 6) + (1 + 3) + (1 + 8) + (1 + 8) + (1 + 1)
    assert item_nbytes(pairs, (), ()) == expected_pairs + 128
    assert item_nbytes(pairs, (1, 2), ()) == expected_pairs + 128 + 8
    assert item_nbytes(pairs, (1,), (5, 6, 7)) == expected_pairs + 128 + 16


@pytest.mark.parametrize(
    "value,vsize",
    [("hello", 5), ("ü" * 3, 6), (b"\x01" * 10, 10), (12345, 8), (2.5, 8), (True, 1)],
    ids=repr,
)
def test_publish_charges_nbytes_per_value_type(store, value, vsize):
    """A stored item's nbytes and its uid's usage follow the accounting formula."""
    assert store.publish(alice, {"kk": value}).status is Status.SUCCESS
    it = item_with_key(store, "kk")
    assert it.nbytes == 2 + vsize + 128
    assert usage(store, UID_A) == it.nbytes


def test_publish_charges_four_bytes_per_accessor_uid_and_gid(store):
    """Each accessor uid and gid adds 4 bytes to the stored item."""
    store.publish(alice, {"k": "v"}, access_uids=[UID_B, 7], access_gids=[9])
    it = item_with_key(store, "k")
    assert it.nbytes == 1 + 1 + 128 + 3 * 4
    assert usage(store, UID_A) == it.nbytes


def test_usage_is_per_uid_and_follows_publish_and_removal(store):
    """Usage is kept per uid, summed over that uid's items, and drops as items leave."""
    store.publish(alice, {"a1": "x" * 10})
    store.publish(alice2, {"a2": "y" * 20})
    store.publish(bob, {"b1": "z"})
    a1 = 2 + 10 + 128
    a2 = 2 + 20 + 128
    b1 = 2 + 1 + 128
    assert store.stats().bytes_by_uid == {UID_A: a1 + a2, UID_B: b1}
    store.unpublish(alice, ["a1"])
    assert store.stats().bytes_by_uid == {UID_A: a2, UID_B: b1}
    store.unpublish(bob, ["b1"])
    assert store.stats().bytes_by_uid == {UID_A: a2}
    store.unpublish(alice, ["a2"])
    assert store.stats().bytes_by_uid == {}


def test_partial_unpublish_shrinks_item_and_usage(store):
    """Removing one key of a two-key item recomputes its nbytes and the uid's usage."""
    store.publish(alice, {"k1": "aaaa", "k2": "bb"}, persistence=P.SESSION)
    it = item_with_key(store, "k1")
    assert it.nbytes == (2 + 4) + (2 + 2) + 128
    store.unpublish(alice, ["k1"])
    assert it.nbytes == (2 + 2) + 128
    assert usage(store, UID_A) == it.nbytes
