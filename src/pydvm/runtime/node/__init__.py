"""The node room: serving one node of a DVM.

``server.NodeServer`` serves a node -- its store, its clients, the jobs it
runs -- in a daemon process (``daemon``) or, for the head node, in the
master's.  Launching a job's share of processes: ``launch`` (with
``jobdirs`` and ``ompienv`` for the rank environment); its processes' I/O:
``jobio``; binding them to CPUs: ``binding`` (pure policy), ``topology``,
``cpubind``; the PMI-1 server MPICH-family jobs talk to: ``pmi1host`` (its
pure core is :mod:`pydvm.pmi1`); handing memory back: ``heap``.  The PMIx
server is hosted by the next room down, :mod:`pydvm.runtime.pmixhost`.
Where to change what: ``DESIGN.md`` beside this file.
"""

from __future__ import annotations

from .. import door

#: The door: name -> (module of this room, name there).  Other rooms and
#: the command line import these names from here, and nothing else of the room.
_DOOR = {
    "NodeServer": ("server", "NodeServer"),
    "run_daemon": ("daemon", "run_daemon"),
    "STDIN_WINDOW": ("jobio", "STDIN_WINDOW"),
    "output_cost": ("jobio", "output_cost"),
}
__all__ = sorted(_DOOR)
__getattr__, __dir__ = door(__name__, _DOOR)
