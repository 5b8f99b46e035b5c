"""The runtime: the I/O shell around the stores and the lifetime core.

Where to change what is in ``DESIGN.md`` (next to this file).  The modules:

* :mod:`.core` -- the pure lifetime core: jobs, applications, processes and
  sessions as state changed only by ``handle(event) -> effects``.
* :mod:`.jobs` -- the pure records the core keeps (jobs, apps, processes,
  sessions), rank mapping, failure classification.
* :mod:`.master` -- the DVM's master: start-up, connections, dispatch;
  assembled from :mod:`.nodes` (daemons, heartbeats, node loss, broadcasts),
  :mod:`.lifetimes` (the core's shell: launching, exits, purges, output),
  :mod:`.routing` (data requests), :mod:`.toolreqs` (tool requests),
  :mod:`.collectives` (PMIx across nodes) and :mod:`.direct` (daemon-node
  clients connected straight to the master).
* :mod:`.node` -- serving one node: launching and reaping processes, their
  client connections, the node store; hosted by :mod:`.daemon` or by the
  master (the head node).  :mod:`.pmixhost` -- a node's PMIx server.
* :mod:`.peers` -- typed peer sessions (identity, outstanding requests, caps).
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
