"""The range table of SPEC 4, walked from both sides.

Publisher side: the *item's* range, anchored at its publisher, must admit
the requestor (check b).  Requester side: the *lookup's* range, anchored at
the requestor, must admit the publisher (check c).  Every subject below has
the anchor's uid and gid, so check (a) always passes and only ranges decide.
"""

from __future__ import annotations

import pytest

from storekit import (
    GID_A, UID_A, UID_B, Range, Status, bob, caller, found_map,
)

DVM_NS = "dvm-test"

#: The anchor process: rank 0 of ns-a behind node1.
ANCHOR = caller(nspace="ns-a", rank=0, node="node1")

SUBJECTS = {
    "self": ANCHOR,
    "same_ns_same_node": caller(nspace="ns-a", rank=1, node="node1"),
    "same_ns_other_node": caller(nspace="ns-a", rank=2, node="node2"),
    "other_ns_same_node": caller(nspace="ns-b", rank=0, node="node1"),
    "other_ns_other_node": caller(nspace="ns-b", rank=1, node="node2"),
    "dvm": caller(nspace=DVM_NS, rank=0, node="head"),
    "default_dvm_name": caller(nspace="pydvm", rank=0, node="head"),  # not this store's DVM
}
ALL = set(SUBJECTS)

#: item range (anchored at its publisher ANCHOR) -> requestors it admits
PUBLISHER_SIDE = {
    Range.SESSION: ALL,
    Range.GLOBAL: ALL,
    Range.UNDEF: ALL,
    Range.NAMESPACE: {"self", "same_ns_same_node", "same_ns_other_node"},
    Range.LOCAL: {"self", "same_ns_same_node", "other_ns_same_node"},
    Range.PROC_LOCAL: {"self"},
    Range.RM: {"dvm"},
    Range.CUSTOM: set(),  # no accessor lists given: refuse
}

#: lookup range (anchored at the requestor ANCHOR) -> publishers it admits
REQUESTER_SIDE = {
    Range.SESSION: ALL,
    Range.GLOBAL: ALL,
    Range.UNDEF: ALL,
    Range.NAMESPACE: {"self", "same_ns_same_node", "same_ns_other_node"},
    Range.LOCAL: {"self", "same_ns_same_node", "other_ns_same_node"},
    Range.PROC_LOCAL: {"self"},
    Range.RM: {"dvm"},
    Range.CUSTOM: set(),  # requester side: always refuse
}


def test_range_tables_cover_every_range():
    """Both literal tables name every Range."""
    assert set(PUBLISHER_SIDE) == set(Range) == set(REQUESTER_SIDE)


@pytest.fixture
def rstore(env):
    return env.make(dvm_nspace=DVM_NS)


@pytest.mark.parametrize("subject", sorted(SUBJECTS))
@pytest.mark.parametrize("rng", list(Range), ids=lambda r: r.name)
def test_item_range_admits_requestor_as_seen_from_publisher(rstore, rng, subject):
    """Item published by the anchor with range R; lookup by the subject with SESSION."""
    rstore.publish(ANCHOR, {"k": "v"}, range=rng)
    r = rstore.lookup(SUBJECTS[subject], ["k"], range=Range.SESSION)
    if subject in PUBLISHER_SIDE[rng]:
        assert r.status is Status.SUCCESS
        assert found_map(r) == {"k": ("v", ANCHOR.proc)}
    else:
        assert r.status is Status.ERR_NOT_FOUND


@pytest.mark.parametrize("subject", sorted(SUBJECTS))
@pytest.mark.parametrize("rng", list(Range), ids=lambda r: r.name)
def test_lookup_range_admits_publisher_as_seen_from_requestor(rstore, rng, subject):
    """Item published by the subject with SESSION; lookup by the anchor with range R."""
    pub = SUBJECTS[subject]
    rstore.publish(pub, {"k": "v"}, range=Range.SESSION)
    r = rstore.lookup(ANCHOR, ["k"], range=rng)
    if subject in REQUESTER_SIDE[rng]:
        assert r.status is Status.SUCCESS
        assert found_map(r) == {"k": ("v", pub.proc)}
    else:
        assert r.status is Status.ERR_NOT_FOUND


#: ranges whose relation is symmetric (same namespace / node / process)
_SYMMETRIC = {Range.SESSION, Range.GLOBAL, Range.UNDEF, Range.NAMESPACE, Range.LOCAL,
              Range.PROC_LOCAL}


@pytest.mark.parametrize("lookup_rng", list(Range), ids=lambda r: "lookup_" + r.name)
@pytest.mark.parametrize("item_rng", list(Range), ids=lambda r: "item_" + r.name)
def test_both_range_checks_must_pass(rstore, item_rng, lookup_rng):
    """Anchor publishes with item range Ri; each subject looks up with Rl: found iff (b) and (c) pass."""
    rstore.publish(ANCHOR, {"k": "v"}, range=item_rng)
    for name, subj in SUBJECTS.items():
        b = name in PUBLISHER_SIDE[item_rng]
        # (c): the lookup range anchored at the subject must admit ANCHOR.  For
        # symmetric relations that is the same cell; RM admits only a DVM
        # publisher (ANCHOR is not) and CUSTOM refuses on this side.
        c = lookup_rng in _SYMMETRIC and name in REQUESTER_SIDE[lookup_rng]
        r = rstore.lookup(subj, ["k"], range=lookup_rng)
        expected = Status.SUCCESS if (b and c) else Status.ERR_NOT_FOUND
        assert r.status is expected, (name, item_rng.name, lookup_rng.name)


def test_custom_item_range_admits_requestors_named_by_accessor_lists(rstore):
    """CUSTOM publisher side: the accessor lists decide who is in range."""
    rstore.publish(ANCHOR, {"k": "v"}, range=Range.CUSTOM, access_uids=[UID_B])
    assert found_map(rstore.lookup(bob, ["k"])) == {"k": ("v", ANCHOR.proc)}
    # the owner is not in its own list: refused by access, NO_PERMISSIONS
    assert rstore.lookup(ANCHOR, ["k"]).status is Status.ERR_NO_PERMISSIONS


def test_custom_item_range_with_gid_list(rstore):
    """CUSTOM with a gid list admits members of that gid, from any namespace or node."""
    rstore.publish(ANCHOR, {"k": "v"}, range=Range.CUSTOM, access_gids=[GID_A])
    for subj in SUBJECTS.values():
        assert rstore.lookup(subj, ["k"]).status is Status.SUCCESS
    assert rstore.lookup(bob, ["k"]).status is Status.ERR_NO_PERMISSIONS


def test_custom_item_range_without_lists_refuses_even_owner(rstore):
    """CUSTOM with no accessor lists admits nobody, the publisher included (NOT_FOUND)."""
    rstore.publish(ANCHOR, {"k": "v"}, range=Range.CUSTOM)
    assert rstore.lookup(ANCHOR, ["k"]).status is Status.ERR_NOT_FOUND


def test_custom_lookup_range_refuses_even_listed_requestor(rstore):
    """CUSTOM as a lookup range refuses every publisher, even when lists admit the requestor."""
    rstore.publish(ANCHOR, {"k": "v"}, range=Range.CUSTOM, access_uids=[UID_B])
    rstore.publish(ANCHOR, {"j": "v"}, range=Range.SESSION, access_uids=[UID_B])
    assert rstore.lookup(bob, ["k", "j"], range=Range.CUSTOM).status is Status.ERR_NOT_FOUND


def test_custom_lookup_range_refuses_publisher_its_own_lists_admit(rstore):
    """CUSTOM as a lookup range refuses even when the item's lists admit both requestor and publisher."""
    rstore.publish(ANCHOR, {"k": "v"}, range=Range.SESSION, access_uids=[UID_A, UID_B])
    rstore.publish(ANCHOR, {"c": "v"}, range=Range.CUSTOM, access_uids=[UID_A, UID_B])
    for who in (bob, ANCHOR):
        assert rstore.lookup(who, ["k", "c"], range=Range.SESSION).status is Status.SUCCESS
        assert rstore.lookup(who, ["k", "c"], range=Range.CUSTOM).status is Status.ERR_NOT_FOUND


def test_local_range_with_unknown_node_admits_nobody(rstore):
    """LOCAL: a publisher with no known node is behind no daemon; nobody (itself included) reads."""
    nowhere = caller(nspace="ns-z", node=None)
    rstore.publish(nowhere, {"k": "v"}, range=Range.LOCAL)
    assert rstore.lookup(nowhere, ["k"]).status is Status.ERR_NOT_FOUND
    assert rstore.lookup(ANCHOR, ["k"]).status is Status.ERR_NOT_FOUND


def test_local_range_requestor_with_unknown_node_not_admitted(rstore):
    """LOCAL: a requestor with no known node is not behind the publisher's daemon."""
    rstore.publish(ANCHOR, {"k": "v"}, range=Range.LOCAL)
    assert rstore.lookup(caller(nspace="ns-z", node=None), ["k"]).status is Status.ERR_NOT_FOUND
    assert rstore.lookup(ANCHOR, ["k"], range=Range.SESSION).status is Status.SUCCESS


def test_rm_range_uses_configured_dvm_namespace(env):
    """RM admits exactly the namespace given as dvm_nspace to the store."""
    s = env.make(dvm_nspace="other-dvm")
    s.publish(ANCHOR, {"k": "v"}, range=Range.RM)
    assert s.lookup(caller(nspace="other-dvm", rank=3, node=None), ["k"]).status is Status.SUCCESS
    assert s.lookup(caller(nspace=DVM_NS), ["k"]).status is Status.ERR_NOT_FOUND


def test_access_check_precedes_range_checks(rstore):
    """Refused by access and out of range -> NO_PERMISSIONS (check a comes first)."""
    rstore.publish(bob, {"k": "v"}, range=Range.PROC_LOCAL)
    assert rstore.lookup(ANCHOR, ["k"], range=Range.CUSTOM).status is Status.ERR_NO_PERMISSIONS
