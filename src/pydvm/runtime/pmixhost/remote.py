"""One PMIx server process as its node sees it: :class:`UserServer`.

A server process (an *agent*, :mod:`pydvm.runtime.pmixhost.agent`) hosts a libpmix
server for one user's jobs on a node (runtime/pmixhost/users.py says which
process serves whom, and why).  Its node holds one :class:`UserServer` per
agent: it starts the process, registers jobs with it, passes events and
modex requests on, and serves the upcalls the agent relays -- each with a
:class:`RemoteReply` that answers the agent.

Wire
----
Framed msgpack (:class:`~pydvm.wire.Channel`), requests and replies matched
by id both ways.  Node -> agent: ``start``, ``register_job`` (a job's
share of the node in one request: the master's layout, from which the agent
builds the job's information itself, and the local processes; answered
with their environments), ``register_nspace`` (another node's job that a
local process connects to, with its information built by the node),
``deregister_nspace``, ``register_client`` (one more process of a
registered job; answered with its environment), ``notify``, ``dmodex``,
``probe``, ``stop``.  Agent -> node, each
written by libpmix's thread in the agent (:mod:`pydvm.runtime.pmixhost.agent`):

* ``data``: a publish, lookup or unpublish as the store's own request
  (``"p": [nspace, rank]``, ``"m"``: :func:`~pydvm.runtime.pmixhost.data.data_request`
  without its id), served as that process's session
  (:meth:`PmixHost.serve_relayed <pydvm.runtime.pmixhost.host.PmixHost.serve_relayed>`:
  at once from the socket handler when a store here can answer, else as a
  native client's request) and answered with the store's reply map; the
  agent makes the PMIx reply.  The node builds no PMIx object for these.
* ``up``: any other upcall (:func:`~pydvm.runtime.pmixhost.codec.encode_request`), answered by a reply
  whose ``args`` are the arguments of the upcall's reply call.

* ``tool`` (the tool server only): a tool asks to connect -- what the
  server process found of it (:func:`~pydvm.runtime.pmixhost.codec.encode_tool`: the kernel's uid of its
  socket, its claims) --, answered with the ``args`` of libpmix's callback
  (its identity) or refused by ``fail`` (the agent then cuts the tool's
  connection); ``tool_gone`` (the tool server only, no answer): an accepted
  tool's connection ended.  The tool server runs as the node does, so the
  node believes its word on a tool's uid; it speaks for the tools it let in
  and for processes the node knows (:meth:`UserServers.may <pydvm.runtime.pmixhost.users.UserServers.may>`).

Either is refused by a reply whose ``fail`` is a status.  PMIx values,
processes and data arrays cross as tagged maps
(:func:`~pydvm.runtime.pmixhost.codec.encode`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
from typing import Any, Callable

from ...errors import Status
from ...pmix import Proc
from ...pmix import constants as C
from ...pmix.replies import run_handler
from ...wire import Channel, Message, reply
from ..shared import dataops
from .codec import decode_request, decode_tool, encode
from .data import DATA_KINDS, RelayedData, relayed_request

log = logging.getLogger("pydvm.pmix")

#: How long the node waits for an agent to start its libpmix server, and
#: for each of its answers (a registration, an event, modex data).
AGENT_TIMEOUT = 30.0
#: Registrations (a namespace, a process, a deregistration) the node has
#: out with one server process at once; more wait their turn at the node.
#: Each libpmix call in the server process gives up after 5 s, counted from
#: when it is made: thousands of jobs launched at once, sent all together,
#: queued in libpmix for longer than that and every one failed.
REGISTRATIONS_IN_FLIGHT = 32
#: How long an agent has to finish after ``stop`` before it is killed.
STOP_GRACE = 5.0


class RemoteReply:
    """The reply object of an upcall relayed by an agent: answering it sends
    the answer back to the agent, which gives it to libpmix.  Same contract
    as the binding's replies: the first call answers, later ones are ignored;
    one dropped unanswered answers PMIX_ERROR."""

    def __init__(self, agent: "UserServer", rid: int | None, kind: str) -> None:
        self._agent = agent
        self._rid = rid
        self.kind = kind
        self.notification = rid is None
        self._done = rid is None

    @property
    def done(self) -> bool:
        return self._done

    def __call__(self, *args) -> bool:
        if self._done:
            if not self.notification:
                log.warning("pmix %s reply called again after it was sent: ignored", self.kind)
            return False
        self._done = True
        try:
            body = encode(list(args))
        except TypeError as exc:
            log.error("pmix %s: answer cannot be relayed (%s): PMIX_ERROR", self.kind, exc)
            self._agent.answer(self._rid, fail=int(C.ERROR))
            return True
        self._agent.answer(self._rid, args=body)
        return True

    def fail(self, status: int) -> bool:
        if self._done:
            return False
        self._done = True
        self._agent.answer(self._rid, fail=int(status))
        return True

    def abandon(self) -> bool:
        """Refuse a tool (``tool_connected``): the agent cuts its connection
        (:meth:`pydvm.pmix.tools.ToolReply.abandon`)."""
        return self.fail(int(Status.ERR_NO_PERMISSIONS))

    def relay(self, msg: Message) -> None:
        """Answer a relayed data request with the store's reply map ``msg``
        as it is (the agent makes the PMIx reply of it)."""
        if self._done:
            return
        self._done = True
        self._agent.send_answer(self._rid, msg)

    def __del__(self):
        try:
            if not self._done:
                log.error("pmix %s reply dropped without an answer: sending PMIX_ERROR",
                          self.kind)
                self.fail(int(C.ERROR))
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


class _Claim:
    """What a relayed data request claims, as :meth:`UserServers.may <pydvm.runtime.pmixhost.users.UserServers.may>` reads an upcall."""

    __slots__ = ("proc",)

    def __init__(self, proc) -> None:
        self.proc = proc


class UserServer:
    """The node's side of one user's agent: the same calls as
    :class:`~pydvm.pmix.PmixServer` that :class:`PmixHost` makes, each a
    request to the agent; upcalls the agent relays go to ``handler``.

    ``nspaces``: the namespaces registered with this agent (its user's jobs
    on this node, and peers' namespaces its processes connected to).
    """

    def __init__(self, uid: int, gid: int, handler: Callable[[Any], Any],
                 trusted: Callable[["UserServer", Any], str | None],
                 on_lost: Callable[["UserServer", str], None], tools: bool = False) -> None:
        self.uid = uid
        self.gid = gid
        #: the head node's tool server (PMIx tools from outside any job, the
        #: DVM owner's process serving every user's tools) rather than a
        #: user's server for that user's jobs
        self.tools = tools
        self.name = "PMIx tool server" if tools else f"PMIx agent of uid {uid}"
        self._handler = handler
        #: the handler's answer-at-once path for data upcalls (PmixHost.answer_now),
        #: and its way with data requests relayed as the store's (serve_relayed)
        self._answer_now: Callable[[Any], bool] | None = getattr(handler, "answer_now", None)
        self._serve_relayed = getattr(handler, "serve_relayed", None)
        self._trusted = trusted
        self._on_lost = on_lost
        self.channel: Channel | None = None
        self.proc: subprocess.Popen | None = None
        self.tmpdir: str | None = None
        self.nspaces: set[str] = set()
        #: nspace -> rank -> the environment the agent gave it at its registration
        self._envs: dict[str, dict[int, dict[str, str]]] = {}
        self._tasks: set[asyncio.Task] = set()
        self.stats = {"requests": 0, "refused": 0, "answered_now": 0, "handler_errors": 0}
        self._in_flight = asyncio.Semaphore(REGISTRATIONS_IN_FLIGHT)
        self.stopping = False
        #: a watchdog probe is out (UserServers.watch)
        self.probing = False
        #: why the watchdog ended it (it did not answer): its end's reason
        self.hung: str | None = None
        #: the fast lane's node end (runtime/pmixhost/fast.py), where the node answers at once
        self.lane = None
        self._serve_fast = getattr(handler, "serve_fast", None)

    # -- lifecycle -------------------------------------------------------

    async def start(self, base: str, nspace: str, hostname: str, max_value_size: int,
                    switch: tuple[int, int, list[int]] | None,
                    attribute_fix: bool = True, fast: bool = False, spin_us: float = 0,
                    gds: str | None = None) -> None:
        """Start the agent as ``switch``'s user and its libpmix server in a
        directory of its own under ``base`` (with ``fast``, and a fast lane:
        runtime/pmixhost/fast.py; ``gds``: libpmix's job store, ``PMIX_MCA_gds``,
        None for its own choice).  Raises RuntimeError saying why it could not."""
        from ..shared import jobproc
        # (the tool server's directory is searched by every user's tools)
        d = os.path.join(base, "pmix-tools" if self.tools else f"pmix-u{self.uid}")
        os.makedirs(d, mode=0o700, exist_ok=True)
        os.chown(d, self.uid, self.gid)
        os.chmod(d, 0o755 if self.tools else 0o700)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        argv = [sys.executable, "-P", "-m", "pydvm.runtime.pmixhost.agent", str(theirs.fileno())]
        lane_ours = lane_theirs = None
        if fast and self._serve_fast is not None:
            lane_ours, lane_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            argv.append(str(lane_theirs.fileno()))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PMIX_", "PYDVM_"))}
        env["HOME"] = d
        if gds:
            env["PMIX_MCA_gds"] = gds
        kw: dict[str, Any] = {}
        if switch is not None and jobproc.setpriv_path() is None:
            kw = {"user": switch[0], "group": switch[1], "extra_groups": switch[2]}
        try:
            fds = (theirs.fileno(),) + ((lane_theirs.fileno(),) if lane_theirs else ())
            self.proc = subprocess.Popen(jobproc.command_line(argv, switch), env=env, cwd=d,
                                         stdin=subprocess.DEVNULL, pass_fds=fds,
                                         start_new_session=True, close_fds=True, **kw)
        except OSError as exc:
            ours.close()
            if lane_ours is not None:
                lane_ours.close()
            raise RuntimeError(f"cannot start it: {exc}") from None
        finally:
            theirs.close()
            if lane_theirs is not None:
                lane_theirs.close()
        loop = asyncio.get_running_loop()
        _, self.channel = await loop.create_unix_connection(
            lambda: Channel(self._on_message, self._on_close, name=self.name), sock=ours)
        r = await self.channel.call({"t": "start", "tmpdir": d, "nspace": nspace,
                                     "host": hostname, "max_value_size": max_value_size,
                                     "attribute_fix": attribute_fix, "spin_us": spin_us,
                                     "tools": self.tools}, AGENT_TIMEOUT)
        if r.get("status") != Status.SUCCESS:
            if lane_ours is not None:
                lane_ours.close()
            await self.finalize_async()
            raise RuntimeError(r.get("msg") or f"status {r.get('status')}")
        self.tmpdir = r.get("tmpdir")
        if lane_ours is not None:
            from .fast import Lane, spin_ns
            self.lane = Lane(lane_ours, self.name, self._lane_serve, spin_ns(spin_us))
            self.lane.start()

    async def finalize_async(self) -> None:
        """Stop the agent (its libpmix server finalises) and reap it."""
        self.stopping = True
        if self.lane is not None:
            self.lane.close()
        ch, proc = self.channel, self.proc
        if ch is not None and not ch.closed:
            await ch.call({"t": "stop"}, STOP_GRACE)
            ch.close("stopped")
        if proc is not None:
            loop = asyncio.get_running_loop()
            try:
                await asyncio.wait_for(loop.run_in_executor(None, proc.wait), STOP_GRACE)
            except asyncio.TimeoutError:
                log.warning("%s (pid %d) did not stop: killed", self.name, proc.pid)
                proc.kill()
                await loop.run_in_executor(None, proc.wait)

    def finalize(self) -> None:
        """Stop without waiting (the node is going): the agent finalises on
        the end of its connection, and has the death signal anyway."""
        self.stopping = True
        if self.lane is not None:
            self.lane.close()
        if self.channel is not None:
            # at once: asyncio closes a transport's socket on the loop's next
            # turn, and the wait below holds the loop's thread
            try:
                fd = self.channel.transport.get_extra_info("socket").fileno()
                with socket.fromfd(fd, socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.shutdown(socket.SHUT_RDWR)   # (a duplicate: the socket itself ends)
            except Exception:  # no transport, already closed
                pass
            self.channel.close("node server stopping")
        if self.proc is not None:
            try:
                self.proc.wait(STOP_GRACE)
            except subprocess.TimeoutExpired:
                log.warning("%s (pid %d) did not stop: killed", self.name, self.proc.pid)
                self.proc.kill()
                self.proc.wait()

    @property
    def running(self) -> bool:
        return self.channel is not None and not self.channel.closed

    def died(self) -> bool:
        """The agent process has ended without being asked to."""
        return not self.stopping and self.proc is not None and self.proc.poll() is not None

    def exit_reason(self) -> str | None:
        """How the agent process ended, in words (None: not seen ending).
        Its socket closes as it exits, a moment before it can be reaped:
        waited for briefly (only when an agent ended unasked)."""
        proc = self.proc
        if self.hung is not None:
            if proc is not None:
                try:
                    proc.wait(0.2)   # (killed: reaped here if it is gone already)
                except subprocess.TimeoutExpired:
                    pass
            return self.hung
        if proc is None:
            return None
        try:
            rc = proc.wait(0.2)
        except subprocess.TimeoutExpired:
            return None
        if rc < 0:
            import signal
            try:
                return f"killed by signal {signal.Signals(-rc).name}"
            except ValueError:
                return f"killed by signal {-rc}"
        return f"exited with status {rc}"

    async def probe(self, limit: float) -> str | None:
        """Why this server is hung (None: it answered): the watchdog's probe,
        which its libpmix must complete within ``limit`` seconds (and its
        process answer within half as long again)."""
        if not self.running:
            return None
        r = await self.channel.call({"t": "probe", "timeout": limit}, limit * 1.5)
        if r.get("status") != Status.ERR_TIMEOUT or self.stopping:
            return None   # (answered; or refused otherwise: an agent without probes)
        if str(r.get("msg") or "").startswith("no reply from"):
            return f"hung: its process did not answer the node in {limit * 1.5:g} s"
        return f"hung: its libpmix did not complete a call in {limit:g} s"

    # -- what PmixHost calls -----------------------------------------------

    async def _ask(self, msg: Message) -> Message:
        """A registration request, answered SUCCESS or raised
        (``PmixServerError``); at most REGISTRATIONS_IN_FLIGHT out at once,
        each timed from when it is sent."""
        if self.channel is None:
            raise RuntimeError(f"{self.name} is not running")
        async with self._in_flight:
            r = await self.channel.call(msg, AGENT_TIMEOUT)
        if r.get("status") != Status.SUCCESS:
            from ...pmix import PmixServerError
            raise PmixServerError(int(r.get("status", C.ERROR)), r.get("msg") or msg["t"])
        return r

    async def register_nspace(self, nspace: str, nlocalprocs: int, info=()) -> None:
        self.nspaces.add(nspace)
        await self._ask({"t": "register_nspace", "nspace": nspace, "nlocal": nlocalprocs,
                         "info": encode([list(i) for i in info])})

    async def register_job(self, nspace: str, layout: dict, session: int | None, node: str,
                           proc_extra: dict, procs: list[tuple[int, int, int]]) -> None:
        """A job's namespace and its local processes ``(rank, uid, gid)`` in
        one request: the server process builds the job's information from
        the master's ``layout`` itself (none of it is built or encoded here)."""
        self.nspaces.add(nspace)
        r = await self._ask({"t": "register_job", "nspace": nspace, "layout": layout,
                             "session": session, "node": node,
                             "proc_extra": [[rank, [list(i) for i in items]]
                                            for rank, items in proc_extra.items()],
                             "procs": [list(p) for p in procs]})
        envs = self._envs.setdefault(nspace, {})
        for rank, env in r.get("envs") or ():
            envs[int(rank)] = {str(k): str(v) for k, v in env.items()}

    async def deregister_nspace(self, nspace: str) -> None:
        self.nspaces.discard(nspace)
        self._envs.pop(nspace, None)
        if self.running:
            await self._ask({"t": "deregister_nspace", "nspace": nspace})

    async def register_client(self, proc, uid: int, gid: int) -> None:
        r = await self._ask({"t": "register_client", "nspace": proc.nspace, "rank": proc.rank,
                             "uid": uid, "gid": gid})
        self._envs.setdefault(proc.nspace, {})[proc.rank] = {
            str(k): str(v) for k, v in (r.get("env") or {}).items()}

    def setup_fork(self, proc) -> dict[str, str]:
        """The environment the agent gave ``proc`` at its registration."""
        return dict(self._envs.get(proc.nspace, {}).get(proc.rank, {}))

    async def notify_event(self, code: int, source, rng: int, info=(), timeout: float = 5.0
                           ) -> int:
        if not self.running:
            return int(Status.ERR_UNREACH)
        r = await self.channel.call({"t": "notify", "code": code, "source": encode(source),
                                     "range": rng, "info": encode([list(i) for i in info]),
                                     "timeout": timeout}, timeout + AGENT_TIMEOUT)
        return int(r.get("status", C.ERROR))

    async def dmodex_request(self, proc) -> tuple[int, bytes]:
        if not self.running:
            return int(Status.ERR_UNREACH), b""
        r = await self.channel.call({"t": "dmodex", "nspace": proc.nspace, "rank": proc.rank},
                                    None)
        return int(r.get("status", C.ERROR)), bytes(r.get("data") or b"")

    # -- the agent's upcalls -------------------------------------------------

    def answer(self, rid: int | None, **fields) -> None:
        if rid is None or self.channel is None or self.channel.closed:
            return
        self.channel.send(reply(rid, Status.SUCCESS, **fields))

    def send_answer(self, rid: int | None, msg: Message) -> None:
        """Send the store's reply map ``msg`` as the answer to ``rid``."""
        if rid is None or self.channel is None or self.channel.closed:
            return
        out = dict(msg)
        out["t"] = "reply"
        out["id"] = rid
        self.channel.send(out)

    def _on_message(self, ch: Channel, msg: Message) -> None:
        t = msg.get("t")
        if t in ("reply", "error"):
            return  # the late answer to a call that timed out
        if t == "log":
            self._agent_log(msg)
            return
        if self.tools and t == "tool_gone":
            # (only the tool server sends these: it runs as the node does, so
            # its word on a tool is as good as this process's own)
            ns = msg.get("ns")
            if isinstance(ns, str):
                self._handler.tools.disconnected(ns, self)
            return
        if t not in ("up", "data") and not (self.tools and t == "tool"):
            log.warning("%s: unexpected %r message: closing", self.name, t)
            ch.close("protocol error", error=True)
            return
        rid = msg.get("id")
        rid = rid if isinstance(rid, int) and not isinstance(rid, bool) else None
        if t == "data":
            self._on_data(rid, msg)
            return
        try:
            # a tool's connection (``tool``: what the tool server found of it), or an upcall
            req = decode_tool(msg.get("req")) if t == "tool" else decode_request(msg.get("req"))
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            log.warning("%s: malformed %s (%s): refused", self.name,
                        "tool connection" if t == "tool" else "upcall", exc)
            self.stats["refused"] += 1
            self.answer(rid, fail=int(Status.ERR_BAD_PARAM))
            return
        req.reply = RemoteReply(self, rid, req.kind)
        req.origin = self
        why = self._trusted(self, req)
        if why:
            log.warning("%s: %s %s: refused", self.name, req.kind, why)
            self.stats["refused"] += 1
            req.reply.fail(int(Status.ERR_NO_PERMISSIONS))
            return
        self.stats["requests"] += 1
        if req.kind in DATA_KINDS and self._answer_now is not None and self._answer_now(req):
            # served here and now, as libpmix's thread serves the owner's (PmixHost.answer_now)
            self.stats["answered_now"] += 1
            return
        # as the binding dispatches its own upcalls (pydvm.pmix.server)
        run_handler(self._handler, req, self._tasks, self.stats)

    def _data_claim(self, rid: Any, p: Any, m: Any, where: str):
        """A relayed data request checked as any upcall is: ``(request, None)``
        when well formed and this agent's user's to make, else ``(None,
        status)`` -- refused BAD_PARAM or NO_PERMISSIONS, logged and counted."""
        m = relayed_request(m)
        if (not isinstance(rid, int) or isinstance(rid, bool) or m is None
                or not (isinstance(p, list) and len(p) == 2 and isinstance(p[0], str)
                        and isinstance(p[1], int) and not isinstance(p[1], bool))):
            log.warning("%s: malformed data request%s: refused", self.name, where)
            self.stats["refused"] += 1
            return None, Status.ERR_BAD_PARAM
        why = self._trusted(self, _Claim(Proc(p[0], p[1])))
        if why:
            log.warning("%s: %s %s: refused", self.name, m["t"], why)
            self.stats["refused"] += 1
            return None, Status.ERR_NO_PERMISSIONS
        return m, None

    def _on_data(self, rid: int | None, msg: Message) -> None:
        """A process's publish, lookup or unpublish, relayed as the store's
        request (``{"t": "data", "id", "p": [nspace, rank], "m": request}``):
        the same trust rule as any upcall, then served as that process's
        session (``PmixHost.serve_relayed``) and answered with the store's
        reply map -- at once, from this handler, when a store here can."""
        p = msg.get("p")
        m, refused = self._data_claim(rid, p, msg.get("m"), "")
        if refused is None and self._serve_relayed is None:
            refused = Status.ERR_BAD_PARAM
        if refused is not None:
            self.answer(rid, fail=int(refused))
            return
        self.stats["requests"] += 1
        waiting = RelayedData(m["t"], RemoteReply(self, rid, m["t"]))
        r = self._serve_relayed(p[0], p[1], m, waiting)
        if r is not None:
            self.stats["answered_now"] += 1
            waiting.reply.relay(dataops.encode(rid, r))

    def _agent_log(self, msg: Message) -> None:
        """A log record of the agent's, logged here as its (one line, at most
        WARNING's level and at least INFO's: the agent runs as its user, who
        can make it say anything)."""
        level, text = msg.get("level"), msg.get("msg")
        if not isinstance(text, str):
            return
        level = level if isinstance(level, int) and not isinstance(level, bool) else 0
        level = min(max(level, logging.INFO), logging.WARNING)
        text = text[:2000].replace("\r", "\\r").replace("\n", "\\n")
        log.log(level, "%s (pid %s): %s", self.name, self.proc.pid if self.proc else "?", text)

    def _lane_serve(self, rid: Any, p: Any, m: Any) -> Message | None:
        """A data request from the fast lane, on the lane's thread: the
        store's reply map if a store here answers it at once
        (``PmixHost.serve_fast``), a refusal, or None (declined: the agent
        sends it on the main socket)."""
        m, refused = self._data_claim(rid, p, m, " on the fast lane")
        if refused is not None:
            return reply(rid if isinstance(rid, int) else None, refused)
        r = self._serve_fast(p[0], p[1], m)
        if r is None:
            return None
        self.stats["requests"] += 1
        self.stats["answered_now"] += 1
        return dataops.encode(rid, r)

    def _on_close(self, ch: Channel, reason: str) -> None:
        if not self.stopping:
            log.warning("%s ended: %s", self.name, reason)
        self._on_lost(self, reason)
