"""The master's data service: the master store, the relay, and whose each request is.

A data request reaches the master from a daemon (for one of that node's
processes), from a tool (the CLI, or another DVM relaying), from a direct
client (:mod:`pydvm.runtime.master.direct`), or from a head-node client through
:class:`MasterRouter`.  Identity is settled first, in one place per kind of
peer:

* a daemon's request names its ``caller``; it is served only while that
  process is a running process of a job on the daemon's own node
  (:meth:`ProcessTable.running_caller
  <pydvm.runtime.master.processes.ProcessTable.running_caller>`) -- an ended
  (reaped) process, or one of another node, is refused
  ``PMIX_ERR_NO_PERMISSIONS``.  So nothing is ever stored under a process
  that no lifetime can reach any more.
* a tool's claims are judged by :meth:`ToolSession.claimed_caller
  <pydvm.runtime.shared.peers.ToolSession.claimed_caller>`; a refused claim is
  answered ``PMIX_ERR_NO_PERMISSIONS`` and logged.
* a direct client's and a head-node client's identity was fixed when they
  connected.

Then :meth:`DataService.serve` sends the request to the master store -- or,
in a relaying DVM, to the data server, carrying the caller as claims
(:mod:`pydvm.runtime.master.relay`).

:class:`DataService` owns the master store, the relay and the request
statistics; it applies the master-store purges the lifetimes cause (as a
:class:`~pydvm.runtime.master.processes.ProcessListener`) and a relaying DVM's
purges (the tools' ``purge``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ...enums import Persistence
from ...errors import Status
from ...store import DataStore, MonotonicClock, StoreParams
from ...wire import Message, reply
from ..shared import dataops
from ..shared.auth import DvmUri
from ..shared.peers import ClaimRefused, DaemonSession, PeerSession, ToolSession, process_caller, \
    route_answer
from ..shared.stats import RequestStats
from ..shared.storeguard import GuardedStats, guard_for, guarded_store
from . import core
from .processes import ProcessListener, ProcessTable
from .relay import Relay

log = logging.getLogger("pydvm.master")


class DataService(ProcessListener):
    """The master store and every data request the master serves (see the module docstring)."""

    def __init__(self, processes: ProcessTable, *, values: dict[str, Any], dvm_nspace: str,
                 data_server: DvmUri | None = None) -> None:
        self._processes = processes
        self.values = values
        self.dvm_nspace = dvm_nspace
        #: the master store (made by :meth:`open`, on the loop).
        self.store: DataStore | None = None
        #: set when this DVM relays its data requests to another DVM (SPEC 7).
        self.relay: Relay | None = Relay(data_server, values) if data_server else None
        #: counts and latencies of the data requests the master store served.
        self.request_stats = RequestStats()

    def open(self, loop: asyncio.AbstractEventLoop) -> None:
        """Make the master store, under the process's store guard, shared with
        the head node's PMIx requests answered on libpmix's thread
        (runtime/shared/storeguard.py); its timers run on ``loop``."""
        self.request_stats = GuardedStats(guard_for(loop))
        self.store = guarded_store(
            guard_for(loop),
            name="master",
            clock=MonotonicClock(),
            on_answer=route_answer,
            params=StoreParams(
                timeout=self.values["prte_data_server_timeout"],
                max_size=self.values["prte_data_server_max_size"],
                verbose=self.values["prte_data_server_verbose"],
            ),
            dvm_nspace=self.dvm_nspace,
        )

    def stop(self) -> None:
        if self.relay is not None:
            self.relay.stop()

    # ------------------------------------------------------------------
    # requests, by kind of peer
    # ------------------------------------------------------------------

    def daemon_request(self, daemon: DaemonSession, msg: Message) -> None:
        """A daemon's data request for one of its node's processes."""
        refusal = daemon.admit(msg)
        if refusal is not None:
            daemon.send(refusal)
            return
        daemon.note_client_rid(msg)
        fields = dataops.parse_caller_fields(msg.get("caller"))
        if fields is None:
            daemon.send_answer(msg["id"], reply(msg["id"], Status.ERR_BAD_PARAM,
                                                "malformed caller"))
            return
        ns, rank, uid, gid = fields
        try:
            caller = self._processes.running_caller(ns, rank, uid, gid, daemon.node)
        except ClaimRefused as exc:
            log.warning("%s: refused a %s request: %s", daemon.name, msg["t"], exc)
            daemon.send_answer(msg["id"], reply(msg["id"], exc.status, str(exc)))
            return
        self.serve(daemon, msg, caller)

    def tool_request(self, tool: ToolSession, msg: Message) -> None:
        """A tool's data request, as itself or as what it may claim."""
        refusal = tool.admit(msg)
        if refusal is not None:
            tool.send(refusal)
            return
        try:
            caller = tool.claimed_caller(msg, self.dvm_nspace, self._processes.job_owner,
                                         self._processes.caller)
        except ClaimRefused as exc:
            log.warning("%s (uid %d): refused a %s request: %s", tool.name, tool.uid,
                        msg["t"], exc)
            tool.send(reply(msg.get("id"), exc.status, str(exc)))
            return
        self.serve(tool, msg, caller)

    def serve(self, peer: PeerSession, msg: Message, caller, adjust=None, **extra) -> None:
        """Serve one admitted data request (:meth:`PeerSession.admit`) as
        ``caller``; ``extra`` fields go into an answer given at once (not a
        relayed one, nor a parked lookup's); ``adjust`` changes the answer,
        given at once or relayed (:func:`dataops.reissue`)."""
        rid = msg["id"]
        if self.relay is not None:
            fields = dataops.op_fields(msg)  # the data server gets a plain request
            if fields is None:
                peer.send_answer(rid, reply(rid, Status.ERR_BAD_PARAM,
                                            "request payload is not a map"))
                return
            head = {"t": msg["t"], **Relay.claims(caller)}
            dataops.reissue(self.relay.request, peer, fields, head, peer.forwarded, adjust)
            return
        out = self.request_stats.apply(self.store, caller, msg, (peer, rid))
        if out is None:
            peer.parked.add(rid)
        else:
            if extra:
                out.update(extra)
            if adjust is not None:
                adjust(out)
            peer.send_answer(rid, out)

    def cancel(self, peer: PeerSession, msg: Message) -> None:
        """A ``cancel``: the request ``ref`` is dropped without an answer."""
        self.cancel_ref(peer, msg.get("ref"))

    def cancel_ref(self, peer: PeerSession, ref: Any) -> None:
        """A request's caller went away or gave up: drop it without an answer."""
        if not isinstance(ref, int) or isinstance(ref, bool):
            return
        if isinstance(peer, DaemonSession):
            peer.forget_client_rid(ref)
        if ref in peer.parked:
            peer.parked.discard(ref)
            self.store.cancel((peer, ref))
        remote = peer.forwarded.pop(ref, None)
        if remote is not None and self.relay is not None:
            self.relay.cancel(remote)

    def withdraw(self, peer: PeerSession) -> None:
        """A peer left: everything it had outstanding is withdrawn."""
        for rid in list(peer.parked):
            self.store.cancel((peer, rid))
        peer.parked.clear()
        if self.relay is not None:
            for remote in peer.forwarded.values():
                self.relay.cancel(remote)
        peer.forwarded.clear()

    # ------------------------------------------------------------------
    # purges
    # ------------------------------------------------------------------

    def lifetime_ended(self, e: core.PurgeStore) -> list[asyncio.Future]:
        """Apply a lifetime's purge to the master store, and the same to the
        relayed data server's store (SPEC 7), durably (relay.py); the
        namespace's and the session's relayed purges are returned, to be
        waited for before the nodes'."""
        self.store.purge(e.horizon, nspace=e.nspace, rank=e.rank, app_idx=e.app_idx,
                         session_id=e.session_id)
        if self.relay is None:
            return []
        if e.horizon is Persistence.SESSION:
            # the remote store knows nothing of our sessions: name each job
            return [self.relay.purge(Persistence.SESSION, ns)
                    for ns in sorted(self._processes.sessions[e.session_id].history)]
        fut = self.relay.purge(e.horizon, e.nspace, rank=e.rank, app_idx=e.app_idx)
        return [fut] if e.horizon is Persistence.NSPACE else []

    def relayed_purge(self, tool: ToolSession, msg: Message) -> None:
        """A tool's ``purge``: a relaying DVM applies one of its lifetimes to this store.

        From root or the owner it applies to every matching item; from any
        other user only to that user's own items (ownership, as for
        ``unpublish``), so a purge can never remove more than its sender could.
        """
        rid = msg.get("id")
        ns, rank, app = msg.get("nspace"), msg.get("rank"), msg.get("app_idx")
        try:
            horizon = Persistence(msg.get("horizon"))
            if horizon not in (Persistence.PROC, Persistence.APP, Persistence.NSPACE,
                               Persistence.SESSION):
                raise ValueError(f"{horizon.name} is not a lifetime horizon")
            if not isinstance(ns, str):
                raise ValueError("a relayed purge names its namespace")
            if horizon is Persistence.PROC and not isinstance(rank, int):
                raise ValueError("a PROC purge names its rank")
            if horizon is not Persistence.PROC:
                rank = None
            if horizon is not Persistence.APP:
                app = None
            owner = None if tool.privileged else process_caller(
                self.dvm_nspace, -tool.seq, tool.uid, tool.gid)
            n = self.store.purge(horizon, nspace=ns, rank=rank, app_idx=app, owner=owner)
        except (ValueError, TypeError) as exc:
            tool.send(reply(rid, Status.ERR_BAD_PARAM, str(exc)))
            return
        tool.send(reply(rid, Status.SUCCESS, removed=n))

    def stats_row(self, uid: int, prefix: str | None) -> dict:
        """The master store's row of ``pydvm store``."""
        return dataops.stats_row(self.store, uid, prefix)


class MasterRouter:
    """The head node's router: its clients' data requests are served by the
    master in place -- one hop, no re-encoding, the answer written straight
    to the client's connection.  (A daemon's clients go through an
    :class:`~pydvm.runtime.shared.dataops.UplinkRouter` instead.)"""

    #: this node is the head node, served in the master's process
    at_master = True

    def __init__(self, data: DataService) -> None:
        self.data = data

    def forward(self, session: PeerSession, msg: Message, adjust=None) -> None:
        self.data.serve(session, msg, session.caller, adjust)

    @property
    def answers_now(self) -> bool:
        """Whether :meth:`serve_now` can answer: the master keeps the data
        (a relaying master passes every request on)."""
        return self.data.relay is None

    def serve_now(self, session: PeerSession, msg: Message):
        """:meth:`forward` for a plain request answered at once, on the thread
        holding the store guard (``NodeServer.serve_now``): the master
        store's :class:`~pydvm.store.Reply`, or None -- nothing changed --
        for a lookup that would park (it then goes through :meth:`forward`)."""
        return self.data.request_stats.apply_now(self.data.store, session.caller, msg)

    def cancel(self, session: PeerSession, ref: int) -> None:
        self.data.cancel_ref(session, ref)

    def withdraw_all(self, session: PeerSession) -> None:
        self.data.withdraw(session)
