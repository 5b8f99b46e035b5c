"""The blocking framed connection: no asyncio, nothing but the protocol module.

Below both sides that talk blocking: the client (:mod:`pydvm.client`: the
data-store client, the job API) and ``pydvm run``'s tool
(:mod:`pydvm.cli.submit`); the runtime's asyncio channel is
:mod:`pydvm.wire`.  It imports :mod:`pydvm.protocol` alone, so that neither
the client nor the wire module needs the other.
"""

from __future__ import annotations

import os
import time
from _socket import MSG_DONTWAIT  # the C module: ``socket`` itself costs an import

TYPE_CHECKING = False  # (not typing's: importing typing costs every job process)
if TYPE_CHECKING:  # for type checkers and the API reference only
    import socket

from .protocol import BODY, HANDSHAKE_FRAME, MAX_FRAME, FrameDecoder, Message, pack, packb
from .seal import TAG

#: How long (µs) a blocking client polls for a reply before it sleeps in
#: ``recv`` (``PYDVM_CLIENT_SPIN_US``; 0: sleep at once).  On a virtual
#: machine whose CPUs idle between requests, waking a sleeping process costs
#: tens of µs -- as much as the whole round trip to a store on the same
#: host -- so a waiting caller that stays awake for about one round trip
#: answers sooner; past that it sleeps as before (a waiting lookup costs at
#: most this much CPU once).  MPI libraries poll for the same reason.
CLIENT_SPIN_US_DEFAULT = 100.0
#: After a poll that found nothing, the next waits sleep at once: one after
#: a single such poll, twice as many after each further one in a row, up to
#: this many; an answered poll starts the count again.  One late answer (a
#: hiccup of the peer or of the host) then costs one sleeping wait, while a
#: peer that keeps answering late -- more clients than cores -- is polled
#: about once per this many waits.
SPIN_BACKOFF_MAX = 256


#: How many reads (of up to 64 KiB) one :meth:`BlockingChannel.recv_available`
#: makes at most.  A peer may send faster than we decode (a job's output
#: flooding ``pydvm run`` on busy CPUs): reading until nothing is left
#: could then go on for seconds before the caller acts on any of it.
AVAILABLE_READS = 4


def _client_spin() -> float:
    """The spin window in seconds, from the environment (bad values: the default)."""
    text = os.environ.get("PYDVM_CLIENT_SPIN_US", "")
    try:
        us = float(text) if text.strip() else CLIENT_SPIN_US_DEFAULT
    except ValueError:
        us = CLIENT_SPIN_US_DEFAULT
    return max(0.0, min(us, 10_000.0)) / 1e6


class BlockingChannel:
    """A framed connection for synchronous code (the blocking client).

    Not thread-safe by itself: one thread sends at a time and one reads at
    a time (the client's :class:`pydvm.client.mux.Mux` sees to both).
    """

    def __init__(self, sock: socket.socket, max_frame: int = MAX_FRAME) -> None:
        self.sock = sock
        self._decoder = FrameDecoder(max_frame)
        self._queue: list[Message] = []
        self._timeout: float | None = sock.gettimeout()
        self.spin = _client_spin()
        #: waits left during which we sleep at once: set after a poll that
        #: found nothing (the peer is slow or the CPUs are oversubscribed, as
        #: with many clients per core; polling would only steal their time).
        self._sleepy = 0
        #: how many waits the next empty poll makes sleep (SPIN_BACKOFF_MAX)
        self._backoff = 1
        #: the link's keys once it is sealed (:meth:`seal`; None: clear frames).
        self.box = None

    def send(self, msg: Message) -> None:
        box = self.box
        if box is None:
            self.sock.sendall(pack(msg))
        elif BODY in msg:
            self.sock.sendall(box.sealer.frames(pack(msg)))
        else:
            self.sock.sendall(box.sealer.frame(packb(msg)))

    def frames(self, clear: bytes) -> bytes:
        """What to write for the clear frames ``clear``: themselves, or on a
        sealed link the same frames sealed (in the order they are sent)."""
        return clear if self.box is None else self.box.sealer.frames(clear)

    # -- the handshake -----------------------------------------------------------

    def gate(self) -> None:
        """Decode one frame at a time, each at most HANDSHAKE_FRAME long: the
        master's challenge, before we know whether what follows is sealed."""
        self._decoder.handshake = HANDSHAKE_FRAME

    def seal(self, box) -> None:
        """Seal the link from here on (:mod:`pydvm.seal`): every frame sent
        after this call, and every frame not yet decoded, with ``box``."""
        self.box = box
        self._decoder.open_with(box.opener.open, TAG)

    def ungate(self) -> None:
        """The handshake is answered: decode as frames come."""
        self._decoder.handshake = None

    def _buffered(self) -> list[Message]:
        """Frames the decoder holds already whole (left by the gate)."""
        return self._decoder.feed(b"") if self._decoder.pending_bytes else []

    def _poll(self) -> bytes | None:
        """Read without sleeping for up to :attr:`spin` seconds; None if
        nothing came (only on a blocking socket: one with a timeout would
        wait in ``poll`` instead).  A poll that comes back empty-handed
        makes the next waits sleep at once (:data:`SPIN_BACKOFF_MAX`)."""
        if not self.spin or self._timeout is not None:
            return None
        if self._sleepy:
            self._sleepy -= 1
            return None
        end = time.perf_counter() + self.spin
        while True:
            try:
                data = self.sock.recv(1 << 16, MSG_DONTWAIT)
            except BlockingIOError:
                if time.perf_counter() >= end:
                    self._sleepy = self._backoff
                    self._backoff = min(2 * self._backoff, SPIN_BACKOFF_MAX)
                    return None
            else:
                self._backoff = 1
                return data

    def recv(self, timeout: float | None = None) -> Message:
        """Next message; raises ConnectionError on EOF, socket.timeout on timeout."""
        if timeout != self._timeout:
            self.sock.settimeout(timeout)
            self._timeout = timeout
        if not self._queue and self._decoder.pending_bytes:
            self._queue.extend(self._buffered())
        while not self._queue:
            data = self._poll()
            if data is None:
                data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("server closed the connection")
            msgs = self._decoder.feed(data)
            if len(msgs) == 1:
                return msgs[0]  # the usual case: one answer, nothing queued
            self._queue.extend(msgs)
        return self._queue.pop(0)

    def recv_ready(self) -> list[Message]:
        """Every message already received, without waiting for more (an
        empty list if none).  Raises ConnectionError at end of file (what
        came before it stays queued)."""
        out, eof = self.recv_available()
        if eof:
            self._queue[:0] = out
            raise ConnectionError("server closed the connection")
        return out

    def recv_available(self) -> tuple[list[Message], bool]:
        """Every message already received, without waiting for more, and
        whether the peer has closed the connection after them (unlike
        :meth:`recv_ready`, what came before an end of file is kept: a
        refusal, or a last answer, is often followed by the close).  At most
        :data:`AVAILABLE_READS` reads: what is left stays readable for the
        next call.
        Raises FrameError on bytes that are not frames, OSError on a reset."""
        if self._timeout is not None:
            # a socket with a timeout would wait for data despite MSG_DONTWAIT
            self.sock.settimeout(None)
            self._timeout = None
        eof = False
        self._queue.extend(self._buffered())
        for _ in range(AVAILABLE_READS):
            try:
                data = self.sock.recv(1 << 16, MSG_DONTWAIT)
            except BlockingIOError:
                break
            if not data:
                eof = True
                break
            self._queue.extend(self._decoder.feed(data))
        out, self._queue = self._queue, []
        return out, eof

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
