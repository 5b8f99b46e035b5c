"""Malformed requests: BAD_PARAM naming the problem, store untouched."""

from __future__ import annotations

import math
import re

import pytest

from storekit import (
    UID_B, Pending, Persistence as P, Status, alice, alice2, bob, snapshot,
)


@pytest.fixture
def busy(env):
    """A store with a few items (one idle, so the sweep is armed) and one parked lookup."""
    s = env.make(timeout=8, max_size=10_000)
    s.publish(alice, {"a": "x", "b": 2})
    s.publish(alice2, {"i": 1}, persistence=P.INDEF)
    s.publish(bob, {"c": b"z"}, access_uids=[alice.uid])
    assert isinstance(s.lookup(alice, ["never"], wait=0, timeout=50, ticket="T"), Pending)
    return s


def _refused(env, store, call, pattern):
    before = snapshot(store)
    n_answers = len(env.answers)
    pending = env.sched.pending()
    r = call()
    assert r.status is Status.ERR_BAD_PARAM
    assert r.found == ()
    assert r.message, "BAD_PARAM must explain itself"
    assert re.search(pattern, r.message), r.message
    assert snapshot(store) == before
    assert len(env.answers) == n_answers
    assert env.sched.pending() == pending


# ---------------------------------------------------------------------------
# publish
# ---------------------------------------------------------------------------

PUBLISH_BAD = {
    "int-key": (dict(pairs={1: "v"}), r"key must be a str, not int"),
    "bytes-key": (dict(pairs={b"k": "v"}), r"key must be a str, not bytes"),
    "none-key": (dict(pairs={None: "v"}), r"key must be a str, not NoneType"),
    "empty-key": (dict(pairs={"": "v"}), r"key must not be empty"),
    "empty-key-among-good": (dict(pairs={"ok": 1, "": "v"}), r"key must not be empty"),
    "none-value": (dict(pairs={"k": None}), r"unsupported value type NoneType for key 'k'"),
    "list-value": (dict(pairs={"k": [1, 2]}), r"unsupported value type list for key 'k'"),
    "dict-value": (dict(pairs={"k": {"x": 1}}), r"unsupported value type dict for key 'k'"),
    "tuple-value": (dict(pairs={"k": (1,)}), r"unsupported value type tuple"),
    "int-over-64-bits": (dict(pairs={"k": 2**64}), r"int value of 'k' does not fit in 64 bits"),
    "int-under-64-bits": (dict(pairs={"k": -(2**63) - 1}), r"does not fit in 64 bits"),
    "empty-pairs": (dict(pairs={}), r"no pairs"),
    "pairs-not-mapping": (dict(pairs=[("k", 1)]), r"pairs must be a mapping"),
    "pairs-none": (dict(pairs=None), r"pairs must be a mapping"),
    "range-8": (dict(range=8), r"unknown range 8"),
    "range-negative": (dict(range=-1), r"unknown range -1"),
    "range-bool": (dict(range=True), r"unknown range True"),
    "range-str": (dict(range="session"), r"unknown range 'session'"),
    "range-float": (dict(range=4.0), r"unknown range 4\.0"),
    "persistence-6": (dict(persistence=6), r"unknown persistence 6"),
    "persistence-254": (dict(persistence=254), r"unknown persistence 254"),
    "persistence-bool": (dict(persistence=False), r"unknown persistence False"),
    "persistence-str": (dict(persistence="indef"), r"unknown persistence 'indef'"),
    "uids-negative": (dict(access_uids=[-1]), r"access uids must be a list of non-negative integers"),
    "uids-str": (dict(access_uids="1000"), r"access uids must be a list"),
    "uids-str-members": (dict(access_uids=["1000"]), r"access uids must be a list"),
    "uids-non-iterable": (dict(access_uids=1000), r"access uids must be a list"),
    "uids-float": (dict(access_uids=[1.0]), r"access uids"),
    "uids-bool": (dict(access_uids=[True]), r"access uids"),
    "uids-over-32-bits": (dict(access_uids=[2**32]), r"access uids"),
    "gids-negative": (dict(access_gids=[5, -3]), r"access gids must be a list of non-negative integers"),
    "gids-str": (dict(access_gids="100"), r"access gids must be a list"),
    "gids-non-iterable": (dict(access_gids=object()), r"access gids must be a list"),
    "replace-not-bool": (dict(replace=1), r"replace must be a bool"),
}


@pytest.mark.parametrize("case", sorted(PUBLISH_BAD))
def test_bad_publish_is_bad_param_naming_problem_and_store_unchanged(env, busy, case):
    """A malformed publish -> BAD_PARAM whose message names the problem; nothing changes."""
    kwargs, pattern = PUBLISH_BAD[case]
    kwargs = dict(kwargs)
    pairs = kwargs.pop("pairs", {"new": "v"})
    _refused(env, busy, lambda: busy.publish(alice, pairs, **kwargs), pattern)


def test_bad_publish_even_when_it_would_collide_is_bad_param(env, busy):
    """Validation comes first: a malformed publish of a colliding key is BAD_PARAM, not DUPLICATE_KEY."""
    _refused(env, busy, lambda: busy.publish(alice, {"a": "x"}, range=99), r"unknown range 99")


@pytest.mark.parametrize("value", [2**64 - 1, -(2**63), 0.0, math.nan, True, b"", ""], ids=repr)
def test_publish_boundary_values_are_accepted(store, value):
    """The 64-bit bounds, NaN, bools and empty str/bytes are valid values."""
    assert store.publish(alice, {"k": value}).status is Status.SUCCESS


def test_publish_accessor_list_may_be_any_iterable(store):
    """Accessor lists may be tuples, sets or generators of ints; duplicates count once."""
    assert store.publish(alice, {"a": 1}, access_uids=(UID_B,), access_gids={7}).status is Status.SUCCESS
    assert store.publish(alice, {"b": 1}, access_uids=(u for u in [UID_B, UID_B])).status is Status.SUCCESS
    assert [it.access_uids for it in store.items()] == [(UID_B,), (UID_B,)]


# ---------------------------------------------------------------------------
# lookup
# ---------------------------------------------------------------------------

LOOKUP_BAD = {
    "empty-key-list": (dict(keys=[]), r"empty key list"),
    "keys-as-str": (dict(keys="abc"), r"keys must be a list of str"),
    "keys-as-bytes": (dict(keys=b"abc"), r"keys must be a list of str"),
    "keys-non-iterable": (dict(keys=5), r"keys must be a list of str"),
    "int-key": (dict(keys=["a", 3]), r"key must be a str, not int"),
    "empty-key": (dict(keys=["a", ""]), r"key must not be empty"),
    "range-99": (dict(range=99), r"unknown range 99"),
    "range-bool": (dict(range=False), r"unknown range False"),
    "wait-negative": (dict(wait=-1), r"wait must be a non-negative integer, not -1"),
    "wait-bool": (dict(wait=True), r"wait must be a non-negative integer"),
    "wait-float": (dict(wait=1.5), r"wait must be a non-negative integer"),
    "wait-str": (dict(wait="1"), r"wait must be a non-negative integer"),
    "timeout-negative": (dict(wait=0, timeout=-1), r"timeout must be non-negative, not -1"),
    "timeout-nan": (dict(wait=0, timeout=math.nan), r"timeout must be non-negative, not nan"),
    "timeout-str": (dict(wait=0, timeout="5"), r"timeout must be a number of seconds"),
    "timeout-bool": (dict(wait=0, timeout=True), r"timeout must be a number of seconds"),
    "timeout-list": (dict(wait=0, timeout=[5]), r"timeout must be a number of seconds"),
}


@pytest.mark.parametrize("case", sorted(LOOKUP_BAD))
def test_bad_lookup_is_bad_param_naming_problem_and_store_unchanged(env, busy, case):
    """A malformed lookup -> BAD_PARAM naming the problem; nothing consumed, touched or parked."""
    kwargs, pattern = LOOKUP_BAD[case]
    kwargs = dict(kwargs)
    keys = kwargs.pop("keys", ["a", "i"])
    env.sched.advance(1)  # so that a touch would show in last_access
    _refused(env, busy, lambda: busy.lookup(alice, keys, **kwargs), pattern)


def test_lookup_duplicate_ticket_is_bad_param_and_store_unchanged(env, busy):
    """Parking a second lookup under a ticket already waiting -> BAD_PARAM, nothing parked."""
    _refused(env, busy, lambda: busy.lookup(alice, ["other"], wait=0, ticket="T"),
             r"ticket 'T' is already waiting")


def test_lookup_duplicate_ticket_with_stale_item_leaves_store_unchanged(env, busy):
    """BAD_PARAM (duplicate ticket) must change nothing, not even lazily expire a stale item it looked at."""
    env.sched.advance(9)  # 'i' (INDEF, timeout 8) is stale; the sweep (every 2 s) last ran at +8
    assert {k for it in busy.items() for k in it.pairs} >= {"i"}
    _refused(env, busy, lambda: busy.lookup(alice2, ["i"], wait=0, ticket="T"),
             r"ticket 'T' is already waiting")


# ---------------------------------------------------------------------------
# unpublish
# ---------------------------------------------------------------------------

UNPUBLISH_BAD = {
    "empty-key-list": ([], r"empty key list"),
    "keys-as-str": ("a", r"keys must be a list of str"),
    "keys-none": (None, r"keys must be a list of str"),
    "int-key": (["a", 1], r"key must be a str, not int"),
    "empty-key": (["a", ""], r"key must not be empty"),
}


@pytest.mark.parametrize("case", sorted(UNPUBLISH_BAD))
def test_bad_unpublish_is_bad_param_naming_problem_and_store_unchanged(env, busy, case):
    """A malformed unpublish -> BAD_PARAM naming the problem; no key removed (not even valid ones)."""
    keys, pattern = UNPUBLISH_BAD[case]
    _refused(env, busy, lambda: busy.unpublish(alice, keys), pattern)
