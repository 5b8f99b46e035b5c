"""The master: one per DVM.  Tracks nodes, jobs and sessions; holds the master store.

Everything here runs on one asyncio loop.  Messages are handled
synchronously as they arrive (the store is synchronous too); only work that
must wait for daemons -- launching a job, the cleanup broadcasts, stopping --
runs as tasks.

Who acts on the master store (SPEC 5)::

    daemon reports "exited"  -> PROC purge of that process
    last process of an app   -> APP purge (per-app termination count, jobs.py)
    last process of the job  -> NSPACE purge, then a purge broadcast to every
                                daemon, acknowledged, before the job's tool
                                hears that the job ended
    session end              -> its jobs are killed and ended as above, then a
                                SESSION purge (every namespace of the session)
                                and a SESSION broadcast, acknowledged

A daemon never asks for a namespace purge: its share of a job finishing is
not a lifetime (the multi-node bug of the design).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shutil
import socket
from dataclasses import dataclass, field
from typing import Any

from .. import params as P
from ..enums import Persistence
from ..errors import Status
from ..store import Caller, DataStore, MonotonicClock, StoreParams
from ..wire import Channel, Message, heartbeat, peer_credentials, refuse, reply
from . import dataops
from .auth import (
    HANDSHAKE_TIMEOUT,
    DvmUri,
    check_auth,
    remove_secret,
    tool_socket_path,
    write_secret,
)
from .jobs import HostSpec, JobRecord, ProcState, SessionRecord, build_job
from .launch import daemon_argv, start_daemon
from .relay import Relay

log = logging.getLogger("pydvm.master")

DEFAULT_SESSION = 0
#: How long start-up waits for every daemon to register.
REGISTER_TIMEOUT = 60.0
#: How long a daemon gets to acknowledge a purge or stats request.
ACK_TIMEOUT = 30.0
#: Exit status recorded for processes lost with their node.
LOST_STATUS = 255


class StartError(RuntimeError):
    """The DVM could not be brought up (the message says why)."""


@dataclass
class NodeRecord:
    name: str
    slots: int
    channel: Channel | None = None
    process: asyncio.subprocess.Process | None = None
    state: str = "launching"  # launching -> up -> lost | stopped
    registered: asyncio.Event = field(default_factory=asyncio.Event)


class _PeerChannel(Channel):
    """A channel accepted on the master's port (or, for a multi-user DVM, on
    its tool socket): greets with a challenge."""

    def __init__(self, master: "Master", unix: bool = False) -> None:
        super().__init__(master._on_unauthenticated, master._on_peer_closed, name="peer")
        self.master = master
        self.unix = unix

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.unix:
            pid, uid, gid = peer_credentials(transport.get_extra_info("socket"))
            self.peer["creds"] = (uid, gid)
            self.name = f"tool socket peer pid {pid} uid {uid}"
        else:
            self.name = f"peer {transport.get_extra_info('peername')}"
        self.master._greet(self)


class Master:
    """One DVM's master.  ``await start()``, then ``await wait_stopped()``."""

    def __init__(
        self,
        hosts: list[HostSpec],
        launcher: str = "local",
        resolved: dict[str, P.Resolved] | None = None,
        bind: str = "127.0.0.1",
        log_dir: str | None = None,
        data_server: DvmUri | None = None,
        port: int = 0,
        dvmid: str | None = None,
        multi_user: bool = False,
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
        self.launcher = launcher
        self.bind = bind
        self.log_dir = log_dir
        self.nodes: dict[str, NodeRecord] = {h.name: NodeRecord(h.name, h.slots) for h in hosts}
        self.jobs: dict[str, JobRecord] = {}
        self._job_done: dict[str, asyncio.Future] = {}
        self._job_tool: dict[str, Channel] = {}
        self.sessions: dict[int, SessionRecord] = {
            DEFAULT_SESSION: SessionRecord(DEFAULT_SESSION, list(hosts))
        }
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
        #: (node, nspace, rank, uid, gid) -> resolved Caller; cleared whenever
        #: a job ends, since resolution depends on the job records.
        self._callers: dict[tuple, Caller] = {}
        self._heartbeat: asyncio.Task | None = None
        #: set when this DVM relays its data requests to another DVM (SPEC 7).
        self.relay: Relay | None = Relay(data_server) if data_server else None

    # ------------------------------------------------------------------
    # start / stop
    # ------------------------------------------------------------------

    async def start(self) -> DvmUri:
        """Listen, launch one daemon per host, wait until all have registered."""
        loop = asyncio.get_running_loop()
        self.store = DataStore(
            name="master",
            clock=MonotonicClock(),
            timer=loop,
            on_answer=dataops.route_answer,
            params=StoreParams(
                timeout=self.values["prte_data_server_timeout"],
                max_size=self.values["prte_data_server_max_size"],
                verbose=self.values["prte_data_server_verbose"],
            ),
            dvm_nspace=self.dvm_nspace,
        )
        try:
            self._server = await loop.create_server(lambda: _PeerChannel(self), self.bind,
                                                    self.port, reuse_address=True)
        except OSError as exc:
            raise StartError(f"cannot listen on {self.bind}: {exc}") from None
        port = self._server.sockets[0].getsockname()[1]
        host = self.bind if self.bind not in ("0.0.0.0", "::") else socket.gethostname()
        self.uri = DvmUri(host, port, self.dvmid)
        write_secret(self.dvmid, self.secret)
        if self.multi_user:
            await self._open_tool_socket()
        log.info("DVM %s listening at %s", self.dvmid, self.uri)
        try:
            if self.relay is not None:
                try:
                    await self.relay.start()
                except (ConnectionError, OSError, ValueError) as exc:
                    raise StartError(f"cannot reach the data server {self.relay.uri}: {exc}")
            await self._launch_daemons()
        except BaseException:
            await self._teardown()
            raise
        self._heartbeat = self._spawn(heartbeat(
            lambda: [n.channel for n in self.nodes.values()
                     if n.state == "up" and n.channel is not None],
            self.values["pydvm_heartbeat_interval"]))
        return self.uri

    async def _open_tool_socket(self) -> None:
        if os.geteuid() != 0:
            raise StartError("--multi-user needs a DVM started by root")
        path = tool_socket_path(self.dvmid)
        try:
            path.parent.mkdir(mode=0o711)  # fails if someone made it first
        except FileExistsError:
            raise StartError(f"{path.parent} already exists; refusing to serve tools there")
        os.chmod(path.parent, 0o711)
        loop = asyncio.get_running_loop()
        self._tool_server = await loop.create_unix_server(
            lambda: _PeerChannel(self, unix=True), str(path))
        os.chmod(path, 0o666)  # any local user; identity comes from SO_PEERCRED

    async def _launch_daemons(self) -> None:
        agent = self.values["plm_ssh_agent"]
        for node in self.nodes.values():
            argv = daemon_argv(self.launcher, node.name, str(self.uri), agent, self.log_dir,
                               self.values["pydvm_remote_python"])
            try:
                node.process = await start_daemon(argv, self.secret)
            except OSError as exc:
                raise StartError(f"cannot start the daemon for {node.name} ({argv[0]}): {exc}")
        waits = {n.name: asyncio.ensure_future(n.registered.wait()) for n in self.nodes.values()}
        exits = {
            n.name: asyncio.ensure_future(n.process.wait())
            for n in self.nodes.values() if n.process is not None
        }
        deadline = asyncio.get_running_loop().time() + REGISTER_TIMEOUT
        try:
            while any(not w.done() for w in waits.values()):
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    missing = sorted(n for n, w in waits.items() if not w.done())
                    raise StartError(f"daemons did not report in within {REGISTER_TIMEOUT:.0f}s: "
                                     f"{', '.join(missing)}")
                pending = [w for w in waits.values() if not w.done()]
                pending += [e for n, e in exits.items() if not waits[n].done()]
                await asyncio.wait(pending, timeout=left, return_when=asyncio.FIRST_COMPLETED)
                for name, e in exits.items():
                    if e.done() and not waits[name].done():
                        raise StartError(f"the daemon for {name} exited with status {e.result()} "
                                         "before reporting in (see its log)")
        finally:
            for f in list(waits.values()) + list(exits.values()):
                f.cancel()

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
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        if self.relay is not None:
            self.relay.stop()
        acks = []
        for node in self.nodes.values():
            if node.channel is not None and not node.channel.closed:
                acks.append(node.channel.call({"t": "shutdown"}, timeout=10))
        if acks:
            await asyncio.gather(*acks)
        for node in self.nodes.values():
            if node.process is not None and node.process.returncode is None:
                try:
                    await asyncio.wait_for(node.process.wait(), 10)
                except asyncio.TimeoutError:
                    log.warning("daemon %s did not exit; killing it", node.name)
                    node.process.kill()
                    await node.process.wait()
            node.state = "stopped"
        if self._server is not None:
            self._server.close()
        if self._tool_server is not None:
            self._tool_server.close()
            shutil.rmtree(tool_socket_path(self.dvmid).parent, ignore_errors=True)
        for ch in list(self._peers):
            if ch.peer.get("role") != "tool":
                ch.close("DVM stopped")
        remove_secret(self.dvmid)
        self._stopped.set()

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

    def _greet(self, ch: Channel) -> None:
        nonce = secrets.token_bytes(32)
        ch.peer["nonce"] = nonce
        self._peers.add(ch)
        ch.send({"t": "challenge", "nonce": nonce, "dvm": self.dvmid})
        loop = asyncio.get_running_loop()
        ch.peer["auth_timer"] = loop.call_later(
            HANDSHAKE_TIMEOUT, lambda: (not ch.peer.get("role")) and
            ch.close(f"no handshake within {HANDSHAKE_TIMEOUT:.0f}s", error=True))

    def _on_unauthenticated(self, ch: Channel, msg: Message) -> None:
        creds = ch.peer.get("creds")
        if creds is not None:  # the multi-user tool socket: identity by credentials
            problem = "" if msg.get("t") == "auth" and msg.get("role") == "tool" else \
                "only tools connect on the tool socket"
        else:
            problem = check_auth(self.secret, ch.peer["nonce"], msg)
        if problem:
            ch.send(reply(msg.get("id"), Status.ERR_NO_PERMISSIONS, problem))
            ch.close(f"handshake refused: {problem}", error=True)
            return
        ch.peer["auth_timer"].cancel()
        if msg["role"] == "daemon":
            self._register_daemon(ch, msg)
        else:
            self._tool_seq += 1
            uid, gid = creds if creds is not None else (os.getuid(), os.getgid())
            ch.peer.update(role="tool", parked=set(), uid=uid, gid=gid, seq=self._tool_seq)
            ch.name = f"tool#{self._tool_seq}"
            ch.on_message = self._on_tool
            ch.send(reply(msg.get("id"), Status.SUCCESS, dvm=self.dvmid))

    def _register_daemon(self, ch: Channel, msg: Message) -> None:
        name = msg.get("node")
        node = self.nodes.get(name) if isinstance(name, str) else None
        if node is None or node.state != "launching":
            why = f"unexpected daemon for node {name!r}"
            ch.send(reply(msg.get("id"), Status.ERR_NO_PERMISSIONS, why))
            ch.close(why, error=True)
            return
        ch.peer.update(role="daemon", node=name, parked=set())
        ch.name = f"daemon {name}"
        ch.on_message = self._on_daemon
        node.channel = ch
        node.state = "joining"  # up once it says it is ready to serve clients
        ch.send(reply(msg.get("id"), Status.SUCCESS, params=P.to_wire(self.resolved),
                      dvm=self.dvmid, dvm_nspace=self.dvm_nspace, multi_user=self.multi_user))

    def _cancel(self, ch: Channel, ref: Any) -> None:
        """A relayed lookup's caller went away: drop it without an answer."""
        if not isinstance(ref, int) or isinstance(ref, bool):
            return
        if ref in ch.peer["parked"]:
            ch.peer["parked"].discard(ref)
            self.store.cancel((ch, ref))
        remote = ch.peer.get("relayed", {}).pop(ref, None)
        if remote is not None and self.relay is not None:
            self.relay.cancel(remote)

    def _on_peer_closed(self, ch: Channel, reason: str) -> None:
        self._peers.discard(ch)
        for rid in list(ch.peer.get("parked", ())):
            self.store.cancel((ch, rid))
        for remote in ch.peer.get("relayed", {}).values():
            self.relay.cancel(remote)
        role = ch.peer.get("role")
        if role == "daemon":
            self._node_lost(ch.peer["node"], reason)
        elif role == "tool":
            for ns, tool in list(self._job_tool.items()):
                if tool is ch and ns in self.jobs:
                    self._kill_job(ns, "its pydvm run went away")

    def _node_lost(self, name: str, reason: str) -> None:
        node = self.nodes[name]
        if node.state not in ("up", "joining"):
            return
        node.state = "stopped" if self._stopping else "lost"
        if self._stopping:
            return
        log.error("lost node %s: %s", name, reason)
        for job in list(self.jobs.values()):
            lost = [p.rank for p in job.procs.values()
                    if p.node == name and p.state is not ProcState.ENDED]
            if lost:
                job.error = job.error or f"node {name} was lost ({reason})"
                self._kill_job(job.nspace, job.error)
                for rank in lost:
                    self._proc_ended(job, rank, LOST_STATUS)

    # ------------------------------------------------------------------
    # daemon messages
    # ------------------------------------------------------------------

    def _on_daemon(self, ch: Channel, msg: Message) -> None:
        t = msg["t"]
        if t in dataops.DATA_OPS:
            fields = dataops.parse_caller_fields(msg.get("caller"))
            if fields is None:
                ch.send(reply(msg.get("id"), Status.ERR_BAD_PARAM, "malformed caller"))
                return
            key = (ch.peer["node"], *fields)
            caller = self._callers.get(key)
            if caller is None:
                caller = self._callers[key] = self._resolve_caller(*fields, ch.peer["node"])
            self._data_op(ch, msg, caller)
        elif t == "cancel":
            self._cancel(ch, msg.get("ref"))
        elif t == "output":
            tool = self._job_tool.get(msg.get("nspace"))
            if tool is not None:
                tool.send(msg)
        elif t == "exited":
            self._on_exited(ch, msg)
        elif t == "ready":
            node = self.nodes[ch.peer["node"]]
            if node.state == "joining":
                node.state = "up"
                node.registered.set()
                log.info("daemon %s registered", node.name)
        elif t == "ping":
            pass
        else:
            if t != "reply":
                log.warning("%s: unknown message type %r", ch.name, t)
            if "id" in msg:
                refuse(ch, msg, Status.ERR_BAD_PARAM, f"unknown message type {t!r}")

    def _resolve_caller(self, ns: str, rank: int, uid: int, gid: int | None,
                        node: str | None) -> Caller:
        job = self.jobs.get(ns)
        proc = job.procs.get(rank) if job else None
        # The default session never ends, so no session horizon applies to it.
        sid = job.session_id if job and job.session_id != DEFAULT_SESSION else None
        return Caller(ns, rank, uid, gid, node, proc.app_idx if proc else None, sid)

    def _data_op(self, ch: Channel, msg: Message, caller: Caller) -> None:
        rid = msg.get("id")
        if not isinstance(rid, int) or isinstance(rid, bool):
            ch.send(reply(None, Status.ERR_BAD_PARAM, "request without an integer id"))
            return
        relayed = ch.peer.setdefault("relayed", {})
        if rid in ch.peer["parked"] or rid in relayed:
            ch.send(reply(rid, Status.ERR_BAD_PARAM, f"request id {rid} is still outstanding"))
            return
        if self.relay is not None:
            self._relay_data_op(ch, msg, caller, rid, relayed)
            return
        out = dataops.apply(self.store, caller, msg, (ch, rid))
        if out is None:
            ch.peer["parked"].add(rid)
        else:
            ch.send(out)

    def _relay_data_op(self, ch: Channel, msg: Message, caller: Caller, rid: int,
                       relayed: dict[int, int]) -> None:
        head = {"t": msg["t"], **Relay.claims(caller)}
        dataops.reissue(self.relay.request, ch, msg, head, relayed)

    def _on_exited(self, ch: Channel, msg: Message) -> None:
        job = self.jobs.get(msg.get("nspace"))
        rank = msg.get("rank")
        status = msg.get("status")
        if job is None or rank not in job.procs or not isinstance(status, int):
            log.warning("%s: exit report for unknown process %r:%r", ch.name,
                        msg.get("nspace"), rank)
            return
        if job.procs[rank].node != ch.peer["node"]:
            log.warning("%s: exit report for %s:%d which runs elsewhere", ch.name,
                        job.nspace, rank)
            return
        self._proc_ended(job, rank, status)

    # ------------------------------------------------------------------
    # lifetimes
    # ------------------------------------------------------------------

    def _proc_ended(self, job: JobRecord, rank: int, status: int) -> None:
        app_done, job_done = job.proc_ended(rank, status)
        store = self.store
        app_idx = job.procs[rank].app_idx
        store.purge(Persistence.PROC, nspace=job.nspace, rank=rank)
        if self.relay is not None:
            self.relay.purge(Persistence.PROC, job.nspace, rank=rank)
        if app_done:
            store.purge(Persistence.APP, nspace=job.nspace, app_idx=app_idx)
            if self.relay is not None:
                self.relay.purge(Persistence.APP, job.nspace, app_idx=app_idx)
        if job_done:
            self._spawn(self._job_ended(job))

    async def _job_ended(self, job: JobRecord) -> None:
        self.store.purge(Persistence.NSPACE, nspace=job.nspace)
        if self.relay is not None:
            self.relay.purge(Persistence.NSPACE, job.nspace)
        await self._broadcast_purge(Persistence.NSPACE, nspace=job.nspace)
        self.jobs.pop(job.nspace, None)
        self._callers.clear()
        session = self.sessions.get(job.session_id)
        if session is not None:
            session.jobs.discard(job.nspace)
        fut = self._job_done.pop(job.nspace, None)
        if fut is not None and not fut.done():
            fut.set_result(job)
        log.info("job %s ended with status %d", job.nspace, job.exit_status)

    async def _broadcast_purge(self, horizon: Persistence, nspace: str | None = None,
                               session_id: int | None = None) -> None:
        """Send a purge to every live daemon and wait for each to apply it."""
        calls = [
            n.channel.call({"t": "purge", "horizon": int(horizon), "nspace": nspace,
                            "session_id": session_id}, timeout=ACK_TIMEOUT)
            for n in self.nodes.values() if n.state == "up" and n.channel is not None
        ]
        for r in await asyncio.gather(*calls):
            if r.get("status") != 0:
                log.warning("purge broadcast not applied everywhere: %s", r.get("msg"))

    def _kill_job(self, nspace: str, why: str) -> None:
        job = self.jobs.get(nspace)
        if job is None or job.killed:
            return
        job.killed = True
        log.info("killing job %s: %s", nspace, why)
        for name in job.nodes():
            node = self.nodes.get(name)
            if node is not None and node.state == "up" and node.channel is not None:
                node.channel.send({"t": "kill", "nspace": nspace})

    # ------------------------------------------------------------------
    # tool messages
    # ------------------------------------------------------------------

    def _on_tool(self, ch: Channel, msg: Message) -> None:
        t = msg["t"]
        rid = msg.get("id")
        if t in dataops.DATA_OPS:
            self._data_op(ch, msg, self._tool_caller(ch, msg))
            return
        handler = _TOOL_HANDLERS.get(t)
        if handler is None:
            refuse(ch, msg, Status.ERR_BAD_PARAM, f"unknown message type {t!r}")
            return
        if self._stopping and t != "stop":
            ch.send(reply(rid, Status.ERR_UNREACH, "the DVM is stopping"))
            return
        if t in _ADMIN_ONLY and not self._is_admin(ch):
            ch.send(reply(rid, Status.ERR_NO_PERMISSIONS,
                          f"only the DVM's owner or root may {t.replace('_', ' ')}"))
            return
        handler(self, ch, msg)

    def _is_admin(self, ch: Channel) -> bool:
        return ch.peer["uid"] in (0, os.getuid())

    def _tool_caller(self, ch: Channel, msg: Message) -> Caller:
        """A tool acts as the DVM itself unless it relays for a process.

        ``requestor`` ([nspace, rank]), ``req_uid`` and ``req_gid`` are
        honoured here, on a tool connection, and nowhere else.
        """
        uid, gid = ch.peer["uid"], ch.peer["gid"]
        ns, rank = self.dvm_nspace, -ch.peer["seq"]
        req = msg.get("requestor")
        if (isinstance(req, (list, tuple)) and len(req) == 2 and isinstance(req[0], str)
                and isinstance(req[1], int)):
            ns, rank = req[0], req[1]
        if isinstance(msg.get("req_uid"), int):
            uid = msg["req_uid"]
        if "req_gid" in msg and (msg["req_gid"] is None or isinstance(msg["req_gid"], int)):
            gid = msg["req_gid"]
        caller = self._resolve_caller(ns, rank, uid, gid, None)
        app = msg.get("req_app")
        if caller.app_idx is None and isinstance(app, int) and not isinstance(app, bool):
            caller = caller._replace(app_idx=app)
        return caller

    def _tool_run(self, ch: Channel, msg: Message) -> None:
        rid = msg.get("id")
        # Jobs run as the submitting user (only a multi-user DVM, run by root,
        # can start them as anyone but itself).
        msg["_uid"], msg["_gid"] = ch.peer["uid"], ch.peer["gid"]
        try:
            job, per_node = self._plan_job(msg)
        except ValueError as exc:
            ch.send(reply(rid, Status.ERR_BAD_PARAM, str(exc)))
            return
        self._spawn(self._run_job(ch, rid, job, per_node), (ch, rid))

    def _plan_job(self, msg: Message) -> tuple[JobRecord, dict[str, list[dict]]]:
        sid = msg.get("session", DEFAULT_SESSION)
        if sid is None:
            sid = DEFAULT_SESSION
        session = self.sessions.get(sid) if isinstance(sid, int) else None
        if session is None:
            raise ValueError(f"no session {sid!r} in this DVM")
        if session.ending:
            raise ValueError(f"session {sid} is ending")
        apps = msg.get("apps")
        if not isinstance(apps, list) or not apps:
            raise ValueError("a job needs at least one app context")
        env = msg.get("env") or {}
        cwd = msg.get("cwd") or "/"
        if not isinstance(env, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise ValueError("env must map str to str")
        session_nodes = {h.name: h for h in session.hosts}
        specs = []
        for i, app in enumerate(apps):
            argv, n, hosts = app.get("argv"), app.get("n"), app.get("hosts")
            if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
                raise ValueError(f"app {i}: missing command")
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ValueError(f"app {i}: -n must be a positive integer")
            if hosts:
                hs = []
                for h in hosts:
                    name, slots = h[0], h[1]
                    if name not in session_nodes:
                        where = "this DVM" if sid == DEFAULT_SESSION else f"session {sid}"
                        raise ValueError(f"app {i}: host {name!r} is not in {where}")
                    hs.append(HostSpec(name, slots))
            else:
                hs = list(session.hosts)
            down = [h.name for h in hs if self.nodes[h.name].state != "up"]
            if down:
                raise ValueError(f"app {i}: node(s) not available: {', '.join(down)}")
            specs.append((argv, n, hs))
        nspace = f"{self.dvm_nspace}@{self._next_job}"
        self._next_job += 1
        job = build_job(nspace, sid, specs)
        job.uid, job.gid = msg.get("_uid"), msg.get("_gid")
        per_node: dict[str, list[dict]] = {}
        for p in job.procs.values():
            per_node.setdefault(p.node, []).append({
                "rank": p.rank, "app_idx": p.app_idx,
                "argv": job.apps[p.app_idx].argv, "env": env, "cwd": cwd,
            })
        return job, per_node

    async def _run_job(self, ch: Channel, rid: Any, job: JobRecord,
                       per_node: dict[str, list[dict]]) -> None:
        ns = job.nspace
        self.jobs[ns] = job
        self.sessions[job.session_id].jobs.add(ns)
        self.sessions[job.session_id].history.add(ns)
        self._job_tool[ns] = ch
        done = self._job_done[ns] = asyncio.get_running_loop().create_future()
        ch.send({"t": "started", "ref": rid, "nspace": ns, "size": job.size})
        names = list(per_node)
        results = await asyncio.gather(*[
            self.nodes[n].channel.call({
                "t": "launch", "nspace": ns, "session_id": job.session_id,
                "job_size": job.size, "procs": per_node[n], "uid": job.uid, "gid": job.gid},
                timeout=ACK_TIMEOUT)
            for n in names
        ])
        for name, r in zip(names, results):
            if r.get("status") != 0:
                job.error = job.error or r.get("msg") or f"launch failed on {name}"
                if r.get("exit") is not None and job.first_failure is None:
                    job.first_failure = r["exit"]
                self._kill_job(ns, job.error)
                for p in per_node[name]:
                    if job.procs[p["rank"]].state is not ProcState.ENDED:
                        self._proc_ended(job, p["rank"], r.get("exit") or LOST_STATUS)
            else:
                for p in per_node[name]:
                    if job.procs[p["rank"]].state is ProcState.PENDING:
                        job.procs[p["rank"]].state = ProcState.RUNNING
        await done
        self._job_tool.pop(ns, None)
        ch.send(reply(rid, Status.SUCCESS, job.error, nspace=ns, exit=job.exit_status))

    def _tool_kill_job(self, ch: Channel, msg: Message) -> None:
        ns = msg.get("nspace")
        if ns not in self.jobs:
            ch.send(reply(msg.get("id"), Status.ERR_NOT_FOUND, f"no running job {ns!r}"))
            return
        if not self._is_admin(ch) and self.jobs[ns].uid != ch.peer["uid"]:
            ch.send(reply(msg.get("id"), Status.ERR_NO_PERMISSIONS, "not your job"))
            return
        self._kill_job(ns, "killed by request")
        ch.send(reply(msg.get("id"), Status.SUCCESS))

    def _tool_stop(self, ch: Channel, msg: Message) -> None:
        async def run() -> None:
            await self.stop()
            ch.send(reply(msg.get("id"), Status.SUCCESS, pid=os.getpid()))
        self._spawn(run(), (ch, msg.get("id")))

    def _tool_session_new(self, ch: Channel, msg: Message) -> None:
        hosts = msg.get("hosts")
        if hosts:
            try:
                specs = []
                for name, slots in hosts:
                    node = self.nodes.get(name)
                    if node is None:
                        raise ValueError(f"host {name!r} is not in this DVM")
                    specs.append(HostSpec(name, slots if slots else node.slots))
            except (TypeError, ValueError) as exc:
                ch.send(reply(msg.get("id"), Status.ERR_BAD_PARAM, str(exc)))
                return
        else:
            specs = list(self.sessions[DEFAULT_SESSION].hosts)
        sid = self._next_session
        self._next_session += 1
        self.sessions[sid] = SessionRecord(sid, specs)
        ch.send(reply(msg.get("id"), Status.SUCCESS, session=sid))

    def _tool_session_end(self, ch: Channel, msg: Message) -> None:
        sid = msg.get("session")
        rid = msg.get("id")
        if sid == DEFAULT_SESSION:
            ch.send(reply(rid, Status.ERR_BAD_PARAM, "the default session ends with the DVM"))
            return
        session = self.sessions.get(sid) if isinstance(sid, int) else None
        if session is None or session.ending:
            ch.send(reply(rid, Status.ERR_NOT_FOUND, f"no session {sid!r}"))
            return
        session.ending = True

        async def run() -> None:
            waits = [self._job_done[ns] for ns in session.jobs if ns in self._job_done]
            for ns in list(session.jobs):
                self._kill_job(ns, f"session {sid} is ending")
            if waits:
                await asyncio.wait(waits, timeout=ACK_TIMEOUT)
            self.store.purge(Persistence.SESSION, session_id=sid)
            if self.relay is not None:
                # The remote store knows nothing of our sessions: name each job.
                for ns in sorted(session.history):
                    self.relay.purge(Persistence.SESSION, ns)
            await self._broadcast_purge(Persistence.SESSION, session_id=sid)
            del self.sessions[sid]
            ch.send(reply(rid, Status.SUCCESS))
        self._spawn(run(), (ch, rid))

    def _tool_store(self, ch: Channel, msg: Message) -> None:
        uid = ch.peer["uid"]

        async def run() -> None:
            stores = [dataops.stats_row(self.store, uid)]
            names = [n.name for n in self.nodes.values() if n.state == "up"]
            results = await asyncio.gather(*[
                self.nodes[n].channel.call({"t": "stats", "uid": uid}, timeout=ACK_TIMEOUT)
                for n in names])
            for name, r in zip(names, results):
                if r.get("status") == 0:
                    stores.append(r["store"])
                else:
                    stores.append({"store": name, "error": r.get("msg", "")})
            ch.send(reply(msg.get("id"), Status.SUCCESS, stores=stores))
        self._spawn(run(), (ch, msg.get("id")))

    def _tool_purge(self, ch: Channel, msg: Message) -> None:
        """A relaying DVM applies one of its lifetimes to this store."""
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
            n = self.store.purge(horizon, nspace=ns, rank=rank, app_idx=app)
        except (ValueError, TypeError) as exc:
            ch.send(reply(rid, Status.ERR_BAD_PARAM, str(exc)))
            return
        ch.send(reply(rid, Status.SUCCESS, removed=n))

    def _tool_cancel(self, ch: Channel, msg: Message) -> None:
        self._cancel(ch, msg.get("ref"))

    def _tool_info(self, ch: Channel, msg: Message) -> None:
        ch.send(reply(
            msg.get("id"), Status.SUCCESS,
            params={k: [r.value, r.source, P.REGISTRY[k].help] for k, r in self.resolved.items()},
            nodes=[[n.name, n.slots, n.state] for n in self.nodes.values()],
            sessions=sorted(self.sessions), jobs=sorted(self.jobs),
            dvm=self.dvmid, uri=str(self.uri), pid=os.getpid(),
            daemon_pids={n.name: n.process.pid for n in self.nodes.values() if n.process},
        ))


_TOOL_HANDLERS = {
    "run": Master._tool_run,
    "kill_job": Master._tool_kill_job,
    "stop": Master._tool_stop,
    "session_new": Master._tool_session_new,
    "session_end": Master._tool_session_end,
    "store": Master._tool_store,
    "info": Master._tool_info,
    "purge": Master._tool_purge,
    "cancel": Master._tool_cancel,
}

#: Requests only the DVM's owner (or root) may make.
_ADMIN_ONLY = frozenset({"stop", "session_end", "purge"})
