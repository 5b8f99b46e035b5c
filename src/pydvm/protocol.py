"""What a client and the runtime agree on, with no I/O.

* **values** -- :class:`Typed` (a value with an explicit PMIx type) and the
  PMIx type tables;
* **frames** -- the length-prefixed msgpack encoding every connection
  carries (``pack``, :class:`FrameDecoder`, envelopes, ``reply``);
* **DVM URIs** -- :class:`DvmUri`;
* **the direct-data credential** a launched process presents to the master
  (:class:`Credential`);
* **the routing table** -- :func:`stores_for`: which store serves a request;
* **reaching a DVM as a tool** -- where its secret and a multi-user DVM's
  tool socket are (:func:`read_secret`, :func:`tool_socket_name`), the
  handshake's MAC (:func:`mac`);
* **what a ``pydvm run`` and the runtime agree on** -- host lists
  (:func:`parse_host_list`), the stdin window (:data:`STDIN_WINDOW`).

``import pydvm`` (every job process that uses the client) loads this, so it
stays light: no asyncio, no dataclasses, no logging, nothing of the store or
the runtime.  The runtime imports the same names from here (re-exported by
:mod:`pydvm.wire`, :mod:`pydvm.runtime.shared.auth`, :mod:`pydvm.runtime.shared.credential`,
:mod:`pydvm.runtime.shared.dataops`, :mod:`pydvm.runtime.node.jobio` and
:mod:`pydvm.store.model`).  Reaching a DVM as a tool
(:mod:`pydvm.client.connect`), the blocking channel (:mod:`pydvm.channel`)
and the blocking ``pydvm run`` (:mod:`pydvm.cli.submit`) need nothing else
either.
"""

from __future__ import annotations

import os
import struct
from _thread import _local as _thread_local  # threading.local, without importing threading
from collections import namedtuple
from collections.abc import Callable


import msgpack

from .enums import Range
from .errors import Status

TYPE_CHECKING = False  # (not typing's: importing typing costs every job process)
if TYPE_CHECKING:  # for type checkers and the API reference only
    from typing import Any

# ----------------------------------------------------------------------
# values
# ----------------------------------------------------------------------


class Typed:
    """A value published with an explicit PMIx data type (immutable).

    A PMIx client's ``PMIX_UINT8`` or ``PMIX_SIZE`` must come back with that
    type, so the store keeps the type code next to the plain Python value.
    Values whose type is the default for their Python type (STRING, BYTE_OBJECT,
    INT64, DOUBLE, BOOL: see :data:`DEFAULT_TYPES`) are stored bare instead,
    so what native and PMIx clients exchange most is never wrapped.

    ``pmix_type`` is a PMIx type code (SPEC 8 numbering style: ``PMIX_UINT8``
    is 12); only the codes of :data:`TYPE_CATEGORY` are accepted, each with a
    value of its category (see :func:`check_typed`).  Size accounting is by
    category (SPEC 3): every integer width and float/double 8, bool 1, a
    string its UTF-8 length, a byte object its length.
    """

    __slots__ = ("value", "pmix_type")

    value: str | bytes | int | float | bool
    pmix_type: int

    def __init__(self, value: str | bytes | int | float | bool, pmix_type: int) -> None:
        object.__setattr__(self, "value", value)
        object.__setattr__(self, "pmix_type", pmix_type)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"cannot assign to field {name!r} (Typed is immutable)")

    __delattr__ = __setattr__

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not Typed:
            return NotImplemented
        return (self.value, self.pmix_type) == (other.value, other.pmix_type)

    def __hash__(self) -> int:
        return hash((self.value, self.pmix_type))

    def __repr__(self) -> str:
        return f"Typed(value={self.value!r}, pmix_type={self.pmix_type!r})"

    def __reduce__(self):
        return (Typed, (self.value, self.pmix_type))

    @property
    def type_name(self) -> str:
        """The PMIx name of :attr:`pmix_type`, e.g. ``"PMIX_UINT8"``."""
        return "PMIX_" + TYPE_NAMES.get(self.pmix_type, str(self.pmix_type))


#: PMIx type code -> (category, name).  Categories: "str", "bytes", "bool",
#: "float", or ("int", bits, signed) for integers.
TYPE_CATEGORY: dict[int, object] = {
    1: "bool", 2: ("int", 8, False), 3: "str", 4: ("int", 64, False),
    5: ("int", 32, True), 6: ("int", 32, True), 7: ("int", 8, True), 8: ("int", 16, True),
    9: ("int", 32, True), 10: ("int", 64, True), 11: ("int", 32, False),
    12: ("int", 8, False), 13: ("int", 16, False), 14: ("int", 32, False),
    15: ("int", 64, False), 16: "float", 17: "float", 20: ("int", 32, True),
    27: "bytes", 30: ("int", 8, False), 33: ("int", 8, False), 40: ("int", 32, False),
}
TYPE_NAMES: dict[int, str] = {
    1: "BOOL", 2: "BYTE", 3: "STRING", 4: "SIZE", 5: "PID", 6: "INT", 7: "INT8",
    8: "INT16", 9: "INT32", 10: "INT64", 11: "UINT", 12: "UINT8", 13: "UINT16",
    14: "UINT32", 15: "UINT64", 16: "FLOAT", 17: "DOUBLE", 20: "STATUS",
    27: "BYTE_OBJECT", 30: "PERSIST", 33: "DATA_RANGE", 40: "PROC_RANK",
}
#: The PMIx type a bare value stands for (and the one a Typed of that type
#: is stored as: bare).  bool before int: bool is a subclass of int.
DEFAULT_TYPES: dict[type, int] = {str: 3, bytes: 27, bool: 1, int: 10, float: 17}



# ----------------------------------------------------------------------
# frames
# ----------------------------------------------------------------------

HEADER = struct.Struct("!I")
#: Largest frame accepted by default.  Large enough for a publish up to the
#: default store cap (16 MiB) with room to spare; a peer announcing more is
#: dropped before the body is read.
MAX_FRAME = 64 * 1024 * 1024
#: Largest frame a listening socket reads from a peer that has not yet
#: authenticated (a handshake -- an ``auth``, a client's ``hello`` -- is a
#: few hundred bytes): what a stranger can make a server hold per connection.
HANDSHAKE_FRAME = 4096

Message = dict  # a decoded frame: str keys, "t" its type
ReplyCallback = Callable[[Message], None]


class FrameError(Exception):
    """The byte stream cannot be read as frames any more.

    ``messages`` holds the whole messages decoded before the bad frame, so
    a caller can still answer them before closing.
    """

    def __init__(self, text: str, messages: list | None = None) -> None:
        super().__init__(text)
        self.messages: list = messages or []


#: msgpack extension code of a :class:`~pydvm.store.model.Typed` value: its
#: data is the msgpack array ``[pmix_type, value]``.
EXT_TYPED = 1


def _default(obj: Any) -> Any:
    """msgpack's hook for what it cannot pack itself (called only for those)."""
    if obj.__class__ is Typed:
        return msgpack.ExtType(EXT_TYPED, msgpack.packb([obj.pmix_type, obj.value],
                                                        use_bin_type=True))
    raise TypeError(f"cannot serialize {type(obj).__name__}")


def _ext_hook(code: int, data: bytes) -> Any:
    """msgpack's hook for extension values (called only when one occurs).

    A malformed one is returned as the raw ExtType: the store refuses it as
    an unsupported value (BAD_PARAM) rather than the frame being dropped.
    """
    if code == EXT_TYPED:
        try:
            t, v = msgpack.unpackb(data, raw=False)
            if isinstance(t, int) and not isinstance(t, bool):
                return Typed(v, t)
        except Exception:
            pass
    return msgpack.ExtType(code, data)


_packers = _thread_local()


def packb(obj: Any) -> bytes:
    """msgpack encoding used on every connection (Typed values as extensions).

    Each thread reuses one ``Packer`` (``msgpack.packb`` builds a new one per
    call, which costs as much as the packing).  It is taken out while in
    use, so a pack re-entered on the same thread (a signal handler's) makes
    its own instead of writing into the first one's buffer."""
    p = getattr(_packers, "p", None)
    if p is None:
        p = msgpack.Packer(use_bin_type=True, default=_default)
    else:
        _packers.p = None
    try:
        return p.pack(obj)
    finally:
        _packers.p = p


def unpackb(data) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=_ext_hook)


#: First byte of an *enveloped* frame body: a byte msgpack never produces.
ENVELOPE = 0xC1
_ENV_HEAD = struct.Struct("!BI")
#: Key under which an enveloped message carries its opaque payload.
BODY = "_body"


def pack(msg: Message) -> bytes:
    """Encode one message as a frame (enveloped if it carries a payload)."""
    if BODY in msg:
        return b"".join(pack_parts(msg))
    body = packb(msg)
    return HEADER.pack(len(body)) + body


def pack_parts(msg: Message) -> list:
    """An enveloped message as the pieces of its frame, payload not copied.

    Envelope layout (the frame body)::

        0xC1 | u32 BE header length | msgpack map (the header) | payload

    The header holds what a hop needs to route the message; the payload is
    opaque bytes (normally a msgpack map) that a hop passes on untouched.
    """
    payload = msg[BODY]
    header = packb({k: v for k, v in msg.items() if k != BODY})
    return [HEADER.pack(_ENV_HEAD.size + len(header) + len(payload)),
            _ENV_HEAD.pack(ENVELOPE, len(header)), header, payload]


def frame_of(body) -> bytes:
    """A frame carrying an already-encoded body (as sent on by a router)."""
    return HEADER.pack(len(body)) + bytes(body)


def unpack_body(body: bytes) -> Message:
    """Decode one frame body; raises FrameError if it is not a typed map.

    An enveloped body decodes to its header map with the payload, undecoded,
    under :data:`BODY` (a memoryview of the frame: no copy).
    """
    payload = None
    if body[:1] == b"\xc1":
        if len(body) < _ENV_HEAD.size:
            raise FrameError("truncated envelope")
        _, hlen = _ENV_HEAD.unpack_from(body, 0)
        end = _ENV_HEAD.size + hlen
        if end > len(body):
            raise FrameError(f"envelope header of {hlen} bytes overruns its frame")
        view = memoryview(body)
        payload = view[end:]
        body = view[_ENV_HEAD.size:end]
    try:
        msg = unpackb(body)
    except Exception as exc:  # msgpack raises several unrelated types
        raise FrameError(f"undecodable frame body ({type(exc).__name__}: {exc})") from None
    if not isinstance(msg, dict):
        raise FrameError(f"frame is a {type(msg).__name__}, not a map")
    if not isinstance(msg.get("t"), str):
        raise FrameError("frame has no string message type 't'")
    if payload is not None:
        msg[BODY] = payload
    elif BODY in msg:
        del msg[BODY]  # only an envelope may carry a payload
    return msg


def unpack_payload(payload) -> dict | None:
    """Decode an envelope's payload as a map; None if it is not one."""
    try:
        out = unpackb(payload)
    except Exception:
        return None
    return out if isinstance(out, dict) else None


def pack_payload(obj: dict) -> bytes:
    """Encode a map as an envelope payload (or a frame body)."""
    return packb(obj)


def reply(req_id: Any, status: Status | int, msg: str = "", **fields: Any) -> Message:
    """Build the reply to request ``req_id``."""
    out: Message = {"t": "reply", "id": req_id, "status": int(status), "msg": msg}
    out.update(fields)
    return out


class FrameDecoder:
    """Incremental frame parser: feed bytes, get whole messages.

    Pure and synchronous, so it can be fuzzed without sockets.
    """

    def __init__(self, max_frame: int = MAX_FRAME, handshake: int | None = None) -> None:
        self.max_frame = max_frame
        #: While not None, the limit of every frame instead of ``max_frame``,
        #: and :meth:`feed` returns at most one message (the rest stays
        #: buffered; ``feed(b"")`` goes on): a server's gate before a peer
        #: has authenticated (:data:`HANDSHAKE_FRAME`).  The server sets it
        #: to None once the peer is in.
        self.handshake = handshake
        #: While not None, every frame is sealed (:mod:`pydvm.seal`):
        #: ``opener(length field, frame body)`` returns the body to decode,
        #: or raises FrameError.  Set by :meth:`open_with`.
        self.opener: Callable[[bytes, bytes], bytes] | None = None
        self._buf = bytearray()

    def open_with(self, opener: Callable[[bytes, bytes], bytes], overhead: int) -> None:
        """Read every frame from now on -- those already buffered too -- as a
        sealed one, opened by ``opener``; each may be ``overhead`` bytes
        longer than a clear one (its tag)."""
        self.opener = opener
        self.max_frame += overhead
        if self.handshake is not None:
            self.handshake += overhead

    def feed(self, data: bytes) -> list[Message]:
        """Add ``data``; return every complete message.  Raises FrameError."""
        buf = self._buf
        gate = self.handshake
        limit = self.max_frame if gate is None else gate
        opener = self.opener
        if not buf and len(data) >= 4:
            # Fast path: exactly one whole frame, the common case of a request.
            (size,) = HEADER.unpack_from(data, 0)
            if size == len(data) - 4 and size <= limit:
                if opener is None:
                    return [unpack_body(data[4:])]
                return [unpack_body(opener(data[:4], data[4:]))]
        buf += data
        out: list[Message] = []
        pos = 0
        n = len(buf)
        while n - pos >= 4:
            (size,) = HEADER.unpack_from(buf, pos)
            if size > limit:
                del buf[:]  # nothing more of this stream is read
                what = "before the handshake " if gate is not None else ""
                raise FrameError(f"frame of {size} bytes {what}exceeds the limit of {limit}",
                                 out)
            if n - pos - 4 < size:
                break
            try:
                if opener is None:
                    body = bytes(buf[pos + 4 : pos + 4 + size])
                else:
                    # opened straight from the buffer: the body is a new object
                    with memoryview(buf) as view:
                        part = view[pos + 4 : pos + 4 + size]
                        try:
                            body = opener(bytes(buf[pos:pos + 4]), part)
                        finally:
                            part.release()
                pos += 4 + size
                out.append(unpack_body(body))
            except FrameError as exc:
                if opener is not None:
                    del buf[:]  # a sealed stream that failed once is read no further
                exc.messages = out
                raise
            if gate is not None:
                break  # one at a time until the peer is in
        if pos:
            del buf[:pos]
        return out

    @property
    def pending_bytes(self) -> int:
        """Bytes of an incomplete frame held (a truncated frame at EOF)."""
        return len(self._buf)



# ----------------------------------------------------------------------
# DVM URIs
# ----------------------------------------------------------------------

#: The form of a URI (what :func:`_split_uri` reads, without :mod:`re`,
#: which a ``pydvm run`` would import for this alone).
_URI_PATTERN = r"^tcp://(?P<host>\[[^\]]+\]|[^:/]+):(?P<port>\d+)/(?P<dvm>[A-Za-z0-9_-]+)$"
_DVMID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def _split_uri(text: str) -> tuple[str, str, str] | None:
    """The host (brackets and all), port and DVM id of ``text`` matched
    against :data:`_URI_PATTERN`; None if it does not match.  As the
    pattern's ``$`` does, one final newline is allowed."""
    if text.endswith("\n"):
        text = text[:-1]
    if not text.startswith("tcp://"):
        return None
    rest = text[6:]
    if rest.startswith("["):  # the first alternative: [HOST]
        end = rest.find("]", 1)
        if end >= 2:  # at least one character between the brackets
            found = _port_and_id(rest[end + 1:])
            if found is not None:
                return (rest[:end + 1],) + found
    end = len(rest)  # the second: everything up to the first ':' or '/'
    for stop in (":", "/"):
        at = rest.find(stop)
        if at != -1 and at < end:
            end = at
    if end == 0:
        return None
    found = _port_and_id(rest[end:])
    return None if found is None else (rest[:end],) + found


def _port_and_id(rest: str) -> tuple[str, str] | None:
    """``:PORT/DVMID`` (all of ``rest``) as (PORT, DVMID); None if it is not."""
    if not rest.startswith(":"):
        return None
    port, slash, dvmid = rest[1:].partition("/")
    if not slash or not port or not dvmid or not all(c.isdecimal() for c in port) \
            or not _DVMID_CHARS.issuperset(dvmid):
        return None
    return port, dvmid


class UriError(ValueError):
    """A DVM URI that cannot be parsed, or whose secret cannot be found."""


class DvmUri(namedtuple("DvmUri", ["host", "port", "dvmid"])):
    """``tcp://HOST:PORT/DVMID``: where a DVM's master listens (``host``,
    ``port``), and its id (``dvmid``)."""

    __slots__ = ()

    def __str__(self) -> str:
        return f"tcp://{self.host}:{self.port}/{self.dvmid}"

    @classmethod
    def parse(cls, text: str) -> "DvmUri":
        """Read a URI; :class:`UriError` naming the expected form if it is not one."""
        m = _split_uri(text.strip())
        if m is None:
            raise UriError(f"not a pydvm URI: {text!r} (expected tcp://HOST:PORT/DVMID)")
        host, port, dvmid = m
        return cls(host.strip("[]"), int(port), dvmid)


# ----------------------------------------------------------------------
# the direct-data credential (runtime/shared/credential.py derives and checks it)
# ----------------------------------------------------------------------

#: The environment variable a launched process finds its credential in.
CREDENTIAL_ENV = "PYDVM_DIRECT_CRED"
#: The role a direct client announces in its ``auth`` answer.
CLIENT_ROLE = "client"


class Credential(namedtuple("Credential",
                            ["node", "uid", "gid", "app", "session", "nonce", "key"])):
    """One process's credential (what :data:`CREDENTIAL_ENV` holds), minus its
    namespace and rank, which the process has in ``PYDVM_NSPACE`` /
    ``PYDVM_RANK``: its node, uid, gid, app index, session, nonce and key."""

    __slots__ = ()

    def token(self) -> str:
        """The environment form: ``v1:UID:GID:APP:SESSION:NONCE:KEY:NODE``."""
        return (f"v1:{self.uid}:{self.gid}:{self.app}:{self.session}:"
                f"{self.nonce.hex()}:{self.key.hex()}:{self.node}")

    @classmethod
    def parse(cls, token: str) -> "Credential":
        """Read a :meth:`token`; ValueError if it is not one."""
        parts = token.strip().split(":", 7)
        if len(parts) != 8 or parts[0] != "v1" or not parts[7]:
            raise ValueError("not a v1 direct-data credential")
        uid, gid, app, session = (int(p) for p in parts[1:5])
        nonce, key = bytes.fromhex(parts[5]), bytes.fromhex(parts[6])
        if len(key) != 32 or not nonce:
            raise ValueError("malformed direct-data credential")
        return cls(parts[7], uid, gid, app, session, nonce, key)

    def answer(self, challenge: bytes, nspace: str, rank: int) -> dict:
        """The fields of the ``auth`` answer to the master's ``challenge``."""
        return {"role": CLIENT_ROLE, "nspace": nspace, "rank": rank, "node": self.node,
                "uid": self.uid, "gid": self.gid, "app": self.app, "session": self.session,
                "nonce": self.nonce, "proof": prove(self.key, challenge)}


def prove(key: bytes, challenge: bytes) -> bytes:
    """The client's answer to a challenge: it holds ``key``."""
    import hashlib  # here: only a process that uses the direct path needs them
    import hmac
    return hmac.new(key, challenge + CLIENT_ROLE.encode(), hashlib.sha256).digest()


def token_from_env() -> str | None:
    """This process's credential token, if it was launched with one."""
    return os.environ.get(CREDENTIAL_ENV) or None


# ----------------------------------------------------------------------
# the routing table
# ----------------------------------------------------------------------

#: The two kinds of store a data request can reach.
NODE, MASTER = "node", "master"


def stores_for(t: str, rng: Any) -> tuple[str, ...]:
    """Which stores serve a data request of type ``t`` and range ``rng``.

    The routing table, in one place: a node server, the master's direct
    connections and the clients that open one all read it.  LOCAL items
    live in the node store, every other range in the master's;
    ``unpublish`` goes to both (removal is a question of ownership, not of
    range).  ``update`` goes where ``publish`` goes and ``keys`` where
    ``lookup`` goes.
    """
    if t == "unpublish":
        return (NODE, MASTER)
    if rng == Range.LOCAL:
        return (NODE,)
    return (MASTER,)


# ----------------------------------------------------------------------
# reaching a DVM as a tool (runtime/shared/auth.py holds the master's side)
# ----------------------------------------------------------------------

#: Seconds either side of a connection gives the other to complete the
#: handshake (challenge, auth, welcome).
HANDSHAKE_TIMEOUT = 10.0


def state_dir_name() -> str:
    """The state directory: ``$PYDVM_STATE_DIR``, default ``~/.pydvm``."""
    d = os.environ.get("PYDVM_STATE_DIR")
    return d if d else os.path.join(os.path.expanduser("~"), ".pydvm")


def read_secret(dvmid: str) -> bytes:
    """The secret of DVM ``dvmid`` (``<state dir>/<dvmid>.secret``, hex);
    :class:`UriError` when this user has none or it is unreadable."""
    d = state_dir_name()
    try:
        with open(os.path.join(d, f"{dvmid}.secret"), "rb") as f:
            return bytes.fromhex(f.read().decode().strip())
    except (FileNotFoundError, PermissionError):
        raise UriError(f"no credentials for DVM {dvmid} in {_path_text(d)} "
                       "(is it running, and started by this user?)") from None
    except ValueError:
        raise UriError(f"corrupt credentials file {_path_text(d, f'{dvmid}.secret')}") from None


def _path_text(*parts: str) -> str:
    """A path as :mod:`pathlib` prints it (imported here: an error path)."""
    from pathlib import Path
    return str(Path(*parts))


def tool_socket_name(dvmid: str) -> str:
    """Where a multi-user DVM serves tools of any local user (identity by
    peer credentials, no secret)."""
    return f"/tmp/pydvm-mu-{dvmid}/tool.sock"


_hmac_pads: tuple | None = None


def hmac_sha256(key: bytes, msg: bytes) -> bytes:
    """HMAC-SHA256 (RFC 2104) of ``msg`` under ``key``: the same bytes as
    ``hmac.new(key, msg, hashlib.sha256).digest()``, from the interpreter's
    built-in SHA-256 -- :mod:`hmac` loads OpenSSL, which costs a command
    line more than the whole handshake."""
    global _hmac_pads
    if _hmac_pads is None:
        try:
            from _sha256 import sha256  # CPython's built-in module (3.11)
        except ImportError:  # elsewhere hashlib's, OpenSSL loaded or not
            from hashlib import sha256
        _hmac_pads = (sha256, bytes(x ^ 0x36 for x in range(256)),
                      bytes(x ^ 0x5C for x in range(256)))
    sha256, inner_pad, outer_pad = _hmac_pads
    if len(key) > 64:
        key = sha256(key).digest()
    key = key.ljust(64, b"\0")
    inner = sha256(key.translate(inner_pad) + msg).digest()
    return sha256(key.translate(outer_pad) + inner).digest()


def mac(secret: bytes, nonce: bytes, role: str) -> bytes:
    """A peer's answer to the master's challenge ``nonce``: it holds
    ``secret`` (HMAC-SHA256 of the nonce and the role it connects as)."""
    return hmac_sha256(secret, nonce + role.encode())


# ----------------------------------------------------------------------
# what pydvm run and the runtime agree on
# ----------------------------------------------------------------------

#: Bytes of stdin a ``pydvm run`` may have sent and not yet seen written
#: into rank 0's pipe; also the largest piece it sends at once.
STDIN_WINDOW = 256 * 1024
STDIN_CHUNK = 64 * 1024


def parse_host_list(text: str) -> list[tuple[str, int]]:
    """Parse ``h1,h2:4,...`` into ``(name, slots)`` pairs (one slot unless
    given); ValueError naming what is wrong."""
    out: list[tuple[str, int]] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        name, _, slots = part.partition(":")
        if not name:
            raise ValueError(f"empty host name in {text!r}")
        if slots:
            try:
                n = int(slots)
            except ValueError:
                raise ValueError(f"bad slot count {slots!r} for host {name!r}") from None
            if n < 1:
                raise ValueError(f"slot count for host {name!r} must be >= 1")
        else:
            n = 1
        out.append((name, n))
    if not out:
        raise ValueError(f"no hosts in {text!r}")
    names = [h for h, _ in out]
    dups = {n for n in names if names.count(n) > 1}
    if dups:
        raise ValueError(f"host listed twice: {', '.join(sorted(dups))}")
    return out
