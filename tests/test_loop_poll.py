"""The master's poll after each message (``pydvm_master_poll_us``): the loop
stays awake for the window after a message, then sleeps; it never runs on
another loop's behalf, and a one-CPU machine never polls."""

from __future__ import annotations

import asyncio
import os
import socket

import pytest

from pydvm import wire
from pydvm.wire import Channel, LoopPoll, pack, poll_after_messages, stop_polling


@pytest.fixture(autouse=True)
def _no_poll_left():
    yield
    stop_polling()


def test_zero_or_one_cpu_turns_the_poll_off(monkeypatch):
    loop = asyncio.new_event_loop()
    try:
        assert poll_after_messages(loop, 0) is None and wire._loop_poll is None
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
        assert poll_after_messages(loop, 50) is None
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
        poll = poll_after_messages(loop, 50)
        assert isinstance(poll, LoopPoll) and poll.seconds == pytest.approx(50e-6)
        assert wire._loop_poll is poll
        stop_polling()
        assert wire._loop_poll is None
    finally:
        loop.close()


def test_a_message_keeps_the_loop_turning_for_the_window_then_it_sleeps(monkeypatch):
    """A message on a channel arms the poll: the loop turns (yielding the CPU
    each time) until the window after the last message ends, then stops."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    turns = []
    real_yield = os.sched_yield
    monkeypatch.setattr(os, "sched_yield", lambda: turns.append(1) or real_yield())

    async def scenario():
        loop = asyncio.get_running_loop()
        # a window long enough that a loaded machine cannot sleep through it
        poll = poll_after_messages(loop, 500_000)  # 500 ms
        got = []
        a, b = socket.socketpair()
        await loop.create_unix_connection(
            lambda: Channel(lambda ch, m: got.append(m), lambda ch, why: None), sock=a)
        assert not poll._armed and not turns
        b.sendall(pack({"t": "ping", "id": 1}))
        while not got:
            await asyncio.sleep(0)
        assert poll._armed
        while len(turns) < 2:
            await asyncio.sleep(0.001)
        assert poll._armed                     # turning, not asleep
        for _ in range(300):                   # the window ends (well within 3 s)
            if not poll._armed:
                break
            await asyncio.sleep(0.01)
        assert not poll._armed                 # the window ended
        n = len(turns)
        await asyncio.sleep(0.02)
        assert len(turns) == n                 # and nothing turns any more
        b.close()
        return got

    assert asyncio.run(scenario()) == [{"t": "ping", "id": 1}]


def test_a_message_on_another_loop_does_not_arm_this_loops_poll(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    other = asyncio.new_event_loop()
    try:
        poll = poll_after_messages(other, 50)

        async def elsewhere():
            poll.arm()
            return poll._armed

        assert asyncio.run(elsewhere()) is False
    finally:
        other.close()
