"""Jobs started stopped in ``PMIx_Init`` for a debugger, and their release.

A job run with ``pydvm run --stop-in-init`` (the job API's
``stop_in_init=True``, or a PMIx tool's ``PMIx_Spawn`` with
``PMIX_DEBUG_STOP_IN_INIT``) is registered with libpmix carrying that key at
job level (:func:`pydvm.pmix.jobinfo.stop_in_init`).  libpmix 4.2's client
reads it at the end of ``PMIx_Init``, registers for ``PMIX_DEBUGGER_RELEASE``,
notifies ``PMIX_READY_FOR_DEBUG`` (range RM) and waits.  The master counts
those notices (:func:`note_ready`: ``pydvm ps`` shows the job ``stopped``)
and releases the job on request (:func:`release`: ``pydvm release NSPACE``,
the job API): ``PMIX_DEBUGGER_RELEASE`` goes to every node of the job, each
delivers it to the job's processes (a custom range of the job's namespace).
libpmix keeps the event for a process that registers later, so a release
before a process reached ``PMIx_Init`` holds too.  A tool's own
``PMIx_Notify_event(PMIX_DEBUGGER_RELEASE, ...)`` travels as any tool's
event (runtime/master/collectives.py) and marks the jobs it reaches released.

Pure bookkeeping plus one delivery through the node table: no state of its
own (the job record holds ``stop_in_init``, ``released``, ``debug_ready``).

"""

from __future__ import annotations

import logging

from ...pmix import constants as PC
from ..shared.jobs import JobRecord
from .nodes import NodeTable

log = logging.getLogger("pydvm.master")


def note_ready(job: JobRecord, node: str) -> None:
    """A process of ``job`` on ``node`` said it waits for a debugger
    (``PMIX_READY_FOR_DEBUG``).

    What the host learns is per node, not per process: libpmix 4.2.2 passes
    that event up with the rank ``PMIX_RANK_LOCAL_PEERS`` (0xFFFFFFFB) as
    its source instead of the process's, and of two processes of a job on
    one node only the first one's reached the host in a test.  So the job
    records the nodes where its processes have begun to wait."""
    if not job.released:
        job.debug_ready.add(node)


def release_info(nspace: str) -> list:
    """The wire info of a release aimed at every process of ``nspace``."""
    return [[PC.EVENT_CUSTOM_RANGE, PC.PROC, [nspace, PC.RANK_WILDCARD]],
            [PC.EVENT_NON_DEFAULT, PC.BOOL, True]]


def released_by_event(jobs: dict[str, JobRecord], code: int, rng: int, info: list,
                      uid: int) -> None:
    """A process's or tool's event, sent as ``uid``: when it is a
    ``PMIX_DEBUGGER_RELEASE``, the jobs of that uid (root: any) its range
    names (custom range) count as released -- named whole (rank WILDCARD),
    or once each of their ranks was (debugger daemons release their node's)."""
    if code != PC.DEBUGGER_RELEASE or rng != PC.RANGE_CUSTOM:
        return
    for key, t, v in info:
        if key != PC.EVENT_CUSTOM_RANGE:
            continue
        procs = [v] if t == PC.PROC else v[1] if t == PC.DATA_ARRAY and v else []
        for p in procs:
            try:
                job, rank = jobs.get(str(p[0])), int(p[1])
            except (TypeError, ValueError, IndexError):
                continue
            if job is None or not job.stop_in_init or not (uid == 0 or job.uid in (None, uid)):
                continue
            if rank == PC.RANK_WILDCARD:
                job.released = True
            elif rank in job.procs:
                job.released_ranks.add(rank)
                job.released = job.released or len(job.released_ranks) == job.size


async def release(nodes: NodeTable, job: JobRecord, source: tuple[str, int],
                  why: str) -> bool:
    """Release ``job``'s processes held in ``PMIx_Init``: ``PMIX_DEBUGGER_RELEASE``
    to every node of the job.  False when the job was not started stopped."""
    if not job.stop_in_init:
        return False
    first = not job.released
    job.released = True
    if first:
        log.info("job %s released from PMIx_Init (%s)", job.nspace, why)
    # sent again on a repeated release: harmless (each process waits for one)
    await nodes.deliver_event(job.nodes(), PC.DEBUGGER_RELEASE, source, PC.RANGE_CUSTOM,
                              release_info(job.nspace))
    return True


# ----------------------------------------------------------------------
# PMIx_Spawn's debugger directives
# ----------------------------------------------------------------------

class SpawnRefused(Exception):
    """A spawn's debugger directives cannot be honoured: ``status`` and why."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


def daemon_hosts(target: JobRecord, rank: int, per_node: int | None,
                 per_proc: int | None) -> list[list]:
    """Where a debugger's daemons go: ``[[node, count], ...]`` -- next to the
    target's processes (all of them for rank WILDCARD, else that rank's node):
    ``per_proc`` per target process there, else ``per_node`` (default 1) per
    node.  :class:`SpawnRefused` for a rank the job does not have."""
    if rank == PC.RANK_WILDCARD:
        by_node = target.by_node()
    elif rank in target.procs:
        by_node = {target.procs[rank].node: [rank]}
    else:
        raise SpawnRefused(PC.ERR_BAD_PARAM, f"PMIX_DEBUG_TARGET: {target.nspace} has no "
                                             f"rank {rank}")
    if per_proc:
        return [[node, per_proc * len(ranks)] for node, ranks in by_node.items()]
    return [[node, per_node or 1] for node in by_node]


def tool_environment(uid: int) -> tuple[dict[str, str], str]:
    """The environment and directory of a job a PMIx tool spawns: a tool
    gives only what its apps carry (``pmix_app_t.env``, ``cwd``), so these
    are the bare minimum a login gives -- the master's ``PATH``, the user's
    ``HOME``, ``USER``, ``LOGNAME`` -- and the user's home (or ``/``)."""
    import os
    import pwd
    env = {"PATH": os.environ.get("PATH") or os.defpath}
    home = "/"
    try:
        pw = pwd.getpwuid(uid)
        env.update(HOME=pw.pw_dir, USER=pw.pw_name, LOGNAME=pw.pw_name)
        home = pw.pw_dir if os.path.isdir(pw.pw_dir) else "/"
    except KeyError:
        pass
    return env, home
