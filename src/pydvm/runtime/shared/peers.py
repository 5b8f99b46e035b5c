"""Peer sessions: who is at the other end of a connection, and what it has pending with us.

Every accepted connection gets one session object once its first message
(a client's ``hello``, a peer's ``auth``) has been accepted.  The session
owns three things, so that nothing else has to keep them in step:

* the peer's **identity** -- a client's :class:`~pydvm.store.Caller`, a
  daemon's node name, a tool's uid/gid and whether it proved it holds the
  DVM secret;
* its **outstanding requests** -- ids whose lookups are parked in one of our
  stores (:attr:`PeerSession.parked`) and ids passed on to the next hop
  (:attr:`PeerSession.forwarded`, their id there), so that a peer that goes
  away, or cancels, can be withdrawn everywhere;
* the **cap** on those (:attr:`PeerSession.max_outstanding`): a connection
  may hold at most that many requests at once; beyond it a request is
  answered ``PMIX_ERR_OUT_OF_RESOURCE`` and nothing is parked.

Who may claim what is decided here and nowhere else
(:meth:`ToolSession.claimed_caller`):

=========================  ====================================================
peer                        identity used for data requests
=========================  ====================================================
client (at a daemon)        uid/gid from ``SO_PEERCRED``; nspace/rank from its
                            ``hello``, checked against the running processes
                            of that node.  Claims in its messages are dropped.
daemon (at the master)      the ``caller`` it names, which must be a running
                            process of a job on *that daemon's* node.
direct client (at the       fixed at its handshake: the identity its daemon
master)                     vouched for at launch (a credential, see
                            :mod:`~pydvm.runtime.shared.credential`), accepted only
                            for a running process.  Claims are dropped.
tool, privileged            root, or the DVM's owner (it answered the
                            challenge with the DVM secret): any ``requestor``,
                            ``req_uid``, ``req_gid`` claim is honoured -- this
                            is what a relaying DVM sends.
tool, unprivileged          (a user on a multi-user DVM's tool socket) may
                            claim only its own uid and gid, and a ``requestor``
                            only if that process is not another user's job of
                            this DVM; what it can remove is further limited to
                            its own uid's items by the store's ownership rule.
                            A refused claim is answered
                            ``PMIX_ERR_NO_PERMISSIONS`` and logged.
=========================  ====================================================
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from ...errors import Status
from ...store import Caller, Reply
from ...wire import BODY, Message, pack_payload, reply, unpack_body
from . import dataops
from .jobs import DEFAULT_SESSION

if TYPE_CHECKING:
    from ...wire import Channel

log = logging.getLogger("pydvm.peers")

#: Requests one client or tool connection may have outstanding at once
#: (parked lookups included).  A relaying DVM's connection carries the
#: requests of all its clients, so it gets :data:`RELAY_FACTOR` times more.
MAX_OUTSTANDING = 1024
RELAY_FACTOR = 64


class ClaimRefused(Exception):
    """A peer asked to act as an identity it may not take (``status`` is
    NO_PERMISSIONS), or its claim is malformed (BAD_PARAM); the text says
    which.  Raised by :meth:`ToolSession.claimed_caller` and by the
    master's process table for a process that is not running where its
    peer says (:meth:`~pydvm.runtime.master.processes.ProcessTable.running_caller`)."""

    def __init__(self, text: str, status: Status = Status.ERR_NO_PERMISSIONS) -> None:
        super().__init__(text)
        self.status = status


def process_caller(nspace: str, rank: int, uid: int, gid: int | None, node: str | None = None,
                   app_idx: int | None = None, session_id: int | None = None) -> Caller:
    """The one way a process's identity is built -- by the master (from its
    job records), a node server (at a client's hello) and a PMIx host (at
    registration).  The default session never ends, so no SESSION horizon
    applies to its processes: their ``session_id`` is None."""
    return Caller(nspace, rank, uid, gid, node, app_idx,
                  None if session_id == DEFAULT_SESSION else session_id)


class SessionChannel:
    """The channel-like end of a session whose peer lives in this process (a
    PMIx upcall, a PMI-1 request): the routing code answers the session by
    sending a reply map (or an encoded body) on its channel, and it is
    handed to ``session.deliver`` at once -- nothing is written, nothing
    waits to drain."""

    write_paused = False

    def __init__(self, name: str) -> None:
        self.name = name
        self.session: Any = None
        self.closed = False

    def send(self, msg: Message) -> None:
        if self.session is not None:
            self.session.deliver(msg)

    def send_raw(self, body) -> None:
        self.send(unpack_body(bytes(body)))

    def on_drain(self, fn: Callable[[], None]) -> None:
        fn()


class PeerSession:
    """The state one accepted connection owns (see the module docstring).

    Invariants: ``parked`` and ``forwarded`` are disjoint; a request id is in
    one of them exactly while its reply is still owed to the peer; together
    they never hold more than ``max_outstanding`` ids (None: no cap).
    """

    kind: ClassVar[str] = "peer"

    def __init__(self, channel: "Channel", max_outstanding: int | None = MAX_OUTSTANDING) -> None:
        self.channel = channel
        #: ids of this peer's lookups parked in one of our stores.
        self.parked: set[int] = set()
        #: this peer's request id -> the id under which it was passed on.
        self.forwarded: dict[int, int] = {}
        self.max_outstanding = max_outstanding
        channel.session = self

    @property
    def name(self) -> str:
        return self.channel.name

    @property
    def closed(self) -> bool:
        return self.channel.closed

    def send(self, msg: Message) -> None:
        self.channel.send(msg)

    def outstanding(self) -> int:
        return len(self.parked) + len(self.forwarded)

    def admit(self, msg: Message) -> Message | None:
        """Check a new data request's id; return the refusal to send, or None.

        Refuses a request without an integer id, one reusing an id still
        outstanding, and one beyond the cap (``PMIX_ERR_OUT_OF_RESOURCE``).
        """
        rid = msg.get("id")
        if not isinstance(rid, int) or isinstance(rid, bool):
            return reply(None, Status.ERR_BAD_PARAM, "request without an integer id")
        if rid in self.parked or rid in self.forwarded:
            return reply(rid, Status.ERR_BAD_PARAM, f"request id {rid} is still outstanding")
        cap = self.max_outstanding
        if cap is not None and self.outstanding() >= cap:
            log.warning("%s: refused a request beyond its cap of %d outstanding", self.name, cap)
            return reply(rid, Status.ERR_OUT_OF_RESOURCE,
                         f"this connection already has {cap} requests outstanding "
                         "(waiting lookups included); cancel or finish some first")
        return None

    def send_answer(self, rid: int, out: Message) -> None:
        """Send ``out``, the answer to this peer's request ``rid``."""
        self.channel.send(out)

    def answer(self, rid: int, r: Reply) -> None:
        """The store answered one of our parked lookups (its ``on_answer`` sink)."""
        self.parked.discard(rid)
        self.send_answer(rid, dataops.encode(rid, r))


def route_answer(ticket: tuple[PeerSession, int], r: Reply) -> None:
    """The ``on_answer`` sink every store is given: tickets are (session, id)."""
    session, rid = ticket
    session.answer(rid, r)


class ClientSession(PeerSession):
    """A job process connected to its node's daemon (after a good ``hello``).

    ``caller`` is fixed at the hello: uid/gid from the socket, the process
    from the daemon's own records.  ``proc_key`` is (nspace, rank) of the
    process it acts for; the daemon closes every session of a process when it
    reaps that process, so a session never outlives the process it acts for.
    """

    kind = "client"

    def __init__(self, channel: "Channel", caller: Caller, pid: int,
                 max_outstanding: int | None = MAX_OUTSTANDING) -> None:
        super().__init__(channel, max_outstanding)
        self.caller = caller
        self.pid = pid

    @property
    def proc_key(self) -> tuple[str, int]:
        return (self.caller.nspace, self.caller.rank)


class DirectSession(PeerSession):
    """A job process of a daemon's node connected straight to the master for
    its master-store requests (:mod:`pydvm.runtime.master.direct`).

    ``caller`` is fixed at the handshake from the credential its daemon gave
    it at launch (uid/gid are those it was launched as), with app and session
    from the master's job records: the tuple the same request relayed by the
    daemon would carry.  The master closes every direct session of a process
    when it learns that process ended, so one never outlives it.
    """

    kind = "direct"

    def __init__(self, channel: "Channel", caller: Caller,
                 max_outstanding: int | None = MAX_OUTSTANDING) -> None:
        super().__init__(channel, max_outstanding)
        self.caller = caller

    @property
    def proc_key(self) -> tuple[str, int]:
        return (self.caller.nspace, self.caller.rank)


class DaemonSession(PeerSession):
    """A daemon connected to the master.  It speaks for its node's processes
    only; its requests are not capped here (each of its clients is, there)."""

    kind = "daemon"

    def __init__(self, channel: "Channel", node: str) -> None:
        super().__init__(channel, None)
        self.node = node
        #: nspace -> bytes of its output received but not yet acknowledged.
        self.output_unacked: dict[str, int] = {}
        #: namespaces whose acknowledgement waits for their tool to drain.
        self.ack_scheduled: set[str] = set()
        #: our id of an enveloped request -> its client's own id, so that the
        #: answer is encoded once, here, for the client (the daemon passes
        #: it on as bytes).
        self.client_rids: dict[int, int] = {}

    def note_client_rid(self, msg: Message) -> None:
        """Remember the client's id of an enveloped request (see send_answer)."""
        rid = msg.get("rid")
        if BODY in msg and isinstance(rid, int) and not isinstance(rid, bool):
            self.client_rids[msg["id"]] = rid

    def forget_client_rid(self, rid: int) -> None:
        self.client_rids.pop(rid, None)

    def send_answer(self, rid: int, out: Message) -> None:
        """Answer our request ``rid``: for an enveloped one, the answer is
        encoded once with the client's id and travels as the payload of a
        reply the daemon passes on untouched."""
        client = self.client_rids.pop(rid, None)
        if client is None:
            self.channel.send(out)
            return
        out["id"] = client
        self.channel.send({"t": "reply", "id": rid, BODY: pack_payload(out)})


class ToolSession(PeerSession):
    """A tool connected to the master: the CLI, or another DVM's master relaying.

    ``owner`` is True when it answered the challenge with the DVM secret
    (only the user who started the DVM can read it); ``uid``/``gid`` are its
    peer credentials on a multi-user tool socket, else the DVM's own.
    ``relay`` is what the tool declared at its handshake: it only raises the
    cap, never what the tool may claim.
    """

    kind = "tool"

    def __init__(self, channel: "Channel", uid: int, gid: int, *, owner: bool, seq: int,
                 relay: bool = False, max_outstanding: int = MAX_OUTSTANDING) -> None:
        super().__init__(channel, max_outstanding * (RELAY_FACTOR if relay else 1))
        self.uid = uid
        self.gid = gid
        self.owner = owner
        self.seq = seq
        self.relay = relay

    @property
    def privileged(self) -> bool:
        """Root, or the DVM's owner: may act for anyone (relay for any user)."""
        return self.owner or self.uid == 0

    def claimed_caller(self, msg: Message, dvm_nspace: str,
                       job_owner: Callable[[str], int | None],
                       resolve: Callable[[str, int, int, int | None], Caller]) -> Caller:
        """The identity a data request from this tool acts as.

        Without claims a tool acts as the DVM itself (``dvm_nspace`` and a
        negative rank unique to the connection) with its own uid/gid.
        ``job_owner(nspace)`` is the uid of this DVM's job of that name
        (None if there is none); ``resolve`` fills app/session from the job
        records.  Raises :class:`ClaimRefused` for a claim this tool may not
        make -- never quietly falls back to its own identity.
        """
        uid, gid = self.uid, self.gid
        ns, rank = dvm_nspace, -self.seq
        req = msg.get("requestor")
        if req is not None:
            if not (isinstance(req, (list, tuple)) and len(req) == 2
                    and isinstance(req[0], str) and _is_int(req[1])):
                raise ClaimRefused(f"malformed requestor claim {req!r}", Status.ERR_BAD_PARAM)
            ns, rank = req[0], req[1]
        if "req_uid" in msg:
            v = msg["req_uid"]
            if not _is_int(v):
                raise ClaimRefused(f"malformed req_uid claim {v!r}", Status.ERR_BAD_PARAM)
            uid = v
        if "req_gid" in msg:
            v = msg["req_gid"]
            if v is not None and not _is_int(v):
                raise ClaimRefused(f"malformed req_gid claim {v!r}", Status.ERR_BAD_PARAM)
            gid = v
        if not self.privileged:
            if uid != self.uid or (gid is not None and gid != self.gid):
                raise ClaimRefused(
                    f"uid {self.uid} may not act as uid {uid} gid {gid}: only root and the "
                    "DVM's owner may relay for other users")
            if req is not None and ns != dvm_nspace:
                owner = job_owner(ns)
                if owner is not None and owner != self.uid:
                    raise ClaimRefused(
                        f"uid {self.uid} may not act as process {ns}:{rank} of another user")
        caller = resolve(ns, rank, uid, gid)
        app = msg.get("req_app")
        if caller.app_idx is None and _is_int(app):
            caller = caller._replace(app_idx=app)
        return caller


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
