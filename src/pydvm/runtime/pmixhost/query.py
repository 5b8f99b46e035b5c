"""``PMIx_Query_info``: what a process or tool in a job may learn about the DVM.

A query libpmix cannot answer itself reaches a node's PMIx host
(:class:`~pydvm.pmix.requests.Query`); the node asks the master, which
holds the jobs, their processes and the nodes, with one request::

    query   {uid, node, queries: [[keys], {qualifier: value}]...}
            -> {results: [[key, form, data]...], refused: [reason...]}

and turns the answer into PMIx values.  Process ids are the nodes': the
master asks each node hosting a job's ranks for them (``pids`` down to it).

Who asks
--------
libpmix 4.2 hands the host its own server's identity, not the requester's.
A user's agent (runtime/pmixhost/users.py) serves only that user's processes, so
a query it relays is that user's.  The node's own server serves the DVM
owner's processes -- and, when a user's agent could not start, that user's
too: a query it relays is answered as the one user it serves, and refused
(``PMIX_ERR_NO_PERMISSIONS``) while it serves several.  The master answers
a user only about that user's jobs; root sees every job.

Keys (values as OpenPMIx 4.2.2's ``pmix_common.h`` types them)
--------------------------------------------------------------
``PMIX_QUERY_NAMESPACES`` (string, comma-separated), ``_NAMESPACE_INFO``
(array of info arrays: ``PMIX_NSPACE``, ``PMIX_CMD_LINE``), ``_JOB_STATUS``
(status: SUCCESS while the job runs unharmed, PMIX_ERROR once it failed or was
killed), ``_PROC_TABLE`` / ``_LOCAL_PROC_TABLE`` (array of
``pmix_proc_info_t``), ``PMIX_JOB_SIZE`` (uint32), ``PMIX_NODE_LIST``
(string) and ``PMIX_NUM_NODES`` (uint32) -- of the job named by a
``PMIX_NSPACE`` qualifier, else of the DVM --, ``_SPAWN_SUPPORT`` and
``_DEBUG_SUPPORT`` (strings: the attributes honoured, :data:`SPAWN_SUPPORT`,
:data:`DEBUG_SUPPORT`), ``_NUM_PSETS``
(size, 0), ``_PSET_NAMES`` (string, empty), ``_PSET_MEMBERSHIP`` (none
defined: not found), ``_SUPPORTED_KEYS``, ``_ALLOC_STATUS`` (no allocation
request is ever granted: not found).  Any other key: not supported.
The answer is SUCCESS when every key was answered, PARTIAL_SUCCESS when
some were, else the first refusal's status.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ...errors import Status
from ...pmix import constants as PC
from ...pmix import queries as Q
from ...wire import Message, reply

log = logging.getLogger("pydvm.pmix")

#: PMIX_QUERY_ALLOC_STATUS: no allocation request ever gets an id here
#: (runtime/pmixhost/jobctl.py refuses them all), so none is found -- mpirun's answer.
ALLOC_STATUS = "pmix.query.alloc"
#: Keys the master answers, with the qualifier each needs (None: none).
ANSWERED = {
    Q.NAMESPACES: None, Q.NAMESPACE_INFO: None, Q.JOB_STATUS: "ns",
    Q.PROC_TABLE: "ns", Q.LOCAL_PROC_TABLE: "ns", Q.JOB_SIZE: "ns",
    Q.NODE_LIST: None, Q.NUM_NODES: None, Q.SPAWN_SUPPORT: None,
    Q.DEBUG_SUPPORT: None, Q.NUM_PSETS: None, Q.PSET_NAMES: None,
    Q.PSET_MEMBERSHIP: "pset", Q.SUPPORTED_KEYS: None,
    ALLOC_STATUS: None,
}
#: PMIX_PROC_STATE_* numbers
RUNNING, LAUNCH_UNDERWAY, TERMINATED = 5, 2, 20
ABORTED_BY_SIG, TERM_NON_ZERO = 54, 62
NSPACE_KEY = "pmix.nspace"

#: The job-level attributes pydvm honours in PMIx_Spawn (PMIX_QUERY_SPAWN_SUPPORT).
SPAWN_SUPPORT = ",".join(["pmix.dbg.init", "pmix.dbg.tgt", "pmix.dbg.dpnd", "pmix.dbg.dpproc",
                          "pmix.dbg.job", "pmix.debugger"])
#: The debugger attributes pydvm honours (PMIX_QUERY_DEBUG_SUPPORT): stop in
#: PMIx_Init (every rank or none), daemons next to a target; not stop on exec.
DEBUG_SUPPORT = ",".join(["pmix.dbg.init", "pmix.dbg.tgt", "pmix.dbg.dpnd", "pmix.dbg.dpproc"])


# --------------------------------------------------------------------------
# node side


def requester_uid(host, req) -> int | None:
    """Whose query this is (see "Who asks"), or None when it cannot be told."""
    origin = getattr(req, "origin", None)
    if origin is not None and not origin.tools:
        return origin.uid
    if origin is not None:  # the tool server process: the users of its tools
        uids = host.tools.query_uids(origin)
    else:
        uids = {s.caller.uid for (ns, _r), s in host.sessions.items()
                if host.local_nspaces.get(ns) is host.server}
        uids |= host.tools.query_uids(None)  # tools from outside (runtime/pmixhost/tools.py)
    if len(uids) > 1:
        return None
    return uids.pop() if uids else os.geteuid()


def serve(host, req) -> None:
    """A Query upcall (loop thread): asked of the master, answered to libpmix."""
    uid = requester_uid(host, req)
    if uid is None:
        req.reply.fail(Status.ERR_NO_PERMISSIONS)
        return
    wire = []
    for q in req.queries:
        quals = {k: v.value for k, v in q.qualifiers.items()
                 if isinstance(v.value, (str, int, bool))}
        wire.append([list(q.keys), quals])

    def answered(r: Message) -> None:
        status = r.get("status", Status.ERR_UNREACH)
        if status not in (Status.SUCCESS, Q.PARTIAL_SUCCESS):
            req.reply.fail(status)
            return
        try:
            items = [to_pmix(key, form, data) for key, form, data in r.get("results") or ()]
            req.reply(status, items)
        except Exception as exc:  # never into the uplink's reader
            log.error("query answer cannot be given: %r", exc)
            if not req.reply.done:
                req.reply.fail(PC.ERROR)
    host.node.uplink.request({"t": "query", "uid": uid, "node": host.node.name,
                              "queries": wire}, answered)


def to_pmix(key: str, form: str, data: Any):
    """One answered key, from its wire form, as ``(key, Value)``."""
    from ...pmix import constants as C
    from ...pmix.values import DataArray, Proc, ProcInfo, Value
    if form == "str":
        return key, Value(str(data), C.STRING)
    if form in ("u32", "size", "status"):
        return key, Value(int(data), {"u32": C.UINT32, "size": C.SIZE,
                                      "status": C.STATUS}[form])
    if form == "nsinfo":
        rows = tuple((Q.NAMESPACE_INFO, Value(DataArray(C.INFO, (
            (NSPACE_KEY, Value(str(ns), C.STRING)),
            (Q.CMD_LINE, Value(str(cmd), C.STRING)))), C.DATA_ARRAY))
            for ns, cmd in data)
        return key, Value(DataArray(C.INFO, rows), C.DATA_ARRAY)
    if form == "ptable":
        rows = tuple(ProcInfo(Proc(str(ns), int(rank)), str(h), str(exe), int(pid),
                              int(code), int(state))
                     for ns, rank, h, exe, pid, code, state in data)
        return key, Value(DataArray(C.PROC_INFO, rows), C.DATA_ARRAY)
    raise ValueError(f"unknown answer form {form!r}")


# --------------------------------------------------------------------------
# master side


class MasterQueries:
    """Answers nodes' ``query`` requests from the process and node tables."""

    def __init__(self, processes, nodes) -> None:
        self._processes = processes
        self._nodes = nodes

    def visible(self, uid: int) -> list:
        """The running jobs ``uid`` may learn about (root: all)."""
        return [j for j in self._processes.jobs.values()
                if not j.done and (uid == 0 or j.uid is None or j.uid == uid)]

    async def request(self, daemon, msg: Message) -> None:
        uid = msg["uid"]
        if not isinstance(uid, int) or isinstance(uid, bool):
            raise ValueError("no uid")
        results: list = []
        refused: list[tuple[int, str]] = []
        asked = 0
        for keys, quals in msg["queries"]:
            if not isinstance(quals, dict):
                raise ValueError("qualifiers are not a map")
            for key in keys:
                asked += 1
                try:
                    results.append([key, *await self._answer(key, quals, uid,
                                                             str(msg.get("node")))])
                except _Refused as r:
                    refused.append((r.status, f"{key}: {r}"))
        if asked and len(results) == asked:
            status = Status.SUCCESS
        elif results:
            status = Q.PARTIAL_SUCCESS
        else:
            status = refused[0][0] if refused else Status.ERR_BAD_PARAM
        daemon.send(reply(msg.get("id"), status, "; ".join(w for _s, w in refused),
                          results=results))

    def _job(self, quals: dict, uid: int):
        ns = quals.get(NSPACE_KEY)
        if not isinstance(ns, str):
            raise _Refused(Status.ERR_BAD_PARAM, "needs a PMIX_NSPACE qualifier")
        job = next((j for j in self.visible(uid) if j.nspace == ns), None)
        if job is None:
            raise _Refused(Status.ERR_NOT_FOUND, f"no job {ns} of this user")
        return job

    async def _answer(self, key: str, quals: dict, uid: int, node: str) -> tuple[str, Any]:
        if key not in ANSWERED:
            raise _Refused(PC.ERR_NOT_SUPPORTED, "not supported")
        if key == Q.NAMESPACES:
            return "str", ",".join(j.nspace for j in self.visible(uid))
        if key == Q.NAMESPACE_INFO:
            jobs = [self._job(quals, uid)] if NSPACE_KEY in quals else self.visible(uid)
            return "nsinfo", [[j.nspace, " : ".join(" ".join(a.argv) for a in j.apps)]
                              for j in jobs]
        if key == Q.JOB_STATUS:
            job = self._job(quals, uid)
            harmed = job.killed or job.failures or job.error
            return "status", PC.ERROR if harmed else Status.SUCCESS
        if key == Q.JOB_SIZE:
            return "u32", self._job(quals, uid).size
        if key in (Q.NODE_LIST, Q.NUM_NODES):
            if NSPACE_KEY in quals:
                names = sorted(self._job(quals, uid).nodes())
            else:
                names = list(self._nodes.up_names())
            return ("str", ",".join(names)) if key == Q.NODE_LIST else ("u32", len(names))
        if key in (Q.PROC_TABLE, Q.LOCAL_PROC_TABLE):
            job = self._job(quals, uid)
            return "ptable", await self._proc_table(job, node if key == Q.LOCAL_PROC_TABLE
                                                    else None)
        if key == Q.SPAWN_SUPPORT:
            return "str", SPAWN_SUPPORT
        if key == Q.DEBUG_SUPPORT:
            return "str", DEBUG_SUPPORT
        if key == Q.PSET_NAMES:
            return "str", ""
        if key == Q.NUM_PSETS:
            return "size", 0
        if key == Q.SUPPORTED_KEYS:
            return "str", ",".join(ANSWERED)
        if key == ALLOC_STATUS:
            raise _Refused(Status.ERR_NOT_FOUND, "no allocation request: a DVM's nodes are fixed")
        raise _Refused(Status.ERR_NOT_FOUND, "no process set of that name")  # membership

    async def _proc_table(self, job, only: str | None) -> list[list]:
        nodes = {only} if only else set(job.nodes())
        pids: dict[tuple[str, int], int] = {}
        for name, r in await self._nodes.broadcast({"t": "pids", "nspace": job.nspace},
                                                   nodes, what="pids"):
            for rank, pid in r.get("pids") or ():
                pids[(name, int(rank))] = int(pid)
        rows = []
        for rank in sorted(job.procs):
            p = job.procs[rank]
            if p.node not in nodes:
                continue
            app = job.apps[p.app_idx] if p.app_idx < len(job.apps) else None
            exe = app.argv[0] if app is not None and app.argv else ""
            rows.append([job.nspace, rank, p.node, exe, pids.get((p.node, rank), 0),
                         *_state(p)])
        return rows


def _state(p) -> tuple[int, int]:
    """(exit code, PMIX_PROC_STATE_*) of a process record."""
    from ..shared.jobs import ProcState
    if p.state is ProcState.PENDING:
        return 0, LAUNCH_UNDERWAY
    if p.state is ProcState.RUNNING:
        return 0, RUNNING
    code = p.exit_status or 0
    return code, ABORTED_BY_SIG if p.signal else TERM_NON_ZERO if code else TERMINATED


class _Refused(Exception):
    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


def pids_of(node, nspace: Any) -> list[list[int]]:
    """A node's ``pids`` answer: [rank, pid] of each of the job's processes it started."""
    job = node.jobs.get(nspace) if isinstance(nspace, str) else None
    if job is None:
        return []
    return [[rank, lp.pgid] for rank, lp in job.procs.items() if lp.pgid is not None]
