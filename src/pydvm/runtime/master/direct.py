"""The master's direct data path: a daemon node's client, one hop from the master store.

A client on a daemon's node would otherwise reach the master store in two
hops (client -> daemon -> master and back).  With ``pydvm_direct_data on``
(the default) its daemon vouches for each process it launches
(:mod:`pydvm.runtime.shared.credential`) and the client opens one connection to
the master, on its first request that needs it, for the requests the
routing table (:func:`pydvm.runtime.shared.dataops.stores_for`) gives to the
master store.  LOCAL-range requests stay with the node's daemon; an
``unpublish``'s node-store part goes to the daemon too, when the master
says the node may hold something of the caller's uid
(:meth:`~pydvm.runtime.master.nodes.NodeTable.may_hold`).

Who such a connection acts for is settled at its handshake, here:

* the proof must match the credential's fields (nspace, rank, node, uid,
  gid, app, session, nonce) -- else ``PMIX_ERR_NO_PERMISSIONS``;
* the process must be one the master knows is running on that node (not
  reported ended, reaped or lost), of that application and session, and on
  a multi-user DVM of that uid -- else ``PMIX_ERR_NO_PERMISSIONS``.

Each refusal is logged and closes only that connection.  An accepted
connection is a :class:`~pydvm.runtime.shared.peers.DirectSession` whose caller is
the tuple the daemon would relay; its requests are served by the same
:meth:`~pydvm.runtime.master.dataservice.DataService.serve` as relayed ones (same
rules, parked lookups, cancel, cap of ``pydvm_max_outstanding``).  When the
master learns a process ended (``exited``, node loss, launch failure) it
closes that process's direct connections (their calls in flight get
``PMIX_ERR_UNREACH``) and refuses new ones: a connection acts for a process
only while that process lives.

Daemons on the master's own machine (same kernel, same mount and network
namespaces: :func:`~pydvm.runtime.shared.auth.host_identity`; the ``local``
launcher's nodes) hand their clients the path of the master's direct-data
Unix socket as well, and the client connects there rather than to the TCP
port: a Unix socket's round trip costs less than a loopback TCP one
(``bench/store/pingpong.py``).  The
handshake is the same; on that socket the peer's SO_PEERCRED uid and gid
must also be the credential's.  The socket lives in a directory like a
node's client socket (:func:`~pydvm.runtime.shared.sockdir.make_socket_dir`), open to
the DVM's user only, or traversable by all on a multi-user DVM.

:class:`DirectGate` owns the open direct sessions by process, the counts
``pydvm info`` shows and the direct-data socket.  Whether a process is
running, of which application and session, is the process table's answer
(:meth:`~pydvm.runtime.master.processes.ProcessTable.refusal`), asked at the
handshake; the gate hears of a process's end as a
:class:`~pydvm.runtime.master.processes.ProcessListener`.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any, Callable

from ...errors import Status
from ...wire import Channel, Message, refuse, reply
from ..shared import credential
from ..shared import dataops
from ..shared.auth import host_identity
from ..shared.guard import Guardian
from ..shared.peers import DirectSession
from ..shared.sockdir import make_socket_dir
from .dataservice import DataService
from .nodes import NodeTable
from .processes import ProcessListener, ProcessTable

log = logging.getLogger("pydvm.master")


class DirectGate(ProcessListener):
    """Direct connections of daemon-node clients (see the module docstring).

    ``on_message`` handles an accepted connection's messages (the master's
    dispatch); ``guardian()`` is the master process's guardian.
    """

    def __init__(self, processes: ProcessTable, data: DataService, nodes: NodeTable, *,
                 values: dict[str, Any], dvmid: str, secret: bytes, multi_user: bool,
                 on_message: Callable[[Channel, Message], None],
                 guardian: Callable[[], Guardian]) -> None:
        self._processes = processes
        self._data = data
        self._nodes = nodes
        self.values = values
        self.dvmid = dvmid
        self.multi_user = multi_user
        self._on_message = on_message
        self._guardian = guardian
        #: the key direct-data credentials are checked with (shared/credential.py).
        self._key = credential.domain_key(secret)
        #: (nspace, rank) -> that process's open direct sessions.
        self._sessions: dict[tuple[str, int], set[DirectSession]] = {}
        #: accepted / refused handshakes and requests served, since start.
        self.counts = {"accepted": 0, "refused": 0, "requests": 0}
        #: handshakes accepted on the Unix socket (also counted in ``accepted``).
        self.unix_accepted = 0
        #: the direct-data Unix socket's directory and server (None: not open).
        self._dir: Path | None = None
        self._server: Any = None

    #: The fields of a direct client's auth that name its process and key,
    #: in the order its seal message's ``cred`` lists them (seal.py).
    CRED_FIELDS = ("nspace", "rank", "node", "uid", "gid", "app", "session", "nonce")

    @property
    def enabled(self) -> bool:
        return self.values["pydvm_direct_data"] == "on"

    def psk(self, cred: Any) -> tuple[bytes | None, str]:
        """The key a direct client's sealed link is sealed with -- its
        process key, from the credential fields its seal message lists
        (:data:`CRED_FIELDS`) -- or (None, why not).  A client that does not
        hold that key cannot open the link: its auth is never read."""
        if not self.enabled:
            return None, "direct data is off in this DVM (pydvm_direct_data)"
        if not isinstance(cred, list) or len(cred) != len(self.CRED_FIELDS):
            return None, "malformed direct-data credential fields"
        ns, rank, node, uid, gid, app, session, nonce = cred
        if not (isinstance(ns, str) and isinstance(node, str) and isinstance(nonce, bytes)
                and all(isinstance(v, int) and not isinstance(v, bool)
                        for v in (rank, uid, gid, app, session))):
            return None, "malformed direct-data credential fields"
        return credential.process_key(self._key, self.dvmid, node, ns, rank, uid, gid, app,
                                      session, nonce), ""

    def count(self) -> int:
        """Processes with an open direct connection (``pydvm info``'s records)."""
        return len(self._sessions)

    # ------------------------------------------------------------------
    # the Unix socket
    # ------------------------------------------------------------------

    async def open_socket(self, listen: Callable[[str], Any]) -> None:
        """Listen on the direct-data Unix socket (same-host clients):
        ``listen(path)`` opens it (the master's door) and returns what has
        ``close()``."""
        self._dir = make_socket_dir(self.dvmid, "master", self.multi_user)
        self._guardian().remove_on_exit(str(self._dir))  # even after a SIGKILL
        path = self._path()
        self._server = listen(path)
        # Multi-user: every user's processes connect; who they are is the
        # credential, checked against SO_PEERCRED.
        os.chmod(path, 0o666 if self.multi_user else 0o600)

    def _path(self) -> str:
        return str(self._dir / "direct.sock")

    def close_socket(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def welcome(self) -> dict[str, Any]:
        """What a joining node learns of the direct-data socket: its path
        and this machine's identity (a daemon with another identity ignores
        it and its clients use the TCP port)."""
        if self._dir is None:
            return {}
        return {"direct_unix": {"path": self._path(), "host": host_identity()}}

    # ------------------------------------------------------------------
    # handshake and requests
    # ------------------------------------------------------------------

    def register(self, ch: Channel, msg: Message) -> None:
        """A client's ``auth`` with ``role: client``: accept it as the process
        its credential names, or refuse it (logged, connection closed)."""
        rid = msg.get("id")
        why = ""
        ident = None
        if not self.enabled:
            why = "direct data is off in this DVM (pydvm_direct_data)"
        else:
            ident = credential.verify(self._key, self.dvmid, ch.nonce, msg)
            if ident is None:
                why = "invalid direct-data credential"
        if ident is not None:
            ns, rank, node, uid, _gid, app, sid = ident
            why = self._processes.refusal(ns, rank, node, app=app, session=sid,
                                          uid=uid if self.multi_user else None)
        if not why and ch.creds is not None and ch.creds != (ident[3], ident[4]):
            why = (f"peer runs as uid {ch.creds[0]} gid {ch.creds[1]}, "
                   f"the credential names uid {ident[3]} gid {ident[4]}")
        if why:
            self.counts["refused"] += 1
            who = f"{msg.get('nspace')!r}:{msg.get('rank')!r} uid {msg.get('uid')!r}"
            log.warning("%s: refused a direct connection claiming %s: %s", ch.name, who, why)
            ch.send(reply(rid, Status.ERR_NO_PERMISSIONS, why))
            ch.close(f"direct connection refused: {why}")
            return
        ns, rank, node, uid, gid, _app, _sid = ident
        caller = self._processes.caller(ns, rank, uid, gid, node)
        peer = DirectSession(ch, caller, self.values["pydvm_max_outstanding"])
        self._sessions.setdefault((ns, rank), set()).add(peer)
        self.counts["accepted"] += 1
        if ch.creds is not None:
            self.unix_accepted += 1
        ch.name = f"direct client {ns}:{rank} ({node})"
        ch.on_message = self._on_message
        log.debug("%s: accepted", ch.name)
        ch.send(reply(rid, Status.SUCCESS, dvm=self.dvmid, node=node))

    def request(self, peer: DirectSession, msg: Message) -> None:
        """A direct client's data request: served by the master store unless
        the routing table gives it to the node alone."""
        t = msg["t"]
        if dataops.MASTER not in dataops.stores_for(t, dataops.request_range(msg)):
            refuse(peer.channel, msg, Status.ERR_BAD_PARAM,
                   "a LOCAL-range request goes to the node's daemon, not the master")
            return
        refusal = peer.admit(msg)
        if refusal is not None:
            peer.send(refusal)
            return
        self.counts["requests"] += 1
        # An unpublish's answer says whether its node part is needed: only
        # if the node store may hold something of this uid.
        extra = {"node": self._nodes.may_hold(peer.caller.node, peer.caller.uid)} \
            if t == "unpublish" else {}
        self._data.serve(peer, msg, peer.caller, **extra)

    # ------------------------------------------------------------------
    # ends
    # ------------------------------------------------------------------

    def proc_ended(self, nspace: str, rank: int) -> None:
        """Process ``nspace:rank`` ended: nothing may act for it any more."""
        for peer in list(self._sessions.pop((nspace, rank), ())):
            peer.channel.close(f"process {nspace}:{rank} ended")

    def gone(self, peer: DirectSession) -> None:
        """A direct connection closed."""
        peers = self._sessions.get(peer.proc_key)
        if peers is not None:
            peers.discard(peer)
            if not peers:
                del self._sessions[peer.proc_key]

    def stats(self) -> dict[str, int]:
        """``pydvm info``'s ``direct``: open connections, and the counts."""
        return {"open": sum(len(s) for s in self._sessions.values()), **self.counts}

    def socket_info(self) -> dict[str, Any] | None:
        """``pydvm info``'s ``direct_unix``: the same-host socket's path and
        how many connections it accepted (None: no such socket)."""
        if self._dir is None:
            return None
        return {"path": self._path(), "accepted": self.unix_accepted}
