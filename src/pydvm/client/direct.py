"""The client's side of the direct data path (see :mod:`pydvm.runtime.master.direct`).

A client on a daemon's node whose daemon handed it a credential
(``PYDVM_DIRECT_CRED``, put there at launch) and named the master in its
hello reply (``direct``) sends the requests the routing table
(:func:`pydvm.runtime.shared.dataops.stores_for`) gives to the master store
straight to the master, on one connection opened on the first such
request: the master's direct-data Unix socket when the daemon offered one
(the master runs on this machine), else its TCP port.  Everything else
keeps going to the daemon.

* the master unreachable when the connection is first opened: logged at
  debug level, and this client uses the daemon path from then on;
* the master refuses the credential: the request fails with that refusal
  (``NoPermissionsError``) -- never silently retried another way;
* the daemon has dropped this client (its process was reaped): nothing is
  opened; the request fails ``UnreachableError`` as on the daemon path;
* a direct connection once open and then lost: the request fails
  ``UnreachableError`` and so does every later one that needs it (the
  master closes it when the process has ended).

Only a process running as the uid/gid its credential names uses it (a
process that changed user falls back to the daemon, which reads its real
peer credentials).
"""

from __future__ import annotations

import os

from ..channel import BlockingChannel
from ..errors import PMIxError, Status, UnreachableError, error_for
from ..protocol import (CLIENT_ROLE, HANDSHAKE_FRAME, MASTER, NODE, Credential, DvmUri,
                        FrameError, Message, UriError, pack, stores_for, token_from_env)
from ..seal import MODES, Answer, SealError, is_loopback, must_seal

TYPE_CHECKING = False  # (not typing's: importing typing costs every job process)
if TYPE_CHECKING:  # for type checkers and the API reference only
    import socket
    from typing import Any

    from ..wire import Channel


class _LazyLog:
    """The client's logger, imported on first use: a job process that never
    logs does not pay for importing ``logging``."""

    def __getattr__(self, name: str):
        import logging
        return getattr(logging.getLogger("pydvm.client"), name)


log = _LazyLog()

#: Seconds to open and authenticate the direct connection before giving up
#: on it (then the daemon path is used).
CONNECT_TIMEOUT = 5.0

UNUSED, OPEN, OFF, LOST = "unused", "open", "off", "lost"


def master_part(t: str, rng: Any) -> tuple[bool, bool]:
    """(goes to the master, also to the node store) for a request."""
    stores = stores_for(t, rng)
    return MASTER in stores, NODE in stores


class DirectInfo:
    """Where and as what this client may connect directly (``uri`` None:
    it may not), or why its credential is unusable (``problem``)."""

    def __init__(self, uri: DvmUri | None, cred: Credential | None, nspace: str, rank: int,
                 problem: str = "", unix: str = "", seal_mode: str = "network") -> None:
        self.uri, self.cred = uri, cred
        self.nspace, self.rank = nspace, rank
        self.problem = problem
        #: the master's direct-data Unix socket ("": connect over TCP).
        self.unix = unix
        #: which TCP links the DVM seals (``pydvm_seal``, from the daemon).
        self.seal_mode = seal_mode

    @classmethod
    def from_hello(cls, hello: Message, nspace: str, rank: int) -> "DirectInfo":
        """From the daemon's hello reply (``direct``: the master's URI, when
        the node vouches for its processes) and this process's environment."""
        where = hello.get("direct")
        token = token_from_env()
        if not isinstance(where, str) or token is None:
            return cls(None, None, nspace, rank)  # head node, or direct data off
        if os.environ.get("PYDVM_NSPACE") != nspace or os.environ.get("PYDVM_RANK") != str(rank):
            return cls(None, None, nspace, rank)  # the credential is not for this identity
        unix = hello.get("direct_unix")
        mode = hello.get("direct_seal")
        try:
            info = cls(DvmUri.parse(where), Credential.parse(token), nspace, rank,
                       unix=unix if isinstance(unix, str) else "",
                       seal_mode=mode if mode in MODES else "network")
        except (UriError, ValueError) as exc:
            return cls(None, None, nspace, rank,
                       f"unusable direct-data credential in the environment: {exc}")
        if (info.cred.uid, info.cred.gid) != (os.getuid(), os.getgid()):
            log.debug("running as uid %d gid %d, not as launched: direct data not used",
                      os.getuid(), os.getgid())
            info.uri = None
        return info

    @property
    def usable(self) -> bool:
        return self.uri is not None or bool(self.problem)

    def auth(self, challenge: Message) -> Message:
        """The answer to the master's challenge (raises ConnectionError if it is none)."""
        if challenge.get("t") != "challenge" or not isinstance(challenge.get("nonce"), bytes):
            raise ConnectionError("master sent no challenge")
        if challenge.get("dvm") != self.uri.dvmid:
            raise ConnectionError(f"{self.uri.host}:{self.uri.port} is DVM "
                                  f"{challenge.get('dvm')}, not {self.uri.dvmid}")
        return {"t": "auth", "id": 0,
                **self.cred.answer(challenge["nonce"], self.nspace, self.rank)}

    def seal_answer(self, challenge: Message, peer_host: str) -> Answer:
        """The sealing side of our answer to ``challenge`` on a link to
        ``peer_host`` (the master's address; "" on the Unix socket): whether
        the link is sealed, our key share.  SealError if the master offers a
        clear link where the DVM seals its links."""
        c = self.cred
        need = bool(peer_host) and must_seal(self.seal_mode, is_loopback(peer_host))
        return Answer(challenge, dvm=self.uri.dvmid, role=CLIENT_ROLE, secret=None,
                      need_seal=need, where=f"master {self.uri.host}:{self.uri.port}",
                      extra={"cred": [self.nspace, self.rank, c.node, c.uid, c.gid, c.app,
                                      c.session, c.nonce]})

    def refused(self, r: Message) -> PMIxError:
        try:
            st = Status(r.get("status"))
        except ValueError:
            st = Status.ERR_NO_PERMISSIONS
        return error_for(st, f"the master refused a direct connection: {r.get('msg') or ''}")


def open_blocking(info: DirectInfo) -> BlockingChannel | None:
    """Open and authenticate the direct connection; None if the master
    cannot be reached (the caller falls back to the daemon).  Raises the
    master's refusal, or NoPermissionsError for an unusable credential."""
    if info.problem:
        raise error_for(Status.ERR_NO_PERMISSIONS, info.problem)
    import socket  # at the first direct connection, not at ``import pydvm``
    sock = _connect_unix(info.unix) if info.unix else None
    if sock is None:
        try:
            sock = socket.create_connection((info.uri.host, info.uri.port), CONNECT_TIMEOUT)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as exc:
            log.debug("direct data: cannot reach the master at %s: %s; using the daemon",
                      info.uri, exc)
            return None
    try:
        ch = BlockingChannel(sock)
        ch.gate()  # the challenge alone, until we know whether the rest is sealed
        challenge = ch.recv(CONNECT_TIMEOUT)
        auth = info.auth(challenge)
        hello = info.seal_answer(challenge, _peer_host(sock))
        if hello.sealed:
            sock.sendall(pack(hello.message))
            ch.seal(hello.box(info.cred.key))
        ch.ungate()
        ch.send(auth)
        r = ch.recv(CONNECT_TIMEOUT)
        if r.get("status") != 0:
            raise info.refused(r)
        return ch
    except PMIxError:
        sock.close()
        raise
    except SealError as exc:
        sock.close()
        log.warning("direct data: refused the master at %s: %s; using the daemon", info.uri, exc)
        return None
    except (OSError, ConnectionError, ValueError, FrameError) as exc:
        sock.close()
        log.debug("direct data: no handshake with the master at %s: %s; using the daemon",
                  info.uri, exc)
        return None


async def open_async(info: DirectInfo) -> "Channel | None":
    """:func:`open_blocking` for the asyncio client."""
    import asyncio

    from ..wire import Channel
    if info.problem:
        raise error_for(Status.ERR_NO_PERMISSIONS, info.problem)
    loop = asyncio.get_running_loop()
    first: asyncio.Future = loop.create_future()

    def on_first(ch: Channel, msg: Message) -> None:
        if first.done():
            return
        # The challenge, answered before another frame is read: what follows
        # it is read sealed when the link is.
        try:
            hello = info.seal_answer(msg, ch.peer_host)
            if hello.sealed:
                ch.send(hello.message)
                ch.seal(hello.box(info.cred.key))
        except SealError as exc:
            first.set_exception(exc)
            ch.close(f"handshake refused: {exc}")
            return
        ch._decoder.handshake = None
        first.set_result(msg)

    def closed(ch: Channel, reason: str) -> None:
        if not first.done():
            first.set_exception(ConnectionError(f"master closed: {reason}"))

    def gated(name: str) -> Channel:
        ch = Channel(on_first, closed, name=name)
        ch.gate(HANDSHAKE_FRAME)  # the challenge alone, until it is answered
        return ch

    ch = None
    if info.unix:
        try:
            _, ch = await asyncio.wait_for(loop.create_unix_connection(
                lambda: gated(f"master {info.unix}"), info.unix), CONNECT_TIMEOUT)
        except (OSError, asyncio.TimeoutError) as exc:
            log.debug("direct data: cannot connect to %s: %s; trying TCP", info.unix, exc)
    if ch is None:
        try:
            _, ch = await asyncio.wait_for(loop.create_connection(
                lambda: gated(f"master {info.uri.host}:{info.uri.port}"),
                info.uri.host, info.uri.port), CONNECT_TIMEOUT)
        except (OSError, asyncio.TimeoutError) as exc:
            log.debug("direct data: cannot reach the master at %s: %s; using the daemon",
                      info.uri, exc)
            return None
    try:
        challenge = await asyncio.wait_for(first, CONNECT_TIMEOUT)
        ch.on_message = _ignore
        auth = info.auth(challenge)
        del auth["id"]
        r = await ch.call(auth, CONNECT_TIMEOUT)
    except SealError as exc:
        ch.close("handshake refused")
        log.warning("direct data: refused the master at %s: %s; using the daemon", info.uri, exc)
        return None
    except (ConnectionError, asyncio.TimeoutError) as exc:
        ch.close("handshake failed")
        log.debug("direct data: no handshake with the master at %s: %s; using the daemon",
                  info.uri, exc)
        return None
    if r.get("status") != 0:
        ch.close("refused")
        raise info.refused(r)
    return ch


def _peer_host(sock: "socket.socket") -> str:
    """The address ``sock`` is connected to ("" for a Unix socket)."""
    try:
        peer = sock.getpeername()
    except OSError:
        return ""
    return str(peer[0]) if isinstance(peer, tuple) else ""


def _connect_unix(path: str) -> "socket.socket | None":
    """A connection to the master's direct-data Unix socket; None (logged at
    debug level) if it cannot be made: then TCP is tried."""
    import socket
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(CONNECT_TIMEOUT)
    try:
        sock.connect(path)
    except OSError as exc:
        sock.close()
        log.debug("direct data: cannot connect to %s: %s; trying TCP", path, exc)
        return None
    return sock


def socket_open(sock: "socket.socket") -> bool:
    """False once the peer has closed ``sock`` (the daemon dropped this
    client: its process was reaped).  Never blocks, never consumes data."""
    import select
    import socket
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return True
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except BlockingIOError:
        return True
    except (OSError, ValueError):
        return False


def daemon_gone() -> UnreachableError:
    return UnreachableError("daemon dropped the connection")


def _ignore(ch: "Channel", msg: Message) -> None:
    pass
