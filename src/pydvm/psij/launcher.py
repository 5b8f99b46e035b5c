"""PSI/J's ``pydvm`` launcher: how *other* executors start a job through pydvm.

The ``pydvm`` executor needs no launcher -- it hands the job to a DVM,
which starts every process itself.  This launcher is for the other way
round: an executor of PSI/J's that runs launcher scripts (``local``,
``slurm``, ``pbs``, ``lsf``...) with ``JobSpec(launcher="pydvm")`` starts
the job's processes with ``pydvm run`` -- on the DVM of ``PYDVM_URI`` in
the job's environment, else on a one-shot DVM (inside a Slurm allocation,
over its nodes), as ``mpirun`` or ``srun`` would.  ``process_count``
processes; ``processes_per_node`` when the resources give a node count or
processes per node (``--npernode``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

from psij import InvalidJobException, Job, JobExecutorConfig, ResourceSpecV1
from psij.launchers.script_based_launcher import ScriptBasedLauncher

#: The launcher script (run by bash, after PSI/J's ``launcher_lib.sh``).
SCRIPT = Path(__file__).parent / "pydvm_launch.sh"


class PydvmLauncher(ScriptBasedLauncher):
    """Start a job's processes with ``pydvm run`` (see the module docstring)."""

    def __init__(self, config: Optional[JobExecutorConfig] = None) -> None:
        """:param config: PSI/J's executor configuration (its work directory
        receives the deployed script)."""
        super().__init__(SCRIPT, config)

    def get_additional_args(self, job: Job) -> List[str]:
        """The process count, processes per node (0: the DVM places them)
        and the Python that has pydvm -- this one."""
        assert job.spec is not None
        res = job.spec.resources
        if res is None:
            res = ResourceSpecV1()
        if not isinstance(res, ResourceSpecV1):
            raise InvalidJobException(f"the pydvm launcher reads resource specifications of "
                                      f"version 1, not {getattr(res, 'version', res)!r}")
        ppn = 0
        if res.node_count is not None or res.processes_per_node is not None:
            ppn = res.computed_processes_per_node
        return [str(res.computed_process_count), str(ppn), sys.executable]


__all__ = ["PydvmLauncher"]
