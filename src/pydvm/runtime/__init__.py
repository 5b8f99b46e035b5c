"""The runtime: the I/O shell around the stores and the lifetime core.

Where to change what is in ``DESIGN.md`` (next to this file).  The modules:

* :mod:`.core` -- the pure lifetime core: jobs, applications, processes and
  sessions as state changed only by ``handle(event) -> effects``.
* :mod:`.jobs` -- the pure records the core keeps (jobs, apps, processes,
  sessions), rank mapping, failure classification.
* :mod:`.master` -- the DVM's master: the composition root (start-up,
  connections and handshakes, the message -> component tables).  Its
  components, each owning its state: :mod:`.nodes` (``NodeTable``: daemons,
  heartbeats, node loss, broadcasts), :mod:`.processes` (``ProcessTable``:
  the core's shell -- jobs, sessions, launching, exits, purges; the one
  process predicate), :mod:`.jobstreams` (``JobStreams``: output and stdin
  forwarding), :mod:`.dataservice` (``DataService``: the master store, the
  relay, data requests), :mod:`.direct` (``DirectGate``: daemon-node clients
  connected straight to the master), :mod:`.collectives` (``Collectives``:
  PMIx across nodes) and :mod:`.toolreqs` (``ToolService``: tool requests);
  :mod:`.tasks` holds their background tasks.
* :mod:`.node` -- serving one node: launching and reaping processes, their
  client connections, the node store; hosted by :mod:`.daemon` or by the
  master (the head node).  :mod:`.jobproc` -- starting and reaping a job
  process; :mod:`.sockdir` -- private socket directories.  :mod:`.pmixhost`
  -- a node's PMIx server; :mod:`.pmixusers` -- on a multi-user DVM, one
  more per user running PMIx jobs there, as that user, relaying its upcalls.
* :mod:`.peers` -- typed peer sessions (identity, outstanding requests, caps)
  and the one builder of a process's identity (``process_caller``).
* :mod:`.dataops` -- how a data request is applied to a store (both kinds),
  and which store takes which request.
* :mod:`.relay` -- the cross-DVM relay (``--data-server-uri``).
* :mod:`.auth`, :mod:`.credential` -- URIs, the DVM secret and handshake; the
  direct-data credential.
* :mod:`.guard`, :mod:`.registry` -- no orphans; one DVM per id.
* :mod:`.launch`, :mod:`.slurm` -- the local, ssh and slurm launchers,
  daemons' stderr, logging; reading a Slurm allocation.
* :mod:`.metrics` -- Prometheus metrics, gathered at scrape time.
"""
