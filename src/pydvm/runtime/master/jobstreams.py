"""The master's job streams: nodes' output to each job's ``pydvm run``, its stdin to the ranks that read it.

Output flow control: a node may have at most ``pydvm_output_window`` of
one job's output unacknowledged, each ``output`` message counted as its
bytes plus a fixed charge (:func:`~pydvm.runtime.node.jobio.output_cost`).  The
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
(:attr:`~pydvm.runtime.shared.peers.DaemonSession.output_unacked`).

Input: a ``run`` with ``stdin`` gives the ranks that read it a pipe --
rank 0, the rank of ``--stdin N`` (``stdin_rank``), or every rank with
``--stdin all`` (``stdin_rank: "all"``).  The tool's ``stdin`` messages go
to every node running such a rank; each node's ``stdin_ack`` counts the
bytes every reading rank there has been given (``closed`` once none of
them reads any more: each ended or closed its stdin).  The tool hears what
*every* node still taking it has acknowledged -- the slowest sets the pace
-- and ``closed`` once no node takes any more (a lost node takes nothing).
At most :data:`~pydvm.runtime.node.jobio.STDIN_WINDOW` bytes are in flight per
job: the tool reads its stdin only within it, and the master drops (and
says ``closed`` to) a tool that sends more.  So a rank that never reads
lets the others get at most the window (plus its pipe's buffer) ahead of
it, until it ends or closes its stdin; nothing is dropped for it.

:class:`JobStreams` owns each job's stdin fan-out (:class:`_StdinFan`); which tool a
job reports to is the process table's (:meth:`ProcessTable.tool_of
<pydvm.runtime.master.processes.ProcessTable.tool_of>`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ...wire import Message
from ..node import STDIN_WINDOW, output_cost
from ..shared.jobs import JobRecord
from ..shared.peers import DaemonSession, PeerSession, ToolSession
from .nodes import NodeTable
from .processes import ProcessListener, ProcessTable

log = logging.getLogger("pydvm.master")


@dataclass
class _StdinFan:
    """A job's stdin on its way to the nodes of the ranks that read it."""

    #: node -> bytes it has acknowledged (every reading rank there has them).
    acked: dict[str, int]
    #: the nodes still taking it (not closed, not lost).
    open: set[str]
    #: bytes sent on to the nodes; bytes the tool was told are through.
    sent: int = 0
    told: int = 0
    closed_told: bool = False


class JobStreams(ProcessListener):
    """Output and stdin forwarding with flow control (see the module docstring)."""

    def __init__(self, processes: ProcessTable, nodes: NodeTable, values: dict[str, Any]) -> None:
        self._processes = processes
        self._nodes = nodes
        self.values = values
        #: nspace -> its stdin on the way to the nodes of the ranks that read it.
        self._stdin: dict[str, _StdinFan] = {}

    def job_ended(self, job: JobRecord) -> None:
        self._stdin.pop(job.nspace, None)

    def count(self) -> int:
        return len(self._stdin)

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

    def _fan(self, job: JobRecord) -> _StdinFan:
        fan = self._stdin.get(job.nspace)
        if fan is None:
            readers = job.procs if job.stdin_all else [job.stdin_rank]
            nodes = {job.procs[r].node for r in readers if r in job.procs}
            fan = self._stdin[job.nspace] = _StdinFan({n: 0 for n in nodes}, set(nodes))
        return fan

    def stdin(self, tool: ToolSession, msg: Message) -> None:
        """A piece of a job's ``pydvm run``'s stdin (``data``, ``eof``): on to
        every node running a rank that reads it.  Only from the job's own
        tool, for a job run with stdin, within :data:`STDIN_WINDOW`; anything
        else is answered ``stdin_ack`` with ``closed`` (send no more)."""
        ns, data = msg.get("nspace"), msg.get("data", b"")
        job = self._processes.jobs.get(ns) if isinstance(ns, str) else None
        fan = None
        if job is not None and job.stdin and self._processes.tool_of(ns) is tool \
                and isinstance(data, bytes):
            fan = self._fan(job)
            self._drop_lost(ns, fan)
            if fan.sent - fan.told + len(data) > STDIN_WINDOW:
                log.warning("%s: sent more stdin than its window for %s: dropped",
                            tool.name, ns)
                fan = None
        if fan is None or not fan.open:
            tool.send({"t": "stdin_ack", "nspace": ns,
                       "bytes": len(data) if isinstance(data, bytes) else 0, "closed": True})
            return
        fan.sent += len(data)
        out = {"t": "stdin", "nspace": ns, "data": data, "eof": msg.get("eof") is True}
        for node in sorted(fan.open):
            self._nodes.send(node, out)

    def stdin_ack(self, daemon: DaemonSession, msg: Message) -> None:
        """A node wrote ``bytes`` more of stdin into the pipes of every rank
        there that reads it (``closed``: it takes no more): once every node
        has, tell the tool."""
        ns, n = msg.get("nspace"), msg.get("bytes")
        fan = self._stdin.get(ns) if isinstance(ns, str) else None
        if fan is None or daemon.node not in fan.open or not isinstance(n, int) \
                or isinstance(n, bool) or n < 0:
            return
        fan.acked[daemon.node] += n
        if msg.get("closed") is True:
            fan.open.discard(daemon.node)
        self._advance(ns, fan)

    def proc_ended(self, nspace: str, rank: int) -> None:
        fan = self._stdin.get(nspace)
        if fan is not None:
            self._drop_lost(nspace, fan)  # a lost node acknowledges nothing more

    def _drop_lost(self, ns: str, fan: _StdinFan) -> None:
        lost = {n for n in fan.open if not self._nodes.is_up(n)}
        if lost:
            fan.open -= lost
            self._advance(ns, fan)

    def _advance(self, ns: str, fan: _StdinFan) -> None:
        """Tell the tool how much more every open node has taken (all it
        was sent, and ``closed``, once no node takes any more)."""
        through = min((fan.acked[n] for n in fan.open), default=fan.sent)
        through = min(through, fan.sent)
        closed = not fan.open
        if through <= fan.told and not (closed and not fan.closed_told):
            return
        n, fan.told = max(0, through - fan.told), max(fan.told, through)
        fan.closed_told = closed
        tool = self._processes.tool_of(ns)
        if tool is not None:
            tool.send({"t": "stdin_ack", "nspace": ns, "bytes": n, "closed": closed})
