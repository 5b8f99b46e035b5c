"""Applying data requests (publish, lookup, unpublish, update, keys) to a store.

Shared by the master (for requests relayed by daemons and sent by tools) and
the daemons (LOCAL-range requests of their own clients), so that both stores
read a request the same way.  The identity is always decided by the caller
of :func:`apply`; nothing in the message is trusted for it.

Wire fields of a data request::

    publish:   pairs{str: value}, range:int, persist:int|None, uids:[int],
               gids:[int], replace:bool
    lookup:    keys:[str], range:int, wait:int|None, timeout:float|None
    unpublish: keys:[str] | None (None: everything the caller published)
    update:    key:str, op:"add"|"cas"|"append", value, expected (cas),
               range:int, persist:int|None, uids:[int], gids:[int]
    keys:      prefix:str, range:int, limit:int|None

Replies carry ``found: [[key, value, nspace, rank], ...]`` (a lookup's
keys; the key an update leaves, with its value and owner), ``count`` (keys
an unpublish removed, 1 when an update changed the store, keys a ``keys``
request matched; absent: 0) and ``keys`` (what a ``keys`` request listed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Hashable

from ...enums import Range
from ...errors import Status
from ...protocol import MASTER, NODE, stores_for  # noqa: F401 (re-exported)
from ...store import Caller, DataStore, Pending, Reply
from ...wire import BODY, Message, reply, unpack_payload

if TYPE_CHECKING:
    from ...wire import Channel
    from .peers import ClientSession

DATA_OPS = frozenset({"publish", "lookup", "unpublish", "update", "keys"})

#: Fields a daemon forwards to the master for each op; anything else a
#: client sent (notably requestor claims) is dropped on the daemon.
FORWARDED_FIELDS = {
    "publish": ("pairs", "range", "persist", "uids", "gids", "replace"),
    "lookup": ("keys", "range", "wait", "timeout"),
    "unpublish": ("keys",),
    "update": ("key", "op", "value", "expected", "range", "persist", "uids", "gids"),
    "keys": ("prefix", "range", "limit"),
}

#: A ``keys`` reply lists at most this many keys, of at most this many
#: UTF-8 bytes in all (its ``count`` is never bounded), so it fits a frame.
KEYS_LISTED = 10_000
KEYS_LISTED_BYTES = 4 * 1024 * 1024


def request_range(msg: Message) -> Any:
    """The range that routes this request (SESSION when absent).

    In an envelope it is in the header, which is all a router reads.
    """
    return msg.get("range", int(Range.SESSION))


def op_fields(msg: Message) -> Message | None:
    """The request as :func:`apply` reads it, or None if its payload is not a map.

    A plain request is its own fields.  An enveloped one
    (:func:`pydvm.wire.pack_parts`) is decoded here -- once, by the store
    that serves it -- keeping only the fields of its operation
    (:data:`FORWARDED_FIELDS`), with type, id and range from the header:
    whatever else the payload holds (claims included) is never read.
    """
    payload = msg.get(BODY)
    if payload is None:
        return msg
    body = unpack_payload(payload)
    if body is None:
        return None
    t = msg["t"]
    out = {f: body[f] for f in FORWARDED_FIELDS.get(t, ()) if f in body and f != "range"}
    out["t"] = t
    out["id"] = msg.get("id")
    if "range" in msg:
        out["range"] = msg["range"]
    return out


def encode(rid: Any, r: Reply) -> Message:
    out = reply(rid, r.status, r.message)
    if r.found:
        out["found"] = [[f.key, f.value, f.publisher[0], f.publisher[1]] for f in r.found]
    if r.count:
        out["count"] = r.count
    if r.keys:
        out["keys"] = list(r.keys)
    return out


def add_count(n: int) -> Callable[[Message], None]:
    """An answer adjuster that adds ``n`` to a successful answer's ``count``:
    an unpublish whose node-store part removed ``n`` keys answers with the
    master's answer, which counts only its own."""
    def adjust(r: Message) -> None:
        if r.get("status") == 0:
            c = r.get("count", 0)
            r["count"] = (c if isinstance(c, int) and not isinstance(c, bool) else 0) + n
    return adjust


def apply(store: DataStore, caller: Caller, msg: Message, ticket: Hashable) -> Message | None:
    """Run one data request; return its reply, or None if a lookup parked.

    A parked lookup is answered later through the store's ``on_answer``
    with ``ticket``.  Never raises for bad input: a malformed request gets a
    BAD_PARAM reply naming the problem.
    """
    rid = msg.get("id")
    fields = op_fields(msg)
    if fields is None:
        return reply(rid, Status.ERR_BAD_PARAM, "request payload is not a map")
    r = run(store, caller, fields, ticket)
    return None if r is None else encode(rid, r)


def run(store: DataStore, caller: Caller, msg: Message, ticket: Hashable) -> Reply | None:
    """:func:`apply` of a plain request (its own fields), answering with the
    store's :class:`~pydvm.store.Reply` itself (None: a lookup parked) --
    for a caller that needs no wire answer (a PMIx request answered in
    libpmix's upcall)."""
    t = msg["t"]
    if t == "publish":
        r = store.publish(
            caller,
            msg.get("pairs"),
            request_range(msg),
            msg.get("persist"),
            msg.get("uids") or (),
            msg.get("gids") or (),
            msg.get("replace", False),
        )
    elif t == "lookup":
        out = store.lookup(
            caller,
            msg.get("keys"),
            request_range(msg),
            msg.get("wait"),
            msg.get("timeout"),
            ticket=ticket,
        )
        if isinstance(out, Pending):
            return None
        return out
    elif t == "unpublish":
        keys = msg.get("keys")
        r = store.unpublish_all(caller) if keys is None else store.unpublish(caller, keys)
    elif t == "update":
        r = store.update(
            caller,
            msg.get("key"),
            msg.get("op"),
            msg.get("value"),
            msg.get("expected"),
            request_range(msg),
            msg.get("persist"),
            msg.get("uids") or (),
            msg.get("gids") or (),
        )
    elif t == "keys":
        limit = msg.get("limit")
        if limit is None or (isinstance(limit, int) and not isinstance(limit, bool)
                             and limit > KEYS_LISTED):
            limit = KEYS_LISTED
        r = store.keys(caller, msg.get("prefix", ""), request_range(msg), limit=limit,
                       max_bytes=KEYS_LISTED_BYTES)
    else:
        r = Reply(Status.ERR_BAD_PARAM, message=f"unknown data operation {t!r}")
    return r


def parse_caller_fields(v: Any) -> tuple[str, int, int, int | None] | None:
    """Validate ``[nspace, rank, uid, gid]`` as relayed by a daemon."""
    if not isinstance(v, (list, tuple)) or len(v) != 4:
        return None
    ns, rank, uid, gid = v
    if not isinstance(ns, str) or not _is_int(rank) or not _is_int(uid):
        return None
    if gid is not None and not _is_int(gid):
        return None
    return ns, rank, uid, gid


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def reissue(send: Callable[[Message, Callable[[Message], None]], int | None],
            to: Any, msg: Message, head: Message, outstanding: dict[int, int],
            adjust: Callable[[Message], None] | None = None) -> None:
    """Pass a data request one hop on and route its one reply back.

    Used by a daemon (client -> master) and a relaying master (daemon ->
    data server).  The reissued request is ``head`` (type and identity,
    chosen by the relaying side) plus the request itself: an enveloped
    request's payload, passed on as bytes, with the sender's id as ``rid``
    so that the next hop can encode the answer for the sender once; a plain
    request's fields in :data:`FORWARDED_FIELDS` -- whatever else the sender
    put in is dropped either way.

    The reply returns to ``to`` (a peer session) under the sender's own id:
    an answer encoded by the next hop (it carries a payload) is passed on as
    it is, any other is re-addressed.  Until then ``outstanding`` maps that id
    to the next hop's, so a vanished sender's waiting lookups can be
    cancelled there.  ``send`` is :meth:`Channel.request`-like: it returns
    the next hop's id, or None when it already answered (the next hop is
    unreachable).  ``adjust`` (rarely given: :func:`add_count`) changes the
    answer before it goes back, which then costs decoding it here.
    """
    rid = msg["id"]
    fwd = dict(head)
    payload = msg.get(BODY)
    if payload is not None:
        fwd["rid"] = rid
        if "range" in msg:
            fwd["range"] = msg["range"]
        fwd[BODY] = payload
    else:
        for f in FORWARDED_FIELDS[msg["t"]]:
            if f in msg:
                fwd[f] = msg[f]

    def answered(r: Message) -> None:
        outstanding.pop(rid, None)
        body = r.get(BODY)
        if body is not None and adjust is not None:
            inner = unpack_payload(body)
            if inner is not None:
                r, body = inner, None
        if body is not None:
            to.channel.send_raw(body)
        else:
            r["id"] = rid
            if adjust is not None:
                adjust(r)
            to.send_answer(rid, r)

    remote = send(fwd, answered)
    if remote is not None and not to.closed:
        outstanding[rid] = remote


def stats_row(store: DataStore, uid: int, prefix: str | None = None) -> dict:
    """One store's entry of ``pydvm store --json``: counts for everyone's
    data, key names only of ``uid``'s own items, and for each of those
    (``key_info``, the first :data:`KEY_INFO_LIMIT`, least recently used
    first; ``key_info_truncated`` says whether there were more) its
    persistence, range, idle seconds, seconds until the idle timeout (None:
    a lifetime removes it), size and publisher.  With ``prefix`` (``pydvm
    store --prefix``) only the keys starting with it, in sorted order."""
    st = store.stats()
    info = store.describe_uid(uid, limit=KEY_INFO_LIMIT + 1, prefix=prefix)
    return {
        "store": store.name,
        "items": st.items,
        "bytes_by_uid": {str(u): b for u, b in st.bytes_by_uid.items()},
        "parked": st.parked,
        "evictions": st.evictions,
        "expiries": st.expiries,
        "keys": store.keys_of_uid(uid, prefix),
        "key_info": [{"key": k.key, "persistence": k.persistence.word, "range": k.range.word,
                      "idle": round(k.idle, 3), "expires_in": _rounded(k.expires_in),
                      "size": k.size, "item_bytes": k.item_bytes,
                      "publisher": f"{k.publisher[0]}:{k.publisher[1]}"}
                     for k in info[:KEY_INFO_LIMIT]],
        "key_info_truncated": len(info) > KEY_INFO_LIMIT,
        "uid": uid,
    }


#: Keys described one by one in a store's row: a reply must fit a frame
#: however many keys a user holds.
KEY_INFO_LIMIT = 1000


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)


class UplinkRouter:
    """Data requests of a daemon's clients go to the master over the uplink.

    The reissued request is the client's own plus a routing head (type and
    the caller's identity); its one reply returns to the client under the
    client's id (see :func:`reissue`).
    """

    #: nothing is answered here: every request waits for the master.
    answers_now = False
    #: a daemon's node, not the head node
    at_master = False

    def __init__(self, uplink: "Channel") -> None:
        self.uplink = uplink

    def forward(self, session: "ClientSession", msg: Message, adjust=None) -> None:
        c = session.caller
        head = {"t": msg["t"], "caller": [c.nspace, c.rank, c.uid, c.gid]}
        reissue(self.uplink.request, session, msg, head, session.forwarded, adjust)

    def cancel(self, session: "ClientSession", ref: int) -> None:
        mid = session.forwarded.pop(ref, None)
        if mid is not None:
            self.uplink.withdraw(mid)

    def withdraw_all(self, session: "ClientSession") -> None:
        for mid in session.forwarded.values():
            self.uplink.withdraw(mid)
        session.forwarded.clear()
