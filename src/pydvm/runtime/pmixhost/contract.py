"""What the PMIx host needs of the node it serves, stated once.

The node (:class:`pydvm.runtime.node.NodeServer`) makes a
:class:`~pydvm.runtime.pmixhost.host.PmixHost` and hands it itself; the host
calls back only through the members below.  They are written here as
protocols so that this room never imports the node's: the node depends on
the PMIx host, never the other way round.  A member added to the host's use
of the node is added here first.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Coroutine, Mapping, Protocol


class HostJob(Protocol):
    """A job as the node runs it (``LocalJob``): its namespace, its session
    and its local processes by rank (each with ``pgid``, ``rank``, ...)."""

    nspace: str
    session_id: int
    procs: Mapping[int, Any]


class HostNode(Protocol):
    """A node as the PMIx host uses it."""

    #: the node's name in the DVM, and the DVM's own namespace
    name: str
    dvm_nspace: str
    #: the DVM's parameters (``pydvm_pmix_*`` among them)
    values: Mapping[str, Any]
    #: whether jobs of several users run here (tools, agents, file modes)
    multi_user: bool
    #: the node's private socket directory (tools' URI files go there)
    socket_dir: Path | None
    #: the link to the master (``request``, ``send``, ``closed``)
    uplink: Any
    #: where data requests go: the master in place (``at_master``) or uplink
    router: Any
    #: the node store, its guard (None on a single-threaded node), the
    #: guardian process that cleans up after the node, its CPU binding
    store: Any
    guard: Any
    guardian: Any
    binding: Any
    #: the jobs running here, by namespace
    jobs: Mapping[str, HostJob]

    def spawn(self, coro: Coroutine, answer_id: Any = None) -> asyncio.Task:
        """Run ``coro`` as one of the node's tasks."""

    async def kill_procs(self, procs: list, grace: float) -> None:
        """End local processes: SIGTERM, SIGKILL after ``grace``."""

    def serve_data(self, session: Any, msg: Any) -> None:
        """Serve a client's data request (replies go to ``session``)."""

    def serve_now(self, session: Any, msg: Any) -> Any:
        """A data request answered at once under the store guard, or None."""

    def drop_session(self, session: Any, nspace: str, rank: int) -> None:
        """A process's client session ended."""
