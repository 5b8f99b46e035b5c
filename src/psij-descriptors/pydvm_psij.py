"""Registers pydvm's PSI/J executor and launcher, both ``pydvm``, with PSI/J.

PSI/J reads every module of the ``psij-descriptors`` namespace package on
``sys.path`` when ``psij`` is imported (this directory has no
``__init__.py`` on purpose: it merges with psij-python's own).  The class
named here must lie under the same ``sys.path`` entry as this file, which
installing pydvm (or ``pip install -e``) arranges.
"""

from packaging.version import Version
from psij.descriptor import Descriptor

__PSI_J_EXECUTORS__ = [
    Descriptor(name="pydvm", nice_name="pydvm DVM", version=Version("0.1.0"),
               cls="pydvm.psij.plugin.PydvmJobExecutor"),
]

__PSI_J_LAUNCHERS__ = [
    Descriptor(name="pydvm", version=Version("0.1.0"),
               cls="pydvm.psij.plugin.PydvmLauncher"),
]
