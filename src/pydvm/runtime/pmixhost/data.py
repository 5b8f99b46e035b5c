"""PMIx publish, lookup and unpublish as the store's requests, and the store's
answers as PMIx replies -- for a node's own libpmix server
(:mod:`pydvm.runtime.pmixhost.host`) and for a user's agent, which turns its
processes' data upcalls into these requests itself so that the node serves
them like any client's (:mod:`pydvm.runtime.pmixhost.users`).

Values
------
A PMIx value becomes a store value: bare when its type is the default for
its Python type (STRING str, BYTE_OBJECT bytes, INT64 int, DOUBLE float,
BOOL bool), else :class:`~pydvm.store.Typed` keeping the type code; lookups
turn them back, so a ``PMIX_UINT8`` comes back a ``PMIX_UINT8``.
"""

from __future__ import annotations

import logging
from typing import Any

from ...errors import Status
from ...store import Reply, Typed
from ...store.model import DEFAULT_TYPES
from ...wire import Message

log = logging.getLogger("pydvm.pmix")

#: The upcalls that are data requests.
DATA_KINDS = frozenset(("publish", "lookup", "unpublish"))

REFUSED = Reply(Status.ERR_NO_PERMISSIONS)
BAD = Reply(Status.ERR_BAD_PARAM)


def data_request(req, rid: int) -> Message | None:
    """A PMIx publish, lookup or unpublish as a native data request with id
    ``rid``; None when a value cannot be stored (a STRING that is not UTF-8)."""
    if req.kind == "publish":
        try:
            pairs = {k: to_store(v) for k, v in req.pairs.items()}
        except ValueError:
            return None
        msg = {"t": "publish", "id": rid, "pairs": pairs, "persist": req.persistence,
               "replace": False}
        if req.access_uids:
            msg["uids"] = list(req.access_uids)
        if req.access_gids:
            msg["gids"] = list(req.access_gids)
    elif req.kind == "lookup":
        msg = {"t": "lookup", "id": rid, "keys": list(req.keys), "wait": req.wait,
               "timeout": req.timeout or None}
    else:
        return {"t": "unpublish", "id": rid,
                "keys": None if req.keys is None else list(req.keys)}
    if req.range is not None:
        msg["range"] = req.range
    return msg


def answer(req, msg: Message, name: str) -> None:
    """Give PMIx request ``req`` the store's answer ``msg`` (a reply map)."""
    _answer(req, msg.get("status", Status.ERR_BAD_PARAM), msg.get("found") or (), name)


def answer_reply(req, r, name: str) -> None:
    """Give PMIx request ``req`` the store's :class:`~pydvm.store.Reply` ``r``."""
    _answer(req, r.status, [(f.key, f.value, *f.publisher) for f in r.found], name)


def _answer(req, status: int, found, name: str) -> None:
    """``found``: ``(key, store value, nspace, rank)`` each."""
    try:
        if req.kind == "lookup":
            if status == Status.ERR_PARTIAL_SUCCESS and found:
                status = Status.SUCCESS  # libpmix passes data only with SUCCESS
            if status == Status.SUCCESS:
                req.reply(int(status), [(k, to_pmix(v), _proc(ns, r)) for k, v, ns, r in found])
            else:
                req.reply(int(status))
        else:
            req.reply(int(status))
    except Exception:
        log.exception("%s: answering a %s failed", name, req.kind)
        if not req.reply.done:
            req.reply.fail(Status.ERR_BAD_PARAM)


#: pydvm.pmix's Proc and Value, imported on first use (a node without PMIx
#: never imports the binding) and kept: the answering path is hot.
_Proc: Any = None
_Value: Any = None


def _load_types() -> None:
    global _Proc, _Value
    from ...pmix import Proc, Value
    _Proc, _Value = Proc, Value


def _proc(ns: str, rank: int):
    if _Proc is None:
        _load_types()
    return _Proc(ns, rank)


def to_store(v) -> Any:
    """A PMIx :class:`~pydvm.pmix.Value` as a store value (bare when default-typed)."""
    x = v.value
    if isinstance(x, str) and not x.isascii():
        try:
            x.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("a PMIX_STRING value that is not valid UTF-8") from None
    if DEFAULT_TYPES.get(x.__class__) == v.type:
        return x
    return Typed(x, v.type)


def to_pmix(x):
    """A store value as a :class:`~pydvm.pmix.Value` with its PMIx type."""
    if _Value is None:
        _load_types()
    if x.__class__ is Typed:
        return _Value(x.value, x.pmix_type)
    return _Value.of(x)


# ----------------------------------------------------------------------
# a user's agent relays its processes' data requests in this form
# ----------------------------------------------------------------------

#: What a relayed data request may say: a PMIx publish, lookup or
#: unpublish's fields (:func:`data_request`), nothing a native client's
#: request could add (``replace``, ``node_only``...).
RELAYED_FIELDS = frozenset(("t", "keys", "pairs", "persist", "uids", "gids", "wait",
                            "timeout", "range"))


def relayed_request(m: Any) -> Message | None:
    """The data request an agent relayed (``m``, :func:`data_request`'s map
    without its id), cut to :data:`RELAYED_FIELDS`; None if it is not one.
    The store checks the fields' values as it does any client's."""
    if not isinstance(m, dict) or m.get("t") not in DATA_KINDS:
        return None
    return {k: v for k, v in m.items() if k in RELAYED_FIELDS}


class RelayedData:
    """A relayed data request the node could not answer at once (a lookup
    that parked, one passed on to the master), as its process's session
    keeps it until answered: ``reply`` is the
    :class:`~pydvm.runtime.pmixhost.remote.RemoteReply` to the agent, and the
    store's answer (a reply map) goes back as it is (:meth:`relay`) -- the
    agent makes the PMIx reply of it (:func:`answer`)."""

    __slots__ = ("kind", "reply")

    def __init__(self, kind: str, reply) -> None:
        self.kind = kind
        self.reply = reply

    def relay(self, msg: Message) -> None:
        self.reply.relay(msg)
