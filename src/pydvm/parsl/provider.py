"""A Parsl execution provider whose blocks are jobs of a persistent DVM.

::

    from parsl.config import Config
    from parsl.executors import HighThroughputExecutor
    from pydvm.parsl import PydvmProvider

    config = Config(executors=[HighThroughputExecutor(
        provider=PydvmProvider(nodes_per_block=2, max_blocks=4))])   # the DVM of $PYDVM_URI

A block -- what Parsl's scaling asks a provider for, ``init_blocks`` at
the start, then between ``min_blocks`` and ``max_blocks`` as
``parallelism`` says -- is one DVM job (see docs/workflows.md, "Parsl on a
DVM"):

* by default (``launcher=None``), the command Parsl gives (HTEX's worker
  pool) on each of ``nodes_per_block`` nodes the DVM picks,
  ``tasks_per_node`` copies a node (``n=nodes*tasks, npernode=tasks``);
* with Parsl's ``SimpleLauncher`` (what MPI mode and ``MPIExecutor`` ask
  for), one rank a node: the pool on the first, the other ranks keeping
  their nodes for the MPI apps the pool starts there (:mod:`.block`);
  those apps' ``$PARSL_MPI_PREFIX`` is ``mpiexec``, which the block's
  ``PATH`` makes :mod:`.mpiexec`, a ``pydvm run`` on the DVM.

Blocks are queued at the DVM (``queue=True``) while its slots are taken,
and start when they free.  A block's status is its job's (see
:meth:`PydvmProvider.status`); :meth:`~PydvmProvider.cancel` kills the
job.  Its script, stdout and stderr are ``SCRIPT_DIR/JOBNAME.sh``,
``.sh.out`` and ``.sh.err`` (``script_dir`` is set by Parsl: the run
directory's ``submit_scripts/``), as Parsl's own providers lay them out.

Which DVM: ``uri``, else ``$PYDVM_URI``, else one the provider starts at
its first block (``hosts``, ``params`` as :func:`pydvm.jobs.start`) and
stops when the DataFlowKernel that ran it is cleaned up
(``parsl.dfk().cleanup()``, the end of ``with parsl.load(config):``) or,
failing that, when the program exits.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import stat
import sys
import threading
from typing import Any

from parsl.jobs.states import JobState, JobStatus
from parsl.launchers import SimpleLauncher, SingleNodeLauncher
from parsl.providers.base import ExecutionProvider
from parsl.providers.errors import SubmitException
from parsl.utils import RepresentationMixin

from . import mpiexec as _mpiexec

logger = logging.getLogger(__name__)

#: The exit status of a job its time limit ended (``pydvm run --timeout``).
TIMEOUT_STATUS = 110


def job_status(job: Any, *, cancelled: bool = False, walltime: bool = False,
               stdout_path: str | None = None, stderr_path: str | None = None) -> JobStatus:
    """A Parsl :class:`JobStatus` for a :class:`pydvm.jobs.Job` (pure: reads
    its ``state`` and, once ended, its Future).

    ======================================  =====================
    the job                                 Parsl's state
    ======================================  =====================
    submitted, queued (waiting for slots)   PENDING
    running                                 RUNNING
    ended, exit 0                           COMPLETED (exit_code 0)
    ended after :meth:`cancel` (our kill)   CANCELLED
    ended by its time limit (exit 110,      TIMEOUT
    ``walltime`` set)
    ended by someone else's kill            CANCELLED, the DVM's reason as message
    ended, any other exit                   FAILED (exit_code, the reason)
    refused by the DVM, connection lost     FAILED, the error as message
    ======================================  =====================
    """
    state = job.state
    if state in ("submitted", "queued"):
        return JobStatus(JobState.PENDING)
    if state == "running":
        return JobStatus(JobState.RUNNING)
    paths = {"stdout_path": stdout_path, "stderr_path": stderr_path}
    if cancelled or job.cancelled():
        return JobStatus(JobState.CANCELLED, **paths)
    exc = job.exception(0)
    if exc is not None:
        return JobStatus(JobState.FAILED, message=f"{type(exc).__name__}: {exc}", **paths)
    r = job.result(0)
    if r.returncode == 0:
        return JobStatus(JobState.COMPLETED, exit_code=0, **paths)
    if walltime and r.returncode == TIMEOUT_STATUS:
        return JobStatus(JobState.TIMEOUT, message=r.reason, exit_code=r.returncode, **paths)
    if r.killed and not r.failed:
        return JobStatus(JobState.CANCELLED, message=r.reason or "killed",
                         exit_code=r.returncode, **paths)
    why = r.reason or (f"rank {r.failures[0].rank} on {r.failures[0].node} exited "
                       f"{r.failures[0].status}" if r.failures else None)
    return JobStatus(JobState.FAILED, message=why, exit_code=r.returncode, **paths)


def _walltime_seconds(walltime: "str | int | float | None") -> float | None:
    """``"HH:MM:SS"`` (Parsl's spelling), or seconds; None: no limit."""
    if walltime is None or walltime == "":
        return None
    if isinstance(walltime, (int, float)) and not isinstance(walltime, bool):
        secs = float(walltime)
    elif isinstance(walltime, str):
        try:
            parts = [float(p) for p in walltime.split(":")]
        except ValueError:
            raise ValueError(f"walltime is 'HH:MM:SS' or seconds, not {walltime!r}") from None
        if not 1 <= len(parts) <= 3:
            raise ValueError(f"walltime is 'HH:MM:SS' or seconds, not {walltime!r}")
        secs = 0.0
        for p in parts:
            secs = secs * 60 + p
    else:
        raise ValueError(f"walltime is 'HH:MM:SS' or seconds, not {walltime!r}")
    if secs <= 0:
        raise ValueError(f"walltime must be > 0, not {walltime!r}")
    return secs


class PydvmProvider(ExecutionProvider, RepresentationMixin):
    """Parsl blocks as jobs of a persistent DVM (see the module docstring).

    ``uri``: the DVM (default ``$PYDVM_URI``; neither: a DVM of the
    provider's own, on ``hosts`` with ``params`` -- ``pydvm start``'s
    ``--hosts`` and ``--mca``); ``nodes_per_block``, ``init_blocks``,
    ``min_blocks``, ``max_blocks``, ``parallelism``, ``worker_init`` (shell
    lines run before the block's command, on each of its nodes) as
    Parsl's other providers; ``walltime`` (``"HH:MM:SS"`` or seconds,
    default none): the block's time limit, past which it ends TIMEOUT;
    ``launcher``: None (a pool a node) or ``SimpleLauncher()`` (one pool,
    the block's other nodes kept for MPI apps); ``pmi``: what the ranks of
    MPI apps get (:data:`pydvm.parsl.mpiexec.PMI`: ``"auto"``, read off the
    program as ``pydvm run --mpi auto`` does; ``"pmix"``, Open MPI;
    ``"pmi1"``, MPICH, Intel MPI, MVAPICH);
    ``cores_per_node``, ``mem_per_node``: told to HTEX, which sizes its
    pools by them (the DVM reserves neither).
    """

    def __init__(self, uri: str | None = None, *, nodes_per_block: int = 1,
                 init_blocks: int = 1, min_blocks: int = 0, max_blocks: int = 1,
                 parallelism: float = 1, worker_init: str = "",
                 walltime: "str | int | float | None" = None, launcher: Any = None,
                 hosts: "str | list[str] | None" = None, params: dict | None = None,
                 pmi: str = "auto", cores_per_node: int | None = None,
                 mem_per_node: float | None = None) -> None:
        if not isinstance(nodes_per_block, int) or nodes_per_block < 1:
            raise ValueError(f"nodes_per_block must be an int >= 1, not {nodes_per_block!r}")
        if launcher is not None and type(launcher) not in (SimpleLauncher, SingleNodeLauncher):
            raise ValueError(
                f"launcher {type(launcher).__name__}: a DVM starts a block's processes "
                "itself; give None (a worker pool on each node) or SimpleLauncher() (one "
                "pool a block, its other nodes kept for MPI apps)")
        if pmi not in _mpiexec.PMI:
            raise ValueError(f"pmi {pmi!r}: the DVM provider serves "
                             f"{', '.join(sorted(_mpiexec.PMI))}")
        self._walltime = _walltime_seconds(walltime)
        self.uri = uri
        self.nodes_per_block = nodes_per_block
        self.init_blocks = init_blocks
        self.min_blocks = min_blocks
        self.max_blocks = max_blocks
        self.parallelism = parallelism
        self.worker_init = worker_init
        self.walltime = walltime
        self.launcher = launcher
        self.hosts = hosts
        self.params = params
        self.pmi = pmi
        self.cores_per_node = cores_per_node
        self.mem_per_node = mem_per_node
        self.script_dir: str | None = None
        #: job id -> {"job": pydvm.jobs.Job, "cancelled": bool, "out", "err", "status"}
        self.resources: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._dvm: Any = None
        self._own = False
        self._ids = itertools.count(1)

    # -- the DVM ----------------------------------------------------------------

    def dvm(self) -> Any:
        """The :class:`pydvm.jobs.Dvm` the blocks go to (connected, or started,
        at the first call)."""
        with self._lock:
            if self._dvm is None or self._dvm.closed:
                import pydvm.jobs

                uri = self.uri or os.environ.get("PYDVM_URI")
                if uri:
                    self._dvm, self._own = pydvm.jobs.connect(uri), False
                else:
                    self._dvm = pydvm.jobs.start(self.hosts, mca=self.params or {})
                    self._own = True
                    atexit.register(self.close)
                    self._stop_with_dfk()
            return self._dvm

    def _stop_with_dfk(self) -> None:
        """Stop our own DVM when the current DataFlowKernel is cleaned up
        (after it has cancelled the blocks and shut its executors down)."""
        try:
            import parsl

            dfk = parsl.dfk()
        except Exception:  # no DFK loaded (DataFlowKernel used directly): atexit does it
            return
        cleanup = dfk.cleanup

        def cleanup_then_stop() -> None:
            try:
                cleanup()
            finally:
                self.close()

        dfk.cleanup = cleanup_then_stop

    def close(self) -> None:
        """Close the connection; a DVM the provider started is stopped (its
        blocks with it).  Blocks of a DVM we attached to are killed by the
        DVM as the connection goes (as it does a gone ``pydvm run``'s job)."""
        with self._lock:
            dvm, self._dvm = self._dvm, None
        if dvm is not None:
            dvm.close()

    # -- Parsl's provider interface ------------------------------------------------

    def _block_env(self, uri: str) -> dict[str, str | None]:
        env: dict[str, str | None] = {"PYDVM_URI": uri, "PYDVM_PARSL_PMI": self.pmi}
        if self.cores_per_node is not None:
            env["PARSL_CORES"] = str(self.cores_per_node)
        if self.mem_per_node is not None:
            env["PARSL_MEMORY_GB"] = str(self.mem_per_node)
        return env

    def _mpiexec_dir(self, base: str) -> str:
        """A directory holding the ``mpiexec`` of :mod:`.mpiexec` (this Python's)."""
        d = os.path.join(base, "pydvm-bin")
        exe = os.path.join(d, "mpiexec")
        if not os.path.exists(exe):
            os.makedirs(d, exist_ok=True)
            tmp = f"{exe}.{os.getpid()}"
            with open(tmp, "w") as f:
                f.write(f"#!/bin/sh\nexec {sys.executable} -m pydvm.parsl.mpiexec \"$@\"\n")
            os.chmod(tmp, os.stat(tmp).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
            os.replace(tmp, exe)
        return d

    def submit(self, command: str, tasks_per_node: int, job_name: str = "parsl.pydvm") -> str:
        """Submit a block: a DVM job running ``command`` (see the module
        docstring); its id at once -- the job may wait in the DVM's queue.
        :class:`SubmitException` if it cannot be sent (no DVM, a bad value)."""
        base = os.path.abspath(self.script_dir or ".")
        seq = next(self._ids)
        name = f"{job_name}.{os.getpid()}.{seq}"
        script = os.path.join(base, f"{name}.sh")
        out, err = script + ".out", script + ".err"
        simple = isinstance(self.launcher, SimpleLauncher)
        lines = ["#!/bin/bash", self.worker_init, f"export JOBNAME={name}"]
        if simple:
            lines.append(f'export PATH="{self._mpiexec_dir(base)}:$PATH"')
        lines.append(command)
        try:
            with open(script, "w") as f:
                f.write("\n".join(lines) + "\n")
            dvm = self.dvm()
            # bind_to none: a pool forks its workers, which must not share one core
            opts: dict[str, Any] = {"env": self._block_env(str(dvm.uri)), "queue": True,
                                    "bind_to": "none",
                                    "stdout": out, "stderr": err}
            if self._walltime is not None:
                opts["timeout"] = self._walltime
            if simple:
                job = dvm.submit([sys.executable, "-m", "pydvm.parsl.block", script],
                                 self.nodes_per_block, npernode=1, **opts)
            else:
                tpn = max(1, int(tasks_per_node))
                job = dvm.submit(["/bin/bash", script], self.nodes_per_block * tpn,
                                 npernode=tpn, **opts)
        except Exception as exc:
            raise SubmitException(name, f"the DVM did not take the block: {exc}") from exc
        job_id = f"{name}"
        self.resources[job_id] = {"job": job, "cancelled": False, "out": out, "err": err,
                                  "status": None}
        logger.debug("block %s submitted as DVM job request %s", job_id, job.id)
        return job_id

    def status(self, job_ids: Any) -> list[JobStatus]:
        """Each block's status, from its job's state (no request to the DVM:
        the job's start and end are pushed to us); see :func:`job_status`."""
        out = []
        for jid in job_ids:
            rec = self.resources.get(jid)
            if rec is None:
                out.append(JobStatus(JobState.UNKNOWN, message="not a block of this provider"))
                continue
            st = rec["status"]
            if st is None or not st.terminal:
                st = job_status(rec["job"], cancelled=rec["cancelled"],
                                walltime=self._walltime is not None,
                                stdout_path=rec["out"], stderr_path=rec["err"])
                rec["status"] = st
            out.append(st)
        return out

    def cancel(self, job_ids: Any) -> list[bool]:
        """Kill each block's job (queued or running: SIGTERM, then SIGKILL
        after the DVM's kill grace); True for each block that had not ended."""
        done = []
        for jid in job_ids:
            rec = self.resources.get(jid)
            if rec is None:
                done.append(False)
                continue
            job = rec["job"]
            ended = job.done()
            if not ended:
                rec["cancelled"] = True
                job.kill()
            done.append(not ended)
        return done

    @property
    def label(self) -> str:
        """The provider's name in Parsl's logs and monitoring: ``pydvm``."""
        return "pydvm"

    @property
    def status_polling_interval(self) -> int:
        """Seconds between Parsl's status polls: 1 -- :meth:`status` only
        reads what the DVM pushed, so it is cheap to ask often."""
        return 1
