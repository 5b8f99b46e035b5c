"""Launch-phase timestamps, for ``bench/launch/launch_phases.py``; off unless asked for.

With ``PYDVM_LAUNCH_TRACE`` naming a file in the environment of the DVM and
of ``pydvm run``, each process appends one line per point a job passes --
``<unix time> <pid> <point> <namespace>`` -- to that file (each line one
``O_APPEND`` write, so processes do not tear each other's lines).  The
points, in the order a job passes them: ``tool.start`` (the command line's
first line of Python), ``tool.send`` (the run request written),
``master.run``, ``master.launch`` (launch messages sent), ``node.launch``,
``node.registered`` (PMIx registration done), ``node.started`` (every local
process forked), ``pmix.<upcall>`` (as each arrives on the node's loop),
``pmix.fence_done``, ``pmi1.<command>.<rank>`` (a PMI-1 request, as it
arrives on the node's loop), ``pmi1.fence_done``, ``node.exit`` (a process reaped), ``node.exited``
(reported), ``master.launched`` (every node answered), ``master.over`` (the
job ended), ``master.purge`` / ``master.purged`` (the end-of-job purge
broadcast; on each node ``node.purge``, and ``node.deregister`` /
``node.deregistered`` around libpmix's deregistration of the namespace), ``master.report`` (the report sent to the tool), ``tool.result``.

Off (the variable unset), a point costs one test of a module global.
"""

from __future__ import annotations

import os
import time

#: The trace file, or None (tracing off).
PATH = os.environ.get("PYDVM_LAUNCH_TRACE") or None


def mark(point: str, nspace: str = "") -> None:
    """Append ``point`` (for job ``nspace``) to the trace file, if tracing."""
    if PATH is None:
        return
    line = f"{time.time():.6f} {os.getpid()} {point} {nspace or '-'}\n".encode()
    try:
        fd = os.open(PATH, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    except OSError:
        return
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
