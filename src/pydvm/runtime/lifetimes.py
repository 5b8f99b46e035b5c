"""The master's jobs and their lifetimes: planning, launching, exits, purges, output.

Who acts on the master store (SPEC 5)::

    daemon reports "exited"  -> PROC purge of that process
    last process of an app   -> APP purge (per-app termination count, jobs.py),
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

Failures and kills: every process end goes through :meth:`_proc_ended`,
which records it in the job (:meth:`JobRecord.proc_ended` decides whether
it failed on its own or was ended by a kill) and, for a job run with
``--abort-on-failure``, kills the rest at the first failure.  Every kill
goes through :meth:`_kill_job` with a reason in words; the first reason
given is the one the job's ``pydvm run`` prints.  The run's final reply
carries the report (:func:`failure_report`).

Output flow control: a node may have at most ``pydvm_output_window`` of
one job's output unacknowledged, each ``output`` message counted as its
bytes plus a fixed charge (:func:`~pydvm.runtime.jobio.output_cost`).  The
master forwards each ``output`` to the job's tool and acknowledges it
(``output_ack``, in the same units) only once the tool's connection has
drained below its high-water mark, so a tool that reads slowly (or is
stopped) stops the nodes reading the job's streams, and the job blocks on
write as it would on a terminal.  What the master holds for one job is
bounded by nodes x window: the messages waiting in the tool connection's
buffer, each of which costs the master less than its charge.  The head
node's output takes the same path (its in-process link delivers each
message at once; the window is the tool connection's).

Input: a ``run`` with ``stdin`` gives rank 0 a pipe; the tool's ``stdin``
messages go to rank 0's node, whose ``stdin_ack`` (bytes written into the
pipe; ``closed`` once rank 0 reads no more) goes back to the tool.  At most
:data:`~pydvm.runtime.jobio.STDIN_WINDOW` bytes are in flight per job: the
tool reads its stdin only within it, and the master drops (and says
``closed`` to) a tool that sends more.

This is one concern of :class:`~pydvm.runtime.master.Master`, written as a
mixin; it owns ``jobs``, ``sessions``, ``_job_done`` and ``_job_tool``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from ..enums import Persistence
from ..errors import Status
from ..pmix import constants as PC
from ..wire import Message, reply
from . import core
from .jobio import STDIN_WINDOW, output_cost
from .jobs import HostSpec, JobRecord, build_job
from .nodes import ACK_TIMEOUT
from .peers import DaemonSession, PeerSession, ToolSession

if TYPE_CHECKING:
    from .master import Master

log = logging.getLogger("pydvm.master")

DEFAULT_SESSION = core.DEFAULT_SESSION

#: Seconds a failed process's PMIx event is given to reach its job's
#: handlers before the job is killed (and twice that, at most, for the
#: nodes to pass it on).
EVENT_GRACE = 1.0

#: Failed processes named one by one in a run's final reply; the count of
#: the rest is given.
FAILURE_REPORT_LIMIT = 20


def failure_report(job: JobRecord) -> dict[str, Any]:
    """The fields of a run's final reply that say why the job failed.

    ``failures``: ``[rank, app_idx, node, status, signal, unfinalized]`` of the first
    :data:`FAILURE_REPORT_LIMIT` processes that failed on their own, first
    failure first; ``failed``: how many failed on their own; ``killed``: how
    many started processes were ended by a kill; ``apps``: the job's app
    count (a report names the app only when there are several).
    """
    rows = []
    for rank in job.failures[:FAILURE_REPORT_LIMIT]:
        p = job.procs[rank]
        rows.append([rank, p.app_idx, p.node, p.exit_status, p.signal, p.unfinalized])
    return {"failures": rows, "failed": len(job.failures), "killed": job.killed_procs,
            "apps": len(job.apps)}


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


class LifetimesMixin:
    """Jobs, sessions and what their ends remove."""

    jobs: dict[str, JobRecord]
    sessions: dict[int, "core.SessionRecord"]

    # ------------------------------------------------------------------
    # planning and launching
    # ------------------------------------------------------------------

    def _plan_job(self: "Master", msg: Message) -> tuple[JobRecord, dict[str, list[dict]]]:
        """Validate a ``run`` request and lay the job out on live nodes.

        Without ``--host`` an app uses the nodes of its session that are up;
        with it, the named nodes that are up.  Raises ValueError (the text
        is shown to the user) when nothing it could run on is up.
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
        if not isinstance(env, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise ValueError("env must map str to str")
        session_nodes = {h.name: h for h in session.hosts}
        specs = []
        for i, app in enumerate(apps):
            if not isinstance(app, dict):
                raise ValueError(f"app {i}: not a map")
            argv, n, hosts = app.get("argv"), app.get("n"), app.get("hosts")
            if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
                raise ValueError(f"app {i}: missing command")
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ValueError(f"app {i}: -n must be a positive integer")
            if hosts:
                hs = []
                for h in hosts:
                    if not (isinstance(h, (list, tuple)) and len(h) == 2 and isinstance(h[0], str)
                            and isinstance(h[1], int) and not isinstance(h[1], bool)):
                        raise ValueError(f"app {i}: malformed host entry {h!r}")
                    name, slots = h[0], h[1]
                    if name not in session_nodes:
                        where = "this DVM" if sid == DEFAULT_SESSION else f"session {sid}"
                        raise ValueError(f"app {i}: host {name!r} is not in {where}")
                    hs.append(HostSpec(name, slots if slots > 0 else session_nodes[name].slots))
            else:
                hs = list(session.hosts)
            live = self.live_hosts(hs)
            if not live:
                down = ", ".join(h.name for h in hs)
                raise ValueError(f"app {i}: node(s) not available: {down}")
            specs.append((argv, n, live))
        nspace = f"{self.dvm_nspace}@{self._next_job}"
        self._next_job += 1
        job = build_job(nspace, sid, specs)
        job.uid, job.gid = msg.get("_uid"), msg.get("_gid")
        abort = msg.get("abort_on_failure")
        job.abort_on_failure = abort if isinstance(abort, bool) else None
        job.pmix_required = msg.get("pmix") is True
        job.started = time.time()
        for a in job.apps:
            a.cwd = cwd
        job.stdin = msg.get("stdin") is True
        per_node: dict[str, list[dict]] = {}
        for p in job.procs.values():
            entry = {"rank": p.rank, "app_idx": p.app_idx,
                     "argv": job.apps[p.app_idx].argv, "env": env, "cwd": cwd}
            if p.rank == 0 and job.stdin:
                entry["stdin"] = True
            per_node.setdefault(p.node, []).append(entry)
        return job, per_node

    async def _run_job(self: "Master", tool: ToolSession, rid: Any, job: JobRecord,
                       per_node: dict[str, list[dict]]) -> None:
        ns = job.nspace
        self._job_tool[ns] = tool
        done = self._job_done[ns] = asyncio.get_running_loop().create_future()
        tool.send({"t": "started", "ref": rid, "nspace": ns, "size": job.size})
        await self._launch_job(job, per_node)
        await done
        await self._children_done(ns)  # jobs it spawned (collectives.py)
        self._job_tool.pop(ns, None)
        tool.send(reply(rid, Status.SUCCESS, job.error or job.kill_reason, nspace=ns,
                        exit=job.exit_status, **failure_report(job)))

    async def _launch_job(self: "Master", job: JobRecord, per_node: dict[str, list[dict]],
                          parent: tuple[str, int] | None = None) -> str:
        """The one way a job starts, for ``pydvm run`` and for ``PMIx_Spawn``:
        the core records it, each node gets one launch message (all sent at
        once), and each answer goes back to the core.  Returns the first
        node's refusal ('' when every node started its share)."""
        self._feed(core.JobSubmitted(job))
        pmix = self._pmix_launch_fields(job, per_node, parent)  # collectives.py
        names = list(per_node)
        results = await asyncio.gather(*[
            self._launch_on(n, {
                "t": "launch", "nspace": job.nspace, "session_id": job.session_id,
                "job_size": job.size, "procs": per_node[n], "uid": job.uid, "gid": job.gid,
                **pmix})
            for n in names
        ])
        failed = ""
        for name, r in zip(names, results):
            ok = r.get("status") == 0
            exit_status = r.get("exit") if isinstance(r.get("exit"), int) else None
            if not ok:
                failed = failed or r.get("msg") or f"launch failed on {name}"
            self._feed(core.LaunchAnswered(job.nspace, name, ok, exit_status,
                                           r.get("msg") or ""))
        return failed

    async def _launch_on(self: "Master", node_name: str, msg: Message) -> Message:
        node = self.nodes[node_name]
        if not node.up:
            return reply(None, Status.ERR_UNREACH, f"node {node_name} is not available")
        return await node.channel.call(msg, timeout=ACK_TIMEOUT)

    # ------------------------------------------------------------------
    # exits and lifetimes: events for the core, effects carried out
    # ------------------------------------------------------------------

    def _on_exited(self: "Master", session: DaemonSession, msg: Message) -> None:
        job = self.jobs.get(msg.get("nspace"))
        rank = msg.get("rank")
        status = msg.get("status")
        if job is None or rank not in job.procs or not isinstance(status, int):
            log.warning("%s: exit report for unknown process %r:%r", session.name,
                        msg.get("nspace"), rank)
            return
        if job.procs[rank].node != session.node:
            log.warning("%s: exit report for %s:%d which runs elsewhere", session.name,
                        job.nspace, rank)
            return
        sig = msg.get("signal")
        if not isinstance(sig, int) or isinstance(sig, bool) or not 0 < sig < 128:
            sig = 0
        pmix = msg.get("pmix")
        self._feed(core.ProcExited(job.nspace, rank, session.node, status, sig,
                                   pmix if pmix in ("connected", "finalized") else None))

    def _kill_job(self: "Master", nspace: str, why: str) -> None:
        """Kill a running job; ``why`` (who or what ended it, in words) is
        what its ``pydvm run`` prints.  A job already killed keeps its first
        reason."""
        self._feed(core.KillRequested(nspace, why))

    def _feed(self: "Master", event: core.Event) -> None:
        """Hand ``event`` to the core and carry out what it says, in order.

        Purges of the master store are applied at once.  A purge of nodes
        runs as a task: it first waits for what the relayed data server must
        apply before (a namespace's or a session's purge there), then for
        the nodes' acknowledgements, and feeds the core the event it named.
        """
        relayed: list[asyncio.Future] = []
        for e in self.core.handle(event):
            if isinstance(e, core.PurgeStore):
                self.store.purge(e.horizon, nspace=e.nspace, rank=e.rank, app_idx=e.app_idx,
                                 session_id=e.session_id)
                relayed += self._relay_purge(e)
            elif isinstance(e, core.PurgeNodes):
                self._spawn(self._purge_nodes(e, relayed))
                relayed = []
            elif isinstance(e, core.SendKill):
                log.info("killing job %s on %s: %s", e.nspace, ", ".join(sorted(e.nodes)),
                         self.jobs[e.nspace].kill_reason if e.nspace in self.jobs else "")
                for name in e.nodes:
                    node = self.nodes.get(name)
                    if node is not None and node.up:
                        node.channel.send({"t": "kill", "nspace": e.nspace})
            elif isinstance(e, core.AnnounceFailure):
                self._spawn(self._announce_failure(e))
            elif isinstance(e, core.ProcGone):
                self._forget_callers(e.nspace)
                self._close_direct(e.nspace, e.rank, f"process {e.nspace}:{e.rank} ended")
                self._collectives_member_ended(e.nspace, e.rank)  # collectives.py
            elif isinstance(e, core.JobEnded):
                self._forget_callers(e.job.nspace)
                fut = self._job_done.pop(e.job.nspace, None)
                if fut is not None and not fut.done():
                    fut.set_result(e.job)
                log.info("job %s ended with status %d", e.job.nspace, e.job.exit_status)
            elif isinstance(e, core.SessionEnded):
                fut = self._session_done.pop(e.sid, None)
                if fut is not None and not fut.done():
                    fut.set_result(e.sid)
            else:  # pragma: no cover - a new effect nobody carries out
                raise TypeError(f"no shell for the effect {e!r}")

    def _relay_purge(self: "Master", e: core.PurgeStore) -> list[asyncio.Future]:
        """The same lifetime applied to the relayed data server's store (SPEC 7),
        durably (relay.py); the namespace's and the session's purges are
        waited for before the nodes'."""
        if self.relay is None:
            return []
        if e.horizon is Persistence.SESSION:
            # the remote store knows nothing of our sessions: name each job
            return [self.relay.purge(Persistence.SESSION, ns)
                    for ns in sorted(self.sessions[e.session_id].history)]
        fut = self.relay.purge(e.horizon, e.nspace, rank=e.rank, app_idx=e.app_idx)
        return [fut] if e.horizon is Persistence.NSPACE else []

    async def _purge_nodes(self: "Master", e: core.PurgeNodes,
                           before: list[asyncio.Future]) -> None:
        try:
            if before:
                await asyncio.gather(*before)
            msg: Message = {"t": "purge", "horizon": int(e.horizon), "nspace": e.nspace,
                            "session_id": e.session_id}
            if e.app_idx is not None:
                msg["app_idx"] = e.app_idx
            if e.job_end is not None:
                msg["event"] = job_end_event(e.job_end)
            await self._broadcast(msg, set(e.nodes) if e.nodes is not None else None,
                                  what=f"{e.horizon.name.lower()} purge")
        finally:
            if e.then is not None:
                self._feed(e.then)

    async def _announce_failure(self: "Master", e: core.AnnounceFailure) -> None:
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
            sent = await self._notify_nodes(set(e.nodes), PC.ERR_PROC_ABORTED,
                                            (job.nspace, rank), PC.RANGE_CUSTOM, info)
            if sent and job.ends_at_failure(rank) and not job.done and job.is_mpi:
                # let the handlers run before their processes are signalled
                await asyncio.sleep(EVENT_GRACE)
        finally:
            self._feed(core.FailureAnnounced(job.nspace, rank))

    async def _notify_nodes(self: "Master", nodes: set[str], code: int,
                            source: tuple[str, int], rng: int, info: list) -> bool:
        """Deliver a PMIx event through the PMIx servers of ``nodes`` (those
        hosting PMIx), each to its clients in range; returns once each has
        passed it on, or after :data:`EVENT_GRACE` x 2 at most.  False when
        none of ``nodes`` hosts PMIx."""
        targets = {n for n in nodes if (self._pmix_nodes.get(n) or [False])[0]}
        if not targets:
            return False
        msg = {"t": "event", "code": code, "source": list(source), "range": rng,
               "info": info}
        try:
            await asyncio.wait_for(self._broadcast(msg, targets, what="event"),
                                   2 * EVENT_GRACE)
        except asyncio.TimeoutError:
            log.warning("event %d from %s:%s not passed on by every node within %.0fs",
                        code, source[0], source[1], 2 * EVENT_GRACE)
        return True

    def _tool_gone(self: "Master", tool: PeerSession) -> None:
        """A tool's connection ended: the jobs it was running are killed."""
        for ns, t in list(self._job_tool.items()):
            if t is tool and ns in self.jobs:
                self._kill_job(ns, "its pydvm run went away")

    # ------------------------------------------------------------------
    # output, with flow control
    # ------------------------------------------------------------------

    def _on_output(self: "Master", session: DaemonSession, msg: Message) -> None:
        ns = msg.get("nspace")
        data = msg.get("data")
        if not isinstance(ns, str) or not isinstance(data, bytes):
            log.warning("%s: malformed output message dropped", session.name)
            return
        tool = self._job_tool.get(ns)
        if tool is not None:
            tool.send(msg)
        self._credit_output(session, ns, output_cost(len(data)), tool)

    def _credit_output(self: "Master", session: DaemonSession, ns: str, n: int,
                       tool: PeerSession | None) -> None:
        """Acknowledge ``n`` (output_cost units) of ``ns``'s output to its
        node -- in batches, and only once the tool has read what went before."""
        pending = session.output_unacked
        pending[ns] = pending.get(ns, 0) + n
        if pending[ns] < self.values["pydvm_output_window"] // 4 or ns in session.ack_scheduled:
            return
        session.ack_scheduled.add(ns)

        def flush() -> None:
            session.ack_scheduled.discard(ns)
            k = pending.pop(ns, 0)
            if k and not session.closed:
                session.send({"t": "output_ack", "nspace": ns, "bytes": k})

        if tool is None:
            flush()
        else:
            tool.channel.on_drain(flush)

    # ------------------------------------------------------------------
    # input, with flow control
    # ------------------------------------------------------------------

    def _on_tool_stdin(self: "Master", tool: PeerSession, msg: Message) -> None:
        """A piece of a job's ``pydvm run``'s stdin (``data``, ``eof``): on to
        rank 0's node.  Only from the job's own tool, for a job run with
        stdin, within :data:`STDIN_WINDOW`; anything else is answered
        ``stdin_ack`` with ``closed`` (send no more)."""
        ns, data = msg.get("nspace"), msg.get("data", b"")
        job = self.jobs.get(ns) if isinstance(ns, str) else None
        node = None
        if job is not None and job.stdin and self._job_tool.get(ns) is tool \
                and isinstance(data, bytes):
            node = self.nodes.get(job.procs[0].node)
            if job.stdin_in_flight + len(data) > STDIN_WINDOW:
                log.warning("%s: sent more stdin than its window for %s: dropped",
                            tool.name, ns)
                node = None
        if node is None or not node.up:
            tool.send({"t": "stdin_ack", "nspace": ns,
                       "bytes": len(data) if isinstance(data, bytes) else 0, "closed": True})
            return
        job.stdin_in_flight += len(data)
        node.channel.send({"t": "stdin", "nspace": ns, "data": data,
                           "eof": msg.get("eof") is True})

    def _on_stdin_ack(self: "Master", session: DaemonSession, msg: Message) -> None:
        """Rank 0's node wrote ``bytes`` of stdin into its pipe (``closed``:
        it takes no more): tell the tool."""
        ns, n = msg.get("nspace"), msg.get("bytes")
        job = self.jobs.get(ns) if isinstance(ns, str) else None
        if job is None or job.procs[0].node != session.node or not isinstance(n, int) \
                or isinstance(n, bool) or n < 0:
            return
        job.stdin_in_flight = max(0, job.stdin_in_flight - n)
        tool = self._job_tool.get(ns)
        if tool is not None:
            tool.send({"t": "stdin_ack", "nspace": ns, "bytes": n,
                       "closed": msg.get("closed") is True})

    # ------------------------------------------------------------------
    # sessions
    # ------------------------------------------------------------------

    def _new_session(self: "Master", hosts: list[HostSpec] | None) -> int:
        """A new session over ``hosts`` (default: every node that is up)."""
        if hosts is None:
            hosts = self.live_hosts(list(self.sessions[DEFAULT_SESSION].hosts))
            if not hosts:
                raise ValueError("no node of this DVM is available")
        sid = self._next_session
        self._next_session += 1
        self.core.new_session(sid, hosts)
        return sid

    async def _end_session(self: "Master", sid: int) -> None:
        """End a session: its jobs are killed, and once they are over its
        purges are applied in every store; returns then."""
        done = self._session_done[sid] = asyncio.get_running_loop().create_future()
        self._feed(core.SessionEndRequested(sid))
        await done
