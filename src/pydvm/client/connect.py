"""How to reach a DVM's master as a tool: the URI, the socket, the handshake, the errors.

Both blocking programs that talk to a master connect here: ``pydvm run``
against a persistent DVM (:mod:`pydvm.cli.submit`, which watches its
signals meanwhile) and the job API (:mod:`pydvm.client.jobs`, through
:mod:`pydvm.client.jobconn`).  A tool gets in with the DVM's secret (a
MAC of the master's challenge) if this user has it, else through a
multi-user DVM's tool socket, where the master reads who it is from the
socket.  With the secret it first checks the challenge is signed with it,
and when the master says the link is sealed (:mod:`pydvm.seal`: a link
between machines, by default) it sends its key share and everything from
its auth on sealed (:func:`answer`).

What fails is a :class:`DvmError`, whose message is meant for the user;
:class:`DvmUnreachable` when nobody answers at the URI (the command line
calls the first ``ToolError``, its old name).  Like the rest of the client
it loads neither asyncio nor anything of the runtime: a ``pydvm run``
starts as fast as the interpreter allows.
"""

from __future__ import annotations

import errno
import os
import select
import time
import _socket  # the C module: ``socket`` wraps it in enums, which costs an import

from ..protocol import (HANDSHAKE_FRAME, HANDSHAKE_TIMEOUT, DvmUri, FrameDecoder, FrameError,
                        UriError, mac, pack, read_secret, tool_socket_name)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: How to start a DVM, as every "no DVM here" message says it.
START_HINT = "export PYDVM_URI=$(pydvm start --daemonize)"

#: SO_RCVBUF of a connection to the master over TCP (the kernel doubles
#: it).  Left to autotuning, a ``pydvm run`` whose reader is slow lets its
#: receive buffer grow to megabytes of a job's output, on top of the output
#: window -- still to be written after a Ctrl-C.  The master caps its side
#: too (``runtime/master/toolreqs.py``, OUTPUT_SEND_BUFFER).
RECV_BUFFER = 256 * 1024

#: What ``poll`` watches for on a socket or pipe that is read.
POLL_IN = select.POLLIN | select.POLLPRI


class DvmError(RuntimeError):
    """A request to a DVM failed, or the DVM could not be reached; the
    message is meant for the user.  (The command line's ``ToolError``.)"""


class DvmUnreachable(DvmError):
    """No DVM answers at the URI (nothing listens there, or this user has no
    credentials for it): the URI is probably stale.  The command line
    explains what to do (:func:`pydvm.cli.dvms.unreachable_lines`)."""

    def __init__(self, uri: DvmUri, why: str) -> None:
        super().__init__(why)
        self.uri = uri


class Interrupted(Exception):
    """A signal came while connecting (one of the ``signals`` a caller
    watches): nothing was submitted, there is nothing to kill."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def resolve_uri(text: str | None) -> DvmUri:
    """The DVM named by ``text``, else by ``PYDVM_URI``; DvmError if neither
    names one, UriError if it is not a URI."""
    text = text or os.environ.get("PYDVM_URI")
    if not text:
        raise DvmError("no DVM given: use --dvm URI or set PYDVM_URI ('pydvm dvms' lists your "
                       f"running DVMs; '{START_HINT}' starts one)")
    return DvmUri.parse(text)


def wait_ready(fd: int, events: int, deadline: float, signals: Any = None) -> bool:
    """Wait until ``fd`` is ready for ``events`` (True) or ``deadline`` (a
    ``time.monotonic()``) passes (False); raise :class:`Interrupted` on a
    signal.  ``signals``: None (none is watched -- a library's caller owns
    its signals), or what ``pydvm run`` watches them with: its ``rfd``
    polls readable when one came, its ``pending()`` says which."""
    poller = select.poll()
    poller.register(fd, events)
    if signals is not None:
        poller.register(signals.rfd, POLL_IN)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        ready = dict(poller.poll(left * 1000))
        for signum in signals.pending() if signals is not None else ():
            raise Interrupted(signum)
        if fd in ready:
            return True


def connect_socket(uri: DvmUri, signals: Any = None) -> tuple[Any, bytes | None, str]:
    """A socket connected to the master, the secret to answer with (None
    on a multi-user DVM's tool socket) and the master's name for messages.
    ``pydvm run`` and the job API (:mod:`pydvm.client.jobs`) both connect
    here.

    Raises DvmUnreachable when there is nobody to talk to: this user has no
    secret for the DVM and there is no tool socket, or nothing listens
    within :data:`HANDSHAKE_TIMEOUT`; Interrupted on one of ``signals``
    (:func:`wait_ready`) meanwhile."""
    name = f"master {uri.host}:{uri.port}"
    try:
        secret: bytes | None = read_secret(uri.dvmid)
    except UriError as exc:
        path = tool_socket_name(uri.dvmid)
        if not os.path.exists(path):
            raise DvmUnreachable(uri, str(exc)) from None
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        sock.settimeout(HANDSHAKE_TIMEOUT)  # a local socket: answered at once, or refused
        try:
            sock.connect(path)
        except OSError as err:
            sock.close()
            raise DvmUnreachable(uri, f"cannot reach DVM master at {path}: {err}") from None
        return sock, None, name
    where = f"{uri.host}:{uri.port}"
    deadline = time.monotonic() + HANDSHAKE_TIMEOUT
    host = uri.host
    if host.isascii():
        host = host.encode()  # a str would be IDNA-encoded, which costs an import
    try:
        infos = _socket.getaddrinfo(host, uri.port, 0, _socket.SOCK_STREAM)
    except (OSError, ValueError, OverflowError) as err:  # also a port past 65535
        raise DvmUnreachable(uri, f"cannot reach DVM master at {where}: {err}") from None
    problem: OSError | None = None
    for family, kind, proto, _, addr in infos:
        sock = _socket.socket(family, kind, proto)
        try:  # before connecting: the window scale is agreed then
            sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_RCVBUF, RECV_BUFFER)
        except OSError:
            pass
        sock.setblocking(False)  # connect while watching for signals
        try:
            err = sock.connect_ex(addr)
            if err == errno.EINPROGRESS:
                if not wait_ready(sock.fileno(), select.POLLOUT, deadline, signals):
                    raise TimeoutError(errno.ETIMEDOUT, "timed out")
                err = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_ERROR)
            if err:
                raise OSError(err, os.strerror(err))
        except OSError as exc:
            sock.close()
            problem = exc
            continue
        except BaseException:
            sock.close()
            raise
        try:
            sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
        except OSError:
            pass
        return sock, secret, name
    raise DvmUnreachable(uri, f"cannot reach DVM master at {where}: {problem}")


# ----------------------------------------------------------------------
# the handshake
# ----------------------------------------------------------------------


def check_challenge(challenge: dict, uri: DvmUri, who: str) -> dict:
    """``challenge``, the master's first message, checked to be a challenge
    from the DVM ``uri`` names (DvmUnreachable if not: "``who`` sent no
    challenge", or the DVM that answered is another)."""
    if challenge.get("t") != "challenge" or not isinstance(challenge.get("nonce"), bytes):
        raise DvmUnreachable(uri, f"{who} sent no challenge")
    if challenge.get("dvm") != uri.dvmid:
        raise DvmUnreachable(uri, f"{uri.host}:{uri.port} is DVM {challenge.get('dvm')}, "
                                  f"not {uri.dvmid}")
    return challenge


def auth_request(challenge: dict, secret: bytes | None, rid: int) -> dict:
    """A tool's answer to ``challenge`` (request id ``rid``): with the MAC
    of its nonce if we hold the DVM's ``secret``, else without (a
    multi-user DVM's tool socket, which knows who we are)."""
    auth: dict = {"t": "auth", "id": rid, "role": "tool"}
    if secret is not None:
        auth["mac"] = mac(secret, challenge["nonce"], "tool")
    return auth


def answer(challenge: dict, uri: DvmUri, secret: bytes | None, who: str,
           rid: int) -> tuple[bytes, Any]:
    """What a tool writes in answer to ``challenge`` (checked by
    :func:`check_challenge`), and the link's box (None: a clear link).

    Holding the DVM's ``secret``, we first check the challenge is signed
    with it: a master without it, or a challenge changed on the way (one
    stripped of its seal), is refused here, before we say anything --
    DvmUnreachable naming why.  On a sealed link the answer is our key
    share, clear, then the auth (request id ``rid``) sealed; what follows
    must be sealed with the box too."""
    from ..seal import Answer, SealError
    try:
        hello = Answer(challenge, dvm=uri.dvmid, role="tool", secret=secret, where=who)
        if hello.sealed and secret is None:
            raise SealError(f"{who} offered a sealed link to a tool without the DVM's secret")
    except SealError as exc:
        raise DvmUnreachable(uri, str(exc)) from None
    auth = pack(auth_request(challenge, secret, rid))
    if not hello.sealed:
        return auth, None
    box = hello.box(secret)
    return pack(hello.message) + box.sealer.frames(auth), box


def handshake(sock: Any, uri: DvmUri, secret: bytes | None, name: str,
              timeout: float) -> tuple[FrameDecoder, list, Any]:
    """Answer the master's challenge on the blocking ``sock`` and wait for
    its welcome, ``timeout`` seconds at most for each; the decoder (opening
    sealed frames on a sealed link), whatever came after the welcome, and
    the link's box (None: clear; else every frame sent must be sealed with
    it).  DvmUnreachable if we are not let in.  (``pydvm run`` does not
    wait for the welcome: its run request follows the answer at once,
    :mod:`pydvm.cli.submit`.)"""
    from ..seal import TAG
    sock.settimeout(timeout)
    # one frame, the challenge, until we know whether the rest is sealed
    dec = FrameDecoder(handshake=HANDSHAKE_FRAME)
    msgs: list = []

    def next_msg() -> dict:
        if not msgs and dec.pending_bytes:
            msgs.extend(dec.feed(b""))
        while not msgs:
            try:
                data = sock.recv(1 << 16)
            except OSError as exc:
                raise DvmUnreachable(uri, f"{name} closed: {exc}") from None
            if not data:
                raise DvmUnreachable(uri, f"{name} closed the connection")
            try:
                msgs.extend(dec.feed(data))
            except FrameError as exc:
                raise DvmUnreachable(uri, f"{name}: protocol error: {exc}") from None
        return msgs.pop(0)

    challenge = check_challenge(next_msg(), uri, name)
    first, box = answer(challenge, uri, secret, name, 0)
    if box is not None:
        dec.open_with(box.opener.open, TAG)
    dec.handshake = None
    try:
        sock.sendall(first)
    except OSError as exc:
        raise DvmUnreachable(uri, f"{name} closed: {exc}") from None
    welcome = next_msg()
    if welcome.get("status") != 0:
        raise DvmUnreachable(uri, f"master refused the connection: {welcome.get('msg')}")
    sock.settimeout(None)
    return dec, msgs, box
