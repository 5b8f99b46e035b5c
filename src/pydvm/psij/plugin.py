"""The class PSI/J's descriptor names (``psij-descriptors/pydvm_psij.py``).

PSI/J loads a descriptor's class by executing its file as a module of its
own, outside ``sys.modules``; this file only imports the executor, so that
the class PSI/J instantiates is :class:`pydvm.psij.executor.PydvmJobExecutor`
itself (one class, one shared private DVM), however it was reached.
"""

from pydvm.psij.executor import PydvmJobExecutor, PydvmJobExecutorConfig

__all__ = ["PydvmJobExecutor", "PydvmJobExecutorConfig"]
