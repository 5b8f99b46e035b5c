"""The master's side of PMIx: collectives across nodes, direct modex, abort, spawn.

Every node hosts its own libpmix server (:mod:`pydvm.runtime.pmixhost.host`),
which completes what involves only its own processes.  What spans nodes
comes here, from each node's uplink (a daemon's link, or the head node's
in-process one), as a request the master answers exactly once::

    fence       {procs: [[nspace, rank]...], data, collect, timeout}
                -> {data: every participating node's contribution, concatenated}
    connect     {procs}  -> {layouts: {nspace: layout}} of every participating job
    disconnect  {procs}  -> {}
    group       {procs, op: construct | destruct, grpid, data, ctxid}
                -> {data, ctxid}: a PMIx group, collected like a fence
    dmodex      {nspace, rank} -> {data}: the master asks the node hosting that
                rank (``dmodex`` down to it), which asks its libpmix server
    abort       {nspace, rank, status, msg} -> {}: the job is killed and its
                ``pydvm run`` exits with that status, saying so
    spawn       {parent: [nspace, rank], apps: [...]} -> {nspace}: a child job
                in the parent's session, launched like any job, whose output
                goes to the parent's ``pydvm run`` (which waits for it)
    notify      {source, code, range, info} -> {}: a client's event, passed to
                the other nodes in its range
    query       {uid, node, queries} -> {results}: PMIx_Query_info, answered by
                :class:`~pydvm.runtime.pmixhost.query.MasterQueries`
    jobctl      {uid, requester, targets, action, signal} -> {procs}:
                PMIx_Job_control, :class:`~pydvm.runtime.pmixhost.jobctl.MasterJobControl`

A **collective** (fence, connect, disconnect) is identified by its kind and
its participants (a rank of ``RANK_WILDCARD`` stands for the whole
namespace): each node hosting a participant contributes once, and when the
last expected node has, every contributor is answered.  It never hangs:
a ``timeout`` the fence carries, the loss of a contributing node, and the
end of any participating process before the collective completed all
answer every contributor with an error.

:class:`Collectives` owns the collectives in progress and the group
context ids handed out.  Jobs, processes and the one "is this a running
process of that node" predicate are the process table's; which nodes host
PMIx, and delivering an event through them, the node table's.  A spawned
job is planned and launched by the process table like any job
(:meth:`~pydvm.runtime.master.processes.ProcessTable.launch_child`).  Collectives
hear of ended processes and lost nodes as a
:class:`~pydvm.runtime.master.processes.ProcessListener` and a
:class:`~pydvm.runtime.master.nodes.NodeListener`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
from dataclasses import dataclass, field
from typing import Any

from ...errors import Status
from ...pmix import constants as PC
from ...pmix.constants import RANK_WILDCARD
from ...wire import Message, reply
from ..shared.jobs import DEFAULT_SESSION
from ..shared.jobs import JobRecord, ProcState
from ..shared.peers import DaemonSession
from .nodes import NodeListener, NodeTable
from .processes import ProcessListener, ProcessTable
from .tasks import Tasks

log = logging.getLogger("pydvm.master")

COLLECTIVES = frozenset({"fence", "connect", "disconnect", "group"})
#: Every PMIx request a node's uplink sends the master (:meth:`Collectives.request`).
PMIX_REQUESTS = COLLECTIVES | {"dmodex", "abort", "spawn", "notify", "query", "jobctl"}


def _lost_status(key: tuple) -> int:
    """The status a collective ends with when a participant is gone: PMIx's
    for a group construct (as PRRTE answers it), else PMIX_ERR_UNREACH."""
    if key[0] == "group" and key[2] == "construct":
        return PC.GROUP_CONSTRUCT_ABORT
    return Status.ERR_UNREACH


@dataclass
class Collective:
    """One fence / connect / disconnect / group operation in progress."""

    kind: str
    procs: tuple[tuple[str, int], ...]
    #: nodes that must contribute.
    expected: set[str]
    #: node -> (its daemon link, its request id, its data).
    contributed: dict[str, tuple[DaemonSession, Any, bytes]] = field(default_factory=dict)
    collect: bool = False
    #: a group construct asked for a context id (PMIX_GROUP_ASSIGN_CONTEXT_ID).
    ctxid: bool = False
    timer: asyncio.TimerHandle | None = None


class Collectives(ProcessListener, NodeListener):
    """PMIx across nodes (see the module docstring)."""

    def __init__(self, processes: ProcessTable, nodes: NodeTable, tasks: Tasks) -> None:
        self._processes = processes
        self._nodes = nodes
        self._tasks = tasks
        #: (kind, participants[, op, grpid]) -> the collective in progress.
        self._pending: dict[tuple, Collective] = {}
        #: the last PMIx group context id handed out (unique in the DVM's life).
        self._next_ctxid = 0
        from ..pmixhost import MasterQueries
        self._queries = MasterQueries(processes, nodes)
        from ..pmixhost import MasterJobControl
        self._jobctl = MasterJobControl(processes, nodes)

    def count(self) -> int:
        """Collectives in progress (``pydvm info``'s records)."""
        return len(self._pending)

    # ------------------------------------------------------------------
    # dispatch
    # ------------------------------------------------------------------

    def request(self, daemon: DaemonSession, msg: Message) -> None:
        """One of :data:`PMIX_REQUESTS` from a node's uplink; answered exactly once."""
        t = msg["t"]
        rid = msg.get("id")
        try:
            if t in COLLECTIVES:
                self._contribute(daemon, msg)
            elif t == "dmodex":
                self._dmodex(daemon, msg)
            elif t == "abort":
                self._abort(daemon, msg)
            elif t == "spawn":
                self._tasks.start(self._spawn_job(daemon, msg), (daemon.channel, rid))
            elif t == "notify":
                self._tasks.start(self._client_event(daemon, msg), (daemon.channel, rid))
            elif t == "query":
                self._tasks.start(self._queries.request(daemon, msg), (daemon.channel, rid))
            elif t == "jobctl":
                self._tasks.start(self._jobctl.request(daemon, msg), (daemon.channel, rid))
        except (ValueError, TypeError, KeyError) as exc:
            daemon.send(reply(rid, Status.ERR_BAD_PARAM, f"malformed {t}: {exc}"))

    # ------------------------------------------------------------------
    # collectives
    # ------------------------------------------------------------------

    def _participant_nodes(self, procs) -> set[str]:
        nodes: set[str] = set()
        for ns, rank in procs:
            job = self._processes.jobs.get(ns)
            if job is None:
                raise ValueError(f"no running job {ns!r}")
            if rank == RANK_WILDCARD:
                nodes |= job.nodes()
            elif rank in job.procs:
                nodes.add(job.procs[rank].node)
            else:
                raise ValueError(f"{ns} has no rank {rank}")
        return nodes

    def _ended_participant(self, procs) -> str:
        """A participant (``ns:rank``) that has already ended, or ''."""
        for ns, rank in procs:
            job = self._processes.jobs.get(ns)
            if job is None:
                return f"{ns}:*"
            ranks = job.procs.values() if rank == RANK_WILDCARD else \
                [job.procs[rank]] if rank in job.procs else []
            for p in ranks:
                if p.state is ProcState.ENDED:
                    return f"{ns}:{p.rank}"
        return ""

    def _contribute(self, daemon: DaemonSession, msg: Message) -> None:
        procs = tuple(sorted((str(p[0]), int(p[1])) for p in msg["procs"]))
        if not procs:
            raise ValueError("no participants")
        kind = msg["t"]
        key: tuple = (kind, procs)
        if kind == "group":
            op = msg["op"]
            if op not in ("construct", "destruct"):
                raise ValueError(f"unknown group operation {op!r}")
            key = (kind, procs, op, str(msg["grpid"]))
        coll = self._pending.get(key)
        if coll is None:
            gone = self._ended_participant(procs)
            if gone:
                # it can never contribute: answer now rather than wait forever
                daemon.send(reply(msg.get("id"), _lost_status(key),
                                  f"{kind}: participant {gone} has ended"))
                return
            coll = Collective(kind, procs, self._participant_nodes(procs))
            self._pending[key] = coll
            timeout = msg.get("timeout")
            if isinstance(timeout, int) and timeout > 0:
                coll.timer = asyncio.get_running_loop().call_later(
                    timeout, self._fail, key, Status.ERR_TIMEOUT,
                    f"{kind} not complete within {timeout}s")
        if daemon.node not in coll.expected or daemon.node in coll.contributed:
            daemon.send(reply(msg.get("id"), Status.ERR_BAD_PARAM,
                              f"node {daemon.node} is not expected in this {kind}"))
            return
        data = msg.get("data") or b""
        coll.collect = coll.collect or bool(msg.get("collect")) or kind == "group"
        coll.ctxid = coll.ctxid or bool(msg.get("ctxid"))
        coll.contributed[daemon.node] = (daemon, msg.get("id"), bytes(data))
        if len(coll.contributed) == len(coll.expected):
            self._complete(key)

    def _complete(self, key: tuple) -> None:
        coll = self._pending.pop(key)
        if coll.timer is not None:
            coll.timer.cancel()
        extra: dict[str, Any] = {}
        if coll.kind in ("fence", "group"):
            extra["data"] = b"".join(d for _, _, d in coll.contributed.values()) \
                if coll.collect else b""
        if coll.ctxid and key[2] == "construct":
            self._next_ctxid += 1
            extra["ctxid"] = self._next_ctxid
        elif coll.kind == "connect":
            jobs = self._processes.jobs
            extra["layouts"] = {ns: self._processes.layout(jobs[ns])
                                for ns in {p[0] for p in coll.procs} if ns in jobs}
        log.debug("%s of %s complete on node(s) %s", coll.kind, coll.procs,
                  ", ".join(sorted(coll.contributed)))
        for daemon, rid, _ in coll.contributed.values():
            daemon.send(reply(rid, Status.SUCCESS, **extra))

    def _fail(self, key: tuple, status: Status, why: str) -> None:
        coll = self._pending.pop(key, None)
        if coll is None:
            return
        if coll.timer is not None:
            coll.timer.cancel()
        log.warning("%s of %d participant(s) failed: %s", coll.kind, len(coll.procs), why)
        for daemon, rid, _ in coll.contributed.values():
            daemon.send(reply(rid, status, why))

    def proc_ended(self, nspace: str, rank: int) -> None:
        """A process ended: a collective it takes part in can no longer complete."""
        for key, coll in list(self._pending.items()):
            if any(ns == nspace and r in (rank, RANK_WILDCARD) for ns, r in coll.procs):
                self._fail(key, _lost_status(key), f"participant {nspace}:{rank} ended")

    def node_lost(self, name: str, reason: str) -> None:
        for key, coll in list(self._pending.items()):
            if name in coll.expected:
                self._fail(key, _lost_status(key), f"node {name} was lost")

    # ------------------------------------------------------------------
    # events a client raised
    # ------------------------------------------------------------------

    async def _client_event(self, daemon: DaemonSession, msg: Message) -> None:
        """A client's ``PMIx_Notify_event`` beyond its node: libpmix there has
        delivered it to that node's clients; pass it to the other nodes in
        its range (and answer the origin once they have)."""
        rid = msg.get("id")
        code, rng = int(msg["code"]), int(msg["range"])
        ns, rank = str(msg["source"][0]), int(msg["source"][1])
        info = list(msg.get("info") or [])
        from . import debugging
        tool_uid = msg.get("tool_uid")
        if tool_uid is not None and self._nodes.trusts_tools(daemon):
            # a PMIx tool attached to the tool server of this process's node
            # (the head node's, or the tool side's: runtime/pmixhost/tools.py): the
            # nodes of its user's jobs, and when other users' jobs run too,
            # only its user's processes (a custom range)
            uid = int(tool_uid)
            debugging.released_by_event(self._processes.jobs, code, rng, info, uid)
            nodes, skip = self._beyond_origin(daemon, msg, self._tool_event_nodes(uid, rng))
            mine = [j.nspace for j in self._processes.jobs.values()
                    if not j.done and (uid == 0 or j.uid is None or j.uid == uid)]
            if nodes and any(not j.done and j.nspace not in mine
                             for j in self._processes.jobs.values()):
                rng = PC.RANGE_CUSTOM
                info = [i for i in info if i[0] != PC.EVENT_CUSTOM_RANGE] + [
                    [PC.EVENT_CUSTOM_RANGE, PC.DATA_ARRAY,
                     [PC.PROC, [[n, RANK_WILDCARD] for n in mine]]]]
            await self._nodes.deliver_event(nodes, code, (ns, rank), rng, info, skip)
            daemon.send(reply(rid, Status.SUCCESS))
            return
        if code == PC.READY_FOR_DEBUG:
            # a process stopped in PMIx_Init for a debugger (range RM): the
            # host's to know, not passed to the other nodes.  libpmix 4.2.2
            # names no rank here (runtime/master/debugging.py): noted per node.
            job = self._processes.jobs.get(ns)
            if job is not None and daemon.node in job.nodes():
                debugging.note_ready(job, daemon.node)
            daemon.send(reply(rid, Status.SUCCESS))
            return
        why = self._processes.refusal(ns, rank, daemon.node)
        if why:
            daemon.send(reply(rid, Status.ERR_NO_PERMISSIONS, why))
            return
        src_uid = self._processes.jobs[ns].uid
        debugging.released_by_event(self._processes.jobs, code, rng, info,
                                    0 if src_uid is None else src_uid)
        nodes, skip = self._beyond_origin(daemon, msg,
                                          self._event_nodes(self._processes.jobs[ns], rng, info))
        await self._nodes.deliver_event(nodes, code, (ns, rank), rng, info, skip)
        daemon.send(reply(rid, Status.SUCCESS))

    @staticmethod
    def _beyond_origin(daemon: DaemonSession, msg: Message, nodes: set[str]
                       ) -> tuple[set[str], tuple[str, str] | None]:
        """Where an event from ``daemon``'s node goes, of ``nodes`` in its
        range: libpmix has delivered it to the clients of the server it came
        from; the origin node stays a target only if it has other servers
        (``server`` names the origin's: PMIx agents, runtime/pmixhost/users.py),
        which then skips that one."""
        origin = msg.get("server")
        if isinstance(origin, str) and (daemon.node in nodes
                                        or msg.get("range") == PC.RANGE_LOCAL):
            return nodes | {daemon.node}, (daemon.node, origin)
        return nodes - {daemon.node}, None

    def _tool_event_nodes(self, uid: int, rng: int) -> set[str]:
        """Where a tool's event goes: the nodes of its user's running jobs
        (root: every job's), unless its range stays on its own node."""
        if rng in (PC.RANGE_LOCAL, PC.RANGE_PROC_LOCAL, PC.RANGE_NAMESPACE):
            return set()
        return {n for j in self._processes.jobs.values()
                if not j.done and (uid == 0 or j.uid is None or j.uid == uid)
                for n in j.nodes()}

    def _event_nodes(self, job: JobRecord, rng: int, info: list) -> set[str]:
        """The nodes whose processes an event of ``job``'s with range ``rng`` may reach."""
        jobs = self._processes.jobs
        if rng in (PC.RANGE_LOCAL, PC.RANGE_PROC_LOCAL):
            return set()
        if rng == PC.RANGE_NAMESPACE:
            return job.nodes()
        if rng == PC.RANGE_SESSION:
            return {n for j in jobs.values() if j.session_id == job.session_id
                    for n in j.nodes()}
        if rng == PC.RANGE_CUSTOM:
            nodes: set[str] = set()
            for key, t, v in info:
                if key != PC.EVENT_CUSTOM_RANGE:
                    continue
                procs = [v] if t == PC.PROC else v[1] if t == PC.DATA_ARRAY and v else []
                for p in procs:
                    target = jobs.get(str(p[0]))
                    if target is None:
                        continue
                    if int(p[1]) == RANK_WILDCARD:
                        nodes |= target.nodes()
                    elif int(p[1]) in target.procs:
                        nodes.add(target.procs[int(p[1])].node)
            return nodes
        return set(self._nodes.up_names())  # GLOBAL, RM, UNDEF

    # ------------------------------------------------------------------
    # direct modex, abort
    # ------------------------------------------------------------------

    def _dmodex(self, daemon: DaemonSession, msg: Message) -> None:
        rid = msg.get("id")
        ns, rank = msg["nspace"], msg["rank"]

        def answered(r: Message) -> None:
            daemon.send(reply(rid, r.get("status", Status.ERR_UNREACH), r.get("msg", ""),
                              data=r.get("data") or b""))
        why = self._processes.refusal(ns, rank)
        if not why:
            node = self._processes.jobs[ns].procs[rank].node
            if self._nodes.request(node, {"t": "dmodex", "nspace": ns, "rank": rank}, answered):
                return
            why = f"process {ns}:{rank}'s node {node} is not available"
        daemon.send(reply(rid, Status.ERR_NOT_FOUND, why))

    def _abort(self, daemon: DaemonSession, msg: Message) -> None:
        ns, rank, status = msg["nspace"], msg["rank"], int(msg["status"])
        why = self._processes.refusal(ns, rank, daemon.node)
        if why:
            daemon.send(reply(msg.get("id"), Status.ERR_NO_PERMISSIONS, why))
            return
        api = "PMI_Abort" if msg.get("api") == "PMI_Abort" else "PMIx_Abort"
        why = f"process {ns}:{rank} called {api} with status {status}"
        if msg.get("msg"):
            why += f": {msg['msg']}"
        if isinstance(msg.get("why"), str) and msg["why"]:
            why = msg["why"]  # the node's own words (runtime/node/pmi1host.py: a wrong interface)
        log.warning("%s", why)
        self._processes.abort(ns, rank, status, why)
        daemon.send(reply(msg.get("id"), Status.SUCCESS))

    # ------------------------------------------------------------------
    # PMIx spawn
    # ------------------------------------------------------------------

    async def _spawn_job(self, daemon: DaemonSession, msg: Message) -> None:
        """Launch the child job of a ``PMIx_Spawn`` (MPI_Comm_spawn) and answer
        with its namespace once every node started its share."""
        from . import debugging
        rid = msg.get("id")
        pns, prank = msg["parent"]
        refused = msg.get("refused")
        if refused:
            daemon.send(reply(rid, int(refused[0]), f"cannot spawn: {refused[1]}"))
            return
        tool_uid = msg.get("tool_uid")
        parent = None
        if tool_uid is not None and self._nodes.trusts_tools(daemon):
            # a PMIx tool attached to this process's tool server (the head
            # node's or the tool side's, runtime/pmixhost/tools.py): the job is its
            # user's, in the default session, with a login's basics
            uid, gid, session = int(tool_uid), int(msg.get("tool_gid") or 0), DEFAULT_SESSION
            env, cwd = debugging.tool_environment(uid)
        else:
            parent = self._processes.jobs.get(pns)
            if parent is None or parent.procs.get(prank) is None:
                daemon.send(reply(rid, Status.ERR_NOT_FOUND,
                                  f"no running process {pns}:{prank}"))
                return
            uid, gid, session = parent.uid, parent.gid, parent.session_id
            env, cwd = self._processes.launch_env(pns)
        apps = []
        app_envs = []
        for a in msg["apps"]:
            argv = [str(x) for x in (a.get("argv") or [])]
            cmd = a.get("cmd")
            # argv[0] names the program when it is the command or a path to it
            # (OpenPMIx's debugger.c: cmd "client", argv ["./client"], in cwd)
            if cmd and (not argv or os.path.basename(argv[0]) != os.path.basename(cmd)):
                argv = [cmd] + argv
            if not argv:
                raise ValueError("a spawned application needs a command")
            n = int(a.get("maxprocs") or 1)
            apps.append({"argv": argv, "n": max(1, n), "hosts": None})
            extra = {}
            for kv in a.get("env") or ():
                k, sep, v = str(kv).partition("=")
                if sep:
                    extra[k] = v
            app_envs.append((extra, a.get("cwd") or cwd))
        target = msg.get("debug_target")
        try:
            if target is not None:  # debugger daemons, next to the target's processes
                tjob = self._processes.jobs.get(str(target[0]))
                if tjob is None or tjob.done:
                    raise debugging.SpawnRefused(Status.ERR_NOT_FOUND, f"PMIX_DEBUG_TARGET: no "
                                                 f"running job {target[0]}")
                if uid not in (0, None) and tjob.uid not in (None, uid):
                    raise debugging.SpawnRefused(Status.ERR_NO_PERMISSIONS,
                                                 f"PMIX_DEBUG_TARGET: {tjob.nspace} is not "
                                                 f"a job of uid {uid}")
                if len(apps) != 1:
                    raise debugging.SpawnRefused(Status.ERR_BAD_PARAM, "debugger daemons are "
                                                 "one application")
                hosts = debugging.daemon_hosts(tjob, int(target[1]),
                                               msg.get("daemons_per_node"),
                                               msg.get("daemons_per_proc"))
                apps[0]["hosts"] = hosts
                apps[0]["n"] = sum(h[1] for h in hosts)
            request = {"session": session, "apps": apps, "env": env, "cwd": cwd,
                       "_uid": uid, "_gid": gid,
                       "stop_in_init": msg.get("stop_in_init") is True}
            if msg.get("mpi") == "pmi1":  # MPI_Comm_spawn of an MPICH-family job
                request["mpi"] = "pmi1"
                request["preput"] = msg.get("preput") or {}
            job, per_node = self._processes.plan(request)
        except debugging.SpawnRefused as exc:
            daemon.send(reply(rid, exc.status, f"cannot spawn: {exc}"))
            return
        except ValueError as exc:
            daemon.send(reply(rid, Status.ERR_BAD_PARAM, f"cannot spawn: {exc}"))
            return
        if target is not None:
            job.debug_target = (str(target[0]), int(target[1]))
        for entries in per_node.values():
            for p in entries:
                extra, app_cwd = app_envs[p["app_idx"]]
                p["pmix_env"] = extra
                p["cwd"] = app_cwd
        for a, (_, app_cwd) in zip(job.apps, app_envs):
            a.cwd = app_cwd
        log.info("%s:%d spawns job %s: %s", pns, prank, job.nspace,
                 " : ".join(shlex.join(a["argv"]) for a in apps))
        if parent is None:
            # a tool's: nobody forwards its output (PMIX_FWD_STDOUT is not
            # served); it ends on its own, or by pydvm kill / PMIx_Job_control
            job.discard_output = True
            failed = await self._processes.launch_detached(job, per_node, (pns, prank))
        else:
            job.parent = (pns, prank)
            # a spawned job fails as its parent does (MPI_Comm_spawn's children are MPI)
            job.abort_on_failure = parent.abort_on_failure
            if parent.pmix_required and job.mpi != "pmi1":
                job.pmix_required, job.mpi = True, "pmix"
            failed = await self._processes.launch_child((pns, prank), job, per_node)
        if failed:
            daemon.send(reply(rid, Status.ERR_NOT_FOUND, f"cannot spawn: {failed}"))
        else:
            daemon.send(reply(rid, Status.SUCCESS, nspace=job.nspace))
