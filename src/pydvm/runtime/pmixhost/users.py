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
the very handlers of its own server (:class:`~pydvm.runtime.pmixhost.host.PmixHost`),
so routing, identity and the store's rules are the same.  The node in turn
asks the agent to register the user's namespaces and processes, pass events
on, and hand over modex data.  With ``pydvm_pmix_isolate`` on (``auto``,
the default, is on for a DVM ``pydvm start`` starts)
the DVM owner gets an agent too (running as the node does, started with the
node and kept), so that a crash inside libpmix ends only that agent and the
processes connected to it (:meth:`UserServers.lost`), never the node or the
master -- which then host no libpmix server at all
(:class:`~pydvm.runtime.pmixhost.host.NoServerHere` stands for theirs, unless a
server process cannot start: :meth:`UserServers._fallback`); off, the
owner's jobs use the node's in-process server.  On the
head node it also gets a *tool server*: an agent of the owner's with tool
support and no job, that takes PMIx tools from outside any job
(runtime/pmixhost/tools.py, :meth:`UserServers.start_tools`).

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

The wire between a node and its agents, and the node's end of one agent
(:class:`~pydvm.runtime.pmixhost.remote.UserServer`): runtime/pmixhost/remote.py.

If the agent cannot be started (the user cannot run this Python, no
``setpriv`` and no privilege), the node serves that user's processes from
its own server with the copying store, as before, and logs why once (with
isolation, starting that server then).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

from .remote import UserServer

log = logging.getLogger("pydvm.pmix")

#: After a user's agent failed to start, how long that user's processes are
#: served by the node's own server before another try.
AGENT_RETRY = 60.0
#: The soonest a tool server that ended is replaced, in seconds after its
#: start (so that a tool crashing each new one cannot make the node spin).
TOOLS_RESTART = 1.0


# ----------------------------------------------------------------------
# node side
# ----------------------------------------------------------------------

class UserServers:
    """A node's agents, one per user (multi-user DVMs): which server a user's
    processes connect to, what an agent may claim, and when an agent goes.

    Belongs to the node's :class:`~pydvm.runtime.pmixhost.host.PmixHost`
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
        (runtime/pmixhost/tools.py).  False, logged, if it cannot start."""
        from ...wire import MAX_FRAME
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
        from ...wire import MAX_FRAME
        from ..shared import jobproc
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
            from ..shared.jobproc import KILL_GRACE
            node.spawn(node.kill_procs(procs, KILL_GRACE))

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
        host.node.spawn(restart())

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
                self.host.node.spawn(self._probe(agent, limit))
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
        self.host.node.spawn(agent.finalize_async())
