"""Parked lookups: waiting, answering, timing out, dropping (SPEC 4)."""

from __future__ import annotations

import pytest

from storekit import (
    UID_A, UID_B, Pending, Persistence as P, Range, Reply, Status, alice, alice2,
    bob, caller, found_map, item_with_key, keys_in_store, snapshot,
)


def test_lookup_wait_all_parks_until_every_key_then_answers_all_at_once(env, store):
    """wait=0 waits for all keys; one on_answer call carries every key once the last is published."""
    r = store.lookup(alice, ["a", "b"], wait=0, ticket="T")
    assert r == Pending("T")
    assert store.stats().parked == 1
    store.publish(alice2, {"a": 1})
    assert env.answers == []
    assert store.stats().parked == 1
    store.publish(bob, {"b": 2}, access_uids=[UID_A])
    assert len(env.answers) == 1
    ticket, reply = env.answers[0]
    assert ticket == "T"
    assert reply.status is Status.SUCCESS
    assert found_map(reply) == {"a": (1, alice2.proc), "b": (2, bob.proc)}
    assert store.stats().parked == 0


def test_lookup_wait_n_answers_once_n_keys_are_found(env, store):
    """wait=N answers as soon as N of the keys are found (PARTIAL_SUCCESS with those)."""
    assert isinstance(store.lookup(alice, ["a", "b", "c"], wait=2, ticket="T"), Pending)
    store.publish(alice, {"c": 3})
    assert env.answers == []
    store.publish(alice, {"a": 1})
    assert len(env.answers) == 1
    reply = env.answers[0][1]
    assert reply.status is Status.ERR_PARTIAL_SUCCESS
    assert found_map(reply) == {"a": (1, alice.proc), "c": (3, alice.proc)}


def test_lookup_wait_n_larger_than_key_count_means_all(env, store):
    """wait=N above the number of keys waits for all of them."""
    assert isinstance(store.lookup(alice, ["a", "b"], wait=5, ticket="T"), Pending)
    store.publish(alice, {"a": 1})
    assert env.answers == []
    store.publish(alice, {"b": 2})
    assert env.answers[0][1].status is Status.SUCCESS


def test_lookup_wait_already_satisfiable_answers_immediately(env, store):
    """A waiting lookup that can be satisfied now returns its Reply and parks nothing."""
    store.publish(alice, {"a": 1})
    r = store.lookup(alice, ["a"], wait=0, timeout=10)
    assert isinstance(r, Reply) and r.status is Status.SUCCESS
    assert store.stats().parked == 0
    assert env.sched.pending() == 0  # no timeout timer armed
    assert env.answers == []


def test_lookup_wait_without_ticket_makes_one_up(env, store):
    """Without a ticket the Pending carries one made up by the store, used in on_answer."""
    r = store.lookup(alice, ["a"], wait=0)
    assert isinstance(r, Pending) and r.ticket is not None
    store.publish(alice, {"a": 1})
    assert env.answers[0][0] == r.ticket


def test_two_auto_tickets_are_distinct(store):
    """Two parked lookups without tickets get distinct tickets."""
    r1 = store.lookup(alice, ["a"], wait=0)
    r2 = store.lookup(alice, ["a"], wait=0)
    assert r1.ticket != r2.ticket
    assert store.stats().parked == 2


def test_parked_lookup_times_out_after_timeout(env, store, sched):
    """A parked lookup unanswered for `timeout` seconds gets TIMEOUT; not a moment before."""
    store.lookup(alice, ["a"], wait=0, timeout=5, ticket="T")
    sched.advance(4.999)
    assert env.answers == []
    sched.advance(0.001)
    assert [(t, r.status) for t, r in env.answers] == [("T", Status.ERR_TIMEOUT)]
    assert env.answers[0][1].found == ()
    assert store.stats().parked == 0
    store.publish(alice, {"a": 1})  # too late: answers nobody
    assert len(env.answers) == 1


def test_parked_lookup_answered_before_timeout_gets_no_timeout(env, store, sched):
    """A lookup answered by a publish is never also answered with TIMEOUT."""
    store.lookup(alice, ["a"], wait=0, timeout=5, ticket="T")
    sched.advance(2)
    store.publish(alice, {"a": 1})
    sched.advance(10)
    assert [(t, r.status) for t, r in env.answers] == [("T", Status.SUCCESS)]
    assert sched.pending() == 0


@pytest.mark.parametrize("timeout", [None, 0])
def test_parked_lookup_without_timeout_waits_forever(env, store, sched, timeout):
    """timeout None or 0 on a waiting lookup means no limit."""
    store.lookup(alice, ["a"], wait=0, timeout=timeout, ticket="T")
    sched.advance(10**6)
    assert env.answers == []
    assert store.stats().parked == 1
    store.publish(alice, {"a": 1})
    assert env.answers[0][1].status is Status.SUCCESS


def test_parked_lookup_timeout_leaves_store_unchanged(env, store, sched):
    """Timing out consumes and touches nothing."""
    store.publish(alice, {"a": 1}, persistence=P.FIRST_READ)
    store.lookup(alice, ["a", "b"], wait=0, timeout=3, ticket="T")
    before = snapshot(store)
    sched.advance(3)
    after = snapshot(store)
    assert before.pop("parked") == 1 and after.pop("parked") == 0
    assert before == after


def test_parked_lookup_consumes_nothing_while_partially_satisfied(env, store):
    """A FIRST_READ item that only partly satisfies a parked lookup stays readable for others."""
    store.lookup(alice, ["tok", "other"], wait=0, ticket="T")
    store.publish(alice2, {"tok": "t"}, persistence=P.FIRST_READ)
    assert env.answers == []
    assert keys_in_store(store) == {"tok"}
    assert store.lookup(alice2, ["tok"]).status is Status.SUCCESS  # another reader gets it
    store.publish(alice2, {"other": 1})
    assert env.answers == []  # tok was consumed by the other reader
    assert store.stats().parked == 1


def test_parked_lookup_partial_match_does_not_restamp(env, store, sched):
    """While parked, a partly matching item is not touched."""
    store.publish(alice, {"a": 1})
    t0 = sched.now()
    sched.advance(4)
    store.lookup(alice, ["a", "b"], wait=0, ticket="T")
    sched.advance(4)
    store.publish(alice, {"c": 0})  # unrelated publish
    assert item_with_key(store, "a").last_access == t0


def test_parked_lookup_answer_restamps_and_consumes(env, store, sched):
    """When answered, the parked lookup touches its items and consumes FIRST_READ keys."""
    store.publish(alice, {"a": 1}, persistence=P.FIRST_READ)
    store.publish(alice, {"keep": 1, "a2": 1})
    sched.advance(4)
    store.lookup(alice, ["a", "a2", "b"], wait=0, ticket="T")
    sched.advance(4)
    store.publish(alice, {"b": 2})
    assert env.answers[0][1].status is Status.SUCCESS
    assert keys_in_store(store) == {"keep", "a2", "b"}  # 'a' consumed
    assert item_with_key(store, "keep").last_access == sched.now()
    assert store.stats().consumed == 1


def test_first_read_key_goes_to_oldest_parked_lookup_only(env, store):
    """Two lookups parked on a FIRST_READ key: the older gets it, the younger stays parked."""
    store.lookup(alice, ["tok"], wait=0, ticket="old")
    store.lookup(alice2, ["tok"], wait=0, ticket="young")
    store.publish(alice, {"tok": 1}, persistence=P.FIRST_READ)
    assert [(t, r.status) for t, r in env.answers] == [("old", Status.SUCCESS)]
    assert store.stats().parked == 1
    assert store.cancel("young") is True
    assert len(store) == 0


def test_publish_answers_every_parked_lookup_it_satisfies(env, store):
    """A non-FIRST_READ publish answers all lookups parked on it, oldest first."""
    for i in range(3):
        store.lookup(caller(rank=i), ["k"], wait=0, ticket=i)
    store.publish(alice, {"k": "v"})
    assert [t for t, _ in env.answers] == [0, 1, 2]
    assert all(r.status is Status.SUCCESS for _, r in env.answers)


def test_refused_publish_answers_no_parked_lookup(env, store):
    """A publish that is refused (duplicate) wakes nobody."""
    store.publish(alice, {"a": 1})
    store.lookup(alice, ["a", "b"], wait=0, ticket="T")
    assert store.publish(alice, {"a": 2, "b": 2}).status is Status.ERR_DUPLICATE_KEY
    assert env.answers == []


def test_parked_lookup_not_answered_by_unreadable_publish(env, store):
    """A publish the requestor may not read leaves its lookup parked."""
    store.lookup(alice, ["k"], wait=0, ticket="T")
    store.publish(bob, {"k": 1})
    store.publish(alice2, {"k": 1}, range=Range.PROC_LOCAL)
    assert env.answers == []
    assert store.stats().parked == 1


def test_cancel_drops_parked_lookup_unanswered(env, store, sched):
    """cancel(ticket) removes the lookup (True), its timer, and any later answer; a second cancel is False."""
    store.lookup(alice, ["k"], wait=0, timeout=5, ticket="T")
    assert sched.pending() == 1
    assert store.cancel("T") is True
    assert store.cancel("T") is False
    assert store.stats().parked == 0
    assert sched.pending() == 0
    store.publish(alice, {"k": 1})
    sched.advance(10)
    assert env.answers == []


def test_cancel_unknown_ticket_is_false(store):
    """Cancelling a ticket that is not parked returns False."""
    assert store.cancel("nobody") is False


def test_parked_counter_in_stats(store):
    """stats().parked counts the waiting lookups."""
    assert store.stats().parked == 0
    for i in range(4):
        store.lookup(alice, [f"k{i}"], wait=0, ticket=i)
    assert store.stats().parked == 4
    store.publish(alice, {"k1": 1})
    store.cancel(2)
    assert store.stats().parked == 2


def test_parked_ticket_is_reusable_once_answered(env, store):
    """After a parked lookup is answered its ticket may be used again."""
    store.lookup(alice, ["k"], wait=0, ticket="T")
    store.publish(alice, {"k": 1})
    assert isinstance(store.lookup(alice, ["j"], wait=0, ticket="T"), Pending)


# ---------------------------------------------------------------------------
# dropped when the requestor terminates
# ---------------------------------------------------------------------------

REQ = caller(nspace="ns-r", rank=3, app_idx=1, session_id=7)


@pytest.mark.parametrize(
    "horizon,target",
    [
        (P.PROC, dict(nspace="ns-r", rank=3)),
        (P.APP, dict(nspace="ns-r", app_idx=1)),
        (P.NSPACE, dict(nspace="ns-r")),
        (P.SESSION, dict(nspace="ns-r")),
        (P.SESSION, dict(nspace=None, session_id=7)),
    ],
    ids=["proc", "app", "nspace", "session-of-nspace", "session-wildcard"],
)
def test_parked_lookup_dropped_unanswered_when_requestor_purged(env, store, sched, horizon, target):
    """A lifetime purge covering the requestor drops its parked lookup, timer included."""
    store.lookup(REQ, ["k"], wait=0, timeout=5, ticket="T")
    store.purge(horizon, **target)
    assert store.stats().parked == 0
    assert sched.pending() == 0
    store.publish(REQ, {"k": 1})
    sched.advance(10)
    assert env.answers == []


@pytest.mark.parametrize(
    "horizon,target",
    [
        (P.PROC, dict(nspace="ns-r", rank=4)),
        (P.APP, dict(nspace="ns-r", app_idx=0)),
        (P.NSPACE, dict(nspace="ns-other")),
        (P.SESSION, dict(nspace=None, session_id=8)),
        (P.PROC, dict(nspace="ns-other", rank=3)),
    ],
    ids=["other-rank", "other-app", "other-nspace", "other-session", "same-rank-other-ns"],
)
def test_parked_lookup_survives_purge_not_covering_requestor(env, store, horizon, target):
    """A purge whose target does not cover the requestor leaves its lookup parked."""
    store.lookup(REQ, ["k"], wait=0, ticket="T")
    store.purge(horizon, **target)
    assert store.stats().parked == 1
    store.publish(REQ, {"k": 1})
    assert [t for t, _ in env.answers] == ["T"]


def test_parked_lookup_of_unknown_session_survives_session_purge(env, store):
    """A requestor with unknown session is not covered by any wildcard session purge."""
    req = caller(nspace="ns-r", session_id=None)
    store.lookup(req, ["k"], wait=0, ticket="T")
    store.purge(P.SESSION, nspace=None, session_id=1)
    assert store.stats().parked == 1


def test_parked_lookup_not_dropped_by_unpublish_all(env, store):
    """The requestor's own unpublish() (explicit, not a termination) keeps its lookup parked."""
    store.lookup(REQ, ["k"], wait=0, ticket="T")
    store.publish(REQ, {"mine": 1})
    store.unpublish_all(REQ)
    assert len(store) == 0
    assert store.stats().parked == 1
    store.purge(P.INVALID, nspace="ns-r", rank=3)
    assert store.stats().parked == 1
    store.publish(alice, {"k": 1}, access_uids=[REQ.uid])
    assert [t for t, _ in env.answers] == ["T"]


# ---------------------------------------------------------------------------
# the parked path applies the same rules as the immediate path
# ---------------------------------------------------------------------------

#: who published item "a", relative to the requestor `alice`: (owner, access_uids)
OWNERS = {
    "self": (alice, ()),
    "same_uid_other_rank": (alice2, ()),
    "same_uid_other_ns_node": (caller(nspace="ns-q", node="node2"), ()),
    "same_uid_unknown_gid": (caller(nspace="ns-q", gid=None), ()),
    "other_uid": (bob, ()),
    "other_uid_listed": (bob, (UID_A,)),
    "self_excluded_by_list": (alice, (UID_B,)),
}
#: lookup ranges under which `alice` always admits herself as publisher of "b"
LOOKUP_RANGES = [Range.SESSION, Range.GLOBAL, Range.UNDEF, Range.NAMESPACE, Range.LOCAL,
                 Range.PROC_LOCAL]


@pytest.mark.parametrize("lookup_rng", LOOKUP_RANGES, ids=lambda r: "lookup_" + r.name)
@pytest.mark.parametrize("persist", [P.NSPACE, P.FIRST_READ, P.INDEF], ids=lambda p: p.name)
def test_parked_path_applies_same_rules_as_immediate_path(env, sched, persist, lookup_rng):
    """Identical scenarios answered immediately and through a parked lookup give identical outcomes."""
    for owner_name, (owner, luids) in OWNERS.items():
        for item_rng in Range:
            where = (owner_name, item_rng.name)
            # --- variant 1: the lookup waits for 'b' while 'a' is already stored
            imm, prk = env.make(), env.make()
            for s in (imm, prk):
                assert s.publish(owner, {"a": "va"}, range=item_rng, persistence=persist,
                                 access_uids=luids).status is Status.SUCCESS
            sched.advance(5)
            imm.publish(alice, {"b": "vb"})
            r_imm = imm.lookup(alice, ["a", "b"], range=lookup_rng)
            assert r_imm.status in (Status.SUCCESS, Status.ERR_PARTIAL_SUCCESS), where
            need = len(r_imm.found)
            ticket = ("v1",) + where + (persist.name, lookup_rng.name)
            p = prk.lookup(alice, ["a", "b"], range=lookup_rng, wait=need, ticket=ticket)
            assert p == Pending(ticket), where
            prk.publish(alice, {"b": "vb"})
            assert env.answers_for(ticket) == [r_imm], where
            assert snapshot(imm) == snapshot(prk), where

            # --- variant 2: the lookup of 'a' alone is parked before 'a' is published
            imm, prk = env.make(), env.make()
            ticket = ("v2",) + where + (persist.name, lookup_rng.name)
            p = prk.lookup(alice, ["a"], range=lookup_rng, wait=0, ticket=ticket)
            assert p == Pending(ticket), where
            sched.advance(1)
            for s in (imm, prk):
                s.publish(owner, {"a": "va"}, range=item_rng, persistence=persist,
                          access_uids=luids)
            r_imm = imm.lookup(alice, ["a"], range=lookup_rng)
            if r_imm.status is Status.SUCCESS:
                assert env.answers_for(ticket) == [r_imm], where
                assert prk.stats().parked == 0
            else:
                assert r_imm.status in (Status.ERR_NOT_FOUND, Status.ERR_NO_PERMISSIONS), where
                assert env.answers_for(ticket) == [], where
                assert prk.stats().parked == 1
                assert prk.cancel(ticket)
            assert snapshot(imm) == snapshot(prk), where
