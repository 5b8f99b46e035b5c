"""``PMIx_Job_control`` and ``PMIx_Allocation_request`` from a process of a job.

Job control
-----------
A node's PMIx host hands a :class:`~pydvm.pmix.requests.JobControl` here
(:func:`serve`).  What the directives ask for is read first
(:func:`pydvm.pmix.jobctl.action_of`): kill, terminate, a signal (pause and
resume are SIGSTOP and SIGCONT), or nothing -- a request that only states
facts (preemptible, a checkpoint method, an id) is answered SUCCESS at
once: a fixed DVM never preempts nor checkpoints.  An action goes to the
master, which holds every job, with one request::

    jobctl  {uid, requester: [nspace, rank], targets: [[nspace, rank]...],
             action: kill | terminate | signal, signal}  -> {procs: n}

No targets means the requester's own namespace; a rank of
``PMIX_RANK_WILDCARD`` a whole namespace.  The master checks every target
before acting on any (:class:`MasterJobControl`): the job must be running
(``PMIX_ERR_NOT_FOUND``), the rank one of its own (``PMIX_ERR_BAD_PARAM``),
and the job the requester's uid's (``PMIX_ERR_NO_PERMISSIONS``; root may
control every job).  Then:

* kill or terminate a whole namespace: the job is killed as ``pydvm kill``
  kills it (SIGTERM, SIGKILL after the grace), its ``pydvm run`` saying
  who asked;
* kill or terminate some ranks: each node hosting them ends them (kill:
  SIGKILL at once; terminate: SIGTERM, SIGKILL after the grace).  Their
  ends are no failures (the core's ``EndRequested``): the others run on and
  the job's exit status is theirs, as under ``mpirun`` and PRRTE, and the
  job's ``pydvm run`` reports each such process with who asked;
* signal: each node hosting a target sends the signal to its process group.

The answer comes once every node concerned has acted (``procs``: how many
processes were signalled or ended).  The requester's uid is that of the
session the process was registered with -- libpmix names the requester it
authenticated, and a user's agent (:mod:`pydvm.runtime.pmixhost.users`) may
relay only its own user's processes -- never anything the process claims.

Allocation requests
-------------------
A pydvm DVM has the nodes it was started with (``pydvm start --host``, or
the Slurm allocation it runs in): it can neither grow nor shrink for one
job.  Every :class:`~pydvm.pmix.requests.Allocate` (new, extend, release,
reacquire, external) is answered ``PMIX_ERR_NOT_SUPPORTED`` -- what
Open MPI 4.1's ``mpirun`` answers too -- at once, on the node, and an
unknown directive ``PMIX_ERR_BAD_PARAM``.  What the DVM has is for
``PMIx_Query_info`` (``PMIX_NODE_LIST``, ``PMIX_NUM_NODES``:
:mod:`pydvm.runtime.pmixhost.query`).
"""

from __future__ import annotations

import logging
import os
import signal as _signal
from typing import Any

from ...errors import Status
from ...pmix import constants as PC
from ...pmix import jobctl as J
from ...wire import Message, reply
from ..shared.jobs import ProcState

log = logging.getLogger("pydvm.pmix")

ACTIONS = ("kill", "terminate", "signal")


# --------------------------------------------------------------------------
# node side: the upcalls


def serve(host, req) -> None:
    """A JobControl upcall (loop thread), answered exactly once."""
    s = host.sessions.get((req.proc.nspace, req.proc.rank))
    if s is None or s.closed:
        req.reply.fail(Status.ERR_NO_PERMISSIONS)
        return
    try:
        action = J.action_of(req.directives, req.unreadable)
    except J.Refused as r:
        log.info("job control from %s refused: %s", req.proc, r)
        req.reply.fail(r.status)
        return
    if action is None:
        req.reply(Status.SUCCESS)
        return
    targets = [[p.nspace, p.rank] for p in req.procs] or \
        [[req.proc.nspace, PC.RANK_WILDCARD]]

    def answered(r: Message) -> None:
        status = r.get("status", Status.ERR_UNREACH)
        if status != Status.SUCCESS:
            log.info("job control from %s: %s", req.proc, r.get("msg"))
        req.reply(status)
    host.node.uplink.request({"t": "jobctl", "uid": s.caller.uid,
                              "requester": [req.proc.nspace, req.proc.rank],
                              "targets": targets, "action": action[0], "signal": action[1]},
                             answered)


def serve_allocate(host, req) -> None:
    """An Allocate upcall: refused, the DVM's nodes are fixed (module docstring)."""
    what = J.ALLOC_DIRECTIVES.get(req.directive)
    if what is None:
        req.reply.fail(Status.ERR_BAD_PARAM)
        return
    log.info("allocation request (%s) from %s: not supported, a DVM's nodes are fixed",
             what, req.proc)
    req.reply.fail(PC.ERR_NOT_SUPPORTED)


def on_master(node, ch, msg: Message) -> None:
    """The master's ``jobctl`` to a node: signal or end ranks of one of its jobs.

    ``{nspace, ranks, action, signal}`` -> ``{procs: n}`` (how many were
    running here and were acted on)."""
    rid = msg.get("id")
    job = node.jobs.get(msg.get("nspace"))
    ranks = msg.get("ranks") or []
    action, sig = msg.get("action"), msg.get("signal")
    if (action not in ACTIONS or not isinstance(ranks, list)
            or not all(isinstance(r, int) for r in ranks)
            or (action == "signal" and not (isinstance(sig, int) and 0 < sig <= J.MAX_SIGNAL))):
        ch.send(reply(rid, Status.ERR_BAD_PARAM, "malformed jobctl"))
        return
    procs = []
    if job is not None:
        procs = [lp for r in ranks if (lp := job.procs.get(r)) is not None
                 and not lp.ended and lp.pgid is not None]
    from ..shared import jobproc
    if action == "signal":
        for lp in procs:
            jobproc.signal_group(lp.pgid, int(sig))
    elif action == "kill":
        for lp in procs:
            jobproc.signal_group(lp.pgid, _signal.SIGKILL)
    elif procs:
        from ..shared.jobproc import KILL_GRACE
        node.spawn(node.kill_procs(procs, KILL_GRACE))
    ch.send(reply(rid, Status.SUCCESS, procs=len(procs)))


# --------------------------------------------------------------------------
# master side


class MasterJobControl:
    """Answers nodes' ``jobctl`` requests (see the module docstring)."""

    def __init__(self, processes, nodes) -> None:
        self._processes = processes
        self._nodes = nodes

    async def request(self, daemon, msg: Message) -> None:
        rid = msg.get("id")
        try:
            uid, who, action, sig, plan = self._check(msg)
        except _Refused as r:
            daemon.send(reply(rid, r.status, str(r)))
            return
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            daemon.send(reply(rid, Status.ERR_BAD_PARAM, f"malformed jobctl: {exc}"))
            return
        done = 0
        per_node: dict[tuple[str, str], list[int]] = {}
        for ns, ranks in plan.items():
            job = self._processes.jobs[ns]
            if ranks is None and action != "signal":
                self._processes.kill(ns, f"killed by PMIx_Job_control from {who} (uid {uid})")
                done += sum(1 for p in job.procs.values() if p.state is not ProcState.ENDED)
                continue
            for rank in sorted(job.procs) if ranks is None else sorted(ranks):
                p = job.procs[rank]
                if p.state is ProcState.RUNNING:
                    per_node.setdefault((ns, p.node), []).append(rank)
        if action != "signal":
            for ns in {ns for ns, _node in per_node}:
                self._processes.end_requested(
                    ns, [r for (n, _), rs in per_node.items() if n == ns for r in rs],
                    f"PMIx_Job_control from {who} (uid {uid})")
        for (ns, node), ranks in per_node.items():
            for _name, r in await self._nodes.broadcast(
                    {"t": "jobctl", "nspace": ns, "ranks": ranks, "action": action,
                     "signal": sig}, {node}, what="jobctl"):
                n = r.get("procs")
                done += n if isinstance(n, int) else 0
        log.info("job control from %s (uid %d): %s%s of %s: %d process(es)", who, uid, action,
                 f" {sig}" if action == "signal" else "", ", ".join(plan), done)
        daemon.send(reply(rid, Status.SUCCESS, procs=done))

    def _check(self, msg: Message):
        """``(uid, requester, action, signal, {nspace: ranks or None})``, or
        :class:`_Refused` naming the first target that may not be acted on."""
        uid, requester = msg["uid"], msg["requester"]
        action, sig, targets = msg["action"], msg.get("signal"), msg["targets"]
        if not isinstance(uid, int) or isinstance(uid, bool):
            raise ValueError("no uid")
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r}")
        if action == "signal" and not (isinstance(sig, int) and 0 < sig <= J.MAX_SIGNAL):
            raise _Refused(Status.ERR_BAD_PARAM, f"{sig!r} is not a signal number")
        if not isinstance(targets, list) or not targets:
            raise ValueError("no targets")
        who = f"{requester[0]}:{requester[1]}"
        plan: dict[str, set[int] | None] = {}
        for ns, rank in targets:
            job = self._processes.jobs.get(ns) if isinstance(ns, str) else None
            if job is None or job.done:
                raise _Refused(Status.ERR_NOT_FOUND, f"no running job {ns!r}")
            if not self._may(uid, job):
                raise _Refused(Status.ERR_NO_PERMISSIONS,
                               f"{ns} is not a job of uid {uid} (only root controls "
                               "other users' jobs)")
            if rank == PC.RANK_WILDCARD:
                plan[ns] = None
            elif isinstance(rank, int) and rank in job.procs:
                if plan.get(ns, set()) is not None:
                    plan.setdefault(ns, set()).add(rank)
            else:
                raise _Refused(Status.ERR_BAD_PARAM, f"{ns} has no rank {rank!r}")
        return uid, who, action, int(sig or 0), plan

    @staticmethod
    def _may(uid: int, job: Any) -> bool:
        if uid == 0 or job.uid == uid:
            return True
        return job.uid is None and uid == os.geteuid()


class _Refused(Exception):
    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status
