"""The daemon: one per node.  Launches and reaps job processes, serves their
client connections, holds the node's store, relays everything else.

Request path of a client call::

    client --unix--> daemon --+-- range LOCAL --> daemon store
                              +-- other ranges --tcp--> master store

The daemon fills the caller's identity itself: uid/gid/pid from the Unix
socket's peer credentials, namespace/rank from the client's hello (checked
against the processes this daemon launched).  Requestor claims a client puts
in a message are never forwarded (see ``dataops.FORWARDED_FIELDS``).

``unpublish`` is applied to both stores: removal is a question of ownership,
not of range, so an owner's key goes wherever it is.

What the daemon purges in its own store: PROC when it reaps a process;
NSPACE and SESSION when the master broadcasts them.  It never sees an APP
purge (the master sends no application notice), so a LOCAL item with APP
persistence lives until its namespace ends -- never shorter than asked
(docs/todo.md).  Its own share of a job finishing purges nothing more.

If the master connection is lost, the daemon kills its processes and exits:
a daemon without its DVM has nobody to report to.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .. import params as P
from ..enums import Persistence, Range
from ..errors import Status
from ..store import Caller, DataStore, MonotonicClock, StoreParams
from ..wire import Channel, Message, heartbeat, peer_credentials, refuse, reply
from . import dataops
from .auth import DvmUri, connect

log = logging.getLogger("pydvm.daemon")

#: Seconds between SIGTERM and SIGKILL when killing a job's processes.
KILL_GRACE = 3.0
#: Longest line forwarded in one piece; longer output is split.
LINE_LIMIT = 64 * 1024


@dataclass
class LocalProc:
    nspace: str
    rank: int
    app_idx: int
    process: asyncio.subprocess.Process | None = None
    ended: bool = False


@dataclass
class LocalJob:
    nspace: str
    session_id: int
    procs: dict[int, LocalProc] = field(default_factory=dict)
    #: the job's owner in a multi-user DVM (its processes run as them).
    uid: int | None = None
    gid: int | None = None


class Daemon:
    def __init__(self, master_uri: DvmUri, node: str, secret: bytes) -> None:
        self.uri = master_uri
        self.node = node
        self.secret = secret
        self.master: Channel | None = None
        self.store: DataStore | None = None
        self.jobs: dict[str, LocalJob] = {}
        self.socket_dir: Path | None = None
        self.socket_path = ""
        self._server: asyncio.AbstractServer | None = None
        self._done = asyncio.Event()
        self._clients: set[Channel] = set()
        self._tasks: set[asyncio.Task] = set()
        self._exiting = False

    # ------------------------------------------------------------------
    # life cycle
    # ------------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        self.master, welcome = await connect(
            self.uri, self.secret, "daemon", self._on_master, self._on_master_lost,
            fields={"node": self.node, "pid": os.getpid()})
        values = P.values(P.from_wire(welcome["params"]))
        self.params = values
        self.store = DataStore(
            name=self.node,
            clock=MonotonicClock(),
            timer=loop,
            on_answer=dataops.route_answer,
            params=StoreParams(
                timeout=values["prte_data_server_timeout"],
                max_size=values["prte_data_server_max_size"],
                verbose=values["prte_data_server_verbose"],
            ),
            dvm_nspace=welcome["dvm_nspace"],
        )
        logging.getLogger("pydvm.store").setLevel(
            logging.INFO if values["prte_data_server_verbose"] > 0 else logging.WARNING)
        self.multi_user = bool(welcome.get("multi_user"))
        # Single-user: only the DVM's user can enter the socket directory.
        # Multi-user: job processes of every user must reach the socket, so the
        # directory is traversable (not listable) and the socket open to all;
        # identity comes from SO_PEERCRED and is checked against the job's owner.
        base = Path(tempfile.gettempdir()) / f"pydvm-{os.getuid()}"
        base.mkdir(mode=0o700, exist_ok=True)
        mode = 0o711 if self.multi_user else 0o700
        os.chmod(base, mode)
        self.socket_dir = Path(tempfile.mkdtemp(prefix=f"{welcome['dvm']}-{self.node}-", dir=base))
        os.chmod(self.socket_dir, mode)
        self.socket_path = str(self.socket_dir / "client.sock")
        self._server = await loop.create_unix_server(
            lambda: Channel(self._on_client_hello, self._on_client_closed, name="client"),
            self.socket_path)
        os.chmod(self.socket_path, 0o666 if self.multi_user else 0o700)
        self.master.send({"t": "ready"})
        self._spawn(heartbeat(lambda: [self.master], values["pydvm_heartbeat_interval"]))
        log.info("daemon %s serving clients at %s", self.node, self.socket_path)
        await self._done.wait()
        return 0

    def _on_master_lost(self, ch: Channel, reason: str) -> None:
        if not self._exiting:
            log.error("lost the master (%s); killing local processes and exiting", reason)
        self._spawn(self._exit())

    async def _exit(self) -> None:
        if self._exiting:
            return
        self._exiting = True
        await self._kill_all(grace=1.0 if self.master is None or self.master.closed else KILL_GRACE)
        if self._server is not None:
            self._server.close()
        for ch in list(self._clients):
            ch.close("daemon exiting")
        if self.socket_dir is not None:
            shutil.rmtree(self.socket_dir, ignore_errors=True)
        self._done.set()

    def _spawn(self, coro, answer_id=None) -> asyncio.Task:
        """Run ``coro`` as a task; if it fails and ``answer_id`` names a master
        request, answer that request with the failure."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)

        def done(t: asyncio.Task) -> None:
            self._tasks.discard(t)
            if t.cancelled() or t.exception() is None:
                return
            log.error("internal error", exc_info=t.exception())
            if answer_id is not None and self.master is not None:
                self.master.send(reply(answer_id, Status.ERR_UNREACH,
                                       f"{self.node}: internal error: {t.exception()!r}"))
        task.add_done_callback(done)
        return task

    # ------------------------------------------------------------------
    # master messages
    # ------------------------------------------------------------------

    def _on_master(self, ch: Channel, msg: Message) -> None:
        t = msg["t"]
        rid = msg.get("id")
        if t == "launch":
            self._spawn(self._launch(msg), rid)
        elif t == "kill":
            job = self.jobs.get(msg.get("nspace"))
            if job is not None:
                self._spawn(self._kill_procs(list(job.procs.values()), KILL_GRACE))
        elif t == "purge":
            self._apply_purge(msg)
        elif t == "stats":
            uid = msg.get("uid")
            uid = uid if isinstance(uid, int) else -1
            ch.send(reply(rid, Status.SUCCESS, store=dataops.stats_row(self.store, uid)))
        elif t == "shutdown":
            async def run() -> None:
                await self._kill_all(KILL_GRACE)
                ch.send(reply(rid, Status.SUCCESS))
                await self._exit()
            self._spawn(run(), rid)
        elif t == "ping":
            if rid is not None:
                ch.send(reply(rid, Status.SUCCESS))
        else:
            if t != "reply":
                log.warning("master sent unknown message type %r", t)
            if rid is not None:
                refuse(ch, msg, Status.ERR_BAD_PARAM, f"unknown message type {t!r}")

    def _apply_purge(self, msg: Message) -> None:
        rid = msg.get("id")
        try:
            horizon = Persistence(msg.get("horizon"))
            n = self.store.purge(horizon, nspace=msg.get("nspace"),
                                 session_id=msg.get("session_id"))
        except (ValueError, TypeError) as exc:
            self.master.send(reply(rid, Status.ERR_BAD_PARAM, str(exc)))
            return
        if horizon is Persistence.NSPACE:
            self.jobs.pop(msg.get("nspace"), None)
        self.master.send(reply(rid, Status.SUCCESS, removed=n))

    # ------------------------------------------------------------------
    # processes
    # ------------------------------------------------------------------

    async def _launch(self, msg: Message) -> None:
        rid = msg.get("id")
        ns = msg.get("nspace")
        procs = msg.get("procs") or []
        job = self.jobs.setdefault(ns, LocalJob(ns, msg.get("session_id", 0)))
        creds = {}
        if self.multi_user and msg.get("uid") is not None:
            job.uid, job.gid = msg["uid"], msg["gid"]
            if job.uid != os.getuid():
                creds = _run_as(job.uid, job.gid)
        # Resolve every executable first: a job either starts here or fails whole.
        for p in procs:
            path = p["env"].get("PATH", os.defpath)
            exe = p["argv"][0]
            if not shutil.which(exe, path=path) and not (os.sep in exe and os.access(exe, os.X_OK)):
                self.master.send(reply(rid, Status.ERR_NOT_FOUND,
                                       f"{self.node}: executable not found: {exe}", exit=127))
                return
        started = 0
        for p in procs:
            env = dict(p["env"])
            env.update({
                "PYDVM_SERVER": self.socket_path,
                "PYDVM_NSPACE": ns,
                "PYDVM_RANK": str(p["rank"]),
                "PYDVM_APP_IDX": str(p["app_idx"]),
                "PYDVM_JOB_SIZE": str(msg.get("job_size")),
                "PYDVM_NODE": self.node,
                "PMIX_NAMESPACE": ns,
                "PMIX_RANK": str(p["rank"]),
            })
            lp = LocalProc(ns, p["rank"], p["app_idx"])
            job.procs[p["rank"]] = lp
            cwd = p.get("cwd") if p.get("cwd") and os.path.isdir(p["cwd"]) else None
            try:
                lp.process = await asyncio.create_subprocess_exec(
                    *p["argv"], env=env, cwd=cwd, stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                    start_new_session=True, limit=LINE_LIMIT, **creds)
            except OSError as exc:
                # Already started ranks of this job are killed by the master.
                job.procs.pop(p["rank"], None)
                self.master.send(reply(rid, Status.ERR_NOT_FOUND,
                                       f"{self.node}: cannot start {p['argv'][0]}: {exc}",
                                       exit=126 if isinstance(exc, PermissionError) else 127))
                for q in procs[started:]:
                    job.procs.pop(q["rank"], None)
                return
            started += 1
            self._spawn(self._watch(lp))
        self.master.send(reply(rid, Status.SUCCESS))

    async def _watch(self, lp: LocalProc) -> None:
        proc = lp.process
        await asyncio.gather(self._pump(lp, proc.stdout, 1), self._pump(lp, proc.stderr, 2))
        rc = await proc.wait()
        status = 128 - rc if rc < 0 else rc  # -N means killed by signal N
        lp.ended = True
        self.store.purge(Persistence.PROC, nspace=lp.nspace, rank=lp.rank)
        if self.master is not None and not self.master.closed:
            self.master.send({"t": "exited", "nspace": lp.nspace, "rank": lp.rank,
                              "status": status})

    async def _pump(self, lp: LocalProc, stream: asyncio.StreamReader, fd: int) -> None:
        while True:
            try:
                line = await stream.readuntil(b"\n")
            except asyncio.IncompleteReadError as exc:  # EOF: the last, unterminated line
                line = exc.partial
            except asyncio.LimitOverrunError as exc:
                # A line longer than LINE_LIMIT goes in pieces; nothing is dropped.
                line = await stream.readexactly(max(1, min(exc.consumed, LINE_LIMIT)))
            if not line:
                return
            if self.master is not None and not self.master.closed:
                self.master.send({"t": "output", "nspace": lp.nspace, "rank": lp.rank,
                                  "fd": fd, "data": line})

    async def _kill_procs(self, procs: list[LocalProc], grace: float) -> None:
        live = [lp for lp in procs if lp.process is not None and lp.process.returncode is None]
        for lp in live:
            _signal_group(lp.process.pid, signal.SIGTERM)
        deadline = asyncio.get_running_loop().time() + grace
        for lp in live:
            left = max(0.0, deadline - asyncio.get_running_loop().time())
            try:
                await asyncio.wait_for(asyncio.shield(lp.process.wait()), left)
            except asyncio.TimeoutError:
                _signal_group(lp.process.pid, signal.SIGKILL)
        for lp in live:
            _signal_group(lp.process.pid, signal.SIGKILL)  # stragglers in the group
            await lp.process.wait()

    async def _kill_all(self, grace: float) -> None:
        procs = [lp for job in self.jobs.values() for lp in job.procs.values()]
        await self._kill_procs(procs, grace)
        # Let the watchers report and purge.
        for _ in range(50):
            if all(lp.ended for lp in procs):
                break
            await asyncio.sleep(0.01)

    # ------------------------------------------------------------------
    # clients
    # ------------------------------------------------------------------

    def _on_client_hello(self, ch: Channel, msg: Message) -> None:
        rid = msg.get("id")
        if msg["t"] != "hello":
            refuse(ch, msg, Status.ERR_BAD_PARAM, "first message must be hello")
            ch.close(f"client sent {msg['t']!r} before hello", error=True)
            return
        try:
            pid, uid, gid = peer_credentials(ch.transport.get_extra_info("socket"))
        except OSError as exc:
            ch.close(f"no peer credentials: {exc}", error=True)
            return
        ns, rank = msg.get("nspace"), msg.get("rank")
        job = self.jobs.get(ns) if isinstance(ns, str) else None
        ok_rank = isinstance(rank, int) and not isinstance(rank, bool)
        lp = job.procs.get(rank) if job is not None and ok_rank else None
        if lp is not None and job.uid is not None and uid not in (job.uid, 0):
            lp = None  # another user's process: claiming it would be claiming them
        if lp is None or lp.ended:
            why = f"{ns!r}:{rank!r} is not a running process of this node"
            ch.send(reply(rid, Status.ERR_NO_PERMISSIONS, why))
            ch.close(f"client pid {pid} refused: {why}", error=True)
            return
        ch.name = f"client {ns}:{rank} pid {pid}"
        # The default session (0) never ends: no session horizon applies to it.
        ch.peer.update(caller=Caller(ns, rank, uid, gid, self.node, lp.app_idx,
                                     job.session_id or None),
                       parked=set(), forwarded={})
        ch.on_message = self._on_client
        self._clients.add(ch)
        ch.send(reply(rid, Status.SUCCESS, node=self.node))

    def _on_client(self, ch: Channel, msg: Message) -> None:
        t = msg["t"]
        rid = msg.get("id")
        if t not in dataops.DATA_OPS:
            refuse(ch, msg, Status.ERR_BAD_PARAM, f"unknown message type {t!r}")
            return
        if not isinstance(rid, int) or isinstance(rid, bool):
            ch.send(reply(None, Status.ERR_BAD_PARAM, "request without an integer id"))
            return
        if rid in ch.peer["parked"] or rid in ch.peer["forwarded"]:
            ch.send(reply(rid, Status.ERR_BAD_PARAM, f"request id {rid} is still outstanding"))
            return
        caller: Caller = ch.peer["caller"]
        if t == "unpublish":
            dataops.apply(self.store, caller, msg, (ch, rid))
            self._forward(ch, msg, caller)
        elif dataops.request_range(msg) == Range.LOCAL:
            out = dataops.apply(self.store, caller, msg, (ch, rid))
            if out is None:
                ch.peer["parked"].add(rid)
            else:
                ch.send(out)
        else:
            self._forward(ch, msg, caller)

    def _forward(self, ch: Channel, msg: Message, caller: Caller) -> None:
        head = {"t": msg["t"], "caller": [caller.nspace, caller.rank, caller.uid, caller.gid]}
        dataops.reissue(self.master.request, ch, msg, head, ch.peer["forwarded"])

    def _on_client_closed(self, ch: Channel, reason: str) -> None:
        self._clients.discard(ch)
        for rid in list(ch.peer.get("parked", ())):
            self.store.cancel((ch, rid))
        for mid in ch.peer.get("forwarded", {}).values():
            self.master.forget(mid)
            if not self.master.closed:
                self.master.send({"t": "cancel", "ref": mid})


def _run_as(uid: int, gid: int) -> dict:
    """subprocess arguments that start a process as ``uid``/``gid`` with the
    user's supplementary groups.  (uvloop's subprocess support has no
    ``user``/``group`` arguments, so the switch happens in the child.)"""
    import pwd

    try:
        groups = os.getgrouplist(pwd.getpwuid(uid).pw_name, gid)
    except KeyError:
        groups = [gid]

    def switch() -> None:
        os.setgroups(groups)
        os.setgid(gid)
        os.setuid(uid)

    return {"preexec_fn": switch}


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


async def run_daemon(master_uri: str, node: str, secret: bytes) -> int:
    d = Daemon(DvmUri.parse(master_uri), node, secret)
    try:
        return await d.run()
    except ConnectionError as exc:
        log.error("daemon %s cannot join the DVM: %s", node, exc)
        return 1
    finally:
        if d.socket_dir is not None:
            shutil.rmtree(d.socket_dir, ignore_errors=True)

