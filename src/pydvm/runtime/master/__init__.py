"""The master room: the DVM's master and its components.

``server.Master`` is the composition root (start-up, connections and
handshakes, the message -> component tables); each component owns its state:
``nodes`` (daemons, heartbeats, node loss), ``processes`` (the shell of the
pure lifetime ``core``), ``jobqueue`` and ``jobevents`` (the job API's queue
and events), ``jobstreams`` (output and stdin), ``dataservice`` (the master
store; ``relay`` for a cross-DVM relay), ``direct`` (daemon-node clients
connected straight to the master), ``collectives`` (PMIx across nodes),
``toolreqs`` (tool requests), ``debugging`` (jobs stopped for a debugger),
``metrics`` (Prometheus), ``launchers`` and ``slurm`` (starting daemons).
Where to change what: ``DESIGN.md`` beside this file.
"""

from __future__ import annotations

from .. import door

#: The door: name -> (module of this room, name there).  Other rooms and
#: the command line import these names from here, and nothing else of the room.
_DOOR = {
    "Master": ("server", "Master"),
    "StartError": ("nodes", "StartError"),
    "LAUNCHERS": ("launchers", "LAUNCHERS"),
    "make_launcher": ("launchers", "make_launcher"),
    "default_log_dir": ("launchers", "default_log_dir"),
    "allocation_from_env": ("slurm", "allocation_from_env"),
    "in_allocation": ("slurm", "in_allocation"),
    "select_hosts": ("slurm", "select_hosts"),
    "parse_address": ("metrics", "parse_address"),
}
__all__ = sorted(_DOOR)
__getattr__, __dir__ = door(__name__, _DOOR)
