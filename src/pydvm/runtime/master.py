"""The master: one per DVM.  Tracks nodes, jobs and sessions; holds the master store.

Everything here runs on one asyncio loop.  Messages are handled
synchronously as they arrive (the store is synchronous too); only work that
must wait for daemons -- launching a job, the cleanup broadcasts, stopping --
runs as tasks.

:class:`Master` is assembled from one mixin per concern, each in its own
module and each owning the attributes its docstring names:

=======================  ===================================================
module                   concern
=======================  ===================================================
``master.py`` (here)     start-up and shutdown, accepting connections, the
                         handshake that gives each peer its session, message
                         dispatch
``nodes.py``             launching daemons (and serving the head node here,
                         see below), registration, heartbeats, node loss,
                         acknowledged broadcasts
``lifetimes.py``         jobs and sessions: planning, launching, exits, the
                         purges each lifetime causes, output flow control
``routing.py``           data requests: whose they are, which store answers
``toolreqs.py``          every other tool request
``collectives.py``       PMIx across nodes: fence, connect, direct modex,
                         abort, spawn (each node hosts its own PMIx server)
``direct.py``            daemon-node clients connected straight to the
                         master for their master-store requests
=======================  ===================================================

Peers are typed sessions (:mod:`pydvm.runtime.peers`): a channel's
``session`` says who it is and what it has outstanding.

The head node (``pydvm_head_node``; by default the node named like this
machine) is served by the master process itself: the same
:class:`~pydvm.runtime.node.NodeServer` a daemon runs, joined to the master
by an in-process link, whose clients' data requests the master serves in
place (one hop).  Every other node has its daemon.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shutil
import socket
from typing import Any

from .. import params as P
from ..errors import Status
from ..store import DataStore, MonotonicClock, StoreParams
from ..wire import Channel, Message, peer_credentials, poll_after_messages, refuse, reply, stop_polling
from . import dataops, registry
from .auth import HANDSHAKE_TIMEOUT, DvmUri, check_auth, tool_socket_path
from .collectives import PMIX_REQUESTS, CollectivesMixin
from .core import LifetimeCore
from .credential import ROLE as DIRECT_ROLE
from .credential import domain_key
from .direct import DirectMixin
from .jobs import HostSpec, JobRecord, SessionRecord
from .launch import Launcher, make_launcher
from .lifetimes import DEFAULT_SESSION, LifetimesMixin
from .guard import Guardian
from .metrics import MetricsServer, MetricsUnavailable, RequestStats, require_prometheus
from .nodes import LOST_STATUS, NodeRecord, NodesMixin, StartError, choose_head_node  # noqa: F401
from .peers import DaemonSession, DirectSession, PeerSession, ToolSession, route_answer
from .relay import Relay
from .routing import RoutingMixin
from .storeguard import GuardedStats, guard_for, guarded_store
from .toolreqs import ToolRequestsMixin

log = logging.getLogger("pydvm.master")

__all__ = ["Master", "StartError"]


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

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.unix:
            pid, uid, gid = peer_credentials(transport.get_extra_info("socket"))
            self.creds = (uid, gid)
            self.name = f"{self.unix} socket peer pid {pid} uid {uid}"
        else:
            self.name = f"peer {transport.get_extra_info('peername')}"
        self.master._greet(self)


class Master(NodesMixin, LifetimesMixin, RoutingMixin, ToolRequestsMixin, CollectivesMixin,
             DirectMixin):
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
        self._tool_server: asyncio.AbstractServer | None = None
        self.dvm_nspace = f"pydvm-{self.dvmid}"
        self.secret = secrets.token_bytes(32)
        #: the key direct-data credentials are checked with (credential.py).
        self._direct_key = domain_key(self.secret)
        self._direct: dict[tuple[str, int], set[DirectSession]] = {}
        self.direct_counts = {"accepted": 0, "refused": 0, "requests": 0}
        #: starts the daemons (:mod:`pydvm.runtime.launch`); a name gets that
        #: launcher with hosts given by the caller.
        self.launcher = launcher if isinstance(launcher, Launcher) else make_launcher(launcher)
        self.bind = bind
        self.log_dir = log_dir
        self.nodes: dict[str, NodeRecord] = {h.name: NodeRecord(h.name, h.slots) for h in hosts}
        #: jobs and sessions, and the rules of their lifetimes (runtime/core.py);
        #: ``jobs`` and ``sessions`` are its records, read by every component
        #: and changed only through ``core.handle`` (lifetimes.LifetimesMixin._feed).
        self.core = LifetimeCore()
        self.core.new_session(DEFAULT_SESSION, list(hosts))
        self.jobs: dict[str, JobRecord] = self.core.jobs
        self.sessions: dict[int, SessionRecord] = self.core.sessions
        self._job_done: dict[str, asyncio.Future] = {}
        self._session_done: dict[int, asyncio.Future] = {}
        self._job_tool: dict[str, PeerSession] = {}
        self._next_session = 1
        self._next_job = 1
        self._tool_seq = 0
        self.uri: DvmUri | None = None
        self.store: DataStore | None = None
        self._server: asyncio.AbstractServer | None = None
        self._stopping = False
        self._stopped = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._peers: set[Channel] = set()
        self._callers: dict[str, dict[tuple, Any]] = {}
        self._collectives: dict[tuple, Any] = {}
        #: the last PMIx group context id handed out (unique in the DVM's life).
        self._next_ctxid = 0
        self._pmix_nodes: dict[str, list] = {}
        self._job_launch: dict[str, tuple[dict, str]] = {}
        self._children: dict[str, list[asyncio.Future]] = {}
        self._heartbeat: asyncio.Task | None = None
        self._lock: registry.DvmLock | None = None
        #: the node this process serves itself (see nodes.choose_head_node).
        self.head_node: str | None = None
        self._guardian: Guardian | None = None
        #: set when this DVM relays its data requests to another DVM (SPEC 7).
        self.relay: Relay | None = Relay(data_server, self.values) if data_server else None
        #: (addr, port) to serve Prometheus metrics on; the server once started.
        self.metrics_address = metrics
        self.metrics: MetricsServer | None = None
        #: counts and latencies of the data requests the master store served.
        self.request_stats = RequestStats()

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
        self.head_node = choose_head_node(self.values["pydvm_head_node"],
                                          [HostSpec(n.name, n.slots) for n in self.nodes.values()])
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
        # under the process's store guard, shared with the head node's
        # PMIx requests answered on libpmix's thread (runtime/storeguard.py)
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
        try:
            try:
                self._server = await loop.create_server(lambda: _PeerChannel(self), self.bind,
                                                        self.port, reuse_address=True)
            except OSError as exc:
                raise StartError(f"cannot listen on {self.bind}: {exc}") from None
            port = self._server.sockets[0].getsockname()[1]
            host = self.bind if self.bind not in ("0.0.0.0", "::") else socket.gethostname()
            self.uri = DvmUri(host, port, self.dvmid)
            self._lock.publish(self.secret, self.uri, [n for n in self.nodes])
            if self.multi_user:
                await self._open_tool_socket()
            if self._direct_enabled():
                await self._open_direct_socket(lambda: _PeerChannel(self, unix="direct"))
            if self.metrics_address is not None:
                try:
                    self.metrics = MetricsServer.start(self, *self.metrics_address)
                except OSError as exc:
                    raise StartError("cannot serve metrics on %s:%d: %s"
                                     % (*self.metrics_address, exc)) from None
                log.info("serving metrics at %s", self.metrics.url)
            log.info("DVM %s listening at %s", self.dvmid, self.uri)
            if self.relay is not None:
                try:
                    await self.relay.start()
                except (ConnectionError, OSError, ValueError) as exc:
                    raise StartError(f"cannot reach the data server {self.relay.uri}: {exc}")
            await self._launch_daemons()
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
        loop = asyncio.get_running_loop()
        self._tool_server = await loop.create_unix_server(
            lambda: _PeerChannel(self, unix="tool"), str(path))
        os.chmod(path, 0o666)  # any local user; identity comes from SO_PEERCRED

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def stop(self) -> None:
        """End every job, shut every daemon down, wait for their exit."""
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        log.info("stopping DVM %s", self.dvmid)
        for ns in list(self.jobs):
            self._kill_job(ns, "the DVM is stopping")
        done = [f for f in self._job_done.values() if not f.done()]
        if done:
            await asyncio.wait(done, timeout=15)
        await self._teardown()

    async def _teardown(self) -> None:
        if self.metrics is not None:
            await self.metrics.stop()
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        if self.relay is not None:
            self.relay.stop()
        acks = []
        for node in self.nodes.values():
            if node.channel is not None and not node.channel.closed:
                acks.append(node.channel.call({"t": "shutdown"}, timeout=10))
        if self._server is not None:
            self._server.close()  # a daemon still on its way in finds nobody
        if acks:
            await asyncio.gather(*acks)
        await self.launcher.finish(timeout=10)
        for node in self.nodes.values():
            if node.server is not None:
                await node.server.stop()
            node.state = "stopped"
        if self._guardian is not None:
            self._guardian.close()
        if self._tool_server is not None:
            self._tool_server.close()
            shutil.rmtree(tool_socket_path(self.dvmid).parent, ignore_errors=True)
        self._close_direct_socket()
        for ch in list(self._peers):
            if not isinstance(ch.session, ToolSession):
                ch.close("DVM stopped")
        if self._lock is not None:
            self._lock.release()
        stop_polling()
        self._stopped.set()

    def record_counts(self) -> dict[str, int]:
        """How many records of each kind the master holds (``pydvm info``).

        Every one of these is bounded by what is running now -- jobs,
        sessions, connections -- never by how many ran before: the soak
        benchmark checks it.
        """
        return {
            "jobs": len(self.jobs),
            "job_waiters": len(self._job_done),
            "job_tools": len(self._job_tool),
            "sessions": len(self.sessions),
            "session_history": sum(len(s.history) for s in self.sessions.values()),
            "caller_cache": sum(len(c) for c in self._callers.values()),
            "collectives": len(self._collectives),
            "job_launch_env": len(self._job_launch),
            "spawn_parents": len(self._children),
            "connections": len(self._peers),
            "direct_procs": len(self._direct),
            "tasks": len(self._tasks),
        }

    def _spawn(self, coro, answer: tuple[Channel, Any] | None = None) -> asyncio.Task:
        """Run ``coro`` as a task.  If it fails and ``answer`` names a request
        (channel, id), that request is answered with the failure, so its
        caller is never left waiting."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._task_done(t, answer))
        return task

    def _task_done(self, task: asyncio.Task, answer: tuple[Channel, Any] | None) -> None:
        self._tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        log.error("internal error", exc_info=task.exception())
        if answer is not None:
            ch, rid = answer
            ch.send(reply(rid, Status.ERR_UNREACH, f"internal error: {task.exception()!r}"))

    # ------------------------------------------------------------------
    # connections
    # ------------------------------------------------------------------

    def _greet(self, ch: _PeerChannel) -> None:
        ch.nonce = secrets.token_bytes(32)
        self._peers.add(ch)
        ch.send({"t": "challenge", "nonce": ch.nonce, "dvm": self.dvmid})
        loop = asyncio.get_running_loop()
        ch.auth_timer = loop.call_later(
            HANDSHAKE_TIMEOUT, lambda: ch.session is None and
            ch.close(f"no handshake within {HANDSHAKE_TIMEOUT:.0f}s", error=True))

    def _on_unauthenticated(self, ch: _PeerChannel, msg: Message) -> None:
        """The first message on a connection: it decides the peer's session."""
        if ch.unix != "tool" and msg.get("t") == "auth" and msg.get("role") == DIRECT_ROLE:
            # a daemon-node client: identity by the credential its daemon gave it
            if ch.auth_timer is not None:
                ch.auth_timer.cancel()
            self._register_direct(ch, msg)
            return
        if ch.unix == "direct":
            problem = "only direct-data clients connect on the direct-data socket"
        elif ch.unix == "tool":  # the multi-user tool socket: identity by credentials
            problem = "" if msg.get("t") == "auth" and msg.get("role") == "tool" else \
                "only tools connect on the tool socket"
        else:
            problem = check_auth(self.secret, ch.nonce, msg)
        if problem:
            ch.send(reply(msg.get("id"), Status.ERR_NO_PERMISSIONS, problem))
            ch.close(f"handshake refused: {problem}", error=True)
            return
        if ch.auth_timer is not None:
            ch.auth_timer.cancel()
        if msg["role"] == "daemon":
            self._register_daemon(ch, msg)
            return
        self._tool_seq += 1
        if ch.creds is not None:
            uid, gid = ch.creds
            owner = uid == os.geteuid()
        else:  # it proved it holds the secret: the DVM's own user
            uid, gid = os.getuid(), os.getgid()
            owner = True
        session = ToolSession(ch, uid, gid, owner=owner, seq=self._tool_seq,
                              relay=bool(msg.get("relay")),
                              max_outstanding=self.values["pydvm_max_outstanding"])
        ch.name = f"tool#{self._tool_seq}" + (" (relay)" if session.relay else "")
        ch.on_message = self._on_tool
        ch.send(reply(msg.get("id"), Status.SUCCESS, dvm=self.dvmid))

    def _on_peer_closed(self, ch: Channel, reason: str) -> None:
        self._peers.discard(ch)
        session = ch.session
        if session is None:
            return
        self._withdraw(session)
        if isinstance(session, DaemonSession):
            self._collectives_node_gone(session.node)
            self._node_lost(session.node, reason)
        elif isinstance(session, ToolSession):
            self._tool_gone(session)
        elif isinstance(session, DirectSession):
            self._direct_gone(session)

    # ------------------------------------------------------------------
    # daemon messages
    # ------------------------------------------------------------------

    def _on_daemon(self, ch: Channel, msg: Message) -> None:
        session: DaemonSession = ch.session
        t = msg["t"]
        if t in dataops.DATA_OPS:
            self._daemon_data_op(session, msg)
        elif t == "output":
            self._on_output(session, msg)
        elif t == "stdin_ack":
            self._on_stdin_ack(session, msg)
        elif t == "cancel":
            self._cancel(session, msg.get("ref"))
        elif t == "exited":
            self._on_exited(session, msg)
        elif t in PMIX_REQUESTS:
            self._on_pmix_request(session, msg)
        elif t == "node_holds":
            self._node_holds(session, msg)
        elif t == "ready":
            pmix = msg.get("pmix")
            self._pmix_nodes[session.node] = list(pmix) if isinstance(pmix, list) else \
                [False, "not reported", None]
            if msg.get("holders") == [] and session.node in self.nodes:
                self.nodes[session.node].holders = set()
            self._daemon_ready(session.node)
        else:
            self._ping_or_unknown(ch, msg)

    def _ping_or_unknown(self, ch: Channel, msg: Message) -> None:
        """What every peer may send besides its own messages: a ``ping``
        (answered), else an unknown type (logged; refused if it asked)."""
        t = msg["t"]
        if t == "ping":
            if "id" in msg:
                ch.send(reply(msg.get("id"), Status.SUCCESS))
            return
        if t != "reply":
            log.warning("%s: unknown message type %r", ch.name, t)
        if "id" in msg:
            refuse(ch, msg, Status.ERR_BAD_PARAM, f"unknown message type {t!r}")
