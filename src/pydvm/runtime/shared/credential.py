"""The direct-data credential: a daemon vouches for a process it launched.

A client on a daemon's node may send its master-store requests straight to
the master (:mod:`pydvm.runtime.master.direct`, :mod:`pydvm.client.direct`).  The master
cannot read that client's peer credentials over TCP, so the daemon that
launched the process vouches for it, once, at launch, without a round trip:

* the daemon draws a per-launch ``nonce`` and derives the process's key
  ``K = HMAC-SHA256(D, msgpack([dvm, node, nspace, rank, uid, gid, app,
  session, nonce]))``, where ``D = HMAC-SHA256(secret, DOMAIN)`` is derived
  from the DVM secret (which only the master and the daemons hold), so that
  a credential can never be mistaken for a handshake answer;
* it puts ``v1:UID:GID:APP:SESSION:NONCE:K:NODE`` in the process's
  environment (:data:`ENV`) -- readable only by the process's own uid and
  root (``/proc/PID/environ``);
* the client proves it holds ``K`` by answering the master's challenge with
  ``HMAC-SHA256(K, challenge + b"client")`` and the fields; ``K`` itself
  never crosses the wire, so a captured handshake cannot be replayed;
* the master recomputes ``K`` from the fields it was sent and checks the
  proof.  Any edited field (another uid, rank, node...) yields another
  ``K``: refused.

The credential says who the process was launched as; whether it still runs
is the master's own records' business (:mod:`pydvm.runtime.master.direct`).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Any

import msgpack

from ...protocol import (  # noqa: F401 (re-exported: the client's half lives there)
    CLIENT_ROLE, CREDENTIAL_ENV, Credential, prove, token_from_env,
)

#: The environment variable a launched process finds its credential in.
ENV = CREDENTIAL_ENV
#: Domain separation: the key credentials are derived with, from the secret.
DOMAIN = b"pydvm direct-data credential v1"
#: The role a direct client announces in its ``auth`` answer.
ROLE = CLIENT_ROLE


def domain_key(secret: bytes) -> bytes:
    """``D``: the key every credential of this DVM is derived with."""
    return hmac.new(secret, DOMAIN, hashlib.sha256).digest()


def process_key(dkey: bytes, dvm: str, node: str, nspace: str, rank: int, uid: int,
                gid: int, app: int, session: int, nonce: bytes) -> bytes:
    """``K`` for one launched process (see the module docstring)."""
    fields = msgpack.packb([dvm, node, nspace, rank, uid, gid, app, session, nonce],
                           use_bin_type=True)
    return hmac.new(dkey, fields, hashlib.sha256).digest()


class Voucher:
    """What a daemon's node server uses to vouch for the processes it launches."""

    def __init__(self, secret: bytes, dvm: str, node: str, master_uri: str) -> None:
        self._dkey = domain_key(secret)
        self.dvm = dvm
        self.node = node
        #: where the node's clients reach the master (as the daemon does).
        self.master_uri = master_uri
        #: the master's direct-data Unix socket, when it runs on this machine.
        self.master_unix = ""

    def environment(self, nspace: str, rank: int, uid: int, gid: int, app: int,
                    session: int) -> dict[str, str]:
        """The variable to add to one process's environment at its launch."""
        nonce = secrets.token_bytes(16)
        key = process_key(self._dkey, self.dvm, self.node, nspace, rank, uid, gid, app,
                          session, nonce)
        return {ENV: Credential(self.node, uid, gid, app, session, nonce, key).token()}


def verify(dkey: bytes, dvm: str, challenge: bytes, msg: dict[str, Any]) -> tuple | None:
    """Check a direct client's ``auth`` answer.

    Returns ``(nspace, rank, node, uid, gid, app, session)`` when the proof
    matches the fields, else None.  Says nothing about whether the process
    still runs.
    """
    ns, rank, node = msg.get("nspace"), msg.get("rank"), msg.get("node")
    nums = [msg.get(f) for f in ("rank", "uid", "gid", "app", "session")]
    nonce, proof = msg.get("nonce"), msg.get("proof")
    if not (isinstance(ns, str) and isinstance(node, str) and isinstance(nonce, bytes)
            and isinstance(proof, bytes)
            and all(isinstance(v, int) and not isinstance(v, bool) for v in nums)):
        return None
    _, uid, gid, app, session = nums
    key = process_key(dkey, dvm, node, ns, rank, uid, gid, app, session, nonce)
    if not hmac.compare_digest(prove(key, challenge), proof):
        return None
    return ns, rank, node, uid, gid, app, session
