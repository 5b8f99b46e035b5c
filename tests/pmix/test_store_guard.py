"""The store guard's discipline (runtime/shared/storeguard.py), thread by thread.

A PMIx request answered on libpmix's thread reaches the same stores as the
event loop; these tests pin the rules that make that safe, each with real
threads and a real asyncio loop (no libpmix needed): every store method
runs under the guard; the other thread never waits for it; sinks and
timers never run on that thread nor under the guard; a lookup answered
"now" never parks; and the PMIx fast path routes exactly as the loop path.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import types

import pytest

from pydvm.pmix import Proc
from pydvm.runtime.shared import storeguard as G
from pydvm.runtime.node.server import NodeServer
from pydvm.runtime.shared.peers import route_answer
from pydvm.runtime.pmixhost.host import PmixSession
from pydvm.runtime.master.dataservice import MasterRouter
from pydvm.store import Caller, DataStore, MonotonicClock, StoreParams

NS = "pydvm-t@1"
ME = Caller(NS, 0, 1000, 1000, "n0", 0, None)
OTHER = Caller(NS, 1, 1000, 1000, "n0", 0, None)


@pytest.fixture
def loop():
    lp = asyncio.new_event_loop()
    asyncio.set_event_loop(lp)
    yield lp
    lp.close()
    asyncio.set_event_loop(None)


def run_briefly(loop, seconds=0.05):
    loop.run_until_complete(asyncio.sleep(seconds))


def in_thread(fn, *args):
    """Run ``fn`` on a new thread (libpmix's, as far as the guard knows); its result."""
    out = {}

    def body():
        try:
            out["value"] = fn(*args)
        except BaseException as exc:  # pragma: no cover - reported below
            out["error"] = exc
    t = threading.Thread(target=body)
    t.start()
    t.join(10)
    assert not t.is_alive()
    if "error" in out:
        raise out["error"]
    return out.get("value")


def make_store(guard, answers, **kw):
    def sink(ticket, reply):
        # never under the guard, always on the loop's thread
        answers.append((ticket, reply.status, guard._lock._is_owned(),
                        threading.get_ident() == guard.loop_thread))
    return G.guarded_store(guard, name="s", clock=MonotonicClock(), on_answer=sink,
                           dvm_nspace="pydvm-x", **kw)


def test_every_method_and_property_of_the_store_is_guarded():
    import inspect
    # its own and those it inherits (the read-only views, store/views.py)
    public = [n for n in dir(DataStore) if not n.startswith("_")
              and (callable(a := inspect.getattr_static(DataStore, n))
                   or isinstance(a, property))]
    assert {"publish", "stats", "keys", "describe_uid", "evictions"} <= set(public)
    assert public and all(n in vars(G.GuardedStore) for n in public), \
        [n for n in public if n not in vars(G.GuardedStore)]


def test_a_store_call_waits_for_the_thread_holding_the_guard(loop):
    guard = G.guard_for(loop)
    store = make_store(guard, [])
    held, release, done = threading.Event(), threading.Event(), threading.Event()

    def holder():
        assert guard.try_enter()
        held.set()
        release.wait(10)
        guard.post(guard.leave())

    t = threading.Thread(target=holder)
    t.start()
    held.wait(10)
    caller = threading.Thread(target=lambda: (store.publish(ME, {"k": "v"}), done.set()))
    caller.start()
    assert not done.wait(0.2)          # blocked while the other thread holds the guard
    assert len(store.raw) == 0
    release.set()
    assert done.wait(10)
    t.join()
    caller.join()
    assert len(store) == 1


def test_the_other_thread_never_waits_for_the_guard(loop):
    guard = G.guard_for(loop)
    with guard:
        assert in_thread(guard.try_enter) is False
    assert guard.busy == 1
    assert in_thread(lambda: (guard.try_enter(), guard.leave())[0]) is True
    with guard:
        with guard:                     # reentrant on the loop
            pass


def test_answers_to_parked_lookups_run_on_the_loop_after_the_guard_is_released(loop):
    guard = G.guard_for(loop)
    answers: list = []
    store = make_store(guard, answers)
    assert store.lookup(OTHER, ["k"], wait=0, ticket="t1").__class__.__name__ == "Pending"

    def publish_now():  # libpmix's thread: a publish answered inside its upcall
        assert guard.try_enter()
        try:
            r = store.publish(ME, {"k": "v"})
        finally:
            effects = guard.leave()
        assert r.status == 0 and answers == []  # nothing answered on this thread
        guard.post(effects)
        return len(effects)
    assert in_thread(publish_now) == 1
    assert answers == []
    run_briefly(loop)
    assert answers == [("t1", 0, False, True)]
    # on the loop the answer goes out when the guarded call returns, in order
    store.lookup(OTHER, ["k2"], wait=0, ticket="t2")
    store.lookup(OTHER, ["k2"], wait=0, ticket="t3")
    store.publish(ME, {"k2": "v"})
    assert [a[0] for a in answers] == ["t1", "t2", "t3"] and all(not a[2] for a in answers)


def test_timers_armed_from_the_other_thread_run_on_the_loop_under_the_guard(loop):
    guard = G.guard_for(loop)
    timer = G.GuardedTimer(guard)
    ran = []

    def cb(tag):
        ran.append((tag, guard._lock._is_owned(), threading.get_ident() == guard.loop_thread))

    def arm(tag, cancel=False):
        assert guard.try_enter()
        h = timer.call_later(0.01, cb, tag)
        assert h.real is None           # not on the loop's heap from this thread
        if cancel:
            h.cancel()
        guard.post(guard.leave())
        return h
    kept = in_thread(arm, "kept")
    dropped = in_thread(arm, "dropped", True)
    assert kept.arming is not None and dropped.arming is None  # nothing to arm for it
    run_briefly(loop, 0.1)
    assert ran == [("kept", True, True)]
    assert kept.cancelled and dropped.cancelled and dropped.real is None
    # armed on the loop, cancelled from the other thread: the loop's handle goes too
    h = timer.call_later(5, cb, "late")
    real = h.real

    def cancel():
        assert guard.try_enter()
        h.cancel()
        guard.post(guard.leave())
    in_thread(cancel)
    run_briefly(loop)
    assert real.cancelled() and ran == [("kept", True, True)]


def test_a_parked_lookups_timeout_is_cancelled_by_a_publish_on_the_other_thread(loop):
    guard = G.guard_for(loop)
    answers: list = []
    store = make_store(guard, answers)
    store.lookup(OTHER, ["k"], wait=0, timeout=0.05, ticket="t")

    def publish_now():
        assert guard.try_enter()
        store.raw.publish(ME, {"k": "v"})
        guard.post(guard.leave())
    in_thread(publish_now)
    run_briefly(loop, 0.2)
    assert answers == [("t", 0, False, True)]   # answered once, no TIMEOUT after


def test_the_sweep_armed_from_the_other_thread_expires_items(loop):
    guard = G.guard_for(loop)
    store = G.guarded_store(guard, name="s", clock=MonotonicClock(),
                            on_answer=route_answer, params=StoreParams(timeout=0.05))

    def publish_now():
        assert guard.try_enter()
        store.raw.publish(ME, {"k": "v"}, persistence=0)  # INDEF: the sweep's business
        guard.post(guard.leave())
    in_thread(publish_now)
    assert store.sweep_armed
    # the sweep period is clamped to at least one second
    run_briefly(loop, 1.3)
    assert len(store) == 0 and store.stats().expiries == 1


def test_apply_now_answers_or_leaves_the_store_as_it_was(loop):
    guard = G.guard_for(loop)
    store = make_store(guard, [])
    stats = G.GuardedStats(guard)
    want = {"t": "lookup", "id": 0, "keys": ["k"], "wait": 0, "timeout": 5}
    with guard:
        assert stats.apply_now(store, OTHER, want) is None
    assert store.stats().parked == 0 and not store.raw._parked
    assert stats.sample()["requests"] == []       # nothing counted for it
    with guard:
        r = stats.apply_now(store, ME, {"t": "publish", "id": 0, "pairs": {"k": "v"}})
        assert r.status == 0
        r = stats.apply_now(store, OTHER, want)
    assert r.status == 0 and [tuple(f) for f in r.found] == [("k", "v", (NS, 0))]
    assert sorted(r[:2] for r in stats.sample()["requests"]) == [["lookup", "PMIX_SUCCESS"],
                                                                ["publish", "PMIX_SUCCESS"]]
    store.check_invariants()


def test_check_mode_logs_and_counts_a_broken_store(loop, monkeypatch, caplog):
    monkeypatch.setenv(G.CHECK_ENV, "1")
    guard = G.StoreGuard(loop)
    store = make_store(guard, [])
    store.publish(ME, {"k": "v"})
    assert guard.checked >= 1 and guard.broken == 0
    store.raw._count += 1            # break an invariant behind the store's back
    with caplog.at_level(logging.ERROR, logger="pydvm.storeguard"):
        store.stats()                # any guarded call checks on the way out
    assert guard.broken == 1 and "store invariants broken" in caplog.text


# ----------------------------------------------------------------------
# the PMIx fast path: same routing as the loop's, or nothing done
# ----------------------------------------------------------------------


class FakeReply:
    def __init__(self):
        self.calls = []
        self.done = False

    def __call__(self, status=0, found=()):
        self.calls.append((status, list(found)))
        self.done = True
        return True

    def fail(self, status):
        return self(status)


def pmix_req(kind, rank=0, **kw):
    base = {"publish": dict(pairs={}, range=None, persistence=None, access_uids=None,
                            access_gids=None),
            "lookup": dict(keys=[], range=None, wait=None, timeout=None),
            "unpublish": dict(keys=None, range=None)}[kind]
    base.update(kw)
    return types.SimpleNamespace(kind=kind, proc=Proc(NS, rank), reply=FakeReply(), **base)


def val(x):
    from pydvm.pmix import Value
    return Value.of(x)


def make_node(loop, *, relay=None, uplink_router=False, voucher=False):
    """A node server as start() leaves it (store, counters, guard), with its
    PMIx sessions for ranks 0 and 1 -- and, unless ``uplink_router``, the
    head node's router over a master store in the same process."""
    guard = G.guard_for(loop)
    master = types.SimpleNamespace(
        relay=relay, request_stats=G.GuardedStats(guard),
        store=G.guarded_store(guard, name="master", clock=MonotonicClock(),
                              on_answer=route_answer, dvm_nspace="pydvm-x"))
    sent = []
    uplink = types.SimpleNamespace(on_message=None, closed=False,
                                   request=lambda msg, cb: sent.append(msg) or 1,
                                   send=sent.append, withdraw=lambda mid: None)
    node = NodeServer("n0", uplink, {"params": {}, "dvm": "x", "dvm_nspace": "pydvm-x"},
                      guardian=None, router=None if uplink_router else MasterRouter(master))
    node.guard = guard
    node.request_stats = G.GuardedStats(guard)
    node.store = G.guarded_store(guard, name="n0", clock=MonotonicClock(),
                                 on_answer=route_answer, dvm_nspace="pydvm-x",
                                 on_holder=node._holder_changed if voucher else None)
    node.voucher = object() if voucher else None
    for rank in (0, 1):
        caller = Caller(NS, rank, 1000, 1000, "n0", 0, None)
        node.pmix.sessions[(NS, rank)] = PmixSession(node.pmix, caller, 4)
    node.sent = sent
    node.master = master
    return node


def now(node, req) -> bool:
    return in_thread(node.pmix.answer_now, req)


def test_pmix_requests_a_head_node_store_can_answer_are_answered_on_the_calling_thread(loop):
    node = make_node(loop)
    pub = pmix_req("publish", pairs={"k": val("v")})
    assert now(node, pub) and pub.reply.calls == [(0, [])]
    assert len(node.master.store) == 1 and len(node.store) == 0   # SESSION: the master's
    loc = pmix_req("publish", pairs={"l": val("w")}, range=2)
    assert now(node, loc) and len(node.store) == 1                # LOCAL: the node's
    look = pmix_req("lookup", rank=1, keys=["k", "l"])
    assert now(node, look)
    assert look.reply.calls[0][0] == 0 and [f[0] for f in look.reply.calls[0][1]] == ["k"]
    # unpublish everything: both stores, the keys removed counted together
    unp = pmix_req("unpublish")
    assert now(node, unp) and unp.reply.calls == [(0, [])]
    assert len(node.master.store) == 0 and len(node.store) == 0
    assert node.sent == []                                        # no network


def test_a_lookup_that_must_wait_goes_to_the_loop_untouched(loop):
    node = make_node(loop)
    look = pmix_req("lookup", rank=1, keys=["k"], wait=0, timeout=30)
    assert not now(node, look) and look.reply.calls == []
    assert node.master.store.stats().parked == 0
    assert node.master.request_stats.sample()["requests"] == []


def test_what_would_wait_on_the_network_or_the_master_goes_to_the_loop(loop):
    relaying = make_node(loop, relay=object())                    # a relaying master
    assert not now(relaying, pmix_req("publish", pairs={"k": val("v")}))
    daemon = make_node(loop, uplink_router=True)                  # a daemon, direct data off
    assert not now(daemon, pmix_req("publish", pairs={"k": val("v")}))        # SESSION
    assert not now(daemon, pmix_req("unpublish"))                # the master's part
    assert daemon.sent == [] and relaying.sent == []
    pub = pmix_req("publish", pairs={"k": val("v")}, range=2)    # LOCAL: its own store
    assert now(daemon, pub) and pub.reply.calls == [(0, [])] and len(daemon.store) == 1
    look = pmix_req("lookup", rank=1, keys=["k", "x"], range=2)
    assert now(daemon, look) and look.reply.calls[0][0] == 0
    # direct data on: the node store keeps the master told which uids it
    # holds, in order, from the loop -- nothing of it is served here
    direct = make_node(loop, uplink_router=True, voucher=True)
    assert not now(direct, pmix_req("publish", pairs={"k": val("v")}, range=2))
    assert not now(direct, pmix_req("lookup", keys=["k"], range=2))
    assert len(direct.store) == 0 and direct.sent == []


def test_the_fast_path_refuses_what_the_loop_refuses_and_never_waits(loop):
    node = make_node(loop)
    s = node.pmix.sessions[(NS, 0)]
    s.parked.update({1, 2, 3, 4})                                # at its cap of 4
    assert not now(node, pmix_req("publish", pairs={"k": val("v")}))
    s.parked.clear()
    s.channel.closed = True                                      # its process was reaped
    r = pmix_req("publish", pairs={"k": val("v")})
    assert now(node, r) and r.reply.calls == [(-23, [])]         # NO_PERMISSIONS
    r = pmix_req("publish", rank=7, pairs={"k": val("v")})       # not registered here
    assert now(node, r) and r.reply.calls == [(-23, [])]
    with node.guard:                                             # the loop holds the guard
        r = pmix_req("publish", rank=1, pairs={"k": val("v")})
        assert not now(node, r) and r.reply.calls == []
    assert len(node.master.store) == 0
