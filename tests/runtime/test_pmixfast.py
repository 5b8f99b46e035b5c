"""The fast lane (runtime/pmixhost/fast.py) over a real socket pair: the asking
thread gets the node's answer, or ``later`` (declined, nothing done); a
broken or lying lane is an
OSError for the asker, and nonsense never leaves it waiting."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest

from pydvm.protocol import HEADER, pack
from pydvm.pmix.constants import ERROR as PMIX_ERROR
from pydvm.runtime.pmixhost.fast import Asker, Lane, read_frame


class _Node:
    """A lane's node side: answers at once what ``now`` says (a reply map
    maker, or None to decline); records what it was asked."""

    def __init__(self, now):
        self.now = now
        self.served = []

    def serve(self, rid, proc, req):
        self.served.append((rid, proc, req))
        return self.now(rid, proc, req)


def _lane(now, spin=0):
    loop = asyncio.new_event_loop()
    node = _Node(now)
    ours, theirs = socket.socketpair()
    lane = Lane(ours, "test lane", node.serve, spin)
    lane.start()
    asker = Asker(theirs)
    asker.spin_ns = spin
    return loop, node, lane, asker


@pytest.mark.parametrize("spin", [0, 200_000, 1], ids=["sleeping", "polling", "poll-then-sleep"])
def test_an_answer_now_comes_back_to_the_asker_with_its_id(spin):
    loop, node, lane, asker = _lane(lambda rid, p, m: {"t": "reply", "id": rid, "status": 0,
                                                        "found": [["k", "v", "ns", 0]]}, spin)
    try:
        for rid in (7, 8, 9):
            r = asker.ask(rid, ["ns", 0], {"t": "lookup", "keys": ["k"]})
            assert r["id"] == rid and r["status"] == 0 and r["found"] == [["k", "v", "ns", 0]]
        assert node.served[0] == (7, ["ns", 0], {"t": "lookup", "keys": ["k"]})
        assert asker.stats == {"answered": 3, "later": 0}
    finally:
        lane.close()
        asker.close()
        loop.close()


def test_a_request_not_answerable_now_is_declined_and_the_lane_goes_on():
    loop, node, lane, asker = _lane(lambda rid, p, m: None if m.get("wait") else
                                    {"t": "reply", "id": rid, "status": 0})
    try:
        assert asker.ask(3, ["ns", 1], {"t": "lookup", "keys": ["k"], "wait": "all"}) is None
        assert asker.ask(4, ["ns", 1], {"t": "lookup", "keys": ["k"]})["status"] == 0
        assert asker.stats == {"answered": 1, "later": 1}
    finally:
        lane.close()
        asker.close()
        loop.close()


def test_a_serve_that_raises_answers_error_and_the_lane_goes_on():
    def now(rid, p, m):
        if m["t"] == "publish":
            raise RuntimeError("boom")
        return {"t": "reply", "id": rid, "status": 0}
    loop, node, lane, asker = _lane(now)
    try:
        assert asker.ask(1, ["ns", 0], {"t": "publish"})["status"] == PMIX_ERROR
        assert asker.ask(2, ["ns", 0], {"t": "unpublish"})["status"] == 0
    finally:
        lane.close()
        asker.close()
        loop.close()


def test_a_closed_lane_is_an_oserror_and_the_asker_stops_using_it():
    loop, node, lane, asker = _lane(lambda rid, p, m: None)
    lane.close()
    try:
        with pytest.raises(OSError):
            asker.ask(1, ["ns", 0], {"t": "lookup", "keys": ["k"]})
        assert asker.broken
    finally:
        asker.close()
        loop.close()


def test_an_answer_to_another_id_is_an_oserror():
    ours, theirs = socket.socketpair()
    asker = Asker(theirs)

    def liar():
        read_frame(ours)
        ours.sendall(pack({"t": "reply", "id": 99, "status": 0}))
    t = threading.Thread(target=liar)
    t.start()
    try:
        with pytest.raises(OSError, match="another request"):
            asker.ask(1, ["ns", 0], {"t": "lookup", "keys": ["k"]})
    finally:
        t.join()
        ours.close()
        asker.close()


@pytest.mark.parametrize("junk", [HEADER.pack(5) + b"\xc1\x00\x00\x00\x00",  # not a frame
                                  HEADER.pack(1 << 30)])                    # too big
def test_the_node_closes_a_lane_that_sends_nonsense(junk):
    loop, node, lane, asker = _lane(lambda rid, p, m: pytest.fail("nothing to serve"))
    try:
        asker.sock.sendall(junk)
        asker.sock.settimeout(10)
        assert asker.sock.recv(10) == b""  # closed, not answered
    finally:
        asker.close()
        loop.close()


def test_no_polling_where_one_cpu_is_all_there_is(monkeypatch):
    from pydvm.runtime.pmixhost import fast as pmixfast
    assert pmixfast.spin_ns(0) == 0
    monkeypatch.setattr(pmixfast.os, "sched_getaffinity", lambda pid: {0})
    assert pmixfast.spin_ns(200) == 0
    monkeypatch.setattr(pmixfast.os, "sched_getaffinity", lambda pid: {0, 1})
    assert pmixfast.spin_ns(200) == 200_000
