"""Sealed links: every frame after the handshake under authenticated encryption.

Pure: no sockets, no event loop, no logging.  The runtime's channels
(:mod:`pydvm.wire`) and the blocking client's install what this module
builds; ``docs/security.md`` says which links are sealed and why.

**The handshake** (the master speaks first, as it always did)::

    master -> peer   challenge  {nonce Nm, dvm, seal, kx Xm, sig}        clear
    peer -> master   seal       {v, role, nonce Np, kx Xp[, cred]}       clear
    peer -> master   auth       (as on a clear link: role, mac, fields)  sealed
    master -> peer   welcome    (the auth's reply)                      sealed

* ``sig`` is HMAC-SHA256 under the DVM secret of the challenge's content
  (:func:`challenge_sig`): a peer holding the secret knows, before it says
  anything, that the challenge -- and whether the link is sealed -- is the
  master's, so an attacker can neither pose as the master nor strip the
  seal off a link (a downgrade).  A direct-data client, which holds no
  secret, learns from its own daemon whether its link must be sealed.
* ``Xm`` and ``Xp`` are fresh X25519 public keys, one pair per connection
  and side.  The keys of the link are HKDF-SHA256 (RFC 5869) of their
  shared secret, salted with the pre-shared key -- the DVM secret, or for a
  direct-data client its process key (:mod:`pydvm.runtime.shared.credential`)
  -- and bound to a hash of both clear messages: 64 bytes, one AES-256 key
  per direction (:func:`derive`).  Only a holder of the pre-shared key gets
  the keys (authentication); a later theft of the secret does not open
  what was recorded, since the X25519 keys are gone (forward secrecy); any
  change to either clear message gives the two sides different keys.
* The first sealed frame each way confirms the keys: the master's opening
  of the auth proves the peer holds the pre-shared key, the peer's opening
  of the welcome proves the master does.  The auth still carries the
  handshake MAC (the check is the same as on a clear link).

**A sealed frame** is ``u32 BE length | AES-256-GCM(body)`` with the 16-byte
tag at the end; the body is what a clear frame carries (a msgpack map or
an envelope), the associated data is the length field.  The 96-bit nonce
is the frame's number on its direction, counted from 0 and never sent: a
frame altered, dropped, replayed, reordered or spliced in does not open
with the number the receiver expects, and a stream cut inside a frame
leaves an incomplete one.  Either ends the link (:class:`SealError`).

**Key limits.**  A direction moves to a new key -- HKDF-Expand of the old
one, which is then forgotten -- after :data:`REKEY_BYTES` bytes or
:data:`REKEY_RECORDS` frames, whichever comes first (both ends count the
same frames, so no message is needed), keeping each AES-GCM key well
inside its safe use; the frame counter goes on.  A direction that reached
2^64 frames refuses to go on.

`cryptography`'s AEAD, X25519 and HKDF do the cryptography; they are
imported when a link is first sealed (a clear link, or a job process that
never opens one, does not load OpenSSL).
"""

from __future__ import annotations

import os
import struct
from _operator import _compare_digest  # hmac.compare_digest, without loading OpenSSL

from .protocol import FrameError, hmac_sha256, packb

#: The version of the sealed-link protocol (the ``v`` of a ``seal`` message).
VERSION = 1
#: Domain separation: every key, signature and hash of this protocol starts here.
LABEL = b"pydvm seal v1"
#: Bytes of a sealed frame's authentication tag (the growth of a frame).
TAG = 16
#: Bytes of each AES-256-GCM key.
KEY_BYTES = 32
#: Bytes of each side's random nonce, and of an X25519 public key.
NONCE_BYTES = 32
KX_BYTES = 32
#: A direction's key is replaced after this many bytes sealed under it...
REKEY_BYTES = 1 << 32
#: ... or this many frames, whichever comes first.
REKEY_RECORDS = 1 << 24
#: Frames one direction may carry in all (the nonce space of a 64-bit counter).
COUNTER_LIMIT = 1 << 64

#: The values of ``pydvm_seal`` (see :func:`must_seal`).
MODES = ("network", "all", "off")

_HEADER = struct.Struct("!I")


class SealError(FrameError):
    """A sealed frame that does not open, or a handshake that cannot go on.

    A :class:`~pydvm.protocol.FrameError`: the stream cannot be read any
    more, and its link is closed."""


# ----------------------------------------------------------------------
# which links
# ----------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    """True if ``host`` (an address, as a socket names its peer) is a
    loopback address: 127.0.0.0/8, ::1, or 127.x as an IPv4-mapped IPv6
    address.  A name or anything unreadable is not."""
    if host.startswith("::ffff:"):
        host = host[7:]
    if host == "::1":
        return True
    parts = host.split(".")
    if len(parts) != 4 or parts[0] != "127":
        return False
    return all(p.isdigit() and len(p) <= 3 and int(p) < 256 for p in parts)


def must_seal(mode: str, loopback: bool) -> bool:
    """Whether a TCP link is sealed under ``pydvm_seal`` ``mode``:
    ``network`` -- every link but loopback ones; ``all`` -- every link;
    ``off`` -- none.  (Unix sockets never are: the kernel names the peer.)"""
    if mode == "all":
        return True
    if mode == "network":
        return not loopback
    if mode == "off":
        return False
    raise ValueError(f"unknown seal mode {mode!r}")


# ----------------------------------------------------------------------
# one direction of a link
# ----------------------------------------------------------------------


def preload() -> None:
    """Import what sealing needs now (a server that will seal links: not
    in the middle of its first handshake)."""
    from cryptography.hazmat.primitives.asymmetric import x25519  # noqa: F401
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # noqa: F401
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF  # noqa: F401


_InvalidTag = None


def _invalid_tag():
    """cryptography's InvalidTag (imported once, on the first frame that fails)."""
    global _InvalidTag
    if _InvalidTag is None:
        from cryptography.exceptions import InvalidTag
        _InvalidTag = InvalidTag
    return _InvalidTag


def _aead(key: bytes):
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    return AESGCM(key)


def next_key(key: bytes) -> bytes:
    """The key a direction moves to after ``key`` (HKDF-Expand, one way)."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDFExpand
    return HKDFExpand(hashes.SHA256(), KEY_BYTES, LABEL + b" next key").derive(key)


class _Direction:
    """One direction of a sealed link: its current key and frame counter.

    (The hot paths, :meth:`Sealer.seal` and :meth:`Opener.open`, run for
    every frame of the link: they count down what the key may still
    carry rather than calling helpers.)"""

    __slots__ = ("_key", "_aead", "_cipher", "count", "_left_bytes", "_left_records",
                 "rekey_bytes", "rekey_records", "keys_used")

    def __init__(self, key: bytes, *, rekey_bytes: int = REKEY_BYTES,
                 rekey_records: int = REKEY_RECORDS, start: int = 0) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError(f"a sealing key is {KEY_BYTES} bytes, not {len(key)}")
        if rekey_bytes < 1 or rekey_records < 1:
            raise ValueError("rekey limits must be >= 1")
        self.rekey_bytes = rekey_bytes
        self.rekey_records = rekey_records
        #: the number of the next frame (its nonce).
        self.count = start
        #: keys this direction has used so far (1 + its rekeyings).
        self.keys_used = 0
        self._use(key)

    def _use(self, key: bytes) -> None:
        """Seal or open with ``key`` from the next frame on."""
        self._key = key
        self._aead = _aead(key)
        self._cipher = self._bind()
        self._left_bytes = self.rekey_bytes
        self._left_records = self.rekey_records
        self.keys_used += 1

    def _bind(self):  # pragma: no cover - each subclass binds its own operation
        raise NotImplementedError

    def _spent(self) -> None:
        """The key carried what it may: the next one (HKDF-Expand of it)."""
        self._use(next_key(self._key))

    def _used_up(self) -> SealError:
        return SealError("the link has sealed 2^64 frames one way: it must end")


class Sealer(_Direction):
    """What one side sends: each body sealed under the next number."""

    __slots__ = ()

    def _bind(self):
        return self._aead.encrypt

    def seal(self, body) -> tuple[bytes, bytes]:
        """``body`` (bytes-like) as a sealed frame: (its length field, the
        ciphertext with its tag), to be written in that order."""
        n = self.count
        if n >= COUNTER_LIMIT:
            raise self._used_up()
        size = len(body)
        header = _HEADER.pack(size + TAG)
        sealed = self._cipher(n.to_bytes(12, "big"), body, header)
        self.count = n + 1
        self._left_bytes -= size
        self._left_records -= 1
        if self._left_bytes <= 0 or self._left_records <= 0:
            self._spent()
        return header, sealed

    def frame(self, body) -> bytes:
        """:meth:`seal` as one bytes object."""
        header, sealed = self.seal(body)
        return header + sealed

    def frames(self, clear) -> bytes:
        """Clear frames (``u32 length | body``, one or more back to back, as
        :func:`~pydvm.protocol.pack` makes them) as the same frames sealed,
        in order.  ValueError if ``clear`` is not whole frames."""
        end = len(clear)
        if end >= 4:
            (n,) = _HEADER.unpack_from(clear, 0)
            if n == end - 4:  # the usual case: one frame
                return self.frame(memoryview(clear)[4:])
        view = memoryview(clear)
        out: list = []
        pos = 0
        while pos < end:
            if end - pos < 4:
                raise ValueError("not whole frames: a length field cut short")
            (n,) = _HEADER.unpack_from(view, pos)
            if end - pos - 4 < n:
                raise ValueError("not whole frames: a body cut short")
            out += self.seal(view[pos + 4:pos + 4 + n])
            pos += 4 + n
        return b"".join(out)


class Opener(_Direction):
    """What one side receives: each frame opened under the number it must
    have.  A frame that does not open leaves the opener unusable (every
    later one fails too): its stream cannot be trusted any more."""

    __slots__ = ("broken",)

    def __init__(self, key: bytes, **kw) -> None:
        self.broken = ""
        super().__init__(key, **kw)

    def _bind(self):
        return self._aead.decrypt

    def open(self, header: bytes, sealed) -> bytes:
        """The body of the sealed frame ``header`` + ``sealed``; raises
        :class:`SealError` naming the frame if it does not open."""
        n = self.count
        if self.broken:
            raise SealError(self.broken)
        if n >= COUNTER_LIMIT:
            raise self._used_up()
        if len(sealed) < TAG:
            self.broken = f"sealed frame #{n} is shorter than its tag ({len(sealed)} bytes)"
            raise SealError(self.broken)
        try:
            body = self._cipher(n.to_bytes(12, "big"), sealed, header)
        except _invalid_tag():
            self.broken = (f"sealed frame #{n} does not open (altered, replayed, "
                           "reordered, dropped or forged in transit"
                           + (", or the peer lacks the key" if n == 0 else "") + ")")
            raise SealError(self.broken) from None
        self.count = n + 1
        self._left_bytes -= len(body)
        self._left_records -= 1
        if self._left_bytes <= 0 or self._left_records <= 0:
            self._spent()
        return body


class Box:
    """Both directions of one sealed link."""

    __slots__ = ("sealer", "opener")

    def __init__(self, send_key: bytes, recv_key: bytes, **kw) -> None:
        self.sealer = Sealer(send_key, **kw)
        self.opener = Opener(recv_key, **kw)


# ----------------------------------------------------------------------
# the handshake
# ----------------------------------------------------------------------


def challenge_sig(secret: bytes, dvm: str, nonce: bytes, seal: bool, kx: bytes) -> bytes:
    """The master's signature of its challenge: HMAC-SHA256 under the DVM
    secret of what it says (which DVM, the nonce, whether the link is
    sealed, its X25519 key)."""
    return hmac_sha256(secret, LABEL + b" challenge\0" + packb([dvm, nonce, bool(seal), kx]))


def transcript_hash(challenge: dict, seal_msg: dict) -> bytes:
    """SHA-256 of the two clear messages of a sealed handshake, as decoded
    (each side re-encodes what it sent or received: msgpack of a decoded map
    is the map's canonical form, so both sides hash the same bytes when, and
    only when, they saw the same messages)."""
    import hashlib
    return hashlib.sha256(LABEL + b" transcript\0" + packb([challenge, seal_msg])).digest()


def derive(psk: bytes, shared: bytes, transcript: bytes) -> tuple[bytes, bytes]:
    """(master -> peer key, peer -> master key) of one link: HKDF-SHA256 of
    the X25519 ``shared`` secret, salted with the pre-shared key, bound to
    the ``transcript`` hash."""
    if not psk:
        raise SealError("no pre-shared key to seal the link with")
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    okm = HKDF(hashes.SHA256(), 2 * KEY_BYTES, salt=psk,
               info=LABEL + b" keys\0" + transcript).derive(shared)
    return okm[:KEY_BYTES], okm[KEY_BYTES:]


def _x25519():
    from cryptography.hazmat.primitives.asymmetric import x25519
    return x25519


def _raw_public(private) -> bytes:
    from cryptography.hazmat.primitives import serialization
    return private.public_key().public_bytes(serialization.Encoding.Raw,
                                             serialization.PublicFormat.Raw)


def _exchange(private, public: object) -> bytes:
    if not isinstance(public, bytes) or len(public) != KX_BYTES:
        raise SealError("the peer's key share is not a 32-byte X25519 key")
    x25519 = _x25519()
    try:
        return private.exchange(x25519.X25519PublicKey.from_public_bytes(public))
    except ValueError:  # a low-order point: the shared secret would be all zeros
        raise SealError("the peer's key share is a weak X25519 key") from None


class Offer:
    """The master's side of one connection's handshake: its challenge, and
    the box once the peer's ``seal`` message is in (:meth:`accept`).

    ``secret`` signs the challenge (None: unsigned -- a test's stand-in);
    ``sealed`` says whether this link will be.  ``nonce`` and ``private``
    (an X25519 private key) are drawn here unless given (tests)."""

    def __init__(self, dvm: str, secret: bytes | None, sealed: bool, *,
                 nonce: bytes | None = None, private=None) -> None:
        self.sealed = bool(sealed)
        self.nonce = os.urandom(NONCE_BYTES) if nonce is None else nonce
        self._private = None
        kx = b""
        if self.sealed:
            self._private = _x25519().X25519PrivateKey.generate() if private is None else private
            kx = _raw_public(self._private)
        #: the challenge message to send.
        self.challenge: dict = {"t": "challenge", "nonce": self.nonce, "dvm": dvm,
                                "seal": self.sealed}
        if self.sealed:
            self.challenge["kx"] = kx
        if secret is not None:
            self.challenge["sig"] = challenge_sig(secret, dvm, self.nonce, self.sealed, kx)

    def accept(self, msg: dict, psk: bytes | None, **box_kw) -> Box:
        """The box of this link from the peer's ``seal`` message ``msg``,
        sealed with ``psk`` (the DVM secret, or a direct client's key);
        raises :class:`SealError` naming what is wrong."""
        if not self.sealed or self._private is None:
            raise SealError("this link is not sealed: the peer sent a seal message")
        problem = seal_msg_problem(msg)
        if problem:
            raise SealError(problem)
        if psk is None:
            raise SealError("no key to seal this peer's link with")
        shared = _exchange(self._private, msg["kx"])
        self._private = None  # used once; forgotten
        to_peer, to_master = derive(psk, shared, transcript_hash(self.challenge, msg))
        return Box(to_peer, to_master, **box_kw)


def seal_msg_problem(msg: dict) -> str:
    """Why ``msg`` is not a well-formed ``seal`` message ("" if it is)."""
    if msg.get("t") != "seal":
        return f"expected the peer's seal message, got {msg.get('t')!r}"
    if msg.get("v") != VERSION:
        return f"unsupported seal version {msg.get('v')!r} (this master speaks {VERSION})"
    if not isinstance(msg.get("role"), str):
        return "the seal message names no role"
    nonce, kx = msg.get("nonce"), msg.get("kx")
    if not isinstance(nonce, bytes) or len(nonce) != NONCE_BYTES:
        return f"the seal message's nonce is not {NONCE_BYTES} bytes"
    if not isinstance(kx, bytes) or len(kx) != KX_BYTES:
        return f"the seal message's key share is not {KX_BYTES} bytes"
    return ""


class Answer:
    """A peer's side of the handshake, from the master's ``challenge``.

    Checks that the challenge is one (:class:`SealError` naming the problem
    if not): of DVM ``dvm``; signed with ``secret`` when the peer holds it;
    sealed when the peer requires it (``need_seal``: a direct client's
    daemon said so).  Then :attr:`sealed` says whether the link is;
    if it is, :attr:`message` is the ``seal`` message to send (clear)
    and :meth:`box` the box, given the pre-shared key.  ``extra`` are
    fields the seal message carries (a direct client's credential fields,
    which the master needs to find its key)."""

    def __init__(self, challenge: dict, *, dvm: str, role: str, secret: bytes | None,
                 need_seal: bool = False, extra: dict | None = None,
                 nonce: bytes | None = None, private=None, where: str = "the master") -> None:
        if challenge.get("t") != "challenge" or not isinstance(challenge.get("nonce"), bytes):
            raise SealError(f"{where} sent no challenge")
        if challenge.get("dvm") != dvm:
            raise SealError(f"{where} is DVM {challenge.get('dvm')}, not {dvm}")
        sealed = challenge.get("seal", False)
        kx = challenge.get("kx", b"")
        if not isinstance(sealed, bool) or not isinstance(kx, bytes):
            raise SealError(f"{where} sent a malformed challenge")
        if secret is not None:
            sig = challenge.get("sig")
            want = challenge_sig(secret, dvm, challenge["nonce"], sealed, kx)
            if not isinstance(sig, bytes) or not _compare_digest(sig, want):
                raise SealError(f"{where}'s challenge is not signed with DVM {dvm}'s secret: "
                                "it is not that DVM's master, or the challenge was altered")
        if need_seal and not sealed:
            raise SealError(f"{where} offered a clear link where this one must be sealed")
        self.sealed = sealed
        self.challenge = challenge
        self.message: dict | None = None
        self._private = None
        if sealed:
            self._private = _x25519().X25519PrivateKey.generate() if private is None else private
            self.message = {"t": "seal", "v": VERSION, "role": role,
                            "nonce": os.urandom(NONCE_BYTES) if nonce is None else nonce,
                            "kx": _raw_public(self._private), **(extra or {})}

    def box(self, psk: bytes, **box_kw) -> Box:
        """The box of this (sealed) link."""
        if self._private is None or self.message is None:
            raise SealError("this link is not sealed")
        shared = _exchange(self._private, self.challenge.get("kx"))
        self._private = None
        to_peer, to_master = derive(psk, shared, transcript_hash(self.challenge, self.message))
        return Box(to_master, to_peer, **box_kw)
