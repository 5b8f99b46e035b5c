"""A node's PMIx processes as sessions, and the null server.

:class:`PmixSession` is one registered local PMIx process as the node's
routing code sees a client (:class:`~pydvm.runtime.shared.peers.PeerSession`):
its requests are libpmix upcalls, its answers go back through their reply
objects (:class:`PmixChannel`).  :class:`NoServerHere` stands for a node
process's own libpmix server when it hosts none (``pydvm_pmix_isolate``:
every job's server is a process of its own).  Used by
:class:`~pydvm.runtime.pmixhost.host.PmixHost`.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from ...errors import Status
from ...store import Caller
from ...wire import Message
from ..shared.peers import PeerSession, SessionChannel
from .data import RelayedData, answer

log = logging.getLogger("pydvm.pmix")

if TYPE_CHECKING:
    from .host import PmixHost


class PmixChannel(SessionChannel):
    """The channel-like end of a :class:`PmixSession`: an answer is matched
    to the pending upcall by its id and handed to libpmix."""

    def __init__(self, host: "PmixHost", name: str) -> None:
        super().__init__(name)
        self.host = host

    def close(self, reason: str = "closed", *, error: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        if error:
            log.warning("%s: closed: %s", self.name, reason)
        self.host.session_closed(self.session, reason)


class PmixSession(PeerSession):
    """One registered PMIx process, as the routing code sees a client.

    ``pending`` maps the ids this session gave its requests to the upcalls
    still owed an answer; an id is in it exactly until :meth:`deliver`
    answered it (or the session closed, answering them UNREACH).
    """

    kind = "pmix"

    def __init__(self, host: "PmixHost", caller: Caller, max_outstanding: int | None) -> None:
        super().__init__(PmixChannel(host, f"pmix {caller.nspace}:{caller.rank}"),
                         max_outstanding)
        self.caller = caller
        self.pending: dict[int, Any] = {}
        self._next = 0
        #: what the process has done with PMIx: None (nothing yet),
        #: "connected" (PMIx_Init), "finalized" (PMIx_Finalize).
        self.pmix_state: str | None = None

    @property
    def proc_key(self) -> tuple[str, int]:
        return (self.caller.nspace, self.caller.rank)

    def new_id(self, req) -> int:
        self._next += 1
        self.pending[self._next] = req
        return self._next

    def send_answer(self, rid: int, out: Message) -> None:
        self.deliver(out)

    def deliver(self, msg: Message) -> None:
        """Answer the upcall whose id ``msg`` replies to (a reply map)."""
        rid = msg.get("id")
        req = self.pending.pop(rid, None) if isinstance(rid, int) else None
        if req is None:
            return  # a refusal of something never admitted, or a late answer
        if req.__class__ is RelayedData:
            req.relay(msg)  # an agent's: it makes the PMIx reply itself
            return
        answer(req, msg, self.name)

    def fail_all(self, status: int) -> None:
        pending, self.pending = self.pending, {}
        for req in pending.values():
            if not req.reply.done:
                req.reply.fail(status)


class NoServerHere:
    """What stands for the node process's own libpmix server where
    ``pydvm_pmix_isolate`` keeps libpmix out of it: every job's and tool's
    server is a process of its own (runtime/pmixhost/users.py), so this serves no
    one -- nothing registers with it, events have no client here, and a
    server process's directory goes beside ``tmpdir``
    (:meth:`PmixHost.fallback_server` replaces it by a real one when a server
    process cannot start)."""

    tool_support = False
    running = True

    def __init__(self, base: str, nspace: str) -> None:
        #: never made: server processes make their directories beside it
        self.tmpdir = os.path.join(base, "pmix-node")
        self.nspace = nspace
        self.stats = {"requests": 0, "answered_now": 0}

    async def register_nspace(self, nspace: str, nlocalprocs: int, info=()) -> None:
        raise RuntimeError("no PMIx server in the node process (pydvm_pmix_isolate)")

    async def register_client(self, proc, uid: int, gid: int) -> None:
        raise RuntimeError("no PMIx server in the node process (pydvm_pmix_isolate)")

    async def deregister_nspace(self, nspace: str) -> None:
        return None

    def setup_fork(self, proc) -> dict[str, str]:
        return {}

    async def notify_event(self, code: int, source, rng: int, info=(), timeout: float = 5.0
                           ) -> int:
        return int(Status.SUCCESS)

    async def dmodex_request(self, proc) -> tuple[int, bytes]:
        return int(Status.ERR_NOT_FOUND), b""

    def finalize(self) -> None:
        return None
