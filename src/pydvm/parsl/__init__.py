"""Parsl on a DVM (``pip install 'pydvm[parsl]'``; docs/workflows.md, "Parsl on a DVM").

Two ways in:

* :class:`~pydvm.parsl.executor.PydvmExecutor` (in :mod:`.executor`): a
  Parsl executor whose apps are each one DVM job -- no worker pools, as
  Parsl's ``FluxExecutor`` does with Flux; :mod:`.task` is what a
  ``python_app``'s job runs, and :func:`~pydvm.parsl.executor.cancel_app`
  kills an app's job.
* :class:`~pydvm.parsl.provider.PydvmProvider` (in :mod:`.provider`): a
  Parsl execution provider whose blocks are DVM jobs, for HTEX's worker
  pools; :mod:`.block` is what runs on each rank of a block that keeps
  nodes for MPI apps, and :mod:`.mpiexec` the ``mpiexec`` such a block's
  apps find on their ``PATH`` (``$PARSL_MPI_PREFIX``), which runs their
  ranks as a DVM job.

Nothing is imported here: ``import pydvm.parsl`` loads neither Parsl nor
the job API; ``from pydvm.parsl import PydvmProvider`` (or
``PydvmExecutor``) loads both.
"""

from __future__ import annotations

__all__ = ["PydvmExecutor", "PydvmProvider", "cancel_app"]


def __getattr__(name: str):
    if name == "PydvmProvider":
        from .provider import PydvmProvider

        return PydvmProvider
    if name in ("PydvmExecutor", "cancel_app"):
        from . import executor

        return getattr(executor, name)
    raise AttributeError(f"module 'pydvm.parsl' has no attribute {name!r}")
