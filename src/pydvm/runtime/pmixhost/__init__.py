"""The PMIx host room: all that stands between a node and libpmix.

``host.PmixHost`` is a node's PMIx server (or, with isolation, its end of
per-user agent processes: ``users``, ``remote``, ``agent``); ``session``,
``data`` and ``fast`` carry PMIx data requests to the node's store;
``events``, ``query``, ``jobctl``, ``tools`` and ``debugger`` serve PMIx
events, queries, job control, tools and a spawn's debugger keys; ``codec``
puts PMIx objects on the wires.  The node it serves is known only through
``contract.HostNode``: this room imports nothing of the node's.  The
binding to libpmix itself is :mod:`pydvm.pmix`.
Where to change what: ``DESIGN.md`` beside this file.
"""

from __future__ import annotations

from .. import door

#: The door: name -> (module of this room, name there).  Other rooms and
#: the command line import these names from here, and nothing else of the room.
_DOOR = {
    "PmixHost": ("host", "PmixHost"),
    "pmix_status": ("host", "pmix_status"),
    "FOREIGN_LAUNCH_PREFIXES": ("host", "FOREIGN_LAUNCH_PREFIXES"),
    "OMPI_JOB_DIRS": ("host", "OMPI_JOB_DIRS"),
    "URI_FILE": ("tools", "URI_FILE"),
    "MasterQueries": ("query", "MasterQueries"),
    "pids_of": ("query", "pids_of"),
    "MasterJobControl": ("jobctl", "MasterJobControl"),
    "jobctl_on_master": ("jobctl", "on_master"),
}
__all__ = sorted(_DOOR)
__getattr__, __dir__ = door(__name__, _DOOR)
