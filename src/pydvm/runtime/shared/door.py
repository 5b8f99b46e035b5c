"""The front door: how a DVM process's listening sockets take connections.

A peer that has not authenticated yet -- a *stranger* -- can make a server
hold only a small, fixed amount, whatever it sends:

* **per connection**, one frame of at most
  :data:`~pydvm.protocol.HANDSHAKE_FRAME` bytes (4 KiB), read one at a time
  (:meth:`pydvm.wire.Channel.gate`); a longer one closes that connection
  with one log line.  Once the handshake is accepted the connection reads
  frames of up to :data:`~pydvm.protocol.MAX_FRAME`;
* **in all**, at most :data:`MAX_STRANGERS` such connections per door: one
  more closes the oldest.

**File descriptors.**  At start the process raises its soft
``RLIMIT_NOFILE`` to the hard limit (:func:`raise_nofile`; as most servers
do -- a job's processes inherit it).  A door keeps a **reserve** of
descriptors (:func:`reserve_for`: an eighth of the limit, 32 to 1,024)
that strangers may not take: a connection accepted into the reserve (the
strangers and every other descriptor open -- counted in ``/proc/self/fd`` at
most every 0.1 s -- reach ``limit - reserve``) closes the oldest stranger (and no other connection is accepted before that one's
descriptor is free, on the loop's next turn), so daemons, authenticated
tools, job pipes and libpmix's own sockets still find descriptors while a
storm of strangers holds the rest.
An ``accept`` failing for want of descriptors (EMFILE, ENFILE) closes the
oldest stranger and tries again on the loop's next turn; with no stranger to close, the
socket is read again 0.1 s later, or as soon as a stranger leaves.  Such an
*episode* is logged twice, whatever its length: when it starts (the
descriptors in use, the limit, the strangers) and one second after it
ends (how many strangers were closed, how many accepts failed).

The door accepts on its own loop callback rather than ``loop.create_server``:
asyncio's server stops accepting for a whole second after an EMFILE and
logs a traceback; uvloop's drops what waits in the backlog, tools included.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import socket
import time
from typing import Any, Callable

from ...protocol import HANDSHAKE_FRAME
from ...wire import Channel

log = logging.getLogger("pydvm.door")

#: Strangers (connections not yet authenticated) one door holds at most.
MAX_STRANGERS = 1024
#: Connections taken per wake-up of a listening socket.
ACCEPT_BATCH = 32
#: After an accept failed with nothing to free: when to try again (seconds).
RETRY = 0.1
#: How often the descriptors other than strangers' are counted, at most (seconds).
COUNT_EVERY = 0.1
#: An episode at the limit is over once this long passes without a closure.
EPISODE_QUIET = 1.0

_OUT_OF = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)

_raised: tuple[int, int] | None = None


def raise_nofile() -> tuple[int, int]:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit (once
    per process); return (soft, hard) as they are now."""
    global _raised
    if _raised is not None:
        return _raised
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            log.info("raised the descriptor limit (RLIMIT_NOFILE) from %d to %d", soft, hard)
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the descriptor limit from %d to %d: %s", soft, hard, exc)
    _raised = (soft, hard)
    return _raised


def reserve_for(limit: int) -> int:
    """The descriptors strangers may not take under a soft limit of ``limit``."""
    return max(32, min(limit // 8, 1024))


def open_descriptors() -> int:
    """How many descriptors this process has open (``/proc/self/fd``)."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # less the listing's own
    except OSError:
        return -1


class Listener:
    """One listening socket of a :class:`Door`."""

    def __init__(self, door: "Door", sock: socket.socket, factory: Callable[[], Channel]) -> None:
        self.door = door
        self.sock = sock
        self.factory = factory
        self.reading = False
        self.closed = False
        self._retry: asyncio.TimerHandle | None = None

    def close(self) -> None:
        """Stop listening (the connections it accepted stay open)."""
        if self.closed:
            return
        self.closed = True
        self.pause()
        if self._retry is not None:
            self._retry.cancel()
        self.door.listeners.discard(self)
        self.sock.close()

    def resume(self) -> None:
        self._retry = None
        if not self.closed and not self.reading:
            self.reading = True
            self.door.loop.add_reader(self.sock.fileno(), self.door._accept, self)

    def pause(self, retry: float | None = None) -> None:
        if self.reading:
            self.reading = False
            self.door.loop.remove_reader(self.sock.fileno())
        if retry is not None and self._retry is None and not self.closed:
            self._retry = self.door.loop.call_later(retry, self.resume)


class Door:
    """The listening sockets of one server (the master's, a node's) and the
    connections on them that have not authenticated yet (see the module
    docstring).  Each accepted :class:`~pydvm.wire.Channel` is gated
    (:meth:`~pydvm.wire.Channel.gate`) until it has a session."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.loop = asyncio.get_running_loop()
        self.limit, self.hard = raise_nofile()
        if self.limit == resource.RLIM_INFINITY:
            self.limit = 1 << 20
        self.reserve = reserve_for(self.limit)
        self.listeners: set[Listener] = set()
        #: connections not yet authenticated, oldest first.
        self._strangers: dict[Channel, None] = {}
        #: accepted connections whose channel is not made yet (a loop turn).
        self._pending = 0
        #: strangers closed to keep the reserve or the cap, and accepts
        #: failed for want of descriptors, since start.
        self.counts = {"closed_at_limit": 0, "accept_failed": 0}
        #: descriptors open but not strangers', and when they were counted.
        self._others = 0
        self._others_at = -COUNT_EVERY
        self._episode: dict[str, Any] | None = None
        self._episode_end: asyncio.TimerHandle | None = None

    # -- listening ----------------------------------------------------------

    def listen_tcp(self, factory: Callable[[], Channel], host: str, port: int) -> Listener:
        """Listen on ``host:port`` (port 0: any); raises OSError."""
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
        family, kind, proto, _, addr = infos[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
        except BaseException:
            sock.close()
            raise
        return self._listen(sock, factory)

    def listen_unix(self, factory: Callable[[], Channel], path: str) -> Listener:
        """Listen on the Unix socket ``path``; raises OSError."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
        except BaseException:
            sock.close()
            raise
        return self._listen(sock, factory)

    def _listen(self, sock: socket.socket, factory: Callable[[], Channel]) -> Listener:
        sock.listen(min(socket.SOMAXCONN, 4096))
        sock.setblocking(False)
        lst = Listener(self, sock, factory)
        self.listeners.add(lst)
        lst.resume()
        return lst

    def close(self) -> None:
        """Stop every listener of this door."""
        for lst in list(self.listeners):
            lst.close()
        if self._episode_end is not None:
            self._episode_end.cancel()

    # -- accepting -----------------------------------------------------------

    def _accept(self, lst: Listener) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _addr = lst.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                if exc.errno not in _OUT_OF:
                    log.warning("%s: accept failed: %s", self.name, exc)
                    lst.pause(RETRY)
                    return
                self.counts["accept_failed"] += 1
                self._at_limit(f"accept failed: {os.strerror(exc.errno)}")
                if not self._close_oldest():
                    lst.pause(RETRY)  # nothing of ours to free: try again soon
                # else again on the loop's next turn, once the closed
                # connection's descriptor is free (a transport closes there)
                return
            conn.setblocking(False)
            self._pending += 1
            self.loop.create_task(self._connect(lst, conn))
            strangers = len(self._strangers) + self._pending
            if strangers > MAX_STRANGERS or conn.fileno() >= self.limit - self.reserve \
                    or strangers > self._room():
                what = "the reserve" if strangers <= MAX_STRANGERS else \
                    f"{MAX_STRANGERS} unauthenticated connections"
                self._at_limit(f"a connection took a descriptor of {what}")
                self._close_oldest()
                # A transport closes on the loop's next turn: accept no more
                # until then, or the batch would run into the reserve.
                return

    def _room(self) -> int:
        """How many strangers fit beside everything else open (the reserve
        kept): the descriptors of the rest counted at most every
        :data:`COUNT_EVERY` seconds (``/proc/self/fd``)."""
        now = time.monotonic()
        if now >= self._others_at + COUNT_EVERY:
            n = open_descriptors()
            if n >= 0:  # -1: no descriptor left to list them with; keep the last count
                self._others = max(0, n - len(self._strangers) - self._pending)
                self._others_at = now
        return self.limit - self.reserve - self._others

    async def _connect(self, lst: Listener, conn: socket.socket) -> None:
        made = False

        def factory() -> Channel:
            nonlocal made
            made = True
            self._pending -= 1
            ch = lst.factory()
            ch.gate(HANDSHAKE_FRAME, self)
            self._strangers[ch] = None
            return ch
        try:
            await self.loop.connect_accepted_socket(factory, sock=conn)
        except OSError as exc:  # the peer left at once
            log.debug("%s: accepted connection lost: %s", self.name, exc)
            conn.close()
        finally:
            if not made:
                self._pending -= 1

    def _close_oldest(self) -> bool:
        """Close the oldest stranger; False if there is none."""
        for ch in self._strangers:
            del self._strangers[ch]
            ch.door = None
            self.counts["closed_at_limit"] += 1
            if self._episode is not None:
                self._episode["closed"] += 1
            ch.close("closed to keep descriptors for authenticated peers")
            self._freed()
            return True
        return False

    # -- what the channels tell -----------------------------------------------

    def admitted(self, ch: Channel) -> None:
        """``ch``'s handshake was accepted: it is no stranger any more."""
        self._strangers.pop(ch, None)

    def forget(self, ch: Channel) -> None:
        """``ch`` closed before authenticating."""
        self._strangers.pop(ch, None)
        self._freed()

    def _freed(self) -> None:
        for lst in self.listeners:
            if not lst.reading and lst._retry is not None:
                lst._retry.cancel()
                lst.resume()

    # -- episodes ---------------------------------------------------------------

    def _at_limit(self, why: str) -> None:
        if self._episode is None:
            self._episode = {"start": time.monotonic(), "closed": 0,
                             "failed0": self.counts["accept_failed"]}
            log.warning("%s: descriptor limit reached (%s): %d of %d descriptors open, "
                        "%d unauthenticated connections, %d kept in reserve; closing the "
                        "oldest unauthenticated connections", self.name, why,
                        open_descriptors(), self.limit, len(self._strangers), self.reserve)
        self._episode["last"] = time.monotonic()
        if self._episode_end is None:
            self._episode_end = self.loop.call_later(EPISODE_QUIET, self._maybe_over)

    def _maybe_over(self) -> None:
        self._episode_end = None
        ep = self._episode
        if ep is None:
            return
        quiet = time.monotonic() - ep["last"]
        if quiet < EPISODE_QUIET:
            self._episode_end = self.loop.call_later(EPISODE_QUIET - quiet, self._maybe_over)
            return
        self._episode = None
        log.warning("%s: descriptor limit episode over after %.1fs: %d unauthenticated "
                    "connections closed, %d accepts failed; %d of %d descriptors open",
                    self.name, ep["last"] - ep["start"], ep["closed"],
                    self.counts["accept_failed"] - ep["failed0"], open_descriptors(),
                    self.limit)

    def info(self) -> dict[str, Any]:
        """``pydvm info``'s ``descriptors``: the limit, the use, the strangers."""
        return {"limit": self.limit, "hard": self.hard, "open": open_descriptors(),
                "reserve": self.reserve, "unauthenticated": len(self._strangers),
                "at_limit": self._episode is not None, **self.counts}
