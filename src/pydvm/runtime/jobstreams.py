"""The master's job streams: nodes' output to each job's ``pydvm run``, its stdin to rank 0.

Output flow control: a node may have at most ``pydvm_output_window`` of
one job's output unacknowledged, each ``output`` message counted as its
bytes plus a fixed charge (:func:`~pydvm.runtime.jobio.output_cost`).  The
master forwards each ``output`` to the job's tool and acknowledges it
(``output_ack``, in the same units) only once the tool's connection has
drained below its high-water mark, so a tool that reads slowly (or is
stopped) stops the nodes reading the job's streams, and the job blocks on
write as it would on a terminal.  What the master holds for one job is
bounded by nodes x window: the messages waiting in the tool connection's
buffer, each of which costs the master less than its charge.  The head
node's output takes the same path (its in-process link delivers each
message at once; the window is the tool connection's).  What is still
unacknowledged is kept per daemon link
(:attr:`~pydvm.runtime.peers.DaemonSession.output_unacked`).

Input: a ``run`` with ``stdin`` gives rank 0 a pipe; the tool's ``stdin``
messages go to rank 0's node, whose ``stdin_ack`` (bytes written into the
pipe; ``closed`` once rank 0 reads no more) goes back to the tool.  At most
:data:`~pydvm.runtime.jobio.STDIN_WINDOW` bytes are in flight per job: the
tool reads its stdin only within it, and the master drops (and says
``closed`` to) a tool that sends more.

:class:`JobStreams` owns the stdin bytes in flight per job; which tool a
job reports to is the process table's (:meth:`ProcessTable.tool_of
<pydvm.runtime.processes.ProcessTable.tool_of>`).
"""

from __future__ import annotations

import logging
from typing import Any

from ..wire import Message
from .jobio import STDIN_WINDOW, output_cost
from .jobs import JobRecord
from .nodes import NodeTable
from .peers import DaemonSession, PeerSession, ToolSession
from .processes import ProcessListener, ProcessTable

log = logging.getLogger("pydvm.master")


class JobStreams(ProcessListener):
    """Output and stdin forwarding with flow control (see the module docstring)."""

    def __init__(self, processes: ProcessTable, nodes: NodeTable, values: dict[str, Any]) -> None:
        self._processes = processes
        self._nodes = nodes
        self.values = values
        #: nspace -> bytes of its stdin sent on to rank 0's node, not yet
        #: acknowledged there.
        self._stdin_in_flight: dict[str, int] = {}

    def job_ended(self, job: JobRecord) -> None:
        self._stdin_in_flight.pop(job.nspace, None)

    def count(self) -> int:
        return len(self._stdin_in_flight)

    # ------------------------------------------------------------------
    # output
    # ------------------------------------------------------------------

    def output(self, daemon: DaemonSession, msg: Message) -> None:
        """A daemon's ``output``: on to the job's tool, acknowledged once read."""
        ns = msg.get("nspace")
        data = msg.get("data")
        if not isinstance(ns, str) or not isinstance(data, bytes):
            log.warning("%s: malformed output message dropped", daemon.name)
            return
        tool = self._processes.tool_of(ns)
        if tool is not None:
            tool.send(msg)
        self._credit(daemon, ns, output_cost(len(data)), tool)

    def _credit(self, daemon: DaemonSession, ns: str, n: int, tool: PeerSession | None) -> None:
        """Acknowledge ``n`` (output_cost units) of ``ns``'s output to its
        node -- in batches, and only once the tool has read what went before."""
        pending = daemon.output_unacked
        pending[ns] = pending.get(ns, 0) + n
        if pending[ns] < self.values["pydvm_output_window"] // 4 or ns in daemon.ack_scheduled:
            return
        daemon.ack_scheduled.add(ns)

        def flush() -> None:
            daemon.ack_scheduled.discard(ns)
            k = pending.pop(ns, 0)
            if k and not daemon.closed:
                daemon.send({"t": "output_ack", "nspace": ns, "bytes": k})

        if tool is None:
            flush()
        else:
            tool.channel.on_drain(flush)

    # ------------------------------------------------------------------
    # input
    # ------------------------------------------------------------------

    def stdin(self, tool: ToolSession, msg: Message) -> None:
        """A piece of a job's ``pydvm run``'s stdin (``data``, ``eof``): on to
        rank 0's node.  Only from the job's own tool, for a job run with
        stdin, within :data:`STDIN_WINDOW`; anything else is answered
        ``stdin_ack`` with ``closed`` (send no more)."""
        ns, data = msg.get("nspace"), msg.get("data", b"")
        job = self._processes.jobs.get(ns) if isinstance(ns, str) else None
        node = None
        if job is not None and job.stdin and self._processes.tool_of(ns) is tool \
                and isinstance(data, bytes):
            node = job.procs[job.stdin_rank].node
            if self._stdin_in_flight.get(ns, 0) + len(data) > STDIN_WINDOW:
                log.warning("%s: sent more stdin than its window for %s: dropped",
                            tool.name, ns)
                node = None
        if node is None or not self._nodes.is_up(node):
            tool.send({"t": "stdin_ack", "nspace": ns,
                       "bytes": len(data) if isinstance(data, bytes) else 0, "closed": True})
            return
        self._stdin_in_flight[ns] = self._stdin_in_flight.get(ns, 0) + len(data)
        self._nodes.send(node, {"t": "stdin", "nspace": ns, "data": data,
                                "eof": msg.get("eof") is True})

    def stdin_ack(self, daemon: DaemonSession, msg: Message) -> None:
        """Rank 0's node wrote ``bytes`` of stdin into its pipe (``closed``:
        it takes no more): tell the tool."""
        ns, n = msg.get("nspace"), msg.get("bytes")
        job = self._processes.jobs.get(ns) if isinstance(ns, str) else None
        if job is None or job.procs[0].node != daemon.node or not isinstance(n, int) \
                or isinstance(n, bool) or n < 0:
            return
        if ns in self._stdin_in_flight:
            self._stdin_in_flight[ns] = max(0, self._stdin_in_flight[ns] - n)
        tool = self._processes.tool_of(ns)
        if tool is not None:
            tool.send({"t": "stdin_ack", "nspace": ns, "bytes": n,
                       "closed": msg.get("closed") is True})
