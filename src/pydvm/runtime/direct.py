"""The master's direct data path: a daemon node's client, one hop from the master store.

A client on a daemon's node would otherwise reach the master store in two
hops (client -> daemon -> master and back).  With ``pydvm_direct_data on``
(the default) its daemon vouches for each process it launches
(:mod:`pydvm.runtime.credential`) and the client opens one connection to
the master, on its first request that needs it, for the requests the
routing table (:func:`pydvm.runtime.dataops.stores_for`) gives to the
master store.  LOCAL-range requests stay with the node's daemon; an
``unpublish``'s node-store part goes to the daemon too, when the master
says the node may hold something of the caller's uid (:meth:`_node_holds`).

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

Daemons on the master's own machine (same kernel, same mount and network
namespaces: :func:`~pydvm.runtime.auth.host_identity`; the ``local``
launcher's nodes) hand their clients the path of the master's direct-data
Unix socket as well, and the client connects there rather than to the TCP
port: a Unix socket's round trip costs less than a loopback TCP one
(``bench/pingpong.py``).  The
handshake is the same; on that socket the peer's SO_PEERCRED uid and gid
must also be the credential's.  The socket lives in a directory like a
node's client socket (:func:`~pydvm.runtime.node.make_socket_dir`), open to
the DVM's user only, or traversable by all on a multi-user DVM.

This is one concern of :class:`~pydvm.runtime.master.Master`, written as a
mixin; it owns ``_direct``, ``direct_counts`` and the direct-data socket.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..errors import Status
from ..wire import Channel, Message, refuse, reply
from . import credential, dataops
from .auth import host_identity
from .jobs import ProcState
from .node import make_socket_dir
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

    #: the direct-data Unix socket's directory and server (None: not open).
    _direct_dir: Path | None = None
    _direct_server: asyncio.AbstractServer | None = None
    #: handshakes accepted on that socket (also counted in ``accepted``).
    direct_unix_accepted = 0

    def _direct_enabled(self: "Master") -> bool:
        return self.values["pydvm_direct_data"] == "on"

    async def _open_direct_socket(self: "Master", factory: Callable[[], Any]) -> None:
        """Listen on the direct-data Unix socket (same-host clients)."""
        self._direct_dir = make_socket_dir(self.dvmid, "master", self.multi_user)
        self.guardian().remove_on_exit(str(self._direct_dir))  # even after a SIGKILL
        path = self._direct_path()
        self._direct_server = await asyncio.get_running_loop().create_unix_server(
            factory, path)
        # Multi-user: every user's processes connect; who they are is the
        # credential, checked against SO_PEERCRED.
        os.chmod(path, 0o666 if self.multi_user else 0o600)

    def _direct_path(self: "Master") -> str:
        return str(self._direct_dir / "direct.sock")

    def _close_direct_socket(self: "Master") -> None:
        if self._direct_server is not None:
            self._direct_server.close()
            self._direct_server = None
        if self._direct_dir is not None:
            shutil.rmtree(self._direct_dir, ignore_errors=True)
            self._direct_dir = None

    def _direct_welcome(self: "Master") -> dict[str, Any]:
        """What a joining node learns of the direct-data socket: its path
        and this machine's identity (a daemon with another identity ignores
        it and its clients use the TCP port)."""
        if self._direct_dir is None:
            return {}
        return {"direct_unix": {"path": self._direct_path(), "host": host_identity()}}

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
        if not why and ch.creds is not None and ch.creds != (ident[3], ident[4]):
            why = (f"peer runs as uid {ch.creds[0]} gid {ch.creds[1]}, "
                   f"the credential names uid {ident[3]} gid {ident[4]}")
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
        if ch.creds is not None:
            self.direct_unix_accepted += 1
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
            # An unpublish's answer says whether its node part is needed: only
            # if the node store may hold something of this uid (_node_holds).
            extra = {"node": self._node_may_hold(session.caller.node, session.caller.uid)} \
                if t == "unpublish" else {}
            self._data_op(session, msg, session.caller, **extra)
        elif t == "cancel":
            self._cancel(session, msg.get("ref"))
        else:
            self._ping_or_unknown(ch, msg)

    def _node_may_hold(self: "Master", node: str | None, uid: int) -> bool:
        """Whether node ``node``'s store may hold items of ``uid`` (True
        unless its daemon's reports say it holds none)."""
        rec = self.nodes.get(node) if node is not None else None
        return rec is None or rec.holders is None or uid in rec.holders

    def _node_holds(self: "Master", session, msg: Message) -> None:
        """A daemon's ``node_holds``: ``uids`` now own items in its store
        (``holds`` true; a call, answered once recorded, before the daemon
        answers the publish that stored them) or no longer do (a notice).
        A direct client's unpublish then tells the client whether its node
        part is needed (``node`` in the answer): the node store of a uid
        that holds nothing there is skipped, saving a wake-up of the daemon.
        """
        uids, holds = msg.get("uids"), msg.get("holds")
        node = self.nodes.get(session.node)
        if (node is None or not isinstance(holds, bool) or not isinstance(uids, list)
                or not all(isinstance(u, int) and not isinstance(u, bool) for u in uids)):
            refuse(session.channel, msg, Status.ERR_BAD_PARAM, "malformed node_holds")
            return
        if node.holders is None:
            pass  # it never said it would report (ready): keep assuming any uid
        elif holds:
            node.holders.update(uids)
        else:
            node.holders.difference_update(uids)
        if "id" in msg:
            session.channel.send(reply(msg["id"], Status.SUCCESS))

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

    def direct_socket_info(self: "Master") -> dict[str, Any] | None:
        """``pydvm info``'s ``direct_unix``: the same-host socket's path and
        how many connections it accepted (None: no such socket)."""
        if self._direct_dir is None:
            return None
        return {"path": self._direct_path(), "accepted": self.direct_unix_accepted}
