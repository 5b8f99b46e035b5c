"""A process's own stalls (pydvm/stalls.py) and the heartbeat judge that discounts them.

The record is pure bookkeeping; the judge is run on a real event loop whose
"stall" is real: a callback that blocks the loop (``time.sleep``) is, from
the loop's side, exactly a process that was not scheduled.
"""

from __future__ import annotations

import asyncio
import socket
import time

from pydvm import wire
from pydvm.stalls import STALL_MIN, Stalls


def test_a_timer_200ms_late_is_not_a_stall():
    s = Stalls()
    assert s.check(due=100.0, now=100.2) == 0.0
    assert s.check(due=100.0, now=100.0 + STALL_MIN) == 0.0
    assert s.spans == [] and s.count == 0


def test_a_timer_seconds_late_records_the_stall_from_due_to_now():
    s = Stalls()
    assert s.check(due=100.0, now=110.0) == 10.0
    assert s.spans == [(100.0, 110.0)] and s.count == 1 and s.total == 10.0
    # a silence from 99 to 111 ran 2 s of it; one from 105 ran none before 110
    assert s.within(99.0, 111.0) == 10.0
    assert s.within(105.0, 111.0) == 5.0
    assert s.within(111.0, 120.0) == 0.0


def test_a_shorter_threshold_for_a_short_heartbeat_period():
    s = Stalls()
    assert s.check(due=10.0, now=10.75, threshold=0.5) == 0.75
    assert s.check(due=20.0, now=20.4, threshold=0.5) == 0.0


def test_one_stall_seen_by_several_timers_is_counted_once():
    s = Stalls()
    assert s.note(100.0, 110.0) == 10.0
    assert s.note(102.0, 110.5) == 0.5   # another timer, due later, saw the same stall
    assert s.note(95.0, 101.0) == 5.0
    assert s.spans == [(95.0, 110.5)]
    assert s.count == 3 and s.total == 15.5
    assert s.within(0.0, 200.0) == 15.5


def test_the_record_is_bounded():
    s = Stalls(keep=4)
    for i in range(10):
        s.note(i * 10.0, i * 10.0 + 2)
    assert len(s.spans) == 4 and s.spans[-1] == (90.0, 92.0)


class _Transport:
    def __init__(self, sock):
        self.sock = sock

    def get_extra_info(self, name):
        return self.sock if name == "socket" else None


class _Peer:
    """What the judge sees of a channel: its last bytes, a ping, a close."""

    def __init__(self, name, sock=None):
        self.name = name
        self.closed = False
        self.close_reason = ""
        self.last_rx = time.monotonic()
        self.pings = 0
        self.transport = _Transport(sock) if sock is not None else None

    def send(self, msg):
        self.pings += 1

    def close(self, reason, error=False):
        self.closed, self.close_reason = True, reason


def _run(coro):
    return asyncio.new_event_loop().run_until_complete(coro)


def test_a_silent_peer_is_closed_within_three_periods_and_a_fourth():
    async def go():
        peer = _Peer("p")
        beat = asyncio.ensure_future(wire.heartbeat(lambda: [peer], 0.1))
        t0 = time.monotonic()
        while not peer.closed and time.monotonic() - t0 < 10:
            await asyncio.sleep(0.01)
        beat.cancel()
        return peer, time.monotonic() - t0

    peer, took = _run(go())
    assert peer.closed and "no heartbeat from p" in peer.close_reason
    assert took >= 0.3 and peer.pings >= 2


def test_a_stalled_judge_condemns_nobody_for_the_time_it_did_not_run():
    """The loop blocked for 1.5 s (15 periods): the peer, heard just before,
    is not closed at the judge's first turn after it; still silent, it is
    closed once the judge has run three more periods."""
    async def go():
        peer = _Peer("p")
        beat = asyncio.ensure_future(wire.heartbeat(lambda: [peer], 0.1))
        await asyncio.sleep(0.15)
        peer.last_rx = time.monotonic()
        time.sleep(1.5)  # the stall: nothing of this loop runs
        woke = time.monotonic()
        await asyncio.sleep(0.05)  # the judge's first turn after the stall has run
        first = peer.closed
        while not peer.closed and time.monotonic() - woke < 10:
            await asyncio.sleep(0.01)
        beat.cancel()
        return first, peer, time.monotonic() - woke

    first, peer, took = _run(go())
    assert not first, "a peer was condemned for the judge's own stall"
    assert peer.closed and took >= 0.2, took


def test_bytes_waiting_on_the_socket_are_not_silence():
    """A peer whose bytes wait unread (the loop has not read them yet) is not
    judged silent, however old its last read."""
    a, b = socket.socketpair()
    try:
        b.send(b"\0\0\0\4ping")
        async def go():
            peer = _Peer("p", sock=a)
            peer.last_rx = time.monotonic() - 60
            assert wire._unread(peer) == 8
            beat = asyncio.ensure_future(wire.heartbeat(lambda: [peer], 0.05))
            await asyncio.sleep(0.4)
            beat.cancel()
            return peer

        peer = _run(go())
        assert not peer.closed and peer.pings >= 3
    finally:
        a.close()
        b.close()


def test_with_a_grace_a_silent_peer_is_torpid_first_then_closed():
    async def go():
        peer = _Peer("p")
        seen = []
        beat = asyncio.ensure_future(wire.heartbeat(
            lambda: [peer], 0.05, grace=0.6, torpid=lambda ch, s: seen.append(s)))
        t0 = time.monotonic()
        while not peer.closed and time.monotonic() - t0 < 10:
            await asyncio.sleep(0.01)
        beat.cancel()
        return peer, seen, time.monotonic() - t0

    peer, seen, took = _run(go())
    assert peer.closed and took >= 0.6
    assert len(seen) == 1 and seen[0] > 0.15


def test_a_torpid_peer_heard_again_is_reported_back():
    async def go():
        peer = _Peer("p")
        seen = []
        beat = asyncio.ensure_future(wire.heartbeat(
            lambda: [peer], 0.05, grace=30, torpid=lambda ch, s: seen.append(s)))
        t0 = time.monotonic()
        while not seen and time.monotonic() - t0 < 10:
            await asyncio.sleep(0.01)
        peer.last_rx = time.monotonic()
        while len(seen) < 2 and time.monotonic() - t0 < 10:
            await asyncio.sleep(0.01)
        beat.cancel()
        return peer, seen

    peer, seen = _run(go())
    assert not peer.closed
    assert len(seen) == 2 and seen[0] > 0.15 and seen[1] is None
