"""The runtime: the I/O shell around the stores.

* :mod:`.master` -- the DVM's master (nodes, jobs, sessions, master store).
* :mod:`.daemon` -- one per node (launch, reap, client socket, node store).
* :mod:`.jobs` -- pure job/app/process/session bookkeeping and rank mapping.
* :mod:`.dataops` -- how a data request is applied to a store (both kinds).
* :mod:`.auth` -- URIs, the DVM secret, the handshake.
* :mod:`.launch` -- the local, ssh and slurm launchers; daemons' stderr; logging set-up.
* :mod:`.slurm` -- reading a Slurm allocation; the srun line of the daemons' step.
"""
