"""The wire: length-prefixed msgpack frames, and the connections that carry them.

Every connection in a DVM (client <-> daemon over a Unix socket, daemon and
tool <-> master over TCP) carries the same frames::

    +-------------------+---------------------------------+
    | length: u32, BE   | msgpack map, length bytes       |
    +-------------------+---------------------------------+

Each map has ``"t"``, its message type.  Requests carry ``"id"``, an integer
chosen by the sender and unique among its outstanding requests; the answer is
``{"t": "reply", "id": <same>, "status": <PMIx status>, "msg": str, ...}``.
Every request gets exactly one reply, including refusals of malformed or
unknown requests; a connection that breaks answers all of its outstanding
requests locally with ``PMIX_ERR_UNREACH`` (see :class:`Channel`).

Frame errors (an oversized length, a body that is not a msgpack map with a
string ``"t"``) cannot be answered reliably, so the receiver logs the reason,
sends an ``error`` frame when it can and closes the connection.  Other
connections are unaffected.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import socket
import struct
import termios
import time
from typing import Any, Callable


from .errors import Status
from .seal import TAG, SealError
from .stalls import STALL_MIN, stalls
from .protocol import (  # noqa: F401 (the frame codec: re-exported for the runtime)
    BODY, ENVELOPE, EXT_TYPED, HANDSHAKE_FRAME, HEADER, MAX_FRAME, FrameDecoder, FrameError,
    Message, ReplyCallback, Typed, frame_of, pack, pack_parts, pack_payload, packb, reply,
    unpack_body, unpack_payload, unpackb,
)

log = logging.getLogger("pydvm.wire")

def refuse(ch: "Channel", msg: Message, status: Status, text: str) -> None:
    """Answer request ``msg`` with a refusal -- unless it is itself an answer.

    A stray ``reply``/``error`` (a late reply whose request was forgotten, or
    a forged one) is never answered: two peers answering each other's
    unknown replies would bounce them forever.
    """
    if msg.get("t") in ("reply", "error"):
        log.debug("%s: dropped a %s to no request (id %r)", ch.name, msg.get("t"), msg.get("id"))
        return
    ch.send(reply(msg.get("id"), status, text))


class Requests:
    """Request/reply bookkeeping shared by :class:`Channel` and :class:`LocalEnd`.

    A subclass provides ``name``, ``closed``, ``send(msg)`` and the two
    texts of the locally made UNREACH replies (``_closed_text`` when a
    request is made on a closed link, ``_lost_text`` when the link ends with
    requests outstanding; both formatted with ``name`` and ``reason``).
    """

    name: str
    closed: bool
    _closed_text = "connection to {name} is closed"
    _lost_text = "connection to {name} lost: {reason}"

    def _init_requests(self) -> None:
        self._pending: dict[int, ReplyCallback] = {}
        self._next_id = 0

    def send(self, msg: Message) -> None:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    def request(self, msg: Message, callback: ReplyCallback) -> int | None:
        """Send ``msg`` with a fresh ``id``; ``callback`` gets the reply.

        Returns the id, or None if the link is closed -- then ``callback``
        has already run with an UNREACH reply.
        """
        self._next_id += 1
        rid = self._next_id
        msg["id"] = rid
        if self.closed:
            callback(reply(rid, Status.ERR_UNREACH, self._closed_text.format(name=self.name)))
            return None
        self._pending[rid] = callback
        self.send(msg)
        return rid

    def forget(self, rid: int) -> None:
        """Stop waiting for the reply to ``rid`` (it will be ignored)."""
        self._pending.pop(rid, None)

    def withdraw(self, rid: int | None) -> None:
        """Give up on request ``rid``: forget it here and tell the peer to
        drop it (``cancel``), so a parked lookup leaves the store."""
        if rid is None or rid not in self._pending:
            return
        self.forget(rid)
        self.send({"t": "cancel", "ref": rid})

    async def call(self, msg: Message, timeout: float | None = None) -> Message:
        """Awaitable :meth:`request`; a timeout yields a TIMEOUT reply."""
        fut = asyncio.get_running_loop().create_future()

        def done(r: Message) -> None:
            if not fut.done():
                fut.set_result(r)

        rid = self.request(msg, done)
        try:
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            self.withdraw(rid)
            return reply(rid, Status.ERR_TIMEOUT, f"no reply from {self.name} in {timeout}s")
        except asyncio.CancelledError:
            # The caller gave up (task cancelled): nothing may stay behind,
            # here or at the peer -- a waiting lookup would stay parked.
            self.withdraw(rid)
            raise

    def _take_reply(self, msg: Message) -> bool:
        """Run the callback waiting for reply ``msg``; False if none waits."""
        rid = msg.get("id")
        cb = self._pending.pop(rid, None) if _hashable(rid) else None
        if cb is None:
            return False
        cb(msg)
        return True

    def _fail_pending(self, reason: str) -> None:
        """Answer every outstanding request UNREACH (the link has ended)."""
        pending, self._pending = self._pending, {}
        for rid, cb in pending.items():
            try:
                cb(reply(rid, Status.ERR_UNREACH,
                         self._lost_text.format(name=self.name, reason=reason)))
            except Exception:
                log.exception("%s: reply callback failed", self.name)


class Channel(Requests, asyncio.Protocol):
    """One framed connection, with request/reply bookkeeping.

    ``on_message(channel, msg)`` receives every frame that is not a reply to
    one of our own requests; it runs synchronously in the event loop.
    ``on_close(channel, reason)`` runs once when the connection ends.

    :meth:`request` sends a request and arranges for ``callback(reply)`` to
    run when the reply arrives -- or, if the connection ends first, with a
    locally made ``PMIX_ERR_UNREACH`` reply, so no caller is left hanging.
    """

    def __init__(
        self,
        on_message: Callable[["Channel", Message], None],
        on_close: Callable[["Channel", str], None] | None = None,
        *,
        name: str = "?",
        max_frame: int = MAX_FRAME,
    ) -> None:
        self.on_message = on_message
        self.on_close = on_close
        self.name = name
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.close_reason = ""
        #: the peer session (runtime/shared/peers.py) once the peer is accepted.
        self.session: Any = None
        #: True while the transport's write buffer is over its high-water
        #: mark (the peer reads slower than we write); see on_drain.
        self.write_paused = False
        self._drain_waiters: list[Callable[[], None]] = []
        self._send_capped = False
        self._decoder = FrameDecoder(max_frame)
        #: the listening side's door while this connection is a stranger's (see gate).
        self.door: Any = None
        #: the link's keys once it is sealed (:meth:`seal`; None: clear frames).
        self.box: Any = None
        #: "HOST:PORT" of a TCP peer ("" for a Unix socket), for log lines.
        self.address = ""
        #: True once a sealed frame from the peer failed to open (the link
        #: closed for it): what ``pydvm info`` counts.
        self.seal_failed = False
        self._init_requests()
        self._closed_waiter: asyncio.Future | None = None
        #: time.monotonic() of the last bytes received (for heartbeats).
        self.last_rx = time.monotonic()

    # -- asyncio.Protocol ---------------------------------------------------

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self.transport = transport
        self._tcp_option(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            self.address = f"[{peer[0]}]:{peer[1]}" if ":" in str(peer[0]) else \
                f"{peer[0]}:{peer[1]}"

    @property
    def peer_host(self) -> str:
        """The TCP peer's address ("" on a Unix socket)."""
        peer = self.transport.get_extra_info("peername") if self.transport else None
        return str(peer[0]) if isinstance(peer, tuple) and peer else ""

    @property
    def sealed(self) -> bool:
        return self.box is not None

    def seal(self, box: Any) -> None:
        """Seal the link from here on (:mod:`pydvm.seal`): every frame sent
        after this call, and every frame received after the one being
        handled -- those already buffered too --, is sealed with ``box``."""
        self.box = box
        self._decoder.open_with(box.opener.open, TAG)

    def _tcp_option(self, level: int, name: int, value: int) -> None:
        """Set a socket option if this connection is TCP (best effort)."""
        sock = self.transport.get_extra_info("socket") if self.transport is not None else None
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(level, name, value)
            except OSError:
                pass

    def data_received(self, data: bytes) -> None:
        if _loop_poll is not None:
            _loop_poll.arm()
        if self.closed:
            return
        self.last_rx = time.monotonic()
        decoder = self._decoder
        while True:
            gated = decoder.handshake is not None
            try:
                messages = decoder.feed(data)
                bad = None
            except FrameError as exc:
                messages, bad = exc.messages, exc
            self._dispatch(messages)
            if bad is not None and not self.closed:
                self._bad_stream(bad)
                return
            if not gated or not messages or self.closed:
                return
            # Gated (a stranger's connection, or ours before the challenge is
            # answered): one frame at a time, until the handshake gave the
            # peer its session -- so that a frame after the one that seals
            # the link is read sealed.
            if self.session is not None and decoder.handshake is not None:
                decoder.handshake = None
                if self.door is not None:
                    door, self.door = self.door, None
                    door.admitted(self)
            data = b""

    def _bad_stream(self, bad: FrameError) -> None:
        """The peer's bytes cannot be read as frames any more: close, with
        one log line naming the peer."""
        if isinstance(bad, SealError):
            self.seal_failed = True
            where = f" from {self.address}" if self.address else ""
            # No answer: the stream is not the peer's any more (an answer
            # would go, sealed, to whoever tampered with it too).
            self.close(f"sealed link broken{where}: {bad}", error=True)
            return
        self.send_error(Status.ERR_BAD_PARAM, str(bad))
        self.close(f"protocol error: {bad}", error=True)

    def gate(self, limit: int, door: Any = None) -> None:
        """Read at most ``limit`` bytes a frame, one frame at a time, until
        the peer has a session (its handshake was accepted): what a listening
        socket does for a peer it does not know yet.  ``door`` (the process's
        :class:`~pydvm.runtime.shared.door.Door`) hears ``admitted(ch)`` then, and
        ``forget(ch)`` when the connection ends."""
        self._decoder.handshake = limit
        self.door = door

    def _dispatch(self, messages: list[Message]) -> None:
        for msg in messages:
            if self.closed:
                return
            if msg["t"] == "reply" and self._take_reply(msg):
                continue
            # Anything else -- including a reply to no request of ours (a
            # forgotten or forged id) -- goes to the handler, which must
            # answer through refuse() so that answers are never answered.
            try:
                self.on_message(self, msg)
            except Exception:  # a handler bug must not take the connection's peers down
                log.exception("%s: handler failed on %r message", self.name, msg.get("t"))
                refuse(self, msg, Status.ERR_BAD_PARAM, "internal error")

    def cap_send_buffer(self, nbytes: int) -> None:
        """Let the kernel hold at most about ``nbytes`` of what we send
        (SO_SNDBUF; Linux counts its overhead in, doubling the figure), once:
        the first call on a TCP connection sets it, later ones do nothing.
        TCP would otherwise grow the buffer to megabytes for a stream the
        peer reads slowly -- megabytes of a job's output still to come out
        of a ``pydvm run`` that was told to stop."""
        if self._send_capped or self.transport is None:
            return
        self._send_capped = True
        self._tcp_option(socket.SOL_SOCKET, socket.SO_SNDBUF, nbytes)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        waiters, self._drain_waiters = self._drain_waiters, []
        for fn in waiters:
            try:
                fn()
            except Exception:
                log.exception("%s: drain callback failed", self.name)

    def on_drain(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` once the peer has caught up, or is gone (at once if so).

        This is how output flow control is applied end to end: whoever
        feeds this channel holds back its next credit until the peer reads.
        A peer that went away will read nothing more, so nothing should be
        held back for it: its waiters run when the channel closes.
        """
        if self.closed or not self.write_paused:
            fn()
        else:
            self._drain_waiters.append(fn)

    def eof_received(self) -> bool | None:
        if self._decoder.pending_bytes:
            self.close(f"connection ended inside a frame ({self._decoder.pending_bytes} bytes)",
                       error=True)
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish(self.close_reason or (f"connection lost: {exc}" if exc else "peer closed"))

    # -- sending --------------------------------------------------------------

    def send(self, msg: Message) -> None:
        if self.closed or self.transport is None:
            return
        box = self.box
        if box is not None:
            if BODY in msg:
                body = b"".join(pack_parts(msg)[1:])
            else:
                body = packb(msg)
            self._send_sealed(box, body)
        elif BODY in msg:
            self.transport.writelines(pack_parts(msg))
        else:
            self.transport.write(pack(msg))

    def send_raw(self, body) -> None:
        """Send an already-encoded frame body (an answer a router passes on)."""
        if self.closed or self.transport is None:
            return
        if self.box is not None:
            self._send_sealed(self.box, body)
        else:
            self.transport.writelines([HEADER.pack(len(body)), body])

    def _send_sealed(self, box: Any, body) -> None:
        try:
            header, sealed = box.sealer.seal(body)
        except SealError as exc:  # 2^64 frames: the link must end
            self.close(str(exc), error=True)
            return
        if len(sealed) < 16384:
            self.transport.write(header + sealed)  # one buffer: one segment for a request
        else:
            self.transport.writelines([header, sealed])

    def send_error(self, status: Status, text: str) -> None:
        self.send({"t": "error", "status": int(status), "msg": text})

    # -- closing ----------------------------------------------------------------

    def close(self, reason: str = "closed", *, error: bool = False) -> None:
        """Close the connection; ``error`` logs ``reason`` as a warning.

        Every close for cause (bad frames, refused handshakes, lost
        heartbeats) passes ``error=True``, so the reason is in the log.
        """
        if self.closed:
            return
        if error:
            log.warning("%s: closed: %s", self.name, reason)
        self.close_reason = reason
        if self.transport is not None:
            self.transport.close()
        self._finish(reason)

    def _finish(self, reason: str) -> None:
        if not self.closed:
            self.closed = True
            self.close_reason = reason
        if self.door is not None:
            door, self.door = self.door, None
            door.forget(self)
        self.write_paused = False
        self.resume_writing()  # nothing will be read any more: release every waiter
        self._fail_pending(reason)
        if self.on_close is not None:
            on_close, self.on_close = self.on_close, None
            on_close(self, reason)
        if self._closed_waiter is not None and not self._closed_waiter.done():
            self._closed_waiter.set_result(reason)

    async def wait_closed(self) -> str:
        if self.closed:
            return self.close_reason
        if self._closed_waiter is None:
            self._closed_waiter = asyncio.get_running_loop().create_future()
        return await self._closed_waiter


class LocalEnd(Requests):
    """One end of an in-process link: the :class:`Channel` interface without a socket.

    The master serves its own node with the same node-serving component a
    daemon process runs (:class:`pydvm.runtime.node.server.NodeServer`); the two
    talk over a :func:`local_pair` instead of TCP.  Messages are delivered
    on the next loop iteration, in order, as shallow copies (no encoding;
    the receiver may keep or change what it gets).  ``local`` tells
    heartbeats to leave the link alone: it cannot go silent.
    """

    local = True
    write_paused = False
    _closed_text = "link {name} is closed"
    _lost_text = "link {name} closed: {reason}"

    def __init__(self, name: str) -> None:
        self.name = name
        self.peer_end: "LocalEnd | None" = None
        self.on_message: Callable[["LocalEnd", Message], None] = lambda ch, m: None
        self.on_close: Callable[["LocalEnd", str], None] | None = None
        self.session: Any = None
        self.closed = False
        self.close_reason = ""
        self.last_rx = time.monotonic()
        self._init_requests()
        self._loop = asyncio.get_running_loop()

    def send(self, msg: Message) -> None:
        peer = self.peer_end
        if self.closed or peer is None:
            return
        self._loop.call_soon(peer._deliver, dict(msg))

    def send_raw(self, body) -> None:
        self.send(unpack_body(bytes(body)))

    def _deliver(self, msg: Message) -> None:
        if self.closed:
            return
        self.last_rx = time.monotonic()
        if msg.get("t") == "reply" and self._take_reply(msg):
            return
        try:
            self.on_message(self, msg)
        except Exception:
            log.exception("%s: handler failed on %r message", self.name, msg.get("t"))
            refuse(self, msg, Status.ERR_BAD_PARAM, "internal error")  # type: ignore[arg-type]

    def on_drain(self, fn: Callable[[], None]) -> None:
        fn()

    def close(self, reason: str = "closed", *, error: bool = False) -> None:
        """Close both ends (each answers its outstanding requests UNREACH)."""
        if self.closed:
            return
        if error:
            log.warning("%s: closed: %s", self.name, reason)
        self._finish(reason)
        peer = self.peer_end
        if peer is not None and not peer.closed:
            self._loop.call_soon(peer._finish, reason)

    def _finish(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        self.close_reason = reason
        self._fail_pending(reason)
        if self.on_close is not None:
            on_close, self.on_close = self.on_close, None
            on_close(self, reason)


def local_pair(name_a: str, name_b: str) -> tuple[LocalEnd, LocalEnd]:
    """Two connected :class:`LocalEnd` objects (must be made inside a running loop)."""
    a, b = LocalEnd(name_a), LocalEnd(name_b)
    a.peer_end, b.peer_end = b, a
    return a, b


async def heartbeat(channels: Callable[[], list[Channel]], interval: float,
                    *, ask: bool = False, grace: float | None = None,
                    torpid: Callable[[Channel, float | None], None] | None = None) -> None:
    """Ping every channel each ``interval`` seconds; close those silent for 3.

    Both ends of a master-daemon link run this, so each notices a dead or
    unreachable peer within about three periods even when TCP does not.
    With ``ask`` the ping is a request the peer must answer: for links whose
    other end does not ping back by itself (a relay's link to its data
    server, whose master treats it as a tool).

    Only the time this process was running counts as a peer's silence:

    * the loop's own lateness shows a stall of this process (its timer woke
      more than a period, at most a second, after it was due): the stall is
      recorded (:mod:`pydvm.stalls`) and no silence accrues during it --
      a whole machine that stopped and woke again condemns nobody;
    * a peer whose bytes wait unread on the socket is not silent: they
      are read before it is judged again.

    With ``grace`` (seconds, more than three periods) a silent peer is first
    *torpid*: ``torpid(ch, silent)`` is called once when it passes three
    periods, ``torpid(ch, None)`` if it is heard again; it is closed only
    when silent for ``grace``.
    """
    threshold = min(interval, STALL_MIN)
    quiet: set[Channel] = set()
    due = time.monotonic() + interval
    while True:
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        now = time.monotonic()
        stalls.check(due, now, threshold)
        due = now + interval
        judge(channels(), now, interval, ask=ask, grace=grace, torpid=torpid, quiet=quiet)


def judge(channels: list[Channel], now: float, interval: float, *, ask: bool = False,
          grace: float | None = None,
          torpid: Callable[[Channel, float | None], None] | None = None,
          quiet: set | None = None) -> None:
    """One period of :func:`heartbeat`: judge each channel's silence at
    ``now`` (without this process's recorded stalls), close the lost, ping
    the rest.  ``quiet`` holds the channels reported torpid (kept by the
    caller from one period to the next)."""
    bound = 3 * interval
    lost_after = max(bound, grace or 0.0)
    quiet = set() if quiet is None else quiet
    stalled = stalls.within if stalls.spans else None  # (none recorded: nothing to take off)
    for ch in channels:
        if ch.closed or getattr(ch, "local", False):
            continue
        since = ch.last_rx
        silent = now - since
        if stalled is not None:
            silent -= stalled(since, now)
        if silent > bound and _unread(ch) > 0:
            silent = 0.0  # it spoke: the loop reads it before the next judgement
        if silent > lost_after:
            quiet.discard(ch)
            ch.close(f"no heartbeat from {ch.name} for {silent:.1f}s", error=True)
            continue
        if torpid is not None:
            if silent > bound and ch not in quiet:
                quiet.add(ch)
                torpid(ch, silent)
            elif silent <= bound and ch in quiet:
                quiet.discard(ch)
                torpid(ch, None)
        if ask:
            ch.request({"t": "ping"}, _pong)
        else:
            ch.send({"t": "ping"})
    for ch in [ch for ch in quiet if ch.closed]:
        quiet.discard(ch)


def _unread(ch: Any) -> int:
    """Bytes the kernel holds for ``ch`` that the loop has not read yet (0
    if unknown: an in-process link, a closed one)."""
    transport = getattr(ch, "transport", None)
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return 0
    try:
        got = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except (OSError, ValueError):
        return 0
    return struct.unpack("i", got)[0]


def _pong(msg: Message) -> None:
    pass  # receiving it refreshed last_rx; an UNREACH made up locally needs nothing


def _hashable(value: Any) -> bool:
    return isinstance(value, (int, str)) and not isinstance(value, bool)


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)


class LoopPoll:
    """Keeps an event loop polling, rather than sleeping, for ``seconds``
    after each message it receives.

    A server whose loop sleeps in ``epoll_wait`` between requests pays a
    wake-up for each one; on a virtual machine whose CPUs halt when idle that
    costs tens of µs, more than serving the request.  While armed, a
    callback re-schedules itself, so the loop polls its sockets without
    blocking and a request that arrives within the window is read at once.
    Each turn yields the CPU (``sched_yield``) to any other runnable process,
    and the window ends ``seconds`` after the last message: a server at rest
    costs nothing, a busy one at most ``seconds`` of CPU per request.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, seconds: float) -> None:
        self.loop = loop
        self.seconds = seconds
        self._until = 0.0
        self._armed = False

    def arm(self) -> None:
        if asyncio._get_running_loop() is not self.loop:
            return  # another loop of this process (an in-process client, a test)
        self._until = time.perf_counter() + self.seconds
        if not self._armed:
            self._armed = True
            self.loop.call_soon(self._turn)

    def _turn(self) -> None:
        os.sched_yield()
        if time.perf_counter() < self._until:
            self.loop.call_soon(self._turn)
        else:
            self._armed = False


_loop_poll: LoopPoll | None = None


def poll_after_messages(loop: asyncio.AbstractEventLoop, microseconds: float) -> LoopPoll | None:
    """Make every :class:`Channel` of this process arm a :class:`LoopPoll`
    of ``microseconds`` on ``loop`` (the master does, ``pydvm_master_poll_us``).
    0, or a machine where this process may use only one CPU, turns it off:
    there the poll would only delay the peer it waits for.  Returns the poll
    (None: off); call :func:`stop_polling` when the loop ends."""
    global _loop_poll
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    _loop_poll = LoopPoll(loop, microseconds / 1e6) if microseconds > 0 and cpus > 1 else None
    return _loop_poll


def stop_polling() -> None:
    global _loop_poll
    _loop_poll = None

