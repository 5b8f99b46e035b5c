"""DVM URIs, the per-DVM secret, and the connection handshake.

A DVM's URI is ``tcp://HOST:PORT/DVMID``.  It carries no secret, so it can
be printed, put in ``PYDVM_URI`` and passed on command lines.  The secret
(32 random bytes) lives in ``$PYDVM_STATE_DIR/<DVMID>.secret`` (default
``~/.pydvm``; directory 0700, file 0600) for tools of the same user, and
reaches daemons on their standard input -- never in argv, the environment
or a log line.

Handshake on the master's TCP port: the master sends
``{"t": "challenge", "nonce": <32 bytes>, "dvm": DVMID, "seal": bool,
"sig": ...}`` (``sig``: the challenge signed with the secret,
:func:`pydvm.seal.challenge_sig`); the peer answers ``{"t": "auth", "role":
"daemon"|"tool", "mac": HMAC-SHA256(secret, nonce + role)}`` plus role
fields.  On a *sealed* link (``seal`` true: ``pydvm_seal``, see
:mod:`pydvm.seal`) the peer first sends its key share (``seal``) and its
auth goes sealed, as does everything after it both ways.  A peer holding
the secret refuses a challenge not signed with it (not its DVM's master, or
a challenge altered to strip the seal).  A wrong MAC, a seal that does not
open, a wrong first message or silence for :data:`HANDSHAKE_TIMEOUT`
seconds closes the connection with a logged reason; nothing of such a
peer reaches a store.  The master reads a connection's messages in order
and a refusal closes it before anything after the auth is read, so a tool
may send its first request right behind its auth without waiting for the
welcome (``pydvm run`` does: :mod:`pydvm.cli.submit`).

What a tool needs to reach a DVM -- the secret's file, the multi-user tool
socket, the MAC -- is :mod:`pydvm.protocol`'s (re-exported here), so that
the blocking ``pydvm run`` loads nothing of the runtime.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import secrets
from pathlib import Path

# What a tool needs too lives in the protocol module (the blocking pydvm run
# loads no runtime): re-exported here for the runtime.
from ...protocol import HANDSHAKE_TIMEOUT, DvmUri, UriError, mac, read_secret  # noqa: F401
from ...protocol import HANDSHAKE_FRAME, state_dir_name, tool_socket_name
from ...seal import Answer, SealError
from ...wire import Channel, Message


def tool_socket_path(dvmid: str) -> Path:
    """Where a multi-user DVM serves tools of any local user (peer credentials)."""
    return Path(tool_socket_name(dvmid))


def host_identity() -> str:
    """Names the machine as a process sees it: the kernel's boot id and this
    process's mount and network namespaces.  Two processes with the same
    identity reach the same Unix socket paths and the same loopback, so one
    may use a Unix socket where the other listens (the direct data path
    does).  "" when any part cannot be read: then nothing is assumed shared.
    """
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        mnt = os.stat("/proc/self/ns/mnt").st_ino
        net = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return ""
    return f"{boot}/mnt:{mnt}/net:{net}" if boot else ""


def state_dir() -> Path:
    return Path(state_dir_name())


def new_secret() -> bytes:
    return secrets.token_bytes(32)


def write_secret(dvmid: str, secret: bytes) -> Path:
    d = state_dir()
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    path = d / f"{dvmid}.secret"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, secret.hex().encode())
    finally:
        os.close(fd)
    return path


def remove_secret(dvmid: str) -> None:
    try:
        (state_dir() / f"{dvmid}.secret").unlink()
    except FileNotFoundError:
        pass


def check_auth(secret: bytes, nonce: bytes, msg: Message) -> str:
    """Return "" if ``msg`` is a valid auth answer to ``nonce``, else the reason."""
    if msg.get("t") != "auth":
        return f"expected an auth message, got {msg.get('t')!r}"
    role = msg.get("role")
    if role not in ("daemon", "tool"):
        return f"unknown role {role!r}"
    got = msg.get("mac")
    if not isinstance(got, bytes) or not hmac.compare_digest(got, mac(secret, nonce, role)):
        return "bad credentials"
    return ""


async def connect(
    uri: DvmUri,
    secret: bytes | None,
    role: str,
    on_message,
    on_close=None,
    fields: dict | None = None,
    timeout: float = HANDSHAKE_TIMEOUT,
    unix_path: str | None = None,
) -> tuple[Channel, Message]:
    """Open an authenticated channel to a master; returns (channel, welcome).

    Over TCP the peer proves it holds ``secret``.  With ``unix_path`` (a
    multi-user DVM's tool socket) no secret is used: the master reads the
    caller's uid/gid from the socket.  Raises ConnectionError (with the
    reason) if the master is unreachable or refuses the credentials.
    """
    loop = asyncio.get_running_loop()
    first: asyncio.Future = loop.create_future()
    where = f"master {uri.host}:{uri.port}"

    def on_first(ch: Channel, msg: Message) -> None:
        if first.done():
            on_message(ch, msg)
            return
        # The challenge: answered here, before another frame is read, so
        # that everything after it is read sealed when the link is.
        try:
            hello = Answer(msg, dvm=uri.dvmid, role=role, secret=secret, where=where)
            if hello.sealed:
                if secret is None:
                    raise SealError(f"{where} offered a sealed link to a peer without "
                                    "the DVM's secret")
                ch.send(hello.message)
                ch.seal(hello.box(secret))
        except SealError as exc:
            first.set_exception(ConnectionError(str(exc)))
            ch.close(f"handshake refused: {exc}")
            return
        ch._decoder.handshake = None  # the rest of the stream as it comes
        first.set_result(msg)

    def closed(ch: Channel, reason: str) -> None:
        if not first.done():
            first.set_exception(ConnectionError(f"{where} closed: {reason}"))
        if on_close is not None:
            on_close(ch, reason)

    def factory() -> Channel:
        ch = Channel(on_first, closed, name=where)
        ch.gate(HANDSHAKE_FRAME)  # one frame, the challenge, before we answer it
        return ch

    try:
        if unix_path:
            conn = loop.create_unix_connection(factory, unix_path)
        else:
            conn = loop.create_connection(factory, uri.host, uri.port)
        _, ch = await asyncio.wait_for(conn, timeout)
    except (OSError, asyncio.TimeoutError) as exc:
        place = unix_path or f"{uri.host}:{uri.port}"
        raise ConnectionError(f"cannot reach DVM master at {place}: {exc}") from None
    try:
        challenge = await asyncio.wait_for(first, timeout)
        auth = {"t": "auth", "role": role}
        if secret is not None:
            auth["mac"] = mac(secret, challenge["nonce"], role)
        auth.update(fields or {})
        ch.on_message = on_message
        welcome = await ch.call(auth, timeout)
    except BaseException:
        ch.close("handshake failed")
        raise
    if welcome.get("status") != 0:
        ch.close("refused")
        raise ConnectionError(f"master refused the connection: {welcome.get('msg')}")
    return ch, welcome
