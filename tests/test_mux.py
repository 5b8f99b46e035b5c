"""The blocking client's multiplexer (pydvm.client.mux) over a real socket pair.

The far end is a thread of this test playing the server: it reads frames
and answers them when and in the order the test says.
"""

from __future__ import annotations

import queue
import socket
import threading

import pytest

from pydvm.client import mux as _mux
from pydvm.client.mux import Mux
from pydvm.errors import DuplicateKeyError, UnreachableError
from pydvm.channel import BlockingChannel
from pydvm.wire import reply


class Server:
    """The other end: every frame received goes to ``got``; ``answer`` replies."""

    def __init__(self, sock: socket.socket) -> None:
        self.ch = BlockingChannel(sock)
        self.got: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while True:
                self.got.put(self.ch.recv())
        except (OSError, ConnectionError):
            self.got.put(None)

    def next(self) -> dict:
        msg = self.got.get(timeout=10)
        assert msg is not None, "the client closed"
        return msg

    def answer(self, msg: dict, status: int = 0, **fields) -> None:
        self.ch.send(reply(msg["id"], status, "refused" if status else "", **fields))


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    mux = Mux(BlockingChannel(a), lambda text: UnreachableError(f"test {text}"))
    server = Server(b)
    yield mux, server
    a.close()
    b.close()


def in_thread(fn):
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            box["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    return t, box


def test_answers_in_another_order_reach_the_thread_that_asked(pair):
    mux, server = pair
    t1, b1 = in_thread(lambda: mux.call({"t": "lookup", "n": 1}))
    first = server.next()
    t2, b2 = in_thread(lambda: mux.call({"t": "lookup", "n": 2}))
    second = server.next()
    server.answer(second, found=2)
    t2.join(10)
    assert b2["value"]["found"] == 2 and t1.is_alive()  # the first still waits
    server.answer(first, found=1)
    t1.join(10)
    assert b1["value"]["found"] == 1


def test_a_refused_post_is_raised_once_by_the_next_call_after_its_own_answer(pair):
    mux, server = pair
    mux.post({"t": "publish"})
    posted = server.next()
    t, box = in_thread(lambda: mux.call({"t": "lookup"}))
    looked = server.next()
    server.answer(posted, -53)
    server.answer(looked)
    t.join(10)
    assert isinstance(box["error"], DuplicateKeyError) and "earlier publish" in str(box["error"])
    t, box = in_thread(lambda: mux.call({"t": "lookup"}))
    server.answer(server.next())
    t.join(10)
    assert box["value"]["status"] == 0  # raised once only


def test_flush_waits_for_every_post_and_raises_the_first_refusal(pair):
    mux, server = pair
    for _ in range(3):
        mux.post({"t": "publish"})
    msgs = [server.next() for _ in range(3)]
    t, box = in_thread(mux.flush)
    server.answer(msgs[0])
    server.answer(msgs[1], -53)
    assert t.is_alive() or "error" not in box
    server.answer(msgs[2], -29)
    t.join(10)
    assert isinstance(box["error"], DuplicateKeyError)
    assert mux.unacked == 0


def test_a_waiting_lookup_gives_way_to_an_earlier_posts_refusal_and_is_withdrawn(pair):
    mux, server = pair
    mux.post({"t": "publish"})
    posted = server.next()
    t, box = in_thread(lambda: mux.call({"t": "lookup", "wait": 0}, withdrawable=True))
    waiting = server.next()
    server.answer(posted, -53)
    t.join(10)
    assert isinstance(box["error"], DuplicateKeyError)
    assert server.next() == {"t": "cancel", "ref": waiting["id"]}


def test_a_lost_connection_fails_every_waiting_call_and_every_later_one(pair):
    mux, server = pair
    calls = [in_thread(lambda: mux.call({"t": "lookup"})) for _ in range(3)]
    for _ in calls:
        server.next()
    server.ch.sock.shutdown(socket.SHUT_RDWR)  # the server goes away
    for t, box in calls:
        t.join(10)
        assert isinstance(box["error"], UnreachableError), box
    with pytest.raises(UnreachableError, match="test connection lost"):
        mux.call({"t": "lookup"})


def test_posts_beyond_the_backlog_wait_for_answers(pair, monkeypatch):
    monkeypatch.setattr(_mux, "MAX_UNACKED", 4)
    mux, server = pair
    for _ in range(4):
        mux.post({"t": "publish"})
    t, box = in_thread(lambda: mux.post({"t": "publish"}))
    msgs = [server.next() for _ in range(4)]
    t.join(0.3)
    assert t.is_alive(), "a fifth post went out with four unanswered"
    for m in msgs[:3]:
        server.answer(m)
    t.join(10)
    assert "error" not in box and not t.is_alive()
    server.answer(msgs[3])
    server.answer(server.next())
    mux.flush()
