"""The runtime: the I/O shell around the stores and the lifetime core.

Four rooms, lowest first; a room imports only rooms below it, and the
others reach ``master``, ``node`` and ``pmixhost`` only through the room's
door (its package's names):

* :mod:`.shared` -- what both sides use, imported module by module: peer
  sessions and the one builder of a process's identity, data routing, the
  store guard, the pure job records, starting job processes, doors, the
  DVM secret and handshake, logging.
* :mod:`.pmixhost` -- all between a node and libpmix: a node's PMIx server,
  per-user agents, PMIx tools, queries and job control; its node known only
  through ``pmixhost.contract.HostNode``.
* :mod:`.node` -- serving one node: ``NodeServer`` (in a daemon, or in the
  master for the head node), a job's share of processes and their streams,
  the rank environment, CPU binding, the PMI-1 server.
* :mod:`.master` -- the DVM's master: the composition root ``Master`` and
  its components, the pure lifetime core, launchers, Slurm, metrics.

The map, the import rules and where to change what: ``DESIGN.md`` next to
this file; each room's own notes are the ``DESIGN.md`` in its folder.
"""

from __future__ import annotations

import sys
from importlib import import_module
from typing import Any, Callable


def door(package: str, names: dict[str, tuple[str, str]]
         ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A room's door: the module ``__getattr__`` and ``__dir__`` (PEP 562) of
    ``package`` that load each of ``names`` (name -> (module of the room,
    name there)) from its module on first use, so that a process importing
    one module of a room does not load the whole room."""

    def __getattr__(name: str) -> Any:
        try:
            module, attr = names[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        value = getattr(import_module(f"{package}.{module}"), attr)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(names))

    return __getattr__, __dir__
