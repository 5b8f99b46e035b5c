"""The master's process table: jobs, applications, processes and sessions, and their lifetimes.

:class:`ProcessTable` wraps the pure :class:`~pydvm.runtime.master.core.LifetimeCore`
(which owns ``jobs`` and ``sessions`` and decides when each lifetime ends)
and is its shell: it turns what happens into the core's events and carries
out the effects the core returns.  It also owns what hangs off a running
job -- the tool whose ``pydvm run`` waits for it, the futures that resolve
when a job or a session is over, the environment a job was launched with
(a PMIx spawn's defaults), the jobs a job spawned -- and the cache of
callers it has vouched for.

Who acts on the master store (SPEC 5)::

    daemon reports "exited"  -> PROC purge of that process
    last process of an app   -> APP purge (per-app termination count, shared/jobs.py),
                                and the application notice to the nodes that
                                ran it (an APP purge there), acknowledged
    last process of the job  -> NSPACE purge, then a purge broadcast to every
                                daemon, acknowledged, before the job's tool
                                hears that the job ended
    session end              -> its jobs are killed and ended as above, then a
                                SESSION purge (every namespace of the session)
                                and a SESSION broadcast, acknowledged

A daemon never asks for a namespace purge: its share of a job finishing is
not a lifetime (the multi-node bug of the design).

**One question, one answer.**  Whether ``nspace:rank`` is a running process
(of a given node, application, session, user) is :meth:`ProcessTable.refusal`,
asked by the data service (a daemon's request for one of its processes),
the direct gate (a direct client's handshake) and collectives (abort,
events); every refusal has the same words.  A process's identity as the
stores see it is built by :func:`~pydvm.runtime.shared.peers.process_caller`
alone.

**Fan-out.**  Other components hear of lifetimes through
:class:`ProcessListener` (the master wires them): ``lifetime_ended`` (a
master-store purge: the data service applies it, and returns what the
nodes' purge must wait for), ``proc_ended`` (nothing may act for that
process any more), ``job_ended``, ``session_ended``.

Failures and kills: every process end goes through the core, which records
it in the job (:meth:`JobRecord.proc_ended` decides whether it failed on
its own or was ended by a kill) and, for a job run with
``--abort-on-failure``, kills the rest at the first failure.  Every kill
goes through :meth:`ProcessTable.kill` with a reason in words; the first
reason given is the one the job's ``pydvm run`` prints.  The run's final
reply carries the report (:func:`failure_report`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from ... import _trace
from ... import params as P
from ...errors import Status
from ...placement import display_allocation_lines, display_map_lines
from ...pmix import constants as PC
from ...store import Caller
from ...wire import Message, reply
from ..shared.jobs import DEFAULT_SESSION
from ..shared.jobs import HostSpec, JobRecord, ProcState, SessionRecord, build_job
from ..shared.peers import ClaimRefused, DaemonSession, PeerSession, ToolSession, process_caller
from . import core
from .nodes import EVENT_GRACE, NodeListener, NodeTable
from .tasks import Tasks

log = logging.getLogger("pydvm.master")

#: Failed processes named one by one in a run's final reply; the count of
#: the rest is given.
FAILURE_REPORT_LIMIT = 20


_STR_ONLY = frozenset((str,))


def _str_map(value: Any) -> bool:
    """Whether ``value`` is an environment: a map of str to str (every job
    carries one: what the wire decodes, exact strs, is told in C first)."""
    if not isinstance(value, dict):
        return False
    if not value or (set(map(type, value)) == _STR_ONLY
                     and set(map(type, value.values())) == _STR_ONLY):
        return True
    return all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def failure_report(job: JobRecord) -> dict[str, Any]:
    """The fields of a run's final reply that say why the job failed.

    ``failures``: ``[rank, app_idx, node, status, signal, unfinalized]`` of the first
    :data:`FAILURE_REPORT_LIMIT` processes that failed on their own, first
    failure first; ``failed``: how many failed on their own; ``killed``: how
    many started processes were ended by a kill; ``apps``: the job's app
    count (a report names the app only when there are several);
    ``ended``: ``[rank, app_idx, node, status, signal, who asked]`` of the
    first processes ended on request (``PMIx_Job_control``), when any were.
    """
    rows = []
    for rank in job.failures[:FAILURE_REPORT_LIMIT]:
        p = job.procs[rank]
        rows.append([rank, p.app_idx, p.node, p.exit_status, p.signal, p.unfinalized])
    out = {"failures": rows, "failed": len(job.failures), "killed": job.killed_procs,
           "apps": len(job.apps)}
    ended = [job.procs[r] for r in job.ended_on_request[:FAILURE_REPORT_LIMIT]]
    if ended:
        out["ended"] = [[p.rank, p.app_idx, p.node, p.exit_status, p.signal, p.ended_by]
                        for p in ended if p.state is ProcState.ENDED]
    return out


def job_end_event(job: JobRecord) -> dict[str, Any]:
    """The PMIx event a job's end is (``PMIX_EVENT_JOB_END``, alias
    ``PMIX_ERR_JOB_TERMINATED``), which the namespace purge carries to
    every node: affected ``{nspace, WILDCARD}``, its status and exit code,
    for handlers that asked for it only (non-default), and not kept for
    processes that register later (a job started tomorrow must not hear of
    today's ends)."""
    return {"code": PC.EVENT_JOB_END, "source": [job.nspace, PC.RANK_WILDCARD],
            "range": PC.RANGE_GLOBAL, "info": [
                [PC.EVENT_AFFECTED_PROC, PC.PROC, [job.nspace, PC.RANK_WILDCARD]],
                [PC.JOB_TERM_STATUS, PC.STATUS, PC.SUCCESS if job.exit_status == 0 else PC.ERROR],
                [PC.EXIT_CODE, PC.INT, job.exit_status],
                [PC.EVENT_NON_DEFAULT, PC.BOOL, True],
                [PC.EVENT_DO_NOT_CACHE, PC.BOOL, True]]}


def _count(v: Any, least: int) -> bool:
    """``v`` is an int (not a bool) of at least ``least``."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= least


def display_lines(job: JobRecord, specs: list[tuple[list[str], int | None, list[HostSpec]]]
                  ) -> list[str]:
    """What ``--display-allocation`` and ``--display-map`` (placement keys)
    print for ``job``, in ``mpirun``'s shape (:mod:`pydvm.placement`): the
    hosts its apps were given, and where each rank goes."""
    p = job.placement
    if not (p.get("display_allocation") or p.get("display_map")):
        return []
    seen: dict[str, tuple[str, int, int | None]] = {}
    for _argv, _n, hosts in specs:
        for h in hosts:
            seen.setdefault(h.name, (h.name, h.slots, h.max_slots))
    hosts = list(seen.values())
    lines: list[str] = []
    if p.get("display_allocation"):
        lines += display_allocation_lines(hosts)
    if p.get("display_map"):
        lines += display_map_lines(job.nspace, [(r, pr.app_idx, pr.node)
                                                for r, pr in job.procs.items()], hosts)
    return lines


class ProcessListener:
    """What a component hears from the process table (override what it needs)."""

    def lifetime_ended(self, purge: core.PurgeStore) -> list[asyncio.Future]:
        """A lifetime ended: apply ``purge`` to the master store now; return
        what the nodes' purge that follows must wait for (the relayed data
        server's namespace or session purge)."""
        return []

    def job_started(self, job: JobRecord) -> None:
        """``job`` is in the table and its launch is being sent (every job:
        a ``pydvm run``'s, a queued one's, a spawned one)."""

    def proc_ended(self, nspace: str, rank: int) -> None:
        """``nspace:rank`` has ended (its record says how): nothing may act
        for it any more."""

    def job_ended(self, job: JobRecord) -> None:
        """The job is over and out of the table."""

    def session_ended(self, sid: int) -> None:
        """The session is over and out of the table."""


class ProcessTable(NodeListener):
    """Jobs and sessions (see the module docstring)."""

    def __init__(self, hosts: list[HostSpec], *, dvm_nspace: str, nodes: NodeTable,
                 tasks: Tasks) -> None:
        self.dvm_nspace = dvm_nspace
        self._nodes = nodes
        self._tasks = tasks
        #: jobs and sessions, and the rules of their lifetimes (core.py);
        #: ``jobs`` and ``sessions`` are its records, read by everyone and
        #: changed only through ``core.handle`` (:meth:`_feed`).
        self.core = core.LifetimeCore()
        self.core.new_session(DEFAULT_SESSION, list(hosts))
        self.jobs: dict[str, JobRecord] = self.core.jobs
        self.sessions: dict[int, SessionRecord] = self.core.sessions
        self._listeners: list[ProcessListener] = []
        #: nspace -> the tool whose ``pydvm run`` it reports to (a spawned
        #: job's is its parent's).
        self._tool: dict[str, ToolSession] = {}
        #: nspace -> resolved with the job at JobEnded.
        self._over: dict[str, asyncio.Future] = {}
        #: sid -> resolved at SessionEnded.
        self._session_over: dict[int, asyncio.Future] = {}
        #: nspace -> {(node, rank, uid, gid): Caller} of running processes.
        #: Dropped for a namespace whenever one of its processes ends, so a
        #: hit is always a live process.
        self._callers: dict[str, dict[tuple, Caller]] = {}
        #: nspace -> (env, cwd) it was launched with (a spawn's defaults).
        self._launch_env: dict[str, tuple[dict, str]] = {}
        #: nspace -> futures of the child jobs it spawned (its end waits for them).
        self._children: dict[str, list[asyncio.Future]] = {}
        self._next_session = 1
        self._next_job = 1

    def add_listener(self, listener: ProcessListener) -> None:
        self._listeners.append(listener)

    # ------------------------------------------------------------------
    # queries
    # ------------------------------------------------------------------

    @property
    def jobs_started(self) -> int:
        """Jobs submitted since the DVM started (namespaces are numbered from 1)."""
        return self._next_job - 1

    def tool_of(self, nspace: Any) -> ToolSession | None:
        """The tool ``nspace``'s output and report go to (None: none)."""
        return self._tool.get(nspace) if isinstance(nspace, str) else None

    def job_owner(self, nspace: str) -> int | None:
        job = self.jobs.get(nspace)
        return job.uid if job is not None else None

    def when_over(self, nspace: str) -> asyncio.Future | None:
        """Resolved with the job once it is over (None: not running)."""
        return self._over.get(nspace)

    def launch_env(self, nspace: str) -> tuple[dict, str]:
        """The (env, cwd) ``nspace`` was launched with (``({}, "/")`` if unknown)."""
        return self._launch_env.get(nspace, ({}, "/"))

    def counts(self) -> dict[str, int]:
        """How many records of each kind the table holds (``pydvm info``)."""
        return {
            "jobs": len(self.jobs),
            "job_waiters": len(self._over),
            "job_tools": len(self._tool),
            "sessions": len(self.sessions),
            "session_history": sum(len(s.history) for s in self.sessions.values()),
            "caller_cache": sum(len(c) for c in self._callers.values()),
            "job_launch_env": len(self._launch_env),
            "spawn_parents": len(self._children),
        }

    # ------------------------------------------------------------------
    # who a process is, and whether anyone may act for it
    # ------------------------------------------------------------------

    def refusal(self, nspace: str, rank: int, node: str | None = None, *,
                app: int | None = None, session: int | None = None,
                uid: int | None = None) -> str:
        """Why nobody may act for ``nspace:rank`` -- '' when it is a running
        process (of node ``node``, application ``app``, session ``session``,
        a job of user ``uid``: each checked when given).  The one predicate:
        every component that asks, asks here, and refusals read the same."""
        job = self.jobs.get(nspace)
        proc = job.procs.get(rank) if job is not None else None
        if proc is None or (node is not None and proc.node != node):
            where = f" of node {node}" if node is not None else ""
            return f"process {nspace}:{rank} is not a running process{where}"
        if proc.state is ProcState.ENDED:
            return f"process {nspace}:{rank} has ended"
        if (app is not None and proc.app_idx != app) or \
                (session is not None and job.session_id != session):
            return f"process {nspace}:{rank} is not of application {app} in session {session}"
        if uid is not None and job.uid is not None and uid != job.uid:
            return f"process {nspace}:{rank} is not a process of uid {uid}"
        return ""

    def caller(self, nspace: str, rank: int, uid: int, gid: int | None,
               node: str | None = None) -> Caller:
        """``nspace:rank``'s identity with app and session from the job
        records (None for what they do not know, e.g. another DVM's process)."""
        job = self.jobs.get(nspace)
        proc = job.procs.get(rank) if job is not None else None
        return process_caller(nspace, rank, uid, gid, node, proc.app_idx if proc else None,
                              job.session_id if job is not None else None)

    def running_caller(self, nspace: str, rank: int, uid: int, gid: int | None,
                       node: str) -> Caller:
        """The identity a daemon's request for its process ``nspace:rank``
        acts as; raises :class:`~pydvm.runtime.shared.peers.ClaimRefused` unless
        that is a running process of ``node`` (:meth:`refusal`)."""
        key = (node, rank, uid, gid)
        cached = self._callers.get(nspace)
        caller = cached.get(key) if cached is not None else None
        if caller is None:
            why = self.refusal(nspace, rank, node)
            if why:
                raise ClaimRefused(why)
            caller = self.caller(nspace, rank, uid, gid, node)
            self._callers.setdefault(nspace, {})[key] = caller
        return caller

    # ------------------------------------------------------------------
    # planning and launching
    # ------------------------------------------------------------------

    def plan(self, msg: Message, nspace: str | None = None
             ) -> tuple[JobRecord, dict[str, list[dict]]]:
        """Validate a ``run`` request and lay the job out on live nodes.

        Without ``--host`` an app uses the nodes of its session that are up;
        with it, the named nodes that are up.  Raises ValueError (the text
        is shown to the user) when nothing it could run on is up.
        ``nspace``: lay out again a job already named (a queued job whose
        node was lost), else a new namespace is taken.
        """
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
        if not _str_map(env):
            raise ValueError("env must map str to str")
        session_nodes = {h.name: h for h in session.hosts}
        specs = []
        app_envs: list[dict] = []  # each app's environment: the job's, plus its own (-x)
        node_envs: list[bool] = []  # whether it starts from its node's instead (-genvnone)
        app_cwds: list[str] = []
        placement = msg.get("placement") or {}
        if not isinstance(placement, dict):
            raise ValueError("placement must be a map")
        timeout = msg.get("timeout")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(
                timeout, (int, float)) or not timeout > 0):
            raise ValueError("timeout must be a positive number of seconds")
        for i, app in enumerate(apps):
            if not isinstance(app, dict):
                raise ValueError(f"app {i}: not a map")
            argv, n, hosts = app.get("argv"), app.get("n"), app.get("hosts")
            if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
                raise ValueError(f"app {i}: missing command")
            if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
                raise ValueError(f"app {i}: -n must be a positive integer")
            if hosts:
                hs = []
                for h in hosts:
                    if not (isinstance(h, (list, tuple)) and len(h) in (2, 3)
                            and isinstance(h[0], str) and _count(h[1], 0)
                            and (len(h) == 2 or h[2] is None or _count(h[2], 1))):
                        raise ValueError(f"app {i}: malformed host entry {h!r}")
                    name, slots = h[0], h[1]
                    if name not in session_nodes:
                        where = "this DVM" if sid == DEFAULT_SESSION else f"session {sid}"
                        raise ValueError(f"app {i}: host {name!r} is not in {where}")
                    spec = HostSpec(name, slots if slots > 0 else session_nodes[name].slots,
                                    h[2] if len(h) == 3 else None)
                    if spec.max_slots is not None and spec.max_slots < spec.slots:
                        raise ValueError(f"app {i}: host {name!r} has max_slots "
                                         f"{spec.max_slots}, less than its {spec.slots} slots")
                    hs.append(spec)
            else:
                hs = list(session.hosts)
            live = self._nodes.live_hosts(hs)
            if not live:
                down = ", ".join(h.name for h in hs)
                raise ValueError(f"app {i}: node(s) not available: {down}")
            app_env, app_cwd = app.get("env"), app.get("cwd")
            if app_env is not None and not _str_map(app_env):
                raise ValueError(f"app {i}: env must map str to str")
            if app_cwd is not None and not isinstance(app_cwd, str):
                raise ValueError(f"app {i}: cwd must be a str")
            env_from = app.get("env_from")
            if env_from not in (None, "job", "node"):
                raise ValueError(f"app {i}: env_from must be 'job' or 'node', not {env_from!r}")
            node_envs.append(env_from == "node")
            if env_from == "node":
                app_envs.append(dict(app_env or {}))
            else:
                app_envs.append({**env, **app_env} if app_env else env)
            app_cwds.append(app_cwd or cwd)
            specs.append((argv, n, live))
        if nspace is None:
            nspace = f"{self.dvm_nspace}@{self._next_job}"
            self._next_job += 1
        job = build_job(nspace, sid, specs, placement, self._nodes.topologies())
        for _argv, _n, live in specs:
            for h in live:
                job.slots.setdefault(h.name, h.slots)
        job.uid, job.gid = msg.get("_uid"), msg.get("_gid")
        abort = msg.get("abort_on_failure")
        job.abort_on_failure = abort if isinstance(abort, bool) else None
        job.pmix_required = msg.get("pmix") is True
        mpi = msg.get("mpi")
        if mpi is None:
            mpi = "pmix" if job.pmix_required else self._nodes.values["pydvm_mpi"]
        if mpi not in P.MPI_INTERFACES:
            raise ValueError(f"--mpi {mpi!r}: must be one of {', '.join(P.MPI_INTERFACES)}")
        if job.pmix_required and mpi != "pmix":
            raise ValueError(f"--pmix asks for PMIx, --mpi {mpi} for another interface: "
                             "give one of them")
        job.mpi = mpi
        preput = msg.get("preput")
        if preput is not None:
            if not _str_map(preput):
                raise ValueError("preput must map str to str")
            job.preput = dict(preput)
        job.stop_in_init = msg.get("stop_in_init") is True
        job.started = time.time()
        for a in job.apps:
            a.cwd = app_cwds[a.idx]
        job.placement = dict(placement)
        job.display = display_lines(job, specs)
        job.timeout = timeout
        job.stdin = msg.get("stdin") is True
        output = msg.get("output")
        if output not in (None, "forward", "discard"):
            raise ValueError(f"output must be 'forward' or 'discard', not {output!r}")
        job.discard_output = output == "discard"
        stdin_rank = msg.get("stdin_rank", 0)
        if stdin_rank == "all":
            job.stdin_all = True
        elif isinstance(stdin_rank, bool) or not isinstance(stdin_rank, int) or not (
                0 <= stdin_rank < job.size):
            raise ValueError(f"--stdin {stdin_rank}: the job has ranks 0 to {job.size - 1}")
        else:
            job.stdin_rank = stdin_rank
        per_node: dict[str, list[dict]] = {}
        for p in job.procs.values():
            entry = {"rank": p.rank, "app_idx": p.app_idx, "argv": job.apps[p.app_idx].argv,
                     "env": app_envs[p.app_idx], "cwd": app_cwds[p.app_idx]}
            if node_envs[p.app_idx]:
                entry["node_env"] = True
            if job.stdin and (job.stdin_all or p.rank == stdin_rank):
                entry["stdin"] = True
            per_node.setdefault(p.node, []).append(entry)
        return job, per_node

    def layout(self, job: JobRecord, parent: tuple[str, int] | None = None) -> dict:
        """The whole job as each node registers it with libpmix: node -> ranks
        (nodes in rank order of first appearance), procs per application,
        parent.  Sent with every launch; a ``connect`` answers with the
        layouts of the jobs it joins."""
        nodes: dict[str, list[int]] = {}
        for rank in sorted(job.procs):
            nodes.setdefault(job.procs[rank].node, []).append(rank)
        ids = self._nodes.node_ids()
        session = self.sessions.get(job.session_id)
        hosts = {h.name: h.slots for h in session.hosts} if session is not None else {}
        slots = sum(hosts.values())
        if job.slots:
            hosts = job.slots
        if parent is None:
            parent = job.parent
        return {"nodes": nodes, "apps": [len(a.ranks) for a in job.apps],
                "parent": list(parent) if parent else None, "session_id": job.session_id,
                "node_ids": {n: ids[n] for n in nodes if n in ids},
                "univ_size": max(slots, job.size),
                # each node's slots: where a job runs more ranks than that, it
                # oversubscribes the node (no binding; Open MPI is told to yield)
                "slots": {n: hosts.get(n, 0) for n in nodes},
                "argv": [list(a.argv) for a in job.apps],
                "wdir": [a.cwd for a in job.apps],
                # its processes wait in PMIx_Init for the release (runtime/master/debugging.py)
                "stop_in_init": job.stop_in_init and not job.released,
                "debug_target": list(job.debug_target) if job.debug_target else None}

    async def run(self, tool: ToolSession, rid: Any, job: JobRecord,
                  per_node: dict[str, list[dict]]) -> None:
        """A ``pydvm run``: launch the job, and answer ``rid`` with its report
        once it -- and every job it spawned -- is over."""
        ns = job.nspace
        self._tool[ns] = tool
        over = self._over[ns] = asyncio.get_running_loop().create_future()
        tool.send({"t": "started", "ref": rid, "nspace": ns, "size": job.size,
                   "nodes": list(per_node)})  # in first-rank order (plan's)
        timer = None
        if job.timeout is not None:
            timer = asyncio.get_running_loop().call_later(job.timeout, self._time_up, job)
        if job.display:  # --display-allocation, --display-map: before anything runs
            tool.send({"t": "output", "nspace": ns, "rank": -1, "fd": 1,
                       "data": "".join(f"{ln}\n" for ln in job.display).encode()})
        try:
            await self.launch(job, per_node)
            await over
        finally:
            if timer is not None:
                timer.cancel()
        if _trace.PATH:
            _trace.mark("master.over", ns)
        kids = self._children.pop(ns, [])
        if kids:
            await asyncio.wait(kids)
        self._tool.pop(ns, None)
        if _trace.PATH:
            _trace.mark("master.report", ns)
        tool.send(reply(rid, Status.SUCCESS, job.error or job.kill_reason, nspace=ns,
                        exit=job.exit_status, **failure_report(job)))

    def _time_up(self, job: JobRecord) -> None:
        """A job's ``--timeout`` has passed: kill it, naming what still ran."""
        if job.done or job.killed or self.jobs.get(job.nspace) is not job:
            return
        running = [r for r in sorted(job.procs) if job.procs[r].state is not ProcState.ENDED]
        named = ", ".join(f"[{job.nspace},{r}] on node {job.procs[r].node}"
                          for r in running[:FAILURE_REPORT_LIMIT])
        more = (f" and {len(running) - FAILURE_REPORT_LIMIT} more"
                if len(running) > FAILURE_REPORT_LIMIT else "")
        job.timed_out = True
        self.kill(job.nspace, f"the job's time limit of {job.timeout:g} s (--timeout) was "
                              f"reached with {len(running)} of its {job.size} processes still "
                              f"running: {named}{more}")

    async def launch_child(self, parent: tuple[str, int], job: JobRecord,
                           per_node: dict[str, list[dict]]) -> str:
        """A PMIx spawn's child job: launched like any job, reporting to its
        parent's ``pydvm run`` (which waits for it); returns the first node's
        refusal ('' when every node started its share)."""
        pns, ns = parent[0], job.nspace
        tool = self._tool.get(pns)
        if tool is not None:
            self._tool[ns] = tool
            # its output comes under its own namespace: say whose child it is
            tool.send({"t": "spawned", "nspace": ns, "parent": pns})
        over = self._over[ns] = asyncio.get_running_loop().create_future()
        self._children.setdefault(pns, []).append(over)

        def ended(_f: asyncio.Future) -> None:
            self._tool.pop(ns, None)
            self._children.pop(ns, None)  # jobs it spawned are not waited for by anyone
            if job.error and tool is not None:
                tool.send({"t": "output", "nspace": ns, "rank": -1, "fd": 2,
                           "data": f"pydvm run: spawned job {ns}: {job.error}\n".encode()})
        over.add_done_callback(ended)
        return await self.launch(job, per_node, parent)

    async def launch_detached(self, job: JobRecord, per_node: dict[str, list[dict]],
                              parent: tuple[str, int]) -> str:
        """A job a PMIx tool spawned (``parent``: the tool's name): no run
        waits for it; ``pydvm kill --wait`` and the job API still can."""
        self._over[job.nspace] = asyncio.get_running_loop().create_future()
        return await self.launch(job, per_node, parent)

    async def launch(self, job: JobRecord, per_node: dict[str, list[dict]],
                     parent: tuple[str, int] | None = None) -> str:
        """The one way a job starts, for ``pydvm run`` and for ``PMIx_Spawn``:
        the core records it, each node gets one launch message (all sent at
        once; launches made in the same turn of the loop go to a node as one
        ``launch_many``: :meth:`NodeTable.launch`), and each answer goes back
        to the core.  Returns the first
        node's refusal ('' when every node started its share)."""
        self._feed(core.JobSubmitted(job))
        for listener in self._listeners:
            listener.job_started(job)
        first = next(iter(per_node.values()), [{}])[0]
        self._launch_env[job.nspace] = (dict(first.get("env") or {}), first.get("cwd") or "/")
        layout = self.layout(job, parent)
        names = list(per_node)
        if _trace.PATH:
            _trace.mark("master.launch", job.nspace)
        extra: dict = {"output": "discard"} if job.discard_output else {}
        if job.mpi != "auto":
            extra["mpi"] = job.mpi
        if job.preput:
            extra["preput"] = job.preput
        if job.parent is not None:
            extra["spawned"] = True
        results = await asyncio.gather(*[
            self._nodes.launch(n, {
                "t": "launch", "nspace": job.nspace, "session_id": job.session_id,
                "job_size": job.size, "procs": per_node[n], "uid": job.uid, "gid": job.gid,
                "pmix": layout, "placement": job.placement, **extra})
            for n in names
        ])
        if _trace.PATH:
            _trace.mark("master.launched", job.nspace)
        failed = ""
        tool = self._tool.get(job.nspace)
        for name, r in zip(names, results):
            ok = r.get("status") == 0
            report = r.get("report")
            if ok and tool is not None and isinstance(report, list) and report:
                # --report-bindings: the node's lines, on the job's stderr as mpirun's
                tool.send({"t": "output", "nspace": job.nspace, "rank": -1, "fd": 2,
                           "data": "".join(f"{ln}\n" for ln in report).encode()})
            exit_status = r.get("exit") if isinstance(r.get("exit"), int) else None
            if not ok:
                failed = failed or r.get("msg") or f"launch failed on {name}"
            self._feed(core.LaunchAnswered(job.nspace, name, ok, exit_status,
                                           r.get("msg") or ""))
        return failed

    # ------------------------------------------------------------------
    # what happens to jobs: events for the core
    # ------------------------------------------------------------------

    def exited(self, daemon: DaemonSession, msg: Message) -> None:
        """A daemon's ``exited``: it reaped one of its processes."""
        job = self.jobs.get(msg.get("nspace"))
        rank = msg.get("rank")
        status = msg.get("status")
        if job is None or rank not in job.procs or not isinstance(status, int):
            log.warning("%s: exit report for unknown process %r:%r", daemon.name,
                        msg.get("nspace"), rank)
            return
        if job.procs[rank].node != daemon.node:
            log.warning("%s: exit report for %s:%d which runs elsewhere", daemon.name,
                        job.nspace, rank)
            return
        sig = msg.get("signal")
        if not isinstance(sig, int) or isinstance(sig, bool) or not 0 < sig < 128:
            sig = 0
        pmix = msg.get("pmix")
        self._feed(core.ProcExited(job.nspace, rank, daemon.node, status, sig,
                                   pmix if pmix in ("connected", "finalized") else None))

    def kill(self, nspace: str, why: str) -> None:
        """Kill a running job; ``why`` (who or what ended it, in words) is
        what its ``pydvm run`` prints.  A job already killed keeps its first
        reason."""
        self._feed(core.KillRequested(nspace, why))

    def kill_all(self, why: str) -> None:
        for ns in list(self.jobs):
            self.kill(ns, why)

    def abort(self, nspace: str, rank: int, status: int, why: str) -> None:
        """``nspace:rank`` called ``PMIx_Abort``: its job ends with ``status``."""
        self._feed(core.AbortRequested(nspace, rank, status, why))

    def end_requested(self, nspace: str, ranks, why: str) -> None:
        """Running ``ranks`` of ``nspace`` are being ended on request
        (``PMIx_Job_control``; ``why`` names who asked): their ends are no
        failures, and the job's ``pydvm run`` reports them."""
        self._feed(core.EndRequested(nspace, tuple(ranks), why))

    def pmix_lost(self, daemon: DaemonSession, msg: Message) -> None:
        """A daemon's ``pmix_lost``: a PMIx server on its node ended unasked
        (a crash inside libpmix, say) while processes of ``nspaces`` there
        were connected to it.  Those jobs end as a lost node's would, ``why``
        being what their ``pydvm run`` prints; only jobs with processes on
        that node."""
        nspaces, why = msg.get("nspaces"), msg.get("why")
        if not (isinstance(nspaces, list) and isinstance(why, str)):
            log.warning("%s: malformed pmix_lost: ignored", daemon.name)
            return
        for ns in nspaces:
            job = self.jobs.get(ns) if isinstance(ns, str) else None
            if job is None or not any(p.node == daemon.node for p in job.procs.values()):
                continue
            log.error("job %s: %s", ns, why[:300])
            self.kill(ns, why[:300])

    def node_lost(self, name: str, reason: str) -> None:
        self._feed(core.NodeLost(name, reason))

    def tool_gone(self, tool: PeerSession) -> None:
        """A tool's connection ended: the jobs it was running are killed."""
        for ns, t in list(self._tool.items()):
            if t is tool and ns in self.jobs:
                self.kill(ns, "its pydvm run went away")

    async def wait_all(self, timeout: float) -> None:
        """Wait (at most ``timeout`` seconds) until every job being waited for is over."""
        pending = [f for f in self._over.values() if not f.done()]
        if pending:
            await asyncio.wait(pending, timeout=timeout)

    # ------------------------------------------------------------------
    # sessions
    # ------------------------------------------------------------------

    def new_session(self, hosts: list[HostSpec] | None) -> int:
        """A new session over ``hosts`` (default: every node that is up)."""
        if hosts is None:
            hosts = self._nodes.live_hosts(list(self.sessions[DEFAULT_SESSION].hosts))
            if not hosts:
                raise ValueError("no node of this DVM is available")
        sid = self._next_session
        self._next_session += 1
        self.core.new_session(sid, hosts)
        return sid

    async def end_session(self, sid: int) -> None:
        """End a session: its jobs are killed, and once they are over its
        purges are applied in every store; returns then."""
        over = self._session_over[sid] = asyncio.get_running_loop().create_future()
        self._feed(core.SessionEndRequested(sid))
        await over

    # ------------------------------------------------------------------
    # the core's effects, carried out
    # ------------------------------------------------------------------

    def _feed(self, event: core.Event) -> None:
        """Hand ``event`` to the core and carry out what it says, in order.

        Purges of the master store are applied at once (by the listeners'
        ``lifetime_ended``).  A purge of nodes runs as a task: it first
        waits for what the relayed data server must apply before (a
        namespace's or a session's purge there), then for the nodes'
        acknowledgements, and feeds the core the event it named.
        """
        relayed: list[asyncio.Future] = []
        for e in self.core.handle(event):
            if isinstance(e, core.PurgeStore):
                for listener in self._listeners:
                    relayed += listener.lifetime_ended(e)
            elif isinstance(e, core.PurgeNodes):
                self._tasks.start(self._purge_nodes(e, relayed))
                relayed = []
            elif isinstance(e, core.SendKill):
                log.info("killing job %s on %s: %s", e.nspace, ", ".join(sorted(e.nodes)),
                         self.jobs[e.nspace].kill_reason if e.nspace in self.jobs else "")
                for name in e.nodes:
                    self._nodes.send(name, {"t": "kill", "nspace": e.nspace})
            elif isinstance(e, core.AnnounceFailure):
                self._tasks.start(self._announce_failure(e))
            elif isinstance(e, core.ProcGone):
                self._callers.pop(e.nspace, None)
                for listener in self._listeners:
                    listener.proc_ended(e.nspace, e.rank)
            elif isinstance(e, core.JobEnded):
                ns = e.job.nspace
                self._callers.pop(ns, None)
                self._launch_env.pop(ns, None)
                over = self._over.pop(ns, None)
                if over is not None and not over.done():
                    over.set_result(e.job)
                log.info("job %s ended with status %d", ns, e.job.exit_status)
                for listener in self._listeners:
                    listener.job_ended(e.job)
            elif isinstance(e, core.SessionEnded):
                over = self._session_over.pop(e.sid, None)
                if over is not None and not over.done():
                    over.set_result(e.sid)
                for listener in self._listeners:
                    listener.session_ended(e.sid)
            else:  # pragma: no cover - a new effect nobody carries out
                raise TypeError(f"no shell for the effect {e!r}")

    async def _purge_nodes(self, e: core.PurgeNodes, before: list[asyncio.Future]) -> None:
        try:
            if before:
                await asyncio.gather(*before)
            msg: Message = {"t": "purge", "horizon": int(e.horizon), "nspace": e.nspace,
                            "session_id": e.session_id}
            if e.app_idx is not None:
                msg["app_idx"] = e.app_idx
            if e.job_end is not None:
                msg["event"] = job_end_event(e.job_end)
            if _trace.PATH:
                _trace.mark("master.purge", e.nspace or "")
            await self._nodes.broadcast(msg, set(e.nodes) if e.nodes is not None else None,
                                        what=f"{e.horizon.name.lower()} purge")
            if _trace.PATH:
                _trace.mark("master.purged", e.nspace or "")
        finally:
            if e.then is not None:
                self._feed(e.then)

    async def _announce_failure(self, e: core.AnnounceFailure) -> None:
        """Tell the job's PMIx processes that ``e.rank`` failed
        (``PMIX_ERR_PROC_ABORTED``, the failed process as source and affected
        one, on every node of the job, as ``mpirun`` does); if the failure
        ends the job, give their handlers a moment before the kill."""
        job, rank = e.job, e.rank
        try:
            p = job.procs[rank]
            info = [[PC.EVENT_AFFECTED_PROC, PC.PROC, [job.nspace, rank]],
                    [PC.EVENT_CUSTOM_RANGE, PC.PROC, [job.nspace, PC.RANK_WILDCARD]],
                    [PC.EXIT_CODE, PC.INT, p.exit_status or (1 if p.unfinalized else 0)]]
            sent = await self._nodes.deliver_event(set(e.nodes), PC.ERR_PROC_ABORTED,
                                                   (job.nspace, rank), PC.RANGE_CUSTOM, info)
            if sent and job.ends_at_failure(rank) and not job.done and job.is_mpi:
                # let the handlers run before their processes are signalled
                await asyncio.sleep(EVENT_GRACE)
        finally:
            self._feed(core.FailureAnnounced(job.nspace, rank))

