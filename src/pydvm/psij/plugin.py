"""The class PSI/J's descriptor names (``psij-descriptors/pydvm_psij.py``).

PSI/J loads a descriptor's class by executing its file as a module of its
own, outside ``sys.modules``; this file only imports the classes, so that
the class PSI/J instantiates is :class:`pydvm.psij.executor.PydvmJobExecutor`
itself (one class, one shared private DVM), however it was reached; the
same for the launcher.
"""

from pydvm.psij.executor import PydvmJobExecutor, PydvmJobExecutorConfig
from pydvm.psij.launcher import PydvmLauncher

__all__ = ["PydvmJobExecutor", "PydvmJobExecutorConfig", "PydvmLauncher"]
