"""A user's PMIx agent's link to its node: upcalls written from libpmix's thread.

The agent (:mod:`pydvm.runtime.pmixusers`) relays every upcall of its
libpmix server to the node over a socket pair.  Handing each upcall from
libpmix's progress thread to the agent's event loop, only for the loop to
write it to the socket, cost a thread wake-up per request; so the progress
thread writes it itself (:meth:`UpcallLink.send_upcall`, the binding's
``take_now``), and the loop is woken only by the node's answer.

Two threads write one socket, so every write goes through
:meth:`UpcallLink.write`, under one lock:

* on the loop's thread, through the asyncio transport (which buffers what
  the socket does not take at once);
* on any other thread, straight to the socket -- but only while nothing
  waits before it (the transport's buffer empty, nothing queued for the
  loop) and the socket takes all of it at once.  Otherwise the bytes (the
  rest of them) are queued, in order, for the loop to hand to the
  transport (one ``call_soon_threadsafe`` for the lot): such a thread never
  waits for the socket or the loop, and frames are never interleaved.

The lock is held while writing only (a non-blocking ``send`` or a
transport ``write``), never while waiting for anything.  Once the link is
closed (:meth:`close`, before the socket is) nothing is written any more:
the socket's descriptor is never used after it was closed.

Upcalls that want an answer are numbered here (their own ids: the
channel's request ids are not used for them) and kept until the node's
``reply`` with that id comes back on the loop (:meth:`take`); those still
waiting when the link closes are answered ``PMIX_ERR_UNREACH`` by the agent.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import threading
from typing import Any

from ..wire import Channel, Message, pack

log = logging.getLogger("pydvm.pmix")


class UpcallLink:
    """The shared write side of the agent's socket to its node, and the
    upcalls waiting for the node's answer.  Made on the loop's thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        self.loop = loop
        self.sock = sock
        self.loop_thread = threading.get_ident()
        self.lock = threading.Lock()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        #: bytes for the loop to write, in order (a write from another thread
        #: that could not go straight to the socket, and every write after it).
        self._queue: list[bytes] = []
        #: id -> the upcall (its request object) waiting for the node's answer.
        self._waiting: dict[int, Any] = {}
        self._ids = itertools.count(1)
        #: writes from another thread: straight to the socket, or queued for the loop.
        self.stats = {"direct": 0, "queued": 0}

    # -- writing ----------------------------------------------------------

    def write(self, data: bytes) -> bool:
        """Write one frame, from any thread; False if the link is closed."""
        with self.lock:
            return self._write_locked(data)

    def _write_locked(self, data: bytes) -> bool:
        if self.closed or self.transport is None:
            return False
        queue = self._queue
        if threading.get_ident() == self.loop_thread:
            if queue:
                queue.append(data)  # after what another thread queued (a flush is due)
            else:
                self.transport.write(data)
            return True
        if not queue and self.transport.get_write_buffer_size() == 0:
            # The buffer only grows under this lock (every write is here), so
            # empty now means nothing is due before these bytes.
            try:
                n = self.sock.send(data)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError:
                n = 0  # the loop sees the socket's end itself; the rest goes to it
            if n == len(data):
                self.stats["direct"] += 1
                return True
            data = data[n:]
        self.stats["queued"] += 1
        queue.append(data)
        if len(queue) == 1:
            try:
                self.loop.call_soon_threadsafe(self._flush)
            except RuntimeError:  # the loop is closed: the agent is ending anyway
                queue.clear()
                return False
        return True

    def _flush(self) -> None:
        with self.lock:
            queue, self._queue = self._queue, []
            if queue and not self.closed and self.transport is not None:
                self.transport.writelines(queue)

    # -- upcalls ------------------------------------------------------------

    def send_upcall(self, body: Message, req: Any, wants_answer: bool) -> bool:
        """Send upcall ``body`` (``{"t": "up", "req": ...}``) from any thread;
        with ``wants_answer`` it gets an id and ``req`` waits for the node's
        answer (:meth:`take`).  False, with nothing sent or kept, if the link
        is closed."""
        with self.lock:
            if self.closed:
                return False
            if wants_answer:
                rid = body["id"] = next(self._ids)
                self._waiting[rid] = req
            if self._write_locked(pack(body)):
                return True
            if wants_answer:
                del self._waiting[rid]
            return False

    def take(self, rid: Any) -> Any:
        """The upcall answered by the node's reply ``rid`` (None: no such one)."""
        try:
            return self._waiting.pop(rid, None)
        except TypeError:  # an unhashable id: not ours
            return None

    def close(self) -> list:
        """Nothing is written any more; returns the upcalls still waiting for
        an answer (the caller answers them).  Called on the loop before the
        socket is closed."""
        with self.lock:
            self.closed = True
            self._queue.clear()
            waiting = list(self._waiting.values())
            self._waiting.clear()
        return waiting


class LinkChannel(Channel):
    """The agent's :class:`~pydvm.wire.Channel` to its node: every frame it
    sends goes through the link's shared write (see the module docstring)."""

    link: UpcallLink | None = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.link is not None:
            self.link.transport = transport

    def send(self, msg: Message) -> None:
        if self.closed or self.link is None:
            return
        self.link.write(pack(msg))

    def send_raw(self, body) -> None:  # pragma: no cover - the agent never passes bodies on
        raise NotImplementedError
