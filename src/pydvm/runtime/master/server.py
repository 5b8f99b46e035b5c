"""The master: one per DVM.  The composition root of its components.

Everything here runs on one asyncio loop.  Messages are handled
synchronously as they arrive (the stores are synchronous too); only work
that must wait for daemons -- launching a job, the cleanup broadcasts,
stopping -- runs as tasks (:class:`~pydvm.runtime.master.tasks.Tasks`).

:class:`Master` builds one object per concern, each owning its state and
reached by the others only through the methods of its interface and the
listeners the master wires:

=======================  ============================  ====================================
component                module                        owns
=======================  ============================  ====================================
``nodes``                ``nodes.py``                  NodeTable: node records, daemons and
                                                       the launcher, heartbeats, node loss,
                                                       acknowledged broadcasts, events
``processes``            ``processes.py``              ProcessTable: the LifetimeCore (jobs,
                                                       sessions), launching, the tool of each
                                                       job, job and session waiters, callers
``streams``              ``jobstreams.py``             JobStreams: output and stdin
                                                       forwarding, flow control
``data``                 ``dataservice.py``            DataService: the master store, the
                                                       relay, data requests, store purges
``direct``               ``direct.py``                 DirectGate: direct-data clients, their
                                                       socket and handshake
``collectives``          ``collectives.py``            Collectives: fence, connect, group,
                                                       dmodex, abort, spawn, events
``queue``                ``jobqueue.py``               JobQueue: jobs waiting for free
                                                       slots, the slots in use per node
``events``               ``jobevents.py``              JobEvents: job-event subscriptions
``tools``                ``toolreqs.py``               ToolService: run, run_many, kill, ps,
                                                       stop, sessions, store, info
=======================  ============================  ====================================

Listeners (fan-out): a lost node (:class:`~pydvm.runtime.master.nodes.NodeListener`)
goes to collectives, then the process table; a lifetime's end
(:class:`~pydvm.runtime.master.processes.ProcessListener`: a master-store purge,
a job started, a process ended, a job ended, a session ended) goes to the
data service, the direct gate, collectives, the job streams, the queue and
the job events, in that order; the queue tells the job events of jobs it
queues and of queued jobs that end without starting.

The master itself keeps what is the DVM's as a whole -- its id, secret,
URI, lock, guardian, metrics server, listening sockets and open
connections -- does the handshake that gives each peer its session, and
dispatches each message to the component that owns its type
(:data:`DAEMON_MESSAGES`, :data:`TOOL_MESSAGES`, :data:`DIRECT_MESSAGES`).

The head node (``pydvm_head_node``; by default the node named like this
machine) is served by the master process itself: the same
:class:`~pydvm.runtime.node.server.NodeServer` a daemon runs, joined to the master
by an in-process link, whose clients' data requests the master serves in
place (one hop, :class:`~pydvm.runtime.master.dataservice.MasterRouter`).  Every
other node has its daemon.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shutil
import socket
from typing import Any, Callable

from ... import params as P
from ...errors import Status
from ...store import DataStore
from ...wire import Channel, Message, peer_credentials, poll_after_messages, refuse, reply, \
    stop_polling
from ..pmixhost import pmix_status
from ..shared import registry
from ...seal import Offer, SealError, is_loopback, must_seal
from ...seal import preload as preload_sealing
from ..shared.auth import HANDSHAKE_TIMEOUT, DvmUri, check_auth, tool_socket_path
from ..shared.credential import ROLE as DIRECT_ROLE
from ..shared.dataops import DATA_OPS
from ..shared.door import Door, Listener
from ..shared.guard import Guardian
from ..shared.jobs import HostSpec, JobRecord, SessionRecord
from ..shared.peers import DaemonSession, DirectSession, PeerSession, ToolSession
from ..shared.stats import RequestStats
from .collectives import PMIX_REQUESTS, Collectives
from .dataservice import DataService, MasterRouter
from .direct import DirectGate
from .jobevents import JobEvents
from .jobqueue import JobQueue
from .jobstreams import JobStreams
from .launchers import Launcher, make_launcher
from .metrics import MetricsServer, MetricsUnavailable, require_prometheus
from .nodes import NodeRecord, NodeTable, StartError
from .processes import ProcessTable
from .tasks import Tasks
from .toolreqs import ADMIN_ONLY, ToolService

log = logging.getLogger("pydvm.master")

__all__ = ["Master", "StartError", "DAEMON_MESSAGES", "TOOL_MESSAGES", "DIRECT_MESSAGES"]

# ----------------------------------------------------------------------
# message -> handler: (component, method); every handler takes
# (peer session, message).  master/DESIGN.md has the same table.
# ----------------------------------------------------------------------

#: What a daemon (or the head node's in-process link) sends the master.
DAEMON_MESSAGES: dict[str, tuple[str, str]] = {
    "ready": ("nodes", "ready"),
    "node_holds": ("nodes", "holds"),
    "exited": ("processes", "exited"),
    "pmix_lost": ("processes", "pmix_lost"),
    "output": ("streams", "output"),
    "stdin_ack": ("streams", "stdin_ack"),
    **{t: ("data", "daemon_request") for t in sorted(DATA_OPS)},
    "cancel": ("data", "cancel"),
    **{t: ("collectives", "request") for t in sorted(PMIX_REQUESTS)},
    "ping": ("master", "ping"),
}

#: What a tool (the CLI, or a relaying DVM) sends the master, once authenticated.
TOOL_MESSAGES: dict[str, tuple[str, str]] = {
    **{t: ("data", "tool_request") for t in sorted(DATA_OPS)},
    "cancel": ("data", "cancel"),
    "purge": ("data", "relayed_purge"),
    "stdin": ("streams", "stdin"),
    "run": ("tools", "run"),
    "run_many": ("tools", "run_many"),
    "subscribe": ("events", "subscribe"),
    "unsubscribe": ("events", "unsubscribe"),
    "kill_job": ("tools", "kill_job"),
    "signal_job": ("tools", "signal_job"),
    "release_job": ("tools", "release_job"),
    "job_procs": ("tools", "job_procs"),
    "ps": ("tools", "ps"),
    "stop": ("tools", "stop"),
    "session_new": ("tools", "session_new"),
    "session_end": ("tools", "session_end"),
    "store": ("tools", "store"),
    "info": ("tools", "info"),
    "ping": ("tools", "ping"),
}

#: What a direct-data client sends the master, once its handshake is accepted.
DIRECT_MESSAGES: dict[str, tuple[str, str]] = {
    **{t: ("direct", "request") for t in sorted(DATA_OPS)},
    "cancel": ("data", "cancel"),
    "ping": ("master", "ping"),
}

#: Tool requests still served while the DVM stops (data requests are, too).
WHILE_STOPPING = frozenset({"stop", "ping", "cancel"})


class _PeerChannel(Channel):
    """A channel accepted on the master's port, or on one of its Unix
    sockets (``unix``: ``"tool"``, a multi-user DVM's tool socket;
    ``"direct"``, the direct-data socket of same-host clients): greets with
    a challenge."""

    def __init__(self, master: "Master", unix: str = "") -> None:
        super().__init__(master._on_unauthenticated, master._on_peer_closed, name="peer")
        self.master = master
        self.unix = unix
        #: (uid, gid) read from SO_PEERCRED on a Unix socket.
        self.creds: tuple[int, int] | None = None
        self.nonce = b""
        self.auth_timer: asyncio.TimerHandle | None = None
        #: this connection's side of the handshake (its challenge; seal.py).
        self.offer: Offer | None = None
        #: the peer's seal message, once its link is sealed.
        self.seal_hello: Message | None = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.unix:
            pid, uid, gid = peer_credentials(transport.get_extra_info("socket"))
            self.creds = (uid, gid)
            self.name = f"{self.unix} socket peer pid {pid} uid {uid}"
        else:
            self.name = f"peer {transport.get_extra_info('peername')}"
        self.master._greet(self)


class Master:
    """One DVM's master.  ``await start()``, then ``await wait_stopped()``."""

    def __init__(
        self,
        hosts: list[HostSpec],
        launcher: "str | Launcher" = "local",
        resolved: dict[str, P.Resolved] | None = None,
        bind: str = "127.0.0.1",
        log_dir: str | None = None,
        data_server: DvmUri | None = None,
        port: int = 0,
        dvmid: str | None = None,
        multi_user: bool = False,
        metrics: tuple[str, int] | None = None,
    ) -> None:
        self.resolved = resolved or P.resolve()
        self.values = P.values(self.resolved)
        self.dvmid = dvmid or secrets.token_hex(4)
        self.port = port
        #: a root-started DVM serving tools of every local user (their jobs
        #: run as them); otherwise only its owner's tools (holders of the secret).
        self.multi_user = multi_user
        self.dvm_nspace = f"pydvm-{self.dvmid}"
        self.secret = secrets.token_bytes(32)
        self.bind = bind
        self.log_dir = log_dir
        self.uri: DvmUri | None = None
        #: the front door (shared/door.py): every listening socket, the strangers on them.
        self.door: Door | None = None
        self._server: Listener | None = None
        self._tool_server: Listener | None = None
        self._stopping = False
        self._stopped = asyncio.Event()
        self._peers: set[Channel] = set()
        self._tool_seq = 0
        self._lock: registry.DvmLock | None = None
        self._guardian: Guardian | None = None
        #: (addr, port) to serve Prometheus metrics on; the server once started.
        self.metrics_address = metrics
        self.metrics: MetricsServer | None = None
        #: which TCP links are sealed (pydvm_seal; seal.py).
        self.seal_mode: str = self.values["pydvm_seal"]
        #: sealed links accepted, handshakes refused for their sealing, and
        #: links closed for a sealed frame that did not open, since start.
        self.seal_counts = {"accepted": 0, "refused": 0, "broken": 0}

        # -- the components, and who hears what ---------------------------
        self.tasks = Tasks()
        self.nodes = NodeTable(
            hosts, values=self.values,
            launcher=launcher if isinstance(launcher, Launcher) else make_launcher(launcher),
            tasks=self.tasks, on_message=self._on_daemon, welcome=self._welcome,
            guardian=self.guardian, all_gone=lambda reason: self.tasks.start(self.stop()))
        self.processes = ProcessTable(hosts, dvm_nspace=self.dvm_nspace, nodes=self.nodes,
                                      tasks=self.tasks)
        self.streams = JobStreams(self.processes, self.nodes, self.values)
        self.data = DataService(self.processes, values=self.values, dvm_nspace=self.dvm_nspace,
                                data_server=data_server)
        self.direct = DirectGate(self.processes, self.data, self.nodes, values=self.values,
                                 dvmid=self.dvmid, secret=self.secret, multi_user=multi_user,
                                 on_message=self._on_direct, guardian=self.guardian)
        self.collectives = Collectives(self.processes, self.nodes, self.tasks)
        self.queue = JobQueue(self.processes, self.nodes, self.tasks, self.values)
        self.events = JobEvents(self.processes, self.queue, self.values)
        self.tools = ToolService(self.processes, self.nodes, self.data, self.tasks, self.queue,
                                 stop=self.stop, describe=self.describe)
        self.nodes.add_listener(self.collectives)
        self.nodes.add_listener(self.processes)
        self.nodes.add_listener(self.queue)
        for listener in (self.data, self.direct, self.collectives, self.streams, self.queue,
                         self.events):
            self.processes.add_listener(listener)
        self.queue.add_listener(self.events)
        self._daemon_handlers = self._bind(DAEMON_MESSAGES)
        self._tool_handlers = self._bind(TOOL_MESSAGES)
        self._direct_handlers = self._bind(DIRECT_MESSAGES)

    def _bind(self, table: dict[str, tuple[str, str]]) -> dict[str, Callable]:
        """A message table with each (component, method) resolved to its bound method."""
        return {t: getattr(self if c == "master" else getattr(self, c), m)
                for t, (c, m) in table.items()}

    # -- read-only views (metrics.py, tests) ------------------------------

    @property
    def store(self) -> DataStore | None:
        return self.data.store

    @property
    def request_stats(self) -> RequestStats:
        return self.data.request_stats

    @property
    def jobs(self) -> dict[str, JobRecord]:
        return self.processes.jobs

    @property
    def sessions(self) -> dict[int, SessionRecord]:
        return self.processes.sessions

    @property
    def node_records(self) -> dict[str, NodeRecord]:
        return self.nodes.records

    @property
    def head_node(self) -> str | None:
        return self.nodes.head_node

    # ------------------------------------------------------------------
    # start / stop
    # ------------------------------------------------------------------

    async def start(self) -> DvmUri:
        """Listen, launch one daemon per host, wait until all have registered.

        Raises :class:`StartError` -- before anything is started or written --
        if a DVM with this id is already running, or ``metrics`` was given
        without prometheus_client; and, after tearing down what it started,
        if the metrics address cannot be bound.
        """
        self.nodes.choose_head(self.values["pydvm_head_node"])
        if self.metrics_address is not None:
            try:
                require_prometheus()
            except MetricsUnavailable as exc:
                raise StartError(str(exc)) from None
        try:
            self._lock = registry.DvmLock.acquire(self.dvmid)
        except registry.AlreadyRunning as exc:
            raise StartError(str(exc)) from None
        loop = asyncio.get_running_loop()
        poll_after_messages(loop, self.values["pydvm_master_poll_us"])
        self.data.open(loop)
        self.door = door = Door("master")
        try:
            try:
                self._server = door.listen_tcp(lambda: _PeerChannel(self), self.bind, self.port)
            except OSError as exc:
                raise StartError(f"cannot listen on {self.bind}: {exc}") from None
            port = self._server.sock.getsockname()[1]
            host = self.bind if self.bind not in ("0.0.0.0", "::") else socket.gethostname()
            self.uri = DvmUri(host, port, self.dvmid)
            self._lock.publish(self.secret, self.uri, list(self.nodes.records))
            if self.multi_user:
                await self._open_tool_socket()
            if self.direct.enabled:
                await self.direct.open_socket(
                    lambda path: door.listen_unix(lambda: _PeerChannel(self, unix="direct"), path))
            if self.metrics_address is not None:
                try:
                    self.metrics = MetricsServer.start(self, *self.metrics_address)
                except OSError as exc:
                    raise StartError("cannot serve metrics on %s:%d: %s"
                                     % (*self.metrics_address, exc)) from None
                log.info("serving metrics at %s", self.metrics.url)
            log.info("DVM %s listening at %s", self.dvmid, self.uri)
            if self.seal_mode != "off":
                preload_sealing()
            else:
                log.warning("pydvm_seal is off: links between machines carry clear frames "
                            "that anyone on the network path can read and forge")
            relay = self.data.relay
            if relay is not None:
                try:
                    await relay.start()
                except (ConnectionError, OSError, ValueError) as exc:
                    raise StartError(f"cannot reach the data server {relay.uri}: {exc}")
            await self.nodes.start(str(self.uri), self.secret, self.log_dir,
                                   MasterRouter(self.data))
        except BaseException:
            await self._teardown()
            raise
        return self.uri

    async def _open_tool_socket(self) -> None:
        if os.geteuid() != 0:
            raise StartError("--multi-user needs a DVM started by root")
        path = tool_socket_path(self.dvmid)
        # We hold this DVM id's lock, so a directory left here is a dead
        # DVM's: nobody else may serve under this id.
        shutil.rmtree(path.parent, ignore_errors=True)
        try:
            path.parent.mkdir(mode=0o711)  # fails if someone made it meanwhile
        except FileExistsError:
            raise StartError(f"{path.parent} already exists; refusing to serve tools there")
        os.chmod(path.parent, 0o711)
        assert self.door is not None
        self._tool_server = self.door.listen_unix(lambda: _PeerChannel(self, unix="tool"),
                                                  str(path))
        os.chmod(path, 0o666)  # any local user; identity comes from SO_PEERCRED

    def guardian(self) -> Guardian:
        """This process's guardian (:mod:`pydvm.runtime.shared.guard`), forked on
        first use: it removes the head node's processes and the master's
        socket directories however the master dies."""
        if self._guardian is None:
            self._guardian = Guardian()
            self._guardian.start()
        return self._guardian

    def _welcome(self) -> dict[str, Any]:
        """What a node is told when it joins."""
        return {"params": P.to_wire(self.resolved), "dvm": self.dvmid,
                "dvm_nspace": self.dvm_nspace, "multi_user": self.multi_user,
                **self.direct.welcome()}

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def stop(self) -> None:
        """End every job, shut every daemon down, wait for their exit."""
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        self.nodes.begin_stop()
        log.info("stopping DVM %s", self.dvmid)
        self.queue.clear("killed while queued because the DVM is stopping")
        self.processes.kill_all("the DVM is stopping")
        await self.processes.wait_all(timeout=15)
        await self._teardown()

    async def _teardown(self) -> None:
        if self.metrics is not None:
            await self.metrics.stop()
        acks = self.nodes.shut_down()
        self.data.stop()
        if self._server is not None:
            self._server.close()  # a daemon still on its way in finds nobody
        await self.nodes.finish(acks)
        if self._guardian is not None:
            self._guardian.close()
        if self._tool_server is not None:
            self._tool_server.close()
            shutil.rmtree(tool_socket_path(self.dvmid).parent, ignore_errors=True)
        self.direct.close_socket()
        if self.door is not None:
            self.door.close()
        for ch in list(self._peers):
            if not isinstance(ch.session, ToolSession):
                ch.close("DVM stopped")
        if self._lock is not None:
            self._lock.release()
        stop_polling()
        self._stopped.set()

    # ------------------------------------------------------------------
    # what the DVM is (pydvm info)
    # ------------------------------------------------------------------

    def record_counts(self) -> dict[str, int]:
        """How many records of each kind the master holds (``pydvm info``).

        Every one of these is bounded by what is running now -- jobs,
        sessions, connections -- never by how many ran before: the soak
        benchmark checks it.
        """
        return {
            **self.processes.counts(),
            **self.queue.counts(),
            "event_subscriptions": self.events.count(),
            "collectives": self.collectives.count(),
            "stdin_streams": self.streams.count(),
            "connections": len(self._peers),
            "direct_procs": self.direct.count(),
            "tasks": len(self.tasks),
        }

    def describe(self) -> dict[str, Any]:
        """The ``info`` reply's fields."""
        return {
            "params": {k: [r.value, r.source, P.REGISTRY[k].help]
                       for k, r in self.resolved.items()},
            **self.nodes.info(),
            "sessions": sorted(self.sessions), "jobs": sorted(self.jobs),
            "dvm": self.dvmid, "uri": str(self.uri), "pid": os.getpid(),
            "log_dir": self.log_dir,
            "records": self.record_counts(),
            "direct": self.direct.stats(),
            "direct_unix": self.direct.socket_info(),
            "metrics": self.metrics.url if self.metrics is not None else None,
            "descriptors": self.door.info() if self.door is not None else None,
            "seal": self.seal_info(),
            "pmix": {"master": list(pmix_status()), "nodes": self.nodes.pmix_report(),
                     "tools": self._pmix_tools()},
        }

    def _pmix_tools(self) -> dict[str, Any] | None:
        """Where PMIx tools attach (the head node's server, or without one
        the tool side beside the master: runtime/pmixhost/tools.py)."""
        server = self.nodes.tool_host()
        tools = server.pmix.tools if server is not None else None
        if tools is None or tools.uri is None:
            return None
        from ..pmixhost import URI_FILE
        return {"uri": tools.uri, "file": str(server.socket_dir / URI_FILE),
                "node": None if server.tools_only else server.name,
                "connected": tools.describe(), **tools.system_info()}

    # ------------------------------------------------------------------
    # connections
    # ------------------------------------------------------------------

    def seal_info(self) -> dict[str, Any]:
        """``pydvm info``'s ``seal``: the mode, the open links by kind, the counts."""
        tcp = [ch for ch in self._peers if not getattr(ch, "unix", "")]
        return {"mode": self.seal_mode, "sealed_open": sum(ch.sealed for ch in tcp),
                "clear_tcp_open": sum(not ch.sealed for ch in tcp), **self.seal_counts}

    def _greet(self, ch: _PeerChannel) -> None:
        sealed = not ch.unix and must_seal(self.seal_mode, is_loopback(ch.peer_host))
        ch.offer = Offer(self.dvmid, self.secret, sealed)
        ch.nonce = ch.offer.nonce
        self._peers.add(ch)
        ch.send(ch.offer.challenge)
        loop = asyncio.get_running_loop()
        ch.auth_timer = loop.call_later(
            HANDSHAKE_TIMEOUT, lambda: ch.session is None and
            ch.close(f"no handshake within {HANDSHAKE_TIMEOUT:.0f}s", error=True))

    def _refuse(self, ch: _PeerChannel, msg: Message, problem: str) -> None:
        """Refuse a handshake: answered (if the peer can read it), closed, logged."""
        ch.send(reply(msg.get("id"), Status.ERR_NO_PERMISSIONS, problem))
        ch.close(f"handshake refused: {problem}", error=True)

    def _on_unauthenticated(self, ch: _PeerChannel, msg: Message) -> None:
        """The first messages on a connection: they decide the peer's session.

        On a link to be sealed the first is the peer's ``seal`` (its key
        share: the link is sealed from the next frame on), the second its
        auth; on a clear link the first is the auth."""
        offer = ch.offer
        if offer is not None and offer.sealed and ch.box is None:
            self._seal_link(ch, msg)
            return
        if msg.get("t") == "seal":
            self._refuse(ch, msg, "this link is not sealed (a Unix socket or loopback, "
                                  f"pydvm_seal {self.seal_mode}): no seal message expected")
            return
        if ch.seal_hello is not None:
            problem = self._seal_mismatch(ch.seal_hello, msg)
            if problem:
                self._refuse(ch, msg, problem)
                return
        if ch.unix != "tool" and msg.get("t") == "auth" and msg.get("role") == DIRECT_ROLE:
            # a daemon-node client: identity by the credential its daemon gave it
            if ch.auth_timer is not None:
                ch.auth_timer.cancel()
            self.direct.register(ch, msg)
            if ch.sealed and ch.session is not None:
                self.seal_counts["accepted"] += 1
            return
        if ch.unix == "direct":
            problem = "only direct-data clients connect on the direct-data socket"
        elif ch.unix == "tool":  # the multi-user tool socket: identity by credentials
            problem = "" if msg.get("t") == "auth" and msg.get("role") == "tool" else \
                "only tools connect on the tool socket"
        else:
            problem = check_auth(self.secret, ch.nonce, msg)
        if problem:
            self._refuse(ch, msg, problem)
            return
        if ch.auth_timer is not None:
            ch.auth_timer.cancel()
        if ch.sealed:
            self.seal_counts["accepted"] += 1
        if msg["role"] == "daemon":
            self.nodes.register(ch, msg)
            return
        self._tool_seq += 1
        if ch.creds is not None:
            uid, gid = ch.creds
            owner = uid == os.geteuid()
        else:  # it proved it holds the secret: the DVM's own user
            uid, gid = os.getuid(), os.getgid()
            owner = True
        tool = ToolSession(ch, uid, gid, owner=owner, seq=self._tool_seq,
                           relay=bool(msg.get("relay")),
                           max_outstanding=self.values["pydvm_max_outstanding"])
        ch.name = f"tool#{self._tool_seq}" + (" (relay)" if tool.relay else "")
        ch.on_message = self._on_tool
        ch.send(reply(msg.get("id"), Status.SUCCESS, dvm=self.dvmid))

    def _seal_link(self, ch: _PeerChannel, msg: Message) -> None:
        """The first message of a link that must be sealed: the peer's key
        share, with which the link is sealed -- or a refusal."""
        assert ch.offer is not None
        if msg.get("t") != "seal":
            self.seal_counts["refused"] += 1
            self._refuse(ch, msg, f"this link must be sealed (pydvm_seal {self.seal_mode}; "
                                  f"peer {ch.address or '?'}), and the peer sent "
                                  f"{msg.get('t')!r} in clear")
            return
        role = msg.get("role")
        if role in ("daemon", "tool"):
            psk, why = self.secret, ""
        elif role == DIRECT_ROLE and ch.unix != "tool":
            psk, why = self.direct.psk(msg.get("cred"))
        else:
            psk, why = None, f"unknown role {role!r}"
        try:
            if why:
                raise SealError(why)
            box = ch.offer.accept(msg, psk)
        except SealError as exc:
            self.seal_counts["refused"] += 1
            self._refuse(ch, msg, f"cannot seal the link: {exc}")
            return
        ch.seal(box)
        ch.seal_hello = msg

    @staticmethod
    def _seal_mismatch(hello: Message, auth: Message) -> str:
        """Why the auth of a sealed link contradicts its seal message ("" if
        it does not): another role, or a direct client naming another process."""
        if auth.get("role") != hello.get("role"):
            return (f"the auth's role {auth.get('role')!r} is not the seal message's "
                    f"{hello.get('role')!r}")
        if hello.get("role") == DIRECT_ROLE:
            named = [auth.get(f) for f in DirectGate.CRED_FIELDS]
            if named != hello.get("cred"):
                return "the auth names another process than the seal message"
        return ""

    def _on_peer_closed(self, ch: Channel, reason: str) -> None:
        self._peers.discard(ch)
        if ch.seal_failed:
            self.seal_counts["broken"] += 1
        peer = ch.session
        if peer is None:
            return
        self.data.withdraw(peer)
        if isinstance(peer, DaemonSession):
            self.nodes.link_closed(peer.node, reason)
        elif isinstance(peer, ToolSession):
            self.queue.tool_gone(peer)
            self.events.tool_gone(peer)
            self.processes.tool_gone(peer)
        elif isinstance(peer, DirectSession):
            self.direct.gone(peer)

    # ------------------------------------------------------------------
    # dispatch: one table per kind of peer (above)
    # ------------------------------------------------------------------

    def _on_daemon(self, ch: Channel, msg: Message) -> None:
        handler = self._daemon_handlers.get(msg["t"])
        if handler is None:
            self._unknown(ch, msg)
        else:
            handler(ch.session, msg)

    def _on_direct(self, ch: Channel, msg: Message) -> None:
        handler = self._direct_handlers.get(msg["t"])
        if handler is None:
            self._unknown(ch, msg)
        else:
            handler(ch.session, msg)

    def _on_tool(self, ch: Channel, msg: Message) -> None:
        tool: ToolSession = ch.session
        t = msg["t"]
        handler = self._tool_handlers.get(t)
        if handler is None:
            refuse(ch, msg, Status.ERR_BAD_PARAM, f"unknown message type {t!r}")
            return
        if t not in DATA_OPS:
            if self._stopping and t not in WHILE_STOPPING:
                ch.send(reply(msg.get("id"), Status.ERR_UNREACH, "the DVM is stopping"))
                return
            if t in ADMIN_ONLY and not tool.privileged:
                ch.send(reply(msg.get("id"), Status.ERR_NO_PERMISSIONS,
                              f"only the DVM's owner or root may {t.replace('_', ' ')}"))
                return
        handler(tool, msg)

    def ping(self, peer: PeerSession, msg: Message) -> None:
        """A ``ping``, from any peer: answered if it asked (a daemon's heartbeat
        is a notice, a relay's a request)."""
        if "id" in msg:
            peer.send(reply(msg.get("id"), Status.SUCCESS))

    def _unknown(self, ch: Channel, msg: Message) -> None:
        """A message type this kind of peer may not send: logged (unless a
        stray reply), refused if it asked."""
        t = msg["t"]
        if t != "reply":
            log.warning("%s: unknown message type %r", ch.name, t)
        if "id" in msg:
            refuse(ch, msg, Status.ERR_BAD_PARAM, f"unknown message type {t!r}")
