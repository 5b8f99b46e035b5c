"""The master's data routing: whose request it is, and which store answers it.

A data request reaches the master from a daemon (for one of that node's
processes) or from a tool (the CLI, or another DVM relaying).  Identity is
settled first, in one place per kind of peer:

* a daemon's request names its ``caller``; it is served only while that
  process is a running process of a job on the daemon's own node -- an
  ended (reaped) process, or one of another node, is refused
  ``PMIX_ERR_NO_PERMISSIONS``.  So nothing is ever stored under a process
  that no lifetime can reach any more.
* a tool's claims are judged by :meth:`ToolSession.claimed_caller
  <pydvm.runtime.peers.ToolSession.claimed_caller>`; a refused claim is
  answered ``PMIX_ERR_NO_PERMISSIONS`` and logged.

Then the request goes to the master store -- or, in a relaying DVM, to the
data server, carrying the caller as claims (:mod:`pydvm.runtime.relay`).

This is one concern of :class:`~pydvm.runtime.master.Master`, written as a
mixin; it owns ``_callers``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..errors import Status
from ..store import Caller
from ..wire import Message, reply
from . import dataops
from .jobs import ProcState
from .peers import ClaimRefused, DaemonSession, PeerSession, ToolSession
from .relay import Relay

if TYPE_CHECKING:
    from .master import Master

log = logging.getLogger("pydvm.master")

DEFAULT_SESSION = 0


class RoutingMixin:
    """Caller resolution and data requests."""

    #: nspace -> {(node, rank, uid, gid): Caller} of running processes.
    #: Dropped for a namespace whenever one of its processes ends, so a hit
    #: is always a live process.
    _callers: dict[str, dict[tuple, Caller]]

    def _resolve_caller(self: "Master", ns: str, rank: int, uid: int, gid: int | None,
                        node: str | None) -> Caller:
        """A Caller with app and session filled from the job records (None
        for what they do not know, e.g. another DVM's process)."""
        job = self.jobs.get(ns)
        proc = job.procs.get(rank) if job else None
        # The default session never ends, so no session horizon applies to it.
        sid = job.session_id if job and job.session_id != DEFAULT_SESSION else None
        return Caller(ns, rank, uid, gid, node, proc.app_idx if proc else None, sid)

    def _forget_callers(self: "Master", nspace: str) -> None:
        self._callers.pop(nspace, None)

    def _job_owner(self: "Master", nspace: str) -> int | None:
        job = self.jobs.get(nspace)
        return job.uid if job is not None else None

    # ------------------------------------------------------------------

    def _daemon_data_op(self: "Master", session: DaemonSession, msg: Message) -> None:
        refusal = session.admit(msg)
        if refusal is not None:
            session.send(refusal)
            return
        session.note_client_rid(msg)
        fields = dataops.parse_caller_fields(msg.get("caller"))
        if fields is None:
            session.send_answer(msg["id"], reply(msg["id"], Status.ERR_BAD_PARAM,
                                                 "malformed caller"))
            return
        ns, rank, uid, gid = fields
        key = (session.node, rank, uid, gid)
        cached = self._callers.get(ns)
        caller = cached.get(key) if cached is not None else None
        if caller is None:
            job = self.jobs.get(ns)
            proc = job.procs.get(rank) if job is not None else None
            if proc is None or proc.state is ProcState.ENDED or proc.node != session.node:
                why = (f"process {ns}:{rank} is not running on node {session.node}"
                       if proc is None or proc.node != session.node
                       else f"process {ns}:{rank} has ended")
                log.warning("%s: refused a %s request: %s", session.name, msg["t"], why)
                session.send_answer(msg["id"], reply(msg["id"], Status.ERR_NO_PERMISSIONS, why))
                return
            caller = self._resolve_caller(ns, rank, uid, gid, session.node)
            self._callers.setdefault(ns, {})[key] = caller
        self._data_op(session, msg, caller)

    def _tool_data_op(self: "Master", session: ToolSession, msg: Message) -> None:
        refusal = session.admit(msg)
        if refusal is not None:
            session.send(refusal)
            return
        try:
            caller = session.claimed_caller(
                msg, self.dvm_nspace, self._job_owner,
                lambda ns, rank, uid, gid: self._resolve_caller(ns, rank, uid, gid, None))
        except ClaimRefused as exc:
            log.warning("%s (uid %d): refused a %s request: %s", session.name, session.uid,
                        msg["t"], exc)
            session.send(reply(msg.get("id"), exc.status, str(exc)))
            return
        self._data_op(session, msg, caller)

    def _data_op(self: "Master", session: PeerSession, msg: Message, caller: Caller,
                 adjust=None, **extra) -> None:
        """Serve one admitted data request (:meth:`PeerSession.admit`) as
        ``caller``; ``extra`` fields go into an answer given at once (not a
        relayed one, nor a parked lookup's); ``adjust`` changes the answer,
        given at once or relayed (:func:`dataops.reissue`)."""
        rid = msg["id"]
        if self.relay is not None:
            fields = dataops.op_fields(msg)  # the data server gets a plain request
            if fields is None:
                session.send_answer(rid, reply(rid, Status.ERR_BAD_PARAM,
                                               "request payload is not a map"))
                return
            head = {"t": msg["t"], **Relay.claims(caller)}
            dataops.reissue(self.relay.request, session, fields, head, session.forwarded,
                            adjust)
            return
        out = self.request_stats.apply(self.store, caller, msg, (session, rid))
        if out is None:
            session.parked.add(rid)
        else:
            if extra:
                out.update(extra)
            if adjust is not None:
                adjust(out)
            session.send_answer(rid, out)

    def _cancel(self: "Master", session: PeerSession, ref: Any) -> None:
        """A request's caller went away or gave up: drop it without an answer."""
        if not isinstance(ref, int) or isinstance(ref, bool):
            return
        if isinstance(session, DaemonSession):
            session.forget_client_rid(ref)
        if ref in session.parked:
            session.parked.discard(ref)
            self.store.cancel((session, ref))
        remote = session.forwarded.pop(ref, None)
        if remote is not None and self.relay is not None:
            self.relay.cancel(remote)

    def _withdraw(self: "Master", session: PeerSession) -> None:
        """A peer left: everything it had outstanding is withdrawn."""
        for rid in list(session.parked):
            self.store.cancel((session, rid))
        session.parked.clear()
        if self.relay is not None:
            for remote in session.forwarded.values():
                self.relay.cancel(remote)
        session.forwarded.clear()


class MasterRouter:
    """The head node's router: its clients' data requests are served by the
    master in place -- one hop, no re-encoding, the answer written straight
    to the client's connection.  (A daemon's clients go through an
    :class:`~pydvm.runtime.node.UplinkRouter` instead.)"""

    #: nothing is passed on: clients send plain maps (one decode fewer).
    wants_envelopes = False

    def __init__(self, master: "Master") -> None:
        self.master = master

    def forward(self, session: PeerSession, msg: Message, adjust=None) -> None:
        self.master._data_op(session, msg, session.caller, adjust)

    @property
    def answers_now(self) -> bool:
        """Whether :meth:`serve_now` can answer: the master keeps the data
        (a relaying master passes every request on)."""
        return self.master.relay is None

    def serve_now(self, session: PeerSession, msg: Message):
        """:meth:`forward` for a plain request answered at once, on the thread
        holding the store guard (``NodeServer.serve_now``): the master
        store's :class:`~pydvm.store.Reply`, or None -- nothing changed --
        for a lookup that would park (it then goes through :meth:`forward`)."""
        m = self.master
        return m.request_stats.apply_now(m.store, session.caller, msg)

    def cancel(self, session: PeerSession, ref: int) -> None:
        self.master._cancel(session, ref)

    def withdraw_all(self, session: PeerSession) -> None:
        self.master._withdraw(session)

