"""pydvm: a distributed virtual machine with a PMIx-style data store.

``from pydvm import Client`` gives the blocking client a job process uses;
``pydvm.aio.Client`` is the asyncio one.  Ranges, persistences and statuses
are :class:`Range`, :class:`Persistence` and :class:`Status`.  Programs
that run jobs on a DVM use :mod:`pydvm.jobs` (``pydvm.Dvm``, ``pydvm.Job``,
``pydvm.JobSpec``, ``pydvm.JobResult``, ``pydvm.Executor``; the asyncio
twin is ``pydvm.aio.jobs``).
"""

from .enums import Persistence, Range
from .errors import PMIxError, Status
from .protocol import Typed

__version__ = "0.1.0"

#: Loaded on first use: the command line imports this package for its
#: version and protocol, and ``pydvm run`` never needs the client.
_LAZY = {"Client": "client", "Found": "client", "LookupResult": "client",
         "Dvm": "client", "Executor": "client", "Job": "client", "JobResult": "client",
         "JobSpec": "client"}


def __getattr__(name: str):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'pydvm' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

__all__ = [
    "Client",
    "Dvm",
    "Executor",
    "Found",
    "Job",
    "JobResult",
    "JobSpec",
    "LookupResult",
    "Persistence",
    "PMIxError",
    "Range",
    "Status",
    "Typed",
    "__version__",
]
