"""The master's job queue: jobs that wait for free slots instead of oversubscribing.

A ``run`` with ``queue: true`` (``pydvm run --queue``; the default for every
``run`` of a DVM started with ``pydvm_queue on``) is planned at once -- it
gets its namespace and its layout then -- and, unless it fits now, waits
here: its tool is answered ``{"t": "queued", "ref": id, "nspace": ns,
"position": k}`` (``k`` from 1, the first to start), then ``started`` and
the rest as for any job once it is launched.

**Slots.**  A node's capacity for a job is the slots the job was given
there (its hosts' slots: ``--host a:2``, a hostfile's ``slots=``, else the
DVM's or its session's); what is used is every running process there, of
every job, queued or not (a job run without ``queue`` starts at once, as
``mpirun`` would, and the queue counts its processes).  A hostfile's
``max_slots`` bounds only how the job is mapped.  A job *fits* when, on every
node it maps to, its ranks there plus the processes running there are at
most that capacity.  A job whose own layout puts more ranks on a node than
its slots there (the default mapping wraps around) is refused at once
(``PMIX_ERR_OUT_OF_RESOURCE``: it could never fit) -- unless it asked
``--oversubscribe``: then it waits until the nodes it oversubscribes run
nothing else.

**Order (no starvation).**  Jobs start in submission order, DVM-wide.  A
waiting job may start before an earlier one only if it shares no node with
any earlier job still waiting: passing never takes a slot an earlier job
waits for, so no stream of small jobs can delay a large one (on its nodes
the queue is strict FIFO; jobs on other nodes -- another session's, or
disjoint ``--host`` sets -- run meanwhile).

**A lost node.**  A waiting job whose layout uses a node that is lost is
laid out again from its ``run`` request, with its namespace, on the nodes
left -- as if it were submitted now (:meth:`ProcessTable.plan`: an app
without ``--host`` uses its session's nodes that are up, one with it the
named ones that are up).  If it still could start from the queue it waits
on in its place, with its new layout; if not (no node left for it, more
ranks on a node than its slots, PMIx missing) it is refused: ended as
below, ``exit`` 255, ``msg`` naming the node and why the nodes left cannot
run it.

**Ends.**  A waiting job leaves the queue by starting, or by being ended
while queued: ``pydvm kill`` (``kill_job``, ``signal_job``), its tool's
connection ending, its session ending, the DVM stopping, or a lost node
leaving nothing it can run on.  Its ``run`` is then answered as a killed
job's: status 0, ``exit`` :data:`QUEUED_KILL_EXIT` (a lost node's: 255),
the reason in ``msg``, no failures.  Nothing of it stays here.

:class:`JobQueue` owns the waiting jobs and the count of processes running
per node (kept from :meth:`ProcessListener.job_started` and
:meth:`~ProcessListener.proc_ended`); :class:`QueueListener` is how the job
events hear of queueing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from bisect import bisect_left
from dataclasses import dataclass
from typing import Any

from ...errors import Status
from ...wire import Message, reply
from ..shared.jobs import JobRecord
from ..shared.peers import PeerSession, ToolSession
from .core import LOST_STATUS
from .nodes import NodeListener, NodeTable
from .processes import ProcessListener, ProcessTable
from .tasks import Tasks

log = logging.getLogger("pydvm.master")

#: The exit status of a job killed while it was queued: a killed running
#: job's (128 + SIGTERM), so scripts see the same status either way.
QUEUED_KILL_EXIT = 143

#: Upper bounds (seconds) of the queue-wait histogram's buckets (+Inf implied).
WAIT_BUCKETS: tuple[float, ...] = (0.01, 0.1, 1.0, 10.0, 60.0, 600.0, 3600.0, 36000.0)


@dataclass
class Waiting:
    """A queued job: who waits for it (``tool``, ``rid``), the planned job
    and each node's share, its ranks per node (``need``) and the most it may
    have there (``cap``); its ``run`` request (``msg``: to lay it out again
    if a node of it is lost)."""

    tool: ToolSession
    rid: Any
    job: JobRecord
    per_node: dict[str, list[dict]]
    need: dict[str, int]
    cap: dict[str, int]
    msg: dict | None = None


class QueueListener:
    """What a component hears from the queue (override what it needs)."""

    def job_queued(self, job: JobRecord, position: int) -> None:
        """``job`` waits in the queue at ``position`` (1: next to start)."""

    def queued_job_ended(self, job: JobRecord, exit: int, reason: str) -> None:
        """``job`` left the queue without ever starting."""


class JobQueue(ProcessListener, NodeListener):
    """Queued jobs and the slots in use (see the module docstring)."""

    def __init__(self, processes: ProcessTable, nodes: NodeTable, tasks: Tasks,
                 values: dict[str, Any]) -> None:
        self._processes = processes
        self._nodes = nodes
        self._tasks = tasks
        self.values = values
        #: nspace -> its waiting entry, in submission order.
        self._waiting: dict[str, Waiting] = {}
        #: node -> processes running there (every job's, ended ones taken off).
        self._used: dict[str, int] = {}
        #: nspace -> its ranks per node: started by the queue, not yet in
        #: the process table (its launch task has not run yet).
        self._reserved: dict[str, dict[str, int]] = {}
        #: node -> ranks of ``_reserved`` there; node -> waiting jobs that
        #: need it (both kept as those change, so a submission costs the
        #: job's nodes, not the queue's length).
        self._reserved_on: dict[str, int] = {}
        self._wanted: dict[str, int] = {}
        self._listeners: list[QueueListener] = []
        self._pump_due = False
        #: figures for the metrics (:meth:`stats`): jobs that had to wait,
        #: jobs that left without starting, the wait of each job started
        #: from the queue (counts per :data:`WAIT_BUCKETS` bound, and +Inf).
        self.jobs_queued = 0
        self.jobs_left = 0
        self._wait_counts = [0] * (len(WAIT_BUCKETS) + 1)
        self._wait_sum = 0.0

    def add_listener(self, listener: QueueListener) -> None:
        self._listeners.append(listener)

    # ------------------------------------------------------------------
    # queries
    # ------------------------------------------------------------------

    def wanted(self, msg: dict) -> bool:
        """Whether a ``run`` request is to be queued: its ``queue`` field if a
        bool, else the DVM's ``pydvm_queue``."""
        q = msg.get("queue")
        return q if isinstance(q, bool) else self.values.get("pydvm_queue") == "on"

    def get(self, nspace: Any) -> JobRecord | None:
        """The queued job ``nspace`` (None: not queued)."""
        w = self._waiting.get(nspace) if isinstance(nspace, str) else None
        return w.job if w is not None else None

    def tool_of(self, nspace: str) -> ToolSession | None:
        w = self._waiting.get(nspace)
        return w.tool if w is not None else None

    def queued(self) -> list[JobRecord]:
        """The waiting jobs, first to start first."""
        return [w.job for w in self._waiting.values()]

    def stats(self) -> dict[str, Any]:
        """The queue's figures for the metrics endpoint: ``waiting`` (now),
        ``queued`` and ``left`` (totals), ``wait`` (per-bucket counts of
        :data:`WAIT_BUCKETS` and +Inf, not cumulative) and ``wait_sum``."""
        return {"waiting": len(self._waiting), "queued": self.jobs_queued,
                "left": self.jobs_left, "wait": list(self._wait_counts),
                "wait_sum": self._wait_sum}

    def counts(self) -> dict[str, int]:
        """Records held (``pydvm info``): waiting jobs, jobs started but not
        yet in the process table, nodes with processes running."""
        return {"queued_jobs": len(self._waiting), "queue_reserved": len(self._reserved),
                "queue_nodes": len(self._used)}

    # ------------------------------------------------------------------
    # submitting
    # ------------------------------------------------------------------

    def refusal(self, job: JobRecord) -> str:
        """Why the planned ``job`` could never start from the queue ('' if it
        can): its ``run`` is then refused with ``PMIX_ERR_OUT_OF_RESOURCE``."""
        if job.placement.get("oversubscribe") is True:
            return ""
        for node, k in job.ranks_per_node().items():
            slots = job.slots.get(node, 0)
            if k > slots:
                return (f"the job's {job.size} processes put {k} on node {node}, which has "
                        f"{slots} slot{'s' if slots != 1 else ''} for it: it could never "
                        "start without oversubscribing (ask for fewer processes, or add "
                        "--oversubscribe to let it run once the node is otherwise idle)")
        return ""

    def submit(self, tool: ToolSession, rid: Any, job: JobRecord,
               per_node: dict[str, list[dict]], msg: dict | None = None) -> None:
        """Queue a planned job (:meth:`refusal` said it may be): started at
        once if it fits and no earlier job waits for its nodes, else it
        waits and its tool is told ``queued``.  ``msg``: its ``run`` request
        (kept while it waits, to lay it out again should a node be lost)."""
        need, cap = _need_cap(job)
        w = Waiting(tool, rid, job, per_node, need, cap, msg)
        if not any(n in self._wanted for n in need) and self._fits(w):
            self._start(w)
            return
        self._waiting[job.nspace] = w
        self.jobs_queued += 1
        _add(self._wanted, {n: 1 for n in need})
        position = len(self._waiting)
        tool.send({"t": "queued", "ref": rid, "nspace": job.nspace, "position": position})
        log.info("job %s queued at position %d (%d processes)", job.nspace, position, job.size)
        for listener in self._listeners:
            listener.job_queued(job, position)

    def _fits(self, w: Waiting) -> bool:
        for node, k in w.need.items():
            if not self._nodes.is_up(node):
                return False
            if self._used.get(node, 0) + self._reserved_on.get(node, 0) + k > w.cap[node]:
                return False
        return True

    def _start(self, w: Waiting) -> None:
        ns = w.job.nspace
        self._reserved[ns] = w.need
        _add(self._reserved_on, w.need)
        now = time.time()
        wait = max(0.0, now - w.job.started)  # since its submission
        self._wait_counts[bisect_left(WAIT_BUCKETS, wait)] += 1
        self._wait_sum += wait
        w.job.started = now

        async def run() -> None:
            try:
                await self._processes.run(w.tool, w.rid, w.job, w.per_node)
            finally:
                self._unreserve(ns)  # if it never got into the table
        self._tasks.start(run(), (w.tool.channel, w.rid))

    def _unreserve(self, ns: str) -> None:
        need = self._reserved.pop(ns, None)
        if need is not None:
            _add(self._reserved_on, need, -1)

    def _unwait(self, ns: str) -> Waiting | None:
        w = self._waiting.pop(ns, None)
        if w is not None:
            _add(self._wanted, {n: 1 for n in w.need}, -1)
        return w

    def _pump_soon(self) -> None:
        """Look for jobs to start once this turn of the loop is over (every
        process end of the turn counted first)."""
        if self._waiting and not self._pump_due:
            self._pump_due = True
            asyncio.get_running_loop().call_soon(self._pump)

    def _pump(self) -> None:
        """Start every waiting job that fits and that no earlier waiting job
        shares a node with, in submission order (the module docstring)."""
        self._pump_due = False
        blocked: set[str] = set()
        every = len(self._nodes.records)
        ended: list[Waiting] = []
        starting: list[Waiting] = []
        # No copy of the whole queue per pass: a pass stops at the first
        # job once every node is blocked, however long the queue is.
        for w in self._waiting.values():
            session = self._processes.sessions.get(w.job.session_id)
            if session is None or session.ending:
                ended.append(w)
                continue
            if blocked.isdisjoint(w.need) and self._fits(w):
                self._start(w)   # reserves its slots: the next _fits counts them
                starting.append(w)
            else:
                blocked.update(w.need)
                if len(blocked) >= every:
                    break  # nothing later can start
        for w in ended:
            self._end(w, QUEUED_KILL_EXIT, f"killed while queued: session "
                                           f"{w.job.session_id} was ended")
        for w in starting:
            self._unwait(w.job.nspace)

    # ------------------------------------------------------------------
    # leaving the queue without starting
    # ------------------------------------------------------------------

    def remove(self, nspace: str, reason: str, exit: int = QUEUED_KILL_EXIT) -> bool:
        """End the queued job ``nspace`` (its ``run`` answered as killed,
        ``reason`` its message); False if it is not queued."""
        w = self._waiting.get(nspace)
        if w is None:
            return False
        self._end(w, exit, reason)
        self._pump_soon()  # what waited behind it may start now
        return True

    def clear(self, reason: str) -> None:
        """End every queued job (the DVM stops)."""
        for w in list(self._waiting.values()):
            self._end(w, QUEUED_KILL_EXIT, reason)

    def tool_gone(self, tool: PeerSession) -> None:
        """A tool's connection ended: its queued jobs go (nobody waits for them)."""
        mine = [w for w in self._waiting.values() if w.tool is tool]
        for w in mine:
            self._end(w, QUEUED_KILL_EXIT, "its pydvm run went away while it was queued")
        if mine:
            self._pump_soon()

    def _end(self, w: Waiting, exit: int, reason: str) -> None:
        job = w.job
        self._unwait(job.nspace)
        self.jobs_left += 1
        log.info("queued job %s ended: %s", job.nspace, reason)
        w.tool.send(reply(w.rid, Status.SUCCESS, reason, nspace=job.nspace, exit=exit,
                          failures=[], failed=0, killed=0, apps=len(job.apps)))
        for listener in self._listeners:
            listener.queued_job_ended(job, exit, reason)

    # ------------------------------------------------------------------
    # what the process table and the node table say
    # ------------------------------------------------------------------

    def job_started(self, job: JobRecord) -> None:
        self._unreserve(job.nspace)
        for node, k in job.ranks_per_node().items():
            self._used[node] = self._used.get(node, 0) + k

    def proc_ended(self, nspace: str, rank: int) -> None:
        job = self._processes.jobs.get(nspace)
        proc = job.procs.get(rank) if job is not None else None
        if proc is None:
            return
        left = self._used.get(proc.node, 0) - 1
        if left > 0:
            self._used[proc.node] = left
        else:
            self._used.pop(proc.node, None)
        self._pump_soon()

    def session_ended(self, sid: int) -> None:
        for w in [w for w in self._waiting.values() if w.job.session_id == sid]:
            self._end(w, QUEUED_KILL_EXIT, f"killed while queued: session {sid} was ended")

    def node_lost(self, name: str, reason: str) -> None:
        """A node of a waiting job's layout is gone: the job is laid out
        again on the nodes left, or refused (the module docstring)."""
        for w in [w for w in self._waiting.values() if name in w.need]:
            why = self._replan(w)
            if why:
                self._end(w, LOST_STATUS, f"node {name} was lost while the job was queued "
                                          f"({reason}): the nodes left cannot run it: {why}")
            else:
                log.info("queued job %s laid out again after node %s was lost: %s",
                         w.job.nspace, name, w.need)
        self._pump_soon()

    def _replan(self, w: Waiting) -> str:
        """Lay ``w``'s job out again on the nodes up now (in place, keeping
        its namespace and its place in the queue); why it cannot be ('' if
        it was)."""
        if w.msg is None:
            return "its request was not kept"
        try:
            job, per_node = self._processes.plan(w.msg, w.job.nspace)
        except ValueError as exc:
            return str(exc)
        why = pmix_refusal(self._nodes, w.msg, job) or self.refusal(job)
        if why:
            return why
        job.started = w.job.started  # its submission time (pydvm ps)
        _add(self._wanted, {n: 1 for n in w.need}, -1)
        w.job, w.per_node = job, per_node
        w.need, w.cap = _need_cap(job)
        _add(self._wanted, {n: 1 for n in w.need})
        return ""


def pmix_refusal(nodes: NodeTable, msg: Message, job: JobRecord) -> str:
    """Why a ``run`` with ``pmix`` (``--pmix``) cannot run as planned ('' if it can)."""
    if msg.get("pmix"):
        missing = nodes.pmix_missing(job.nodes())
        if missing:
            return "PMIx is required (--pmix) but not available on: " + ", ".join(missing)
    return ""


def _need_cap(job: JobRecord) -> tuple[dict[str, int], dict[str, int]]:
    """A planned job's ranks per node, and the most it may have running there."""
    need = job.ranks_per_node()
    return need, {node: max(job.slots.get(node, 0), k) for node, k in need.items()}


def _add(counts: dict[str, int], by: dict[str, int], sign: int = 1) -> None:
    """Add (``sign`` -1: take) ``by``'s counts to ``counts``, dropping zeros."""
    for key, k in by.items():
        v = counts.get(key, 0) + sign * k
        if v > 0:
            counts[key] = v
        else:
            counts.pop(key, None)
