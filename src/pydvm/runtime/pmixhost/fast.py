"""The fast lane: a PMIx agent's publish, lookup and unpublish answered while
libpmix's upcall waits, as the node's own server answers its clients'.

Why
---
Through the agent's main socket (:mod:`pydvm.runtime.pmixhost.agent`) a data
request wakes the node's event loop, whose answer wakes the agent's loop,
whose call to libpmix's callback wakes libpmix's thread again: three
wake-ups more than the node's own server, whose progress thread answers in
the upcall (``PmixHost.answer_now``).  The lane takes two of them out.

How
---
A second socket pair per agent, created only where the node can answer a
data request at once (its router answers in place: the head node).  On the
agent's side libpmix's progress thread writes each publish, lookup or
unpublish to the lane and **waits for one frame back** (:class:`Asker`); on
the node's side a thread of its own reads the lane (:class:`Lane`), serves
the request under the process's store guard exactly as ``answer_now`` does
(``NodeServer.serve_now``: same routing, store rules, identity) and writes
the answer.  A request the node cannot answer at once -- a lookup that
would wait, one for another node, a session at its cap -- is declined
(``later``), having changed nothing: the agent sends it on its main socket
as any other (``UserServer._on_data`` serves it there).

On the agent's side the lane is libpmix's ``answer_now`` hook, as the
node's own server answers its clients: a publish or unpublish answered in
the upcall is a status the upcall returns (no callback), a lookup's answer
goes through libpmix's callback before the upcall returns.

What libpmix's thread waits for is bounded by the node serving one request
under the guard (the loop holds the guard only while it serves one itself);
the node's thread never waits for the agent.  If the lane breaks (the node
is stopping), the request is answered ``PMIX_ERR_UNREACH`` and the lane is
not used again.

Frames are the wire's (:func:`~pydvm.protocol.pack`): the agent sends
``{"t": "data", "id", "p": [nspace, rank], "m": request}`` (the main
socket's ``data`` message), the node answers with the store's reply map
(:func:`~pydvm.runtime.shared.dataops.encode`) or ``{"id", "later": true}``
(declined).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any, Callable

from ...protocol import HEADER, MAX_FRAME, pack, unpack_body
from ...wire import Message

log = logging.getLogger("pydvm.pmix")

#: PMIX_ERROR: a request the node failed to serve
PMIX_ERROR = -1


def spin_ns(microseconds: float) -> int:
    """How long, in ns, the asker polls for the node's answer and the lane
    for the next request after one before sleeping (``pydvm_master_poll_us``:
    on a VM a sleeping thread's wake-up costs tens of µs, more than serving
    the request).  0 where this process may use one CPU only."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return int(microseconds * 1000) if cpus > 1 and microseconds > 0 else 0


def read_frame(sock: socket.socket, spin_ns: int = 0) -> Message | None:
    """One frame from blocking socket ``sock``; None at its end.  Raises
    ValueError on a frame that is not one.  ``spin_ns``: see :func:`_read`."""
    head = _read(sock, HEADER.size, spin_ns)
    if head is None:
        return None
    (size,) = HEADER.unpack(head)
    if size > MAX_FRAME:
        raise ValueError(f"a {size}-byte frame")
    body = _read(sock, size)
    if body is None:
        raise ValueError("the lane ended inside a frame")
    try:
        return unpack_body(body)
    except Exception as exc:  # FrameError, msgpack's own
        raise ValueError(f"a frame that is not one ({exc})") from None


def _read(sock: socket.socket, n: int, spin_ns: int = 0) -> bytes | None:
    """``n`` bytes; first polled for without sleeping for up to ``spin_ns``,
    yielding the CPU (``sched_yield``) between tries: both ends of the lane
    poll, and when the scheduler puts them on one CPU the one that is to
    answer would otherwise wait for the other's poll to run out (a request
    took 430-490 µs instead of 115-170 in some runs, by where the threads
    landed; bench/pmix/pmix_isolate.py)."""
    buf = bytearray()
    if spin_ns:
        end = time.perf_counter_ns() + spin_ns
        while True:
            try:
                chunk = sock.recv(n, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                if time.perf_counter_ns() < end:
                    os.sched_yield()
                    continue
                break
            if not chunk:
                return None
            buf += chunk
            break
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            if buf:
                raise ValueError("the lane ended inside a frame")
            return None
        buf += chunk
    return bytes(buf)


class Asker:
    """The agent's end of the lane, used by libpmix's progress thread only."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(True)
        self.sock = sock
        self.broken = False
        #: ns polled for each answer before sleeping (the node says: ``start``)
        self.spin_ns = 0
        self.stats = {"answered": 0, "later": 0}

    def ask(self, rid: int, proc: list, request: Message) -> Message | None:
        """Send data request ``request`` of process ``proc`` as ``rid``; the
        node's answer (a reply map), or None: declined, nothing done (the
        request goes on the main socket).  Raises OSError (and marks the
        lane broken) if the lane is gone or answers nonsense."""
        try:
            self.sock.sendall(pack({"t": "data", "id": rid, "p": proc, "m": request}))
            r = read_frame(self.sock, self.spin_ns)
            if r is None or r.get("id") != rid:
                raise OSError("the node's lane closed" if r is None
                              else "the node's lane answered another request")
        except (OSError, ValueError) as exc:
            self.broken = True
            raise OSError(str(exc)) from None
        if r.get("later"):
            self.stats["later"] += 1
            return None
        self.stats["answered"] += 1
        return r

    def close(self) -> None:
        self.broken = True
        try:
            self.sock.close()
        except OSError:
            pass


class Lane:
    """The node's end of one agent's lane: a thread that reads its requests
    and answers each (see the module docstring).

    ``serve(rid, proc, request)``: the answer now (a reply map), or None,
    having done nothing -- then the request is declined.  ``spin``: ns
    polled for the next request after each before sleeping (:func:`spin_ns`)."""

    def __init__(self, sock: socket.socket, name: str,
                 serve: Callable[[Any, Any, Any], Message | None], spin: int = 0) -> None:
        sock.setblocking(True)
        self.sock = sock
        self.spin_ns = spin
        self.name = name
        self._serve = serve
        self.stats = {"answered": 0, "later": 0}
        self._thread = threading.Thread(target=self._run, name=f"lane {name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop serving: the thread ends at the lane's end."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _run(self) -> None:
        try:
            while True:
                try:
                    msg = read_frame(self.sock, self.spin_ns)
                except ValueError as exc:
                    log.warning("%s: %s: lane closed", self.name, exc)
                    return
                if msg is None:
                    return
                rid, proc, request = msg.get("id"), msg.get("p"), msg.get("m")
                try:
                    r = self._serve(rid, proc, request)
                except Exception as exc:  # never leave the agent waiting
                    log.error("%s: serving a data request failed: %r", self.name, exc)
                    r = {"t": "reply", "id": rid, "status": PMIX_ERROR}
                if r is not None:
                    self.stats["answered"] += 1
                    self.sock.sendall(pack(r))
                    continue
                self.stats["later"] += 1
                self.sock.sendall(pack({"t": "reply", "id": rid, "later": True}))
        except OSError:
            return
        finally:
            try:
                self.sock.close()
            except OSError:
                pass
