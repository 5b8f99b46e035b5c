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

Output flow control: a daemon may have at most ``pydvm_output_window``
bytes of one job's output unacknowledged.  The master forwards each
``output`` to the job's tool and acknowledges it (``output_ack``) only once
the tool's connection has drained below its high-water mark, so a tool that
reads slowly (or is stopped) stops the daemons reading the job's pipes, and
the job blocks on write as it would on a terminal.  What the master holds
for one job is bounded by nodes x window plus the tool connection's buffer.

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
from .jobs import HostSpec, JobRecord, ProcState, SessionRecord, build_job
from .nodes import ACK_TIMEOUT, LOST_STATUS
from .peers import DaemonSession, PeerSession, ToolSession

if TYPE_CHECKING:
    from .master import Master

log = logging.getLogger("pydvm.master")

DEFAULT_SESSION = 0

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


class LifetimesMixin:
    """Jobs, sessions and what their ends remove."""

    jobs: dict[str, JobRecord]
    sessions: dict[int, SessionRecord]

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
        per_node: dict[str, list[dict]] = {}
        for p in job.procs.values():
            per_node.setdefault(p.node, []).append({
                "rank": p.rank, "app_idx": p.app_idx,
                "argv": job.apps[p.app_idx].argv, "env": env, "cwd": cwd,
            })
        return job, per_node

    async def _run_job(self: "Master", tool: ToolSession, rid: Any, job: JobRecord,
                       per_node: dict[str, list[dict]]) -> None:
        ns = job.nspace
        self.jobs[ns] = job
        session = self.sessions[job.session_id]
        session.jobs.add(ns)
        if job.session_id != DEFAULT_SESSION:
            # Relayed SESSION purges name each namespace; the default
            # session never ends, so it keeps no history (it would only grow).
            session.history.add(ns)
        self._job_tool[ns] = tool
        done = self._job_done[ns] = asyncio.get_running_loop().create_future()
        tool.send({"t": "started", "ref": rid, "nspace": ns, "size": job.size})
        pmix = self._pmix_launch_fields(job, per_node)  # collectives.py
        names = list(per_node)
        results = await asyncio.gather(*[
            self._launch_on(n, {
                "t": "launch", "nspace": ns, "session_id": job.session_id,
                "job_size": job.size, "procs": per_node[n], "uid": job.uid, "gid": job.gid,
                **pmix})
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
                        self._proc_ended(job, p["rank"], r.get("exit") or LOST_STATUS,
                                         launched=False)
            else:
                for p in per_node[name]:
                    if job.procs[p["rank"]].state is ProcState.PENDING:
                        job.procs[p["rank"]].state = ProcState.RUNNING
        if job.killed and not job.done:
            # Killed while its launches were in flight: a node may have had
            # nothing to kill yet, so tell every node again now they have.
            self._send_kill(job)
        await done
        await self._children_done(ns)  # jobs it spawned (collectives.py)
        self._job_tool.pop(ns, None)
        tool.send(reply(rid, Status.SUCCESS, job.error or job.kill_reason, nspace=ns,
                        exit=job.exit_status, **failure_report(job)))

    async def _launch_on(self: "Master", node_name: str, msg: Message) -> Message:
        node = self.nodes[node_name]
        if not node.up:
            return reply(None, Status.ERR_UNREACH, f"node {node_name} is not available")
        return await node.channel.call(msg, timeout=ACK_TIMEOUT)

    # ------------------------------------------------------------------
    # exits and lifetimes
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
        self._proc_ended(job, rank, status, sig,
                         pmix=pmix if pmix in ("connected", "finalized") else None)

    def _proc_ended(self: "Master", job: JobRecord, rank: int, status: int, signal: int = 0,
                    launched: bool = True, pmix: str | None = None) -> None:
        app_done, job_done = job.proc_ended(rank, status, signal, launched, pmix)
        if not job_done and job.failures and job.failures[-1] == rank and not job.killed:
            self._spawn(self._proc_failed(job, rank))
        store = self.store
        app_idx = job.procs[rank].app_idx
        self._forget_callers(job.nspace)
        self._close_direct(job.nspace, rank, f"process {job.nspace}:{rank} ended")
        store.purge(Persistence.PROC, nspace=job.nspace, rank=rank)
        if self.relay is not None:
            self.relay.purge(Persistence.PROC, job.nspace, rank=rank)
        if app_done:
            store.purge(Persistence.APP, nspace=job.nspace, app_idx=app_idx)
            if self.relay is not None:
                self.relay.purge(Persistence.APP, job.nspace, app_idx=app_idx)
            if not job_done:  # the job's end purges APP items everywhere anyway
                self._spawn(self._app_ended(job, app_idx))
        if job_done:
            self._spawn(self._job_ended(job))

    async def _proc_failed(self: "Master", job: JobRecord, rank: int) -> None:
        """``rank`` failed on its own while the rest of its job runs.

        The job's PMIx processes that asked to hear of it are told first
        (``PMIX_ERR_PROC_ABORTED``, the failed process as the affected one,
        on every node of the job, as ``mpirun`` does); then, if this failure
        ends the job (:meth:`JobRecord.ends_at_failure`), the rest is killed
        and the job's report says why.
        """
        ends = job.ends_at_failure(rank)
        p = job.procs[rank]
        info = [[PC.EVENT_AFFECTED_PROC, PC.PROC, [job.nspace, rank]],
                [PC.EVENT_CUSTOM_RANGE, PC.PROC, [job.nspace, PC.RANK_WILDCARD]],
                [PC.EXIT_CODE, PC.INT, p.exit_status or (1 if p.unfinalized else 0)]]
        sent = await self._notify_nodes(job.nodes(), PC.ERR_PROC_ABORTED, (job.nspace, rank),
                                        PC.RANGE_CUSTOM, info)
        if sent and ends and not job.done and job.is_mpi:
            # let the handlers run before their processes are signalled
            await asyncio.sleep(EVENT_GRACE)
        if ends and not job.done:
            how = "(--abort-on-failure)" if job.abort_on_failure else \
                "(an MPI/PMIx job ends at its first failure, as under mpirun; " \
                "--no-abort-on-failure keeps the others running)"
            self._kill_job(job.nspace, f"aborted because process [{job.nspace},{rank}] "
                                       f"failed {how}")

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

    async def _app_ended(self: "Master", job: JobRecord, app_idx: int) -> None:
        """The application notice: the nodes that ran ``app_idx`` purge its
        APP (and PROC) items from their own stores, and acknowledge."""
        nodes = {job.procs[r].node for r in job.apps[app_idx].ranks}
        await self._broadcast({"t": "purge", "horizon": int(Persistence.APP),
                               "nspace": job.nspace, "app_idx": app_idx, "session_id": None},
                              nodes, what="application purge")

    async def _job_ended(self: "Master", job: JobRecord) -> None:
        self.store.purge(Persistence.NSPACE, nspace=job.nspace)
        if self.relay is not None:
            # Reported only once applied by the data server, or queued for
            # re-send because it is unreachable (relay.py).
            await self.relay.purge(Persistence.NSPACE, job.nspace)
        # With the namespace purge, each node's PMIx server tells the processes
        # that asked (a spawning parent, a monitor; not a default handler) that
        # the job has ended: PMIX_EVENT_JOB_END (alias PMIX_ERR_JOB_TERMINATED).
        end_event = {"code": PC.EVENT_JOB_END, "source": [job.nspace, PC.RANK_WILDCARD],
                     "range": PC.RANGE_GLOBAL, "info": [
                         [PC.EVENT_AFFECTED_PROC, PC.PROC, [job.nspace, PC.RANK_WILDCARD]],
                         [PC.JOB_TERM_STATUS, PC.STATUS,
                          PC.SUCCESS if job.exit_status == 0 else PC.ERROR],
                         [PC.EXIT_CODE, PC.INT, job.exit_status],
                         [PC.EVENT_NON_DEFAULT, PC.BOOL, True],
                         # not kept for processes that register later: a job
                         # started tomorrow must not hear of today's ends
                         [PC.EVENT_DO_NOT_CACHE, PC.BOOL, True]]}
        await self._broadcast({"t": "purge", "horizon": int(Persistence.NSPACE),
                               "nspace": job.nspace, "session_id": None, "event": end_event},
                              what="namespace purge")
        self.jobs.pop(job.nspace, None)
        self._forget_callers(job.nspace)
        session = self.sessions.get(job.session_id)
        if session is not None:
            session.jobs.discard(job.nspace)
        fut = self._job_done.pop(job.nspace, None)
        if fut is not None and not fut.done():
            fut.set_result(job)
        log.info("job %s ended with status %d", job.nspace, job.exit_status)

    def _kill_job(self: "Master", nspace: str, why: str) -> None:
        """Kill a running job; ``why`` (who or what ended it, in words) is
        what its ``pydvm run`` prints.  A job already killed keeps its first
        reason."""
        job = self.jobs.get(nspace)
        if job is None or job.killed:
            return
        job.killed = True
        job.kill_reason = why
        log.info("killing job %s: %s", nspace, why)
        self._send_kill(job)

    def _send_kill(self: "Master", job: JobRecord) -> None:
        nspace = job.nspace
        for name in job.nodes():
            node = self.nodes.get(name)
            if node is not None and node.up:
                node.channel.send({"t": "kill", "nspace": nspace})

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
        self._credit_output(session, ns, len(data), tool)

    def _credit_output(self: "Master", session: DaemonSession, ns: str, n: int,
                       tool: PeerSession | None) -> None:
        """Acknowledge ``n`` bytes of ``ns``'s output to its daemon -- in
        batches, and only once the tool has read what went before."""
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
        self.sessions[sid] = SessionRecord(sid, hosts)
        return sid

    async def _end_session(self: "Master", sid: int) -> None:
        session = self.sessions[sid]
        session.ending = True
        waits = [self._job_done[ns] for ns in session.jobs if ns in self._job_done]
        for ns in list(session.jobs):
            self._kill_job(ns, f"killed because session {sid} was ended ('pydvm session end')")
        if waits:
            await asyncio.wait(waits, timeout=ACK_TIMEOUT)
        self.store.purge(Persistence.SESSION, session_id=sid)
        if self.relay is not None:
            # The remote store knows nothing of our sessions: name each job.
            await asyncio.gather(*[self.relay.purge(Persistence.SESSION, ns)
                                   for ns in sorted(session.history)])
        await self._broadcast({"t": "purge", "horizon": int(Persistence.SESSION),
                               "nspace": None, "session_id": sid}, what="session purge")
        del self.sessions[sid]
