"""The environment Open MPI 4.1's ``mpirun`` gives every rank, computed from a
job's layout (pure: no I/O, no runtime import).

``mpirun`` (ORTE's ``schizo/ompi`` and ``odls``) sets, for each process it
starts, public variables that job scripts and wrapper scripts read before the
program runs (``CUDA_VISIBLE_DEVICES=$OMPI_COMM_WORLD_LOCAL_RANK``), and a few
``OMPI_MCA_*`` parameters Open MPI's ``MPI_Init`` reads (``MPI_INFO_ENV``'s
``wdir``, ``ompi_num_apps``, ``ompi_first_rank``; yielding when the node is
oversubscribed).  pydvm sets the same names for every job, PMIx or not, from
the layout each node gets with its ``launch`` (``ProcessTable.layout``).

Not set, on purpose: the ORTE-internal variables that would send ``MPI_Init``
down ORTE's own paths instead of PMIx (``OMPI_MCA_orte_hnp_uri``,
``orte_local_daemon_uri``, ``ess_base_jobid``/``vpid``, ``OMPI_MCA_ess``,
``OMPI_MCA_pmix``, ``orte_precondition_transports``, the ORTE session
directories, ``orte_launch``), and hints Open MPI computes itself when absent
(``OMPI_MCA_shmem_RUNTIME_QUERY_hint``).  docs/runtime.md, "The rank
environment", lists every variable and each deliberate difference.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping, MutableMapping

#: Open MPI's launch state that a rank must never inherit from the shell that
#: ran ``pydvm run`` (a job script run inside another launcher's rank, a
#: nested ``pydvm run``): stale values would name another job's world, ranks
#: and directories, or its launcher (``orte_hnp_uri``).  Dropped for every
#: job (:func:`drop_stale`); pydvm then sets its own.  A user's Open MPI
#: tunables (``OMPI_MCA_btl_*``, ``OMPI_MCA_orte_base_help_aggregate``...) pass.
OMPI_STALE_PREFIXES = ("OMPI_COMM_WORLD_", "OMPI_APP_CTX_", "OMPI_MCA_ess_base_",
                       "OMPI_MCA_orte_ess_")
OMPI_STALE_NAMES = frozenset((
    "OMPI_UNIVERSE_SIZE", "OMPI_FIRST_RANKS", "OMPI_NUM_APP_CTX", "OMPI_FILE_LOCATION",
    "OMPI_COMMAND", "OMPI_ARGV", "OMPI_MCA_initial_wdir", "OMPI_MCA_mpi_oversubscribe",
    "OMPI_MCA_ess", "OMPI_MCA_pmix", "OMPI_MCA_orte_hnp_uri", "OMPI_MCA_orte_local_daemon_uri",
    "OMPI_MCA_orte_app_num", "OMPI_MCA_orte_num_nodes", "OMPI_MCA_orte_launch",
    "OMPI_MCA_orte_precondition_transports", "OMPI_MCA_orte_jobfam_session_dir",
    "OMPI_MCA_orte_top_session_dir", "OMPI_MCA_orte_bound_at_launch",
    "OMPI_MCA_orte_num_restarts", "OMPI_MCA_orte_do_not_barrier", "OMPI_MCA_orte_tag_output",
    "OMPI_MCA_rmaps_base_oversubscribe", "OMPI_MCA_shmem_RUNTIME_QUERY_hint", "PMIX_ID"))


def drop_stale(env: MutableMapping[str, str]) -> None:
    """Remove from ``env`` every Open MPI launch variable of another job."""
    for k in [k for k in env if k in OMPI_STALE_NAMES or k.startswith(OMPI_STALE_PREFIXES)]:
        del env[k]


def without_stale(env: Mapping[str, str], also: tuple[str, ...] = ()) -> dict[str, str]:
    """A copy of ``env`` without what :func:`drop_stale` removes, nor the
    variables named with a prefix in ``also`` -- one pass (every process
    started goes through it)."""
    prefixes = OMPI_STALE_PREFIXES + also
    return {k: v for k, v in env.items()
            if not (k in OMPI_STALE_NAMES or k.startswith(prefixes))}


#: A directory pydvm made for a job on a node (``NodeServer.job_dir``): in a
#: ``pydvm-<uid>[-mu]`` base, either ``<dvmid>-<node>-jobs-XXXX`` (in
#: /dev/shm) or ``<socket dir>/jobs`` (where there is no /dev/shm).
_JOB_DIR = re.compile(r"/pydvm-\d+(?:-mu)?/(?:[^/]+-jobs-[^/]+|[^/]+/jobs)(?:/|$)")


def oversubscribed(layout: Mapping, node: str) -> bool:
    """Whether the job runs more ranks on ``node`` than the node's slots
    (``layout["slots"]``; a node whose slots are unknown or 0 is not)."""
    slots = (layout.get("slots") or {}).get(node) or 0
    return slots > 0 and len(layout["nodes"].get(node) or ()) > slots


def universe_size(layout: Mapping) -> int:
    """``MPI_UNIVERSE_SIZE`` as the job's ``PMIX_UNIV_SIZE`` says it
    (``pmix/jobinfo.py``): the session's slots, at least the job's size."""
    size = sum(len(r) for r in layout["nodes"].values())
    return max(int(layout.get("univ_size") or 0), size)


def job_env(layout: Mapping, node: str) -> dict[str, str]:
    """What every rank of the job on ``node`` gets alike (Open MPI 4.1's
    ``schizo/ompi`` ``setup_fork``)."""
    nodes = layout["nodes"]
    size = sum(len(r) for r in nodes.values())
    apps = [int(n) for n in (layout.get("apps") or [size])]
    firsts, r = [], 0
    for n in apps:
        firsts.append(r)
        r += n
    return {
        "OMPI_COMM_WORLD_SIZE": str(size),
        "OMPI_MCA_orte_ess_num_procs": str(size),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(len(nodes.get(node) or ())),
        "OMPI_UNIVERSE_SIZE": str(universe_size(layout)),
        "OMPI_MCA_orte_num_nodes": str(len(nodes)),
        "OMPI_NUM_APP_CTX": str(len(apps)),
        "OMPI_APP_CTX_NUM_PROCS": " ".join(map(str, apps)),
        # mpirun 4.1.4 says "0 0" for `-n 2 a : -n 1 b` (ORTE sets it before
        # numbering the apps); pydvm gives each app's real first rank, "0 2".
        "OMPI_FIRST_RANKS": " ".join(map(str, firsts)),
        # what makes Open MPI yield when idle (mpi_yield_when_idle defaults to it)
        "OMPI_MCA_mpi_oversubscribe": "1" if oversubscribed(layout, node) else "0",
    }


def rank_env(layout: Mapping, node: str, rank: int, app_idx: int, local_rank: int,
             file_location: str | None = None,
             common: Mapping[str, str] | None = None) -> dict[str, str]:
    """The Open MPI variables of ``rank`` (of application ``app_idx``, the
    ``local_rank``-th of the job on ``node``): :func:`job_env` (or ``common``,
    computed once per launch) plus the rank's own.  ``file_location`` is the
    rank's ``OMPI_FILE_LOCATION`` (a directory the node made for it)."""
    env = dict(common if common is not None else job_env(layout, node))
    env.update({
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(local_rank),
        # as PMIX_NODE_RANK (pmix/jobinfo.py): its rank among the job's ranks
        # here (mpirun's counts an earlier job's ranks too, for a spawned job)
        "OMPI_COMM_WORLD_NODE_RANK": str(local_rank),
        "OMPI_MCA_orte_ess_node_rank": str(local_rank),
        "OMPI_MCA_orte_app_num": str(app_idx),
    })
    argv = (layout.get("argv") or [])
    argv = argv[app_idx] if app_idx < len(argv) else None
    if argv:
        env["OMPI_COMMAND"] = posixpath.basename(argv[0])  # as mpirun: "./a.out" -> "a.out"
        if len(argv) > 1:
            env["OMPI_ARGV"] = " ".join(argv[1:])
    wdirs = layout.get("wdir") or []
    wdir = wdirs[app_idx] if app_idx < len(wdirs) else None
    if wdir:
        env["OMPI_MCA_initial_wdir"] = wdir
        env["PWD"] = wdir  # mpirun makes it match the directory the rank starts in
    if file_location:
        env["OMPI_FILE_LOCATION"] = file_location
    return env


def launch_envs(layout: Mapping, node: str, procs: Iterable[Mapping],
                file_locations: Mapping[int, str] | None = None) -> list[dict[str, str]]:
    """The Open MPI variables of each of ``procs`` (the ``launch`` message's
    entries: ``rank``, ``app_idx``) started on ``node``, in their order."""
    common = job_env(layout, node)
    local = {r: i for i, r in enumerate(layout["nodes"].get(node) or ())}
    locs = file_locations or {}
    return [rank_env(layout, node, p["rank"], p["app_idx"], local.get(p["rank"], 0),
                     locs.get(p["rank"]), common) for p in procs]


def is_pydvm_job_dir(path: str) -> bool:
    """Whether ``path`` lies in a directory pydvm made for a job on some node
    (any node, any DVM): such a value in a job's environment came from pydvm,
    not from its user -- a spawned job's copy of its parent's ``OMPI_MCA_*``
    (Open MPI's MPI_Comm_spawn passes every one on), or a nested run's."""
    return bool(_JOB_DIR.search(path))


def own_job_dirs(env: MutableMapping[str, str], names: Iterable[str], job_dir: str) -> None:
    """Point each of ``names`` at this node's ``job_dir``, unless the user
    set it to a directory of their own (a value in a pydvm job directory,
    this node's or another's, is replaced: :func:`is_pydvm_job_dir`)."""
    for k in names:
        v = env.get(k)
        if v is None or is_pydvm_job_dir(v):
            env[k] = job_dir
