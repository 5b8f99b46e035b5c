"""purge: lifetimes ending, by horizon and target (SPEC 5)."""

from __future__ import annotations

import pytest

from storekit import (
    UID_B, Persistence as P, Range, Status, caller, keys_in_store, snapshot,
)

STORED = [P.INDEF, P.FIRST_READ, P.PROC, P.APP, P.SESSION, P.NSPACE]

#: horizon -> persistences that SURVIVE a purge at that horizon (literal SPEC 5 table)
SURVIVES = {
    P.PROC: {P.INDEF, P.FIRST_READ, P.APP, P.NSPACE, P.SESSION},
    P.APP: {P.INDEF, P.FIRST_READ, P.NSPACE, P.SESSION},
    P.NSPACE: {P.INDEF, P.FIRST_READ, P.SESSION},
    P.SESSION: {P.INDEF, P.FIRST_READ},
    P.INVALID: set(),
}

PUB = caller(nspace="ns-j", rank=2, app_idx=1, session_id=5)


def _publish_every_persistence(store, who, tag=""):
    for p in STORED:
        assert store.publish(who, {f"{tag}{p.name}": 1}, persistence=p).status is Status.SUCCESS


def _persistences_left(store, tag=""):
    return {P[k[len(tag):]] for k in keys_in_store(store) if k.startswith(tag)}


@pytest.mark.parametrize("horizon", list(SURVIVES), ids=lambda h: h.name)
def test_purge_of_process_removes_persistences_per_horizon_table(store, horizon):
    """A purge naming the publishing process removes exactly the table's persistences."""
    _publish_every_persistence(store, PUB)
    n = store.purge(horizon, nspace="ns-j", rank=2)
    assert _persistences_left(store) == SURVIVES[horizon]
    assert n == len(STORED) - len(SURVIVES[horizon])


@pytest.mark.parametrize("horizon", list(SURVIVES), ids=lambda h: h.name)
def test_purge_of_namespace_removes_persistences_per_horizon_table(store, horizon):
    """A purge naming the namespace (all ranks) applies the same table to every rank."""
    _publish_every_persistence(store, PUB, "r2.")
    _publish_every_persistence(store, caller(nspace="ns-j", rank=0, app_idx=1, session_id=5), "r0.")
    kwargs = {"app_idx": 1} if horizon is P.APP else {}
    store.purge(horizon, nspace="ns-j", **kwargs)
    assert _persistences_left(store, "r2.") == SURVIVES[horizon]
    assert _persistences_left(store, "r0.") == SURVIVES[horizon]


def test_proc_purge_removes_only_that_process(store):
    """A PROC purge of (ns, rank) leaves other ranks' PROC items."""
    store.publish(caller(nspace="ns-j", rank=0), {"r0": 1}, persistence=P.PROC)
    store.publish(caller(nspace="ns-j", rank=1), {"r1": 1}, persistence=P.PROC)
    store.publish(caller(nspace="ns-k", rank=0), {"k0": 1}, persistence=P.PROC)
    assert store.purge(P.PROC, nspace="ns-j", rank=0) == 1
    assert keys_in_store(store) == {"r1", "k0"}


def test_app_purge_requires_matching_app_idx(store):
    """An APP purge removes PROC/APP items of that app only; another app's stay."""
    store.publish(caller(nspace="ns-j", rank=0, app_idx=0), {"a0p": 1}, persistence=P.PROC)
    store.publish(caller(nspace="ns-j", rank=1, app_idx=0), {"a0a": 1}, persistence=P.APP)
    store.publish(caller(nspace="ns-j", rank=2, app_idx=1), {"a1p": 1}, persistence=P.PROC)
    store.publish(caller(nspace="ns-j", rank=3, app_idx=1), {"a1a": 1}, persistence=P.APP)
    store.publish(caller(nspace="ns-j", rank=0, app_idx=0), {"a0n": 1}, persistence=P.NSPACE)
    assert store.purge(P.APP, nspace="ns-j", app_idx=0) == 2
    assert keys_in_store(store) == {"a1p", "a1a", "a0n"}


def test_app_purge_never_matches_unknown_app_idx(store):
    """An item whose app_idx is unknown (None) is taken by no APP purge."""
    unknown = caller(nspace="ns-j", rank=0, app_idx=None)
    store.publish(unknown, {"u": 1}, persistence=P.APP)
    store.publish(unknown, {"up": 1}, persistence=P.PROC)
    for idx in (0, 1, 2):
        assert store.purge(P.APP, nspace="ns-j", app_idx=idx) == 0
    assert keys_in_store(store) == {"u", "up"}
    assert store.purge(P.NSPACE, nspace="ns-j") == 2  # its namespace's end still takes it


def test_app_purge_of_other_namespace_leaves_same_app_idx(store):
    """An APP purge is confined to its namespace."""
    store.publish(caller(nspace="ns-k", app_idx=0), {"k": 1}, persistence=P.APP)
    store.purge(P.APP, nspace="ns-j", app_idx=0)
    assert keys_in_store(store) == {"k"}


def test_nspace_purge_removes_all_ranks_and_leaves_other_namespaces(store):
    """An NSPACE purge removes the NSPACE items of every rank of that namespace only."""
    for r in range(3):
        store.publish(caller(nspace="ns-j", rank=r), {f"j{r}": 1})
    store.publish(caller(nspace="ns-k", rank=0), {"k0": 1})
    assert store.purge(P.NSPACE, nspace="ns-j") == 3
    assert keys_in_store(store) == {"k0"}


def test_wildcard_session_purge_removes_session_items_of_every_namespace(store):
    """nspace=None + session_id removes PROC/APP/NSPACE/SESSION of every namespace of that session only."""
    for ns in ("ns-1", "ns-2"):
        _publish_every_persistence(store, caller(nspace=ns, session_id=5), f"{ns}.")
    _publish_every_persistence(store, caller(nspace="ns-3", session_id=6), "ns-3.")
    _publish_every_persistence(store, caller(nspace="ns-4", session_id=None), "ns-4.")
    store.purge(P.SESSION, nspace=None, session_id=5)
    assert _persistences_left(store, "ns-1.") == {P.INDEF, P.FIRST_READ}
    assert _persistences_left(store, "ns-2.") == {P.INDEF, P.FIRST_READ}
    assert _persistences_left(store, "ns-3.") == set(STORED)
    assert _persistences_left(store, "ns-4.") == set(STORED)


def test_session_purge_with_namespace_and_session_filters_both(store):
    """A purge naming a namespace and a session id takes items matching both."""
    store.publish(caller(nspace="ns-j", rank=0, session_id=5), {"in": 1}, persistence=P.SESSION)
    store.publish(caller(nspace="ns-j", rank=1, session_id=6), {"out": 1}, persistence=P.SESSION)
    assert store.purge(P.SESSION, nspace="ns-j", session_id=5) == 1
    assert keys_in_store(store) == {"out"}


def test_purge_takes_items_of_the_target_whatever_their_uid_or_range(store):
    """A purge is about the publishing process: range and uid do not matter."""
    for i, rng in enumerate(Range):
        store.publish(caller(nspace="ns-j", rank=0, uid=UID_B + i), {f"k{i}": 1}, range=rng)
    assert store.purge(P.NSPACE, nspace="ns-j", rank=0) == len(Range)
    assert len(store) == 0


def test_purge_counts_no_eviction_or_expiry(store):
    """Purged items count as neither evictions nor expiries."""
    store.publish(PUB, {"k": 1})
    store.purge(P.NSPACE, nspace="ns-j")
    st = store.stats()
    assert (st.items, st.evictions, st.expiries, st.consumed) == (0, 0, 0, 0)


def test_purge_with_nothing_to_remove_returns_zero_and_changes_nothing(store):
    """A purge that covers no item returns 0 and leaves the store as it was."""
    store.publish(PUB, {"k": 1}, persistence=P.SESSION)
    before = snapshot(store)
    assert store.purge(P.NSPACE, nspace="ns-j") == 0
    assert store.purge(P.PROC, nspace="ns-zzz", rank=0) == 0
    assert snapshot(store) == before


@pytest.mark.parametrize(
    "horizon,target,pattern",
    [
        (P.INDEF, dict(nspace="ns-j"), "not a purge horizon"),
        (P.FIRST_READ, dict(nspace="ns-j"), "not a purge horizon"),
        (99, dict(nspace="ns-j"), "not a purge horizon"),
        (True, dict(nspace="ns-j"), "not a purge horizon"),
        ("NSPACE", dict(nspace="ns-j"), "not a purge horizon"),
        (P.SESSION, dict(), "needs a session id"),
        (P.SESSION, dict(nspace=None, session_id=None), "needs a session id"),
        (P.PROC, dict(rank=0, session_id=5), "needs its namespace"),
    ],
    ids=["indef", "first-read", "99", "bool", "str", "no-target", "none-none", "rank-no-ns"],
)
def test_ill_formed_purge_raises_value_error_and_changes_nothing(store, horizon, target, pattern):
    """A purge with a non-horizon or an ill-formed target raises ValueError, store untouched."""
    _publish_every_persistence(store, PUB)
    before = snapshot(store)
    with pytest.raises(ValueError, match=pattern):
        store.purge(horizon, **target)
    assert snapshot(store) == before
