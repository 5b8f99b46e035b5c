"""PMI-1, the interface the MPICH family of MPIs finds its launcher through.

MPICH, Intel MPI, MVAPICH and Cray MPICH start by talking PMI-1 ("simple
PMI") to whoever launched them, over an inherited socket (``PMI_FD``) or a
``host:port`` (``PMI_PORT`` with ``PMI_ID``): a line protocol of ``put``,
``get``, ``barrier``, ``abort``, the name service and ``spawn``.  This
package is its pure part:

* :mod:`~pydvm.pmi1.wire` -- the lines (:class:`Reader`, :func:`encode`);
* :mod:`~pydvm.pmi1.job` -- a node's share of one job (:class:`Pmi1Job`):
  requests in, effects out, no I/O;
* :mod:`~pydvm.pmi1.detect` -- which interface a program needs.

The node's I/O shell around it is :mod:`pydvm.runtime.node.pmi1host`.
"""

from .job import Pmi1Job, process_mapping
from .wire import Command, ProtocolError, Reader, encode

__all__ = ["Command", "Pmi1Job", "ProtocolError", "Reader", "encode", "process_mapping"]
