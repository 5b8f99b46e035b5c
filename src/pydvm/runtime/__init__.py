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
