"""The master's direct data path: a daemon node's client, one hop from the master store.

A client on a daemon's node would otherwise reach the master store in two
hops (client -> daemon -> master and back).  With ``pydvm_direct_data on``
(the default) its daemon vouches for each process it launches
(:mod:`pydvm.runtime.credential`) and the client opens one TCP connection
to the master, on its first request that needs it, for the requests the
routing table (:func:`pydvm.runtime.dataops.stores_for`) gives to the
master store.  LOCAL-range requests stay with the node's daemon; an
``unpublish`` goes to both (its node-store part to the daemon).

Who such a connection acts for is settled at its handshake, here:

* the proof must match the credential's fields (nspace, rank, node, uid,
  gid, app, session, nonce) -- else ``PMIX_ERR_NO_PERMISSIONS``;
* the process must be one the master knows is running on that node (not
  reported ended, reaped or lost), of that application and session, and on
  a multi-user DVM of that uid -- else ``PMIX_ERR_NO_PERMISSIONS``.

Each refusal is logged and closes only that connection.  An accepted
connection is a :class:`~pydvm.runtime.peers.DirectSession` whose caller is
the tuple the daemon would relay; its requests are served by the same
:meth:`~pydvm.runtime.routing.RoutingMixin._data_op` as relayed ones (same
rules, parked lookups, cancel, cap of ``pydvm_max_outstanding``).  When the
master learns a process ended (``exited``, node loss, launch failure) it
closes that process's direct connections (their calls in flight get
``PMIX_ERR_UNREACH``) and refuses new ones: a connection acts for a process
only while that process lives.

This is one concern of :class:`~pydvm.runtime.master.Master`, written as a
mixin; it owns ``_direct`` and ``direct_counts``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..errors import Status
from ..wire import Channel, Message, refuse, reply
from . import credential, dataops
from .jobs import ProcState
from .peers import DirectSession

if TYPE_CHECKING:
    from .master import Master

log = logging.getLogger("pydvm.master")


class DirectMixin:
    """Direct connections of daemon-node clients (see the module docstring)."""

    #: (nspace, rank) -> that process's open direct sessions.
    _direct: dict[tuple[str, int], set[DirectSession]]
    #: accepted / refused handshakes and requests served, since start.
    direct_counts: dict[str, int]

    def _direct_enabled(self: "Master") -> bool:
        return self.values["pydvm_direct_data"] == "on"

    def _register_direct(self: "Master", ch: Channel, msg: Message) -> None:
        """A client's ``auth`` with ``role: client``: accept it as the process
        its credential names, or refuse it (logged, connection closed)."""
        rid = msg.get("id")
        why = ""
        ident = None
        if not self._direct_enabled():
            why = "direct data is off in this DVM (pydvm_direct_data)"
        else:
            ident = credential.verify(self._direct_key, self.dvmid, ch.nonce, msg)
            if ident is None:
                why = "invalid direct-data credential"
        if ident is not None:
            why = self._direct_refusal(*ident)
        if why:
            self.direct_counts["refused"] += 1
            who = f"{msg.get('nspace')!r}:{msg.get('rank')!r} uid {msg.get('uid')!r}"
            log.warning("%s: refused a direct connection claiming %s: %s", ch.name, who, why)
            ch.send(reply(rid, Status.ERR_NO_PERMISSIONS, why))
            ch.close(f"direct connection refused: {why}")
            return
        ns, rank, node, uid, gid, _app, _session = ident
        caller = self._resolve_caller(ns, rank, uid, gid, node)
        session = DirectSession(ch, caller, self.values["pydvm_max_outstanding"])
        self._direct.setdefault((ns, rank), set()).add(session)
        self.direct_counts["accepted"] += 1
        ch.name = f"direct client {ns}:{rank} ({node})"
        ch.on_message = self._on_direct
        log.debug("%s: accepted", ch.name)
        ch.send(reply(rid, Status.SUCCESS, dvm=self.dvmid, node=node))

    def _direct_refusal(self: "Master", ns: str, rank: int, node: str, uid: int, gid: int,
                        app: int, session: int) -> str:
        """Why the master will not act for this (vouched-for) process; "" if it will."""
        job = self.jobs.get(ns)
        proc = job.procs.get(rank) if job is not None else None
        if proc is None or proc.node != node:
            return f"process {ns}:{rank} is not a process of node {node}"
        if proc.state is ProcState.ENDED:
            return f"process {ns}:{rank} has ended"
        if proc.app_idx != app or job.session_id != session:
            return f"process {ns}:{rank} is not of application {app} in session {session}"
        if self.multi_user and job.uid is not None and uid != job.uid:
            return f"process {ns}:{rank} is not a process of uid {uid}"
        return ""

    def _on_direct(self: "Master", ch: Channel, msg: Message) -> None:
        session: DirectSession = ch.session
        t = msg["t"]
        if t in dataops.DATA_OPS:
            if dataops.MASTER not in dataops.stores_for(t, dataops.request_range(msg)):
                refuse(ch, msg, Status.ERR_BAD_PARAM,
                       "a LOCAL-range request goes to the node's daemon, not the master")
                return
            refusal = session.admit(msg)
            if refusal is not None:
                session.send(refusal)
                return
            self.direct_counts["requests"] += 1
            self._data_op(session, msg, session.caller)
        elif t == "cancel":
            self._cancel(session, msg.get("ref"))
        else:
            self._ping_or_unknown(ch, msg)

    def _close_direct(self: "Master", nspace: str, rank: int, why: str) -> None:
        """Process ``nspace:rank`` ended: nothing may act for it any more."""
        for session in list(self._direct.pop((nspace, rank), ())):
            session.channel.close(why)

    def _direct_gone(self: "Master", session: DirectSession) -> None:
        sessions = self._direct.get(session.proc_key)
        if sessions is not None:
            sessions.discard(session)
            if not sessions:
                del self._direct[session.proc_key]

    def direct_stats(self: "Master") -> dict[str, int]:
        """``pydvm info``'s ``direct``: open connections, and the counts."""
        return {"open": sum(len(s) for s in self._direct.values()), **self.direct_counts}
