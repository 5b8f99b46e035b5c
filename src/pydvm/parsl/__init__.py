"""Parsl on a DVM (``pip install 'pydvm[parsl]'``; docs/workflows.md, "Parsl on a DVM").

:class:`~pydvm.parsl.provider.PydvmProvider` (in :mod:`.provider`) is a
Parsl execution provider whose blocks are DVM jobs; :mod:`.block` is what
runs on each rank of a block that keeps nodes for MPI apps, and
:mod:`.mpiexec` the ``mpiexec`` such a block's apps find on their ``PATH``
(``$PARSL_MPI_PREFIX``), which runs their ranks as a DVM job.

Nothing is imported here: ``import pydvm.parsl`` loads neither Parsl nor
the job API; ``from pydvm.parsl import PydvmProvider`` loads both.
"""

from __future__ import annotations

__all__ = ["PydvmProvider"]


def __getattr__(name: str):
    if name == "PydvmProvider":
        from .provider import PydvmProvider

        return PydvmProvider
    raise AttributeError(f"module 'pydvm.parsl' has no attribute {name!r}")
