"""The master's side of PMIx: collectives across nodes, direct modex, abort, spawn.

Every node hosts its own libpmix server (:mod:`pydvm.runtime.pmixhost`),
which completes what involves only its own processes.  What spans nodes
comes here, from each node's uplink (a daemon's link, or the head node's
in-process one), as a request the master answers exactly once::

    fence       {procs: [[nspace, rank]...], data, collect, timeout}
                -> {data: every participating node's contribution, concatenated}
    connect     {procs}  -> {layouts: {nspace: layout}} of every participating job
    disconnect  {procs}  -> {}
    dmodex      {nspace, rank} -> {data}: the master asks the node hosting that
                rank (``dmodex`` down to it), which asks its libpmix server
    abort       {nspace, rank, status, msg} -> {}: the job is killed and its
                ``pydvm run`` exits with that status, saying so
    spawn       {parent: [nspace, rank], apps: [...]} -> {nspace}: a child job
                in the parent's session, launched like any job, whose output
                goes to the parent's ``pydvm run`` (which waits for it)

A **collective** (fence, connect, disconnect) is identified by its kind and
its participants (a rank of ``RANK_WILDCARD`` stands for the whole
namespace): each node hosting a participant contributes once, and when the
last expected node has, every contributor is answered.  It never hangs:
a ``timeout`` the fence carries, the loss of a contributing node, and the
end of any participating process before the collective completed all
answer every contributor with an error.

This is one concern of :class:`~pydvm.runtime.master.Master`, written as a
mixin; it owns ``_collectives``, ``_pmix_nodes``, ``_job_launch`` and
``_children``.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import Status
from ..pmix import constants as PC
from ..wire import Message, reply
from . import core
from .jobs import JobRecord, ProcState
from .peers import DaemonSession

if TYPE_CHECKING:
    from .master import Master

log = logging.getLogger("pydvm.master")

#: PMIx's wildcard rank: the whole namespace.
RANK_WILDCARD = 0xFFFFFFFE
COLLECTIVES = frozenset({"fence", "connect", "disconnect", "group"})
PMIX_REQUESTS = COLLECTIVES | {"dmodex", "abort", "spawn", "notify"}


def _lost_status(key: tuple) -> int:
    """The status a collective ends with when a participant is gone: PMIx's
    for a group construct (as PRRTE answers it), else PMIX_ERR_UNREACH."""
    if key[0] == "group" and key[2] == "construct":
        return PC.GROUP_CONSTRUCT_ABORT
    return Status.ERR_UNREACH


@dataclass
class Collective:
    """One fence / connect / disconnect in progress."""

    kind: str
    procs: tuple[tuple[str, int], ...]
    #: nodes that must contribute.
    expected: set[str]
    #: node -> (its session, its request id, its data).
    contributed: dict[str, tuple[DaemonSession, Any, bytes]] = field(default_factory=dict)
    collect: bool = False
    #: a group construct asked for a context id (PMIX_GROUP_ASSIGN_CONTEXT_ID).
    ctxid: bool = False
    timer: asyncio.TimerHandle | None = None


class CollectivesMixin:
    """Fence, connect, disconnect, direct modex, abort, spawn (see the module docstring)."""

    #: (kind, participants) -> the collective in progress.
    _collectives: dict[tuple, Collective]
    #: node -> [available, version or reason, path] as its node server reported.
    _pmix_nodes: dict[str, list]
    #: nspace -> (env, cwd) it was launched with (a spawn's defaults).
    _job_launch: dict[str, tuple[dict, str]]
    #: nspace -> futures of the child jobs it spawned (its end waits for them).
    _children: dict[str, list[asyncio.Future]]

    # ------------------------------------------------------------------
    # what the launch message carries
    # ------------------------------------------------------------------

    def _pmix_layout(self: "Master", job: JobRecord, parent: tuple[str, int] | None = None
                     ) -> dict:
        """The whole job as each node registers it with libpmix: node -> ranks
        (nodes in rank order of first appearance), procs per application, parent."""
        nodes: dict[str, list[int]] = {}
        for rank in sorted(job.procs):
            nodes.setdefault(job.procs[rank].node, []).append(rank)
        ids = {name: i for i, name in enumerate(self.nodes)}
        session = self.sessions.get(job.session_id)
        slots = sum(h.slots for h in session.hosts) if session is not None else 0
        if parent is None:
            parent = job.parent
        return {"nodes": nodes, "apps": [len(a.ranks) for a in job.apps],
                "parent": list(parent) if parent else None, "session_id": job.session_id,
                "node_ids": {n: ids[n] for n in nodes if n in ids},
                "univ_size": max(slots, job.size),
                "argv": [list(a.argv) for a in job.apps],
                "wdir": [a.cwd for a in job.apps]}

    def _pmix_launch_fields(self: "Master", job: JobRecord, per_node: dict[str, list[dict]],
                            parent: tuple[str, int] | None = None) -> dict:
        """Fields added to every ``launch`` of ``job`` (see lifetimes._run_job)."""
        first = next(iter(per_node.values()), [{}])[0]
        self._job_launch[job.nspace] = (dict(first.get("env") or {}), first.get("cwd") or "/")
        return {"pmix": self._pmix_layout(job, parent)}

    def _pmix_check(self: "Master", job: JobRecord, required: bool) -> str:
        """'' if ``job`` may run; else why not (``pydvm run --pmix``: PMIx on every node)."""
        if not required:
            return ""
        missing = [f"{n} ({(self._pmix_nodes.get(n) or [False, 'not reported'])[1]})"
                   for n in sorted(job.nodes()) if not (self._pmix_nodes.get(n) or [False])[0]]
        if missing:
            return "PMIx is required (--pmix) but not available on: " + ", ".join(missing)
        return ""

    async def _children_done(self: "Master", nspace: str) -> None:
        """Wait for the jobs ``nspace`` spawned (its ``pydvm run`` reports after them)."""
        kids = self._children.pop(nspace, [])
        if kids:
            await asyncio.wait(kids)
        self._job_launch.pop(nspace, None)

    # ------------------------------------------------------------------
    # dispatch
    # ------------------------------------------------------------------

    def _on_pmix_request(self: "Master", session: DaemonSession, msg: Message) -> None:
        t = msg["t"]
        rid = msg.get("id")
        try:
            if t in COLLECTIVES:
                self._contribute(session, msg)
            elif t == "dmodex":
                self._dmodex(session, msg)
            elif t == "abort":
                self._abort(session, msg)
            elif t == "spawn":
                self._spawn(self._spawn_job(session, msg), (session.channel, rid))
            elif t == "notify":
                self._spawn(self._client_event(session, msg), (session.channel, rid))
        except (ValueError, TypeError, KeyError) as exc:
            session.send(reply(rid, Status.ERR_BAD_PARAM, f"malformed {t}: {exc}"))

    # ------------------------------------------------------------------
    # collectives
    # ------------------------------------------------------------------

    def _participant_nodes(self: "Master", procs) -> set[str]:
        nodes: set[str] = set()
        for ns, rank in procs:
            job = self.jobs.get(ns)
            if job is None:
                raise ValueError(f"no running job {ns!r}")
            if rank == RANK_WILDCARD:
                nodes |= job.nodes()
            elif rank in job.procs:
                nodes.add(job.procs[rank].node)
            else:
                raise ValueError(f"{ns} has no rank {rank}")
        return nodes

    def _ended_participant(self: "Master", procs) -> str:
        """A participant (``ns:rank``) that has already ended, or ''."""
        for ns, rank in procs:
            job = self.jobs.get(ns)
            if job is None:
                return f"{ns}:*"
            ranks = job.procs.values() if rank == RANK_WILDCARD else \
                [job.procs[rank]] if rank in job.procs else []
            for p in ranks:
                if p.state is ProcState.ENDED:
                    return f"{ns}:{p.rank}"
        return ""

    def _contribute(self: "Master", session: DaemonSession, msg: Message) -> None:
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
        coll = self._collectives.get(key)
        if coll is None:
            gone = self._ended_participant(procs)
            if gone:
                # it can never contribute: answer now rather than wait forever
                session.send(reply(msg.get("id"), _lost_status(key),
                                   f"{kind}: participant {gone} has ended"))
                return
            coll = Collective(kind, procs, self._participant_nodes(procs))
            self._collectives[key] = coll
            timeout = msg.get("timeout")
            if isinstance(timeout, int) and timeout > 0:
                coll.timer = asyncio.get_running_loop().call_later(
                    timeout, self._fail_collective, key, Status.ERR_TIMEOUT,
                    f"{kind} not complete within {timeout}s")
        if session.node not in coll.expected or session.node in coll.contributed:
            session.send(reply(msg.get("id"), Status.ERR_BAD_PARAM,
                               f"node {session.node} is not expected in this {kind}"))
            return
        data = msg.get("data") or b""
        coll.collect = coll.collect or bool(msg.get("collect")) or kind == "group"
        coll.ctxid = coll.ctxid or bool(msg.get("ctxid"))
        coll.contributed[session.node] = (session, msg.get("id"), bytes(data))
        if len(coll.contributed) == len(coll.expected):
            self._complete(key)

    def _complete(self: "Master", key: tuple) -> None:
        coll = self._collectives.pop(key)
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
            extra["layouts"] = {ns: self._pmix_layout(self.jobs[ns])
                                for ns in {p[0] for p in coll.procs} if ns in self.jobs}
        log.debug("%s of %s complete on node(s) %s", coll.kind, coll.procs,
                  ", ".join(sorted(coll.contributed)))
        for session, rid, _ in coll.contributed.values():
            session.send(reply(rid, Status.SUCCESS, **extra))

    def _fail_collective(self: "Master", key: tuple, status: Status, why: str) -> None:
        coll = self._collectives.pop(key, None)
        if coll is None:
            return
        if coll.timer is not None:
            coll.timer.cancel()
        log.warning("%s of %d participant(s) failed: %s", coll.kind, len(coll.procs), why)
        for session, rid, _ in coll.contributed.values():
            session.send(reply(rid, status, why))

    def _collectives_member_ended(self: "Master", nspace: Any, rank: Any) -> None:
        """A process ended: a collective it takes part in can no longer complete."""
        for key, coll in list(self._collectives.items()):
            if any(ns == nspace and r in (rank, RANK_WILDCARD) for ns, r in coll.procs):
                self._fail_collective(key, _lost_status(key),
                                      f"participant {nspace}:{rank} ended")
        job = self.jobs.get(nspace)
        if job is not None and job.done:
            self._job_launch.pop(nspace, None)

    def _collectives_node_gone(self: "Master", node: str) -> None:
        for key, coll in list(self._collectives.items()):
            if node in coll.expected:
                self._fail_collective(key, _lost_status(key), f"node {node} was lost")

    # ------------------------------------------------------------------
    # events a client raised
    # ------------------------------------------------------------------

    async def _client_event(self: "Master", session: DaemonSession, msg: Message) -> None:
        """A client's ``PMIx_Notify_event`` beyond its node: libpmix there has
        delivered it to that node's clients; pass it to the other nodes in
        its range (and answer the origin once they have)."""
        rid = msg.get("id")
        code, rng = int(msg["code"]), int(msg["range"])
        ns, rank = str(msg["source"][0]), int(msg["source"][1])
        job = self.jobs.get(ns)
        if job is None or job.procs.get(rank) is None or job.procs[rank].node != session.node:
            session.send(reply(rid, Status.ERR_NO_PERMISSIONS,
                               f"{ns}:{rank} is not a running process of node {session.node}"))
            return
        info = list(msg.get("info") or [])
        nodes = self._event_nodes(job, rng, info) - {session.node}
        await self._notify_nodes(nodes, code, (ns, rank), rng, info)
        session.send(reply(rid, Status.SUCCESS))

    def _event_nodes(self: "Master", job: JobRecord, rng: int, info: list) -> set[str]:
        """The nodes whose processes an event of ``job``'s with range ``rng`` may reach."""
        if rng in (PC.RANGE_LOCAL, PC.RANGE_PROC_LOCAL):
            return set()
        if rng == PC.RANGE_NAMESPACE:
            return job.nodes()
        if rng == PC.RANGE_SESSION:
            return {n for j in self.jobs.values() if j.session_id == job.session_id
                    for n in j.nodes()}
        if rng == PC.RANGE_CUSTOM:
            nodes: set[str] = set()
            for key, t, v in info:
                if key != PC.EVENT_CUSTOM_RANGE:
                    continue
                procs = [v] if t == PC.PROC else v[1] if t == PC.DATA_ARRAY and v else []
                for p in procs:
                    target = self.jobs.get(str(p[0]))
                    if target is None:
                        continue
                    if int(p[1]) == RANK_WILDCARD:
                        nodes |= target.nodes()
                    elif int(p[1]) in target.procs:
                        nodes.add(target.procs[int(p[1])].node)
            return nodes
        return {n for n, rec in self.nodes.items() if rec.up}  # GLOBAL, RM, UNDEF

    # ------------------------------------------------------------------
    # direct modex, abort
    # ------------------------------------------------------------------

    def _dmodex(self: "Master", session: DaemonSession, msg: Message) -> None:
        rid = msg.get("id")
        ns, rank = msg["nspace"], msg["rank"]
        job = self.jobs.get(ns)
        proc = job.procs.get(rank) if job is not None else None
        node = self.nodes.get(proc.node) if proc is not None else None
        if proc is None or proc.state is ProcState.ENDED or node is None or not node.up:
            session.send(reply(rid, Status.ERR_NOT_FOUND, f"{ns}:{rank} is not running"))
            return

        def answered(r: Message) -> None:
            session.send(reply(rid, r.get("status", Status.ERR_UNREACH), r.get("msg", ""),
                               data=r.get("data") or b""))
        node.channel.request({"t": "dmodex", "nspace": ns, "rank": rank}, answered)

    def _abort(self: "Master", session: DaemonSession, msg: Message) -> None:
        ns, rank, status = msg["nspace"], msg["rank"], int(msg["status"])
        job = self.jobs.get(ns)
        if job is None or job.procs.get(rank) is None or job.procs[rank].node != session.node:
            session.send(reply(msg.get("id"), Status.ERR_NO_PERMISSIONS,
                               f"{ns}:{rank} is not a running process of node {session.node}"))
            return
        why = f"process {ns}:{rank} called PMIx_Abort with status {status}"
        if msg.get("msg"):
            why += f": {msg['msg']}"
        log.warning("%s", why)
        self._feed(core.AbortRequested(ns, rank, status, why))
        session.send(reply(msg.get("id"), Status.SUCCESS))

    # ------------------------------------------------------------------
    # spawn
    # ------------------------------------------------------------------

    async def _spawn_job(self: "Master", session: DaemonSession, msg: Message) -> None:
        """Launch the child job of a ``PMIx_Spawn`` (MPI_Comm_spawn) and answer
        with its namespace once every node started its share."""
        rid = msg.get("id")
        pns, prank = msg["parent"]
        parent = self.jobs.get(pns)
        if parent is None or parent.procs.get(prank) is None:
            session.send(reply(rid, Status.ERR_NOT_FOUND, f"no running process {pns}:{prank}"))
            return
        env, cwd = self._job_launch.get(pns, ({}, "/"))
        apps = []
        app_envs = []
        for a in msg["apps"]:
            argv = [str(x) for x in (a.get("argv") or [])]
            cmd = a.get("cmd")
            if cmd and (not argv or argv[0] != cmd):
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
        try:
            job, per_node = self._plan_job({"session": parent.session_id, "apps": apps,
                                            "env": env, "cwd": cwd,
                                            "_uid": parent.uid, "_gid": parent.gid})
        except ValueError as exc:
            session.send(reply(rid, Status.ERR_BAD_PARAM, f"cannot spawn: {exc}"))
            return
        for entries in per_node.values():
            for p in entries:
                extra, app_cwd = app_envs[p["app_idx"]]
                p["pmix_env"] = extra
                p["cwd"] = app_cwd
        for a, (_, app_cwd) in zip(job.apps, app_envs):
            a.cwd = app_cwd
        job.parent = (pns, prank)
        # a spawned job fails as its parent does (MPI_Comm_spawn's children are MPI)
        job.abort_on_failure = parent.abort_on_failure
        job.pmix_required = parent.pmix_required
        ns = job.nspace
        log.info("%s:%d spawns job %s: %s", pns, prank, ns,
                 " : ".join(shlex.join(a["argv"]) for a in apps))
        tool = self._job_tool.get(pns)
        if tool is not None:
            self._job_tool[ns] = tool
        done = self._job_done[ns] = asyncio.get_running_loop().create_future()
        self._children.setdefault(pns, []).append(done)
        failed = await self._launch_job(job, per_node, (pns, prank))  # lifetimes.py
        if failed:
            session.send(reply(rid, Status.ERR_NOT_FOUND, f"cannot spawn: {failed}"))
        else:
            session.send(reply(rid, Status.SUCCESS, nspace=ns))

        def ended(_f: asyncio.Future) -> None:
            self._job_tool.pop(ns, None)
            self._job_launch.pop(ns, None)
            self._children.pop(ns, None)  # jobs it spawned are not waited for by anyone
            if job.error and tool is not None:
                tool.send({"t": "output", "nspace": ns, "rank": -1, "fd": 2,
                           "data": f"pydvm run: spawned job {ns}: {job.error}\n".encode()})
        done.add_done_callback(ended)
