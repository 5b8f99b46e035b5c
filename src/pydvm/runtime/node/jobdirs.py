"""A node's per-job directories: where a job's MPI libraries keep what they
keep per host (shared-memory segments, session files), and each rank's
``OMPI_FILE_LOCATION`` in it -- made on a job's first use, removed with the
job (:meth:`pydvm.runtime.node.server.NodeServer._clean_up_job`).  Functions of the
node server's state (its ``shm_dir``, socket directory, guardian).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..shared.sockdir import make_socket_dir
from . import ompienv

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .server import NodeServer
    from .launch import LocalJob


def job_dir(node: "NodeServer", job: "LocalJob") -> Path:
    """The job's own directory for what MPI libraries keep per host
    (shared-memory segments, session files), removed with the job.

    Several nodes of a DVM may run on one machine (local daemons), and
    Open MPI names such files after the machine's host name: ranks of
    two nodes would then share a segment name.  A directory per node
    and job keeps them apart; it is in ``/dev/shm`` where there is one.
    """
    if job.work_dir is not None:
        return job.work_dir
    if node.shm_dir is None:
        try:
            node.shm_dir = make_socket_dir(node.dvmid, f"{node.name}-jobs",
                                           node.multi_user, root="/dev/shm")
        except OSError:
            node.shm_dir = node.socket_dir / "jobs"
            node.shm_dir.mkdir(mode=0o711 if node.multi_user else 0o700,
                               exist_ok=True)
        node.guardian.remove_on_exit(str(node.shm_dir))
    d = node.shm_dir / job.nspace.rpartition("@")[2]
    d.mkdir(mode=0o700, exist_ok=True)
    if job.uid is not None and job.uid != os.getuid():
        os.chown(d, job.uid, job.gid if job.gid is not None else -1)
    job.work_dir = d
    return d


def ompi_envs(node: "NodeServer", job: "LocalJob", layout: dict | None,
              procs: list[dict]) -> list[dict[str, str]]:
    """The Open MPI variables of each of ``procs`` (``ompienv``), with
    each rank's ``OMPI_FILE_LOCATION`` made in the job's directory here
    (removed with it); none without a layout."""
    if not layout or node.name not in (layout.get("nodes") or {}):
        return [{} for _ in procs]
    base = job_dir(node, job)
    where = {}
    for p in procs:
        d = base / str(p["rank"])
        d.mkdir(mode=0o700, exist_ok=True)
        if job.uid is not None and job.uid != os.getuid():
            os.chown(d, job.uid, job.gid if job.gid is not None else -1)
        where[p["rank"]] = str(d)
    return ompienv.launch_envs(layout, node.name, procs, where)
