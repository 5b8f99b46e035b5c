"""A PMIx server per user: other users' jobs of a multi-user DVM get libpmix's
shared-memory job store.

Why
---
libpmix 4.2's shared-memory job store (the ``ds21``/``ds12`` "gds"
components a client prefers) belongs to the user its server was initialised
as: the store's directory, segments and lock files are created for that uid
at ``PMIx_server_init`` (a ``PMIX_USERID`` registered with one namespace
re-owns only the top directory).  A node server of a root-started
multi-user DVM runs as root, so a process of another user could not attach
that store: libpmix printed ``PMIX ERROR ... gds_ds12_lock_pthread.c`` and
fell back to copying the job's data into each client at ``PMIx_Init``.
And libpmix allows one server per process.

So each user who runs PMIx jobs on a node gets a small process of its own,
started at that user's first PMIx job there, **running as that user**: the
*agent*; it is stopped ``pydvm_pmix_user_idle`` seconds after the user's
last PMIx job there ended (:meth:`UserServers.maybe_idle`), or with the
node.  It hosts a libpmix server (its own rendezvous directory, 0700, owned
by the user: no other user's process can even reach it) and relays
every upcall to the node server over a socket pair; the node serves it with
the very handlers of its own server (:class:`~pydvm.runtime.pmixhost.PmixHost`),
so routing, identity and the store's rules are the same.  The node in turn
asks the agent to register the user's namespaces and processes, pass events
on, and hand over modex data.  With ``pydvm_pmix_isolate`` on (``auto``,
the default, is on for a DVM ``pydvm start`` starts)
the DVM owner gets an agent too (running as the node does, started with the
node and kept), so that a crash inside libpmix ends only that agent and the
processes connected to it (:meth:`UserServers.lost`), never the node or the
master -- which then host no libpmix server at all
(:class:`~pydvm.runtime.pmixhost.NoServerHere` stands for theirs, unless a
server process cannot start: :meth:`UserServers._fallback`); off, the
owner's jobs use the node's in-process server.  On the
head node it also gets a *tool server*: an agent of the owner's with tool
support and no job, that takes PMIx tools from outside any job
(runtime/pmixtools.py, :meth:`UserServers.start_tools`).

Trust
-----
The agent runs as the user, who can therefore make it say anything.  The
node believes of it only what that user may claim (:meth:`UserServers.may`):
the requesting process of
an upcall must belong to a namespace the node registered with *this* agent,
and every process an upcall names that runs on this node must too (so a
fence, connect or group between two users' jobs on one node is refused
``PMIX_ERR_NO_PERMISSIONS``).  A direct-modex upcall names the process whose
data is wanted, never the asker: a process elsewhere, or of this user's jobs
here.  Identity stays the registered one: the
session of ``(nspace, rank)``, with the uid/gid of the job's owner.

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
written by libpmix's thread in the agent (:mod:`pydvm.runtime.pmixagent`):

* ``data``: a publish, lookup or unpublish as the store's own request
  (``"p": [nspace, rank]``, ``"m"``: :func:`~pydvm.runtime.pmixdata.data_request`
  without its id), served as that process's session
  (:meth:`PmixHost.serve_relayed <pydvm.runtime.pmixhost.PmixHost.serve_relayed>`:
  at once from the socket handler when a store here can answer, else as a
  native client's request) and answered with the store's reply map; the
  agent makes the PMIx reply.  The node builds no PMIx object for these.
* ``up``: any other upcall (:func:`~pydvm.runtime.pmixcodec.encode_request`), answered by a reply
  whose ``args`` are the arguments of the upcall's reply call.

* ``tool`` (the tool server only): a tool asks to connect -- what the
  server process found of it (:func:`~pydvm.runtime.pmixcodec.encode_tool`: the kernel's uid of its
  socket, its claims) --, answered with the ``args`` of libpmix's callback
  (its identity) or refused by ``fail`` (the agent then cuts the tool's
  connection); ``tool_gone`` (the tool server only, no answer): an accepted
  tool's connection ended.  The tool server runs as the node does, so the
  node believes its word on a tool's uid; it speaks for the tools it let in
  and for processes the node knows (:meth:`UserServers.may`).

Either is refused by a reply whose ``fail`` is a status.  PMIx values,
processes and data arrays cross as tagged maps
(:func:`~pydvm.runtime.pmixcodec.encode`).

If the agent cannot be started (the user cannot run this Python, no
``setpriv`` and no privilege), the node serves that user's processes from
its own server with the copying store, as before, and logs why once (with
isolation, starting that server then).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
import time
from typing import Any, Callable

from ..errors import Status
from ..pmix import Proc
from ..pmix import constants as C
from ..pmix.replies import handler_failed, task_done
from ..wire import Channel, Message, reply
from . import dataops
from .pmixcodec import decode_request, decode_tool, encode
from .pmixdata import DATA_KINDS, RelayedData, relayed_request

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
#: After a user's agent failed to start, how long that user's processes are
#: served by the node's own server before another try.
AGENT_RETRY = 60.0
#: The soonest a tool server that ended is replaced, in seconds after its
#: start (so that a tool crashing each new one cannot make the node spin).
TOOLS_RESTART = 1.0


# ----------------------------------------------------------------------
# node side
# ----------------------------------------------------------------------

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
    """What a relayed data request claims, as :meth:`UserServers.may` reads an upcall."""

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
        #: the fast lane's node end (runtime/pmixfast.py), where the node answers at once
        self.lane = None
        self._serve_fast = getattr(handler, "serve_fast", None)

    # -- lifecycle -------------------------------------------------------

    async def start(self, base: str, nspace: str, hostname: str, max_value_size: int,
                    switch: tuple[int, int, list[int]] | None,
                    attribute_fix: bool = True, fast: bool = False, spin_us: float = 0,
                    gds: str | None = None) -> None:
        """Start the agent as ``switch``'s user and its libpmix server in a
        directory of its own under ``base`` (with ``fast``, and a fast lane:
        runtime/pmixfast.py; ``gds``: libpmix's job store, ``PMIX_MCA_gds``,
        None for its own choice).  Raises RuntimeError saying why it could not."""
        from . import jobproc
        # (the tool server's directory is searched by every user's tools)
        d = os.path.join(base, "pmix-tools" if self.tools else f"pmix-u{self.uid}")
        os.makedirs(d, mode=0o700, exist_ok=True)
        os.chown(d, self.uid, self.gid)
        os.chmod(d, 0o755 if self.tools else 0o700)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        argv = [sys.executable, "-P", "-m", "pydvm.runtime.pmixagent", str(theirs.fileno())]
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
            from .pmixfast import Lane, spin_ns
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
            from ..pmix import PmixServerError
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
        try:
            res = self._handler(req)
        except Exception as exc:
            handler_failed(req, exc, self.stats)
            return
        if asyncio.iscoroutine(res):
            task = asyncio.ensure_future(res)
            self._tasks.add(task)
            task.add_done_callback(lambda t: (self._tasks.discard(t),
                                              task_done(req, t, self.stats)))

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


class UserServers:
    """A node's agents, one per user (multi-user DVMs): which server a user's
    processes connect to, what an agent may claim, and when an agent goes.

    Belongs to the node's :class:`~pydvm.runtime.pmixhost.PmixHost`
    (``host``), whose namespace map (``host.local_nspaces``: namespace ->
    the server its processes use) says which agent serves what.
    """

    def __init__(self, host) -> None:
        self.host = host
        #: uid -> that user's running agent on this node.
        self.agents: dict[int, UserServer] = {}
        self._starting: dict[int, asyncio.Future] = {}
        #: uid -> the timer that stops that user's idle agent
        #: (``pydvm_pmix_user_idle`` after the user's last job here ended).
        self._idle: dict[int, asyncio.TimerHandle] = {}
        #: uid -> (why, when) that user's agent could not be started (logged
        #: once): its processes are served by the node's own server with the
        #: copying store, and a new agent is tried AGENT_RETRY seconds later.
        self.failed: dict[int, tuple[str, float]] = {}
        #: the head node's tool server process (``pydvm_pmix_isolate``), if any
        self.tool_server: UserServer | None = None
        #: when the tool server last started (a crash soon after waits to restart)
        self._tools_started = 0.0
        self._stopped = False
        #: the next round of the watchdog's probes (``pydvm_pmix_watchdog``)
        self._watchdog: asyncio.TimerHandle | None = None

    def running(self) -> list[UserServer]:
        return list(self.agents.values()) + ([self.tool_server] if self.tool_server else [])

    def stop(self) -> None:
        """The node is stopping: every agent goes with it."""
        self._stopped = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        for timer in self._idle.values():
            timer.cancel()
        self._idle.clear()
        for agent in self.running():
            agent.finalize()
        self.agents.clear()
        self.tool_server = None

    async def start_tools(self) -> bool:
        """Start the tool server process: the DVM owner's libpmix server that
        takes PMIx tools from outside any job on this (the head) node, so
        that what a tool does to libpmix ends that process only
        (runtime/pmixtools.py).  False, logged, if it cannot start."""
        from ..wire import MAX_FRAME
        host = self.host
        if host.server is None or self._stopped:
            return False
        agent = UserServer(os.geteuid(), os.getegid(), host, self.may, self.lost, tools=True)
        try:
            # the libpmix namespace tools name (--namespace) is the node's own
            await agent.start(os.path.dirname(host.server.tmpdir), host.server.nspace,
                              host.node.name, MAX_FRAME // 2, None,
                              host.node.values.get("pydvm_pmix_attribute_fix") != "off",
                              gds=host.job_store)
        except Exception as exc:
            log.error("node %s: no PMIx tool server (%s): tools cannot attach",
                      host.node.name, exc)
            return False
        if host.server is None or self._stopped:  # the node stopped meanwhile
            agent.finalize()
            return False
        self.tool_server = agent
        self._tools_started = time.monotonic()
        self._arm_watchdog()
        host.tools.started(agent.tmpdir, agent.proc.pid, host.status[1].split()[1]
                           if len(host.status[1].split()) > 1 else "")
        log.info("node %s: PMIx tool server (pid %d) in %s", host.node.name, agent.proc.pid,
                 agent.tmpdir)
        return True

    async def server_for(self, uid: int, gid: int):
        """The server the processes of user ``uid`` connect to: the node's
        own, or (on a multi-user DVM for another user; with
        ``pydvm_pmix_isolate`` for the owner too) that user's agent, started
        at its first job here.  If the agent cannot start, the node's own
        server (logged once; :meth:`_fallback`)."""
        host = self.host
        if uid == os.geteuid() or not getattr(host.node, "multi_user", False):
            if host.node.values.get("pydvm_pmix_isolate") == "off":
                return host.server
            uid, gid = os.geteuid(), os.getegid()   # the owner's own agent
        agent = self.agents.get(uid)
        if agent is not None:
            self._keep(uid)  # busy again (before any await: the stop cannot fire now)
            return agent
        failed = self.failed.get(uid)
        if failed is not None and time.monotonic() - failed[1] < AGENT_RETRY:
            return self._fallback(failed[0])
        starting = self._starting.get(uid)
        if starting is not None:
            return await asyncio.shield(starting)
        fut = self._starting[uid] = asyncio.get_running_loop().create_future()
        try:
            agent = await self._start(uid, gid)
        finally:
            del self._starting[uid]
        fut.set_result(agent)
        return agent

    async def _start(self, uid: int, gid: int):
        from ..wire import MAX_FRAME
        from . import jobproc
        host, name = self.host, self.host.node.name
        agent = UserServer(uid, gid, host, self.may, self.lost)
        try:
            await agent.start(os.path.dirname(host.server.tmpdir),
                              host.server.nspace + f"-u{uid}", name, MAX_FRAME // 2,
                              None if uid == os.geteuid() else jobproc.credentials(uid, gid),
                              host.node.values.get("pydvm_pmix_attribute_fix") != "off",
                              fast=bool(getattr(host.node.router, "answers_now", False)),
                              spin_us=float(host.node.values.get("pydvm_master_poll_us", 0)),
                              gds=host.job_store)
        except Exception as exc:
            if uid not in self.failed:
                log.warning("node %s: no PMIx server of its own for uid %d (%s): its "
                            "processes use the node's, with the job store that copies the "
                            "job's data into each process (tried again after %.0f s)",
                            name, uid, exc, AGENT_RETRY)
            self.failed[uid] = (str(exc), time.monotonic())
            return self._fallback(str(exc))
        if host.server is None:  # the node stopped meanwhile
            agent.finalize()
            return None
        self.agents[uid] = agent
        self.failed.pop(uid, None)
        self._arm_watchdog()
        log.info("node %s: PMIx server of uid %d (pid %d) in %s", name, uid, agent.proc.pid,
                 agent.tmpdir)
        return agent

    def _fallback(self, why: str):
        """The server for processes whose server process cannot start: the
        node's own (with ``pydvm_pmix_isolate``, started for them now:
        ``PmixHost.fallback_server``).  Raises RuntimeError if there is none."""
        host = self.host
        if host.server is None:
            return None   # (the node stopped)
        server = host.fallback_server(why) if host.isolated else host.server
        if server is None:
            raise RuntimeError(f"no PMIx server for these processes: {why}")
        return server

    def may(self, agent: UserServer, req) -> str | None:
        """Why an upcall relayed by ``agent`` is not its user's to make (None: it is)."""
        local = self.host.local_nspaces
        if agent.tools:
            # the tool server runs as the node does: it speaks for the tools
            # it let in (kernel-checked, pmix/tools.py), and for a job's
            # process that connected to it as a "client tool"
            for who in (getattr(req, "proc", None), getattr(req, "source", None)):
                if (who is not None and who.nspace != ""
                        and self.host.tools.served_by(who.nspace) is not agent
                        and (who.nspace, who.rank) not in self.host.sessions):
                    return f"from {who}, not a tool or process known here"
            return None
        named = list(getattr(req, "procs", None) or ())
        askers = (getattr(req, "proc", None), getattr(req, "source", None))
        if getattr(req, "kind", None) == "direct_modex":
            # libpmix names the process whose data is wanted (elsewhere, or of
            # a peer job), never the asker
            named.append(req.proc)
            askers = ()
        for who in askers:
            if who is not None and local.get(who.nspace) is not agent:
                return f"from {who}, not a process of this user's jobs on this node"
        for p in named:
            srv = local.get(p.nspace)
            if srv is not None and srv is not agent:
                return f"names {p}, a process of another user's job on this node"
        return None

    def _forget(self, agent: UserServer) -> None:
        """``agent`` serves nothing any more: out of every table."""
        if agent is self.tool_server:
            self.tool_server = None
            return
        if self.agents.get(agent.uid) is agent:
            del self.agents[agent.uid]
            self._keep(agent.uid)
        host = self.host
        for ns in [n for n, srv in host.local_nspaces.items() if srv is agent]:
            del host.local_nspaces[ns]
        for ns in list(host.foreign):
            host.forget_foreign(ns, agent)

    def lost(self, agent: UserServer, reason: str) -> None:
        """An agent ended: unless it was stopped, the processes here that are
        connected to it lost their PMIx server: their jobs are ended, as a
        lost node's are, with the reason (``pmix_lost`` to the master, which
        kills them; ``pydvm run`` prints it), and the processes here are
        ended at once.  Processes that never connected (or had finalized)
        carry on; the user's next job here gets a new agent."""
        self._forget(agent)
        if agent.stopping:
            return
        agent.stopping = True  # handled once (its socket's end may come after)
        host, node = self.host, self.host.node
        reason = agent.exit_reason() or reason
        if agent.tools:
            self._tools_lost(agent, reason)
            return
        procs, nspaces = [], set()
        for key, s in list(host.sessions.items()):
            if key[0] in agent.nspaces and s.pmix_state == "connected":
                job = node.jobs.get(key[0])
                lp = job.procs.get(key[1]) if job is not None else None
                if lp is not None and not lp.ended:
                    procs.append(lp)
                    nspaces.add(key[0])
                s.channel.close(f"its PMIx server ended: {reason}")
        log.error("node %s: the PMIx server of uid %d (pid %s) ended (%s): it served %s; "
                  "%d connected process(es) here are ended with their jobs", node.name,
                  agent.uid, agent.proc.pid if agent.proc else "?", reason,
                  ", ".join(sorted(agent.nspaces)) or "no job", len(procs))
        if nspaces and not node.uplink.closed:
            node.uplink.send({"t": "pmix_lost", "nspaces": sorted(nspaces),
                              "why": f"its PMIx server ended on node {node.name} ({reason})"})
        if procs:
            from .node import KILL_GRACE
            node._spawn(node._kill_procs(procs, KILL_GRACE))

    def _tools_lost(self, agent: UserServer, reason: str) -> None:
        """The tool server ended unasked: its tools went with it; a new one
        is started (a second after the last one's start at the soonest)."""
        host = self.host
        log.error("node %s: the PMIx tool server (pid %s) ended (%s): %d tool(s) were "
                  "connected; a new one is started", host.node.name,
                  agent.proc.pid if agent.proc else "?", reason,
                  sum(t.server is agent for t in host.tools.tools.values()))
        host.tools.server_lost(agent, reason)
        wait = max(0.0, self._tools_started + TOOLS_RESTART - time.monotonic())

        async def restart() -> None:
            await asyncio.sleep(wait)
            await self.start_tools()
        host.node._spawn(restart())

    # -- the watchdog ------------------------------------------------------

    def _limit(self) -> float:
        return float(self.host.node.values.get("pydvm_pmix_watchdog", 0) or 0)

    def _arm_watchdog(self) -> None:
        """Probe every server process now and then (a third of
        ``pydvm_pmix_watchdog``, at most every 10 s) while any runs."""
        limit = self._limit()
        if limit > 0 and self._watchdog is None and not self._stopped and self.running():
            self._watchdog = asyncio.get_running_loop().call_later(min(10.0, limit / 3),
                                                                   self.watch)

    def watch(self) -> None:
        """One round of the watchdog: each server process without a probe
        out gets one (:meth:`UserServer.probe`); one that does not answer in
        time is hung (:meth:`hung`)."""
        self._watchdog = None
        limit = self._limit()
        for agent in self.running():
            if not agent.probing and agent.running and not agent.stopping:
                agent.probing = True
                self.host.node._spawn(self._probe(agent, limit))
        self._arm_watchdog()

    async def _probe(self, agent: UserServer, limit: float) -> None:
        try:
            why = await agent.probe(limit)
        finally:
            agent.probing = False
        if why is not None and not agent.stopping and agent.proc is not None:
            self.hung(agent, why)

    def hung(self, agent: UserServer, why: str) -> None:
        """``agent`` is hung (a hang inside libpmix, or its process stuck):
        it is killed, and its end is handled as any server process's
        (:meth:`lost`: its connected processes' jobs end saying why; the next
        job, or tool, gets a new one)."""
        log.error("node %s: %s (pid %d) %s: killed", self.host.node.name, agent.name,
                  agent.proc.pid, why)
        agent.hung = why
        try:
            agent.proc.kill()
        except OSError:
            pass
        self.lost(agent, why)

    def _keep(self, uid: int) -> None:
        """Cancel the idle stop of ``uid``'s agent, if one is armed."""
        timer = self._idle.pop(uid, None)
        if timer is not None:
            timer.cancel()

    def _busy(self, agent: UserServer) -> bool:
        return any(srv is agent for srv in self.host.local_nspaces.values())

    def maybe_idle(self, agent: UserServer) -> None:
        """Arm the stop of ``agent`` if no job of its user runs here any more."""
        idle = float(self.host.node.values.get("pydvm_pmix_user_idle", 0) or 0)
        if (idle <= 0 or self.agents.get(agent.uid) is not agent or agent.uid in self._idle
                or self._busy(agent) or agent.uid == os.geteuid()):
            return  # (the owner's, with pydvm_pmix_isolate, stays with the node)
        self._idle[agent.uid] = asyncio.get_running_loop().call_later(idle, self._retire, agent)

    def _retire(self, agent: UserServer) -> None:
        """An idle agent's time is up: it leaves the tables at once (a new job
        of its user starts a new one) and is stopped."""
        self._idle.pop(agent.uid, None)
        if self.agents.get(agent.uid) is not agent or self._busy(agent):
            return
        self._forget(agent)
        log.info("node %s: PMIx server of uid %d idle: stopped", self.host.node.name, agent.uid)
        self.host.node._spawn(agent.finalize_async())
