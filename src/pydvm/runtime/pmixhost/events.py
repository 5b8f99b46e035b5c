"""PMIx events across the DVM, a node's side.

A process's ``PMIx_Notify_event`` with a range beyond its node reaches its
server's libpmix, which delivers it to that server's own clients in range
and hands it to the host (:func:`notify`): the node asks the master to pass
it on, naming the source -- for a tool, the tool's user and namespace
(:meth:`ToolHost.event_source <pydvm.runtime.pmixhost.tools.ToolHost.event_source>`),
since the master decides where a tool's event may go -- and, when this
node has more than one server, which one it came from
(:meth:`PmixHost.server_tag <pydvm.runtime.pmixhost.host.PmixHost.server_tag>`).

The master sends the event to every node in range (``event``), and each
node's :func:`deliver` gives it to each of its servers -- the node's own,
every user's agent, the tool server when tools are attached -- except the
one it came from (``skip``), whose libpmix has it already; libpmix filters
by each handler's codes, range and affected processes.  An event libpmix is
told not to keep for later clients (``PMIX_EVENT_DO_NOT_CACHE``: a job's
end) goes only to servers with a process connected now.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from ...errors import Status
from ...wire import Message
from .session import NoServerHere

if TYPE_CHECKING:
    from .host import PmixHost

log = logging.getLogger("pydvm.pmix")

#: How long a node waits for libpmix to pass an event on to its clients.
EVENT_TIMEOUT = 5.0


def notify(host: "PmixHost", req) -> None:
    """A local client's PMIx_Notify_event beyond this node: libpmix has
    delivered it here; the master passes it to the other nodes in range."""
    def answered(r: Message) -> None:
        if r.get("status") != Status.SUCCESS:
            log.warning("event %d of %s not passed on: %s", req.code, req.source,
                        r.get("msg"))
    from . import codec as pmixcodec  # (it loads pydvm.pmix: only once a node hosts PMIx)
    msg = {"t": "notify", "code": req.code, "source": [req.source.nspace, req.source.rank],
           "range": req.range, "info": pmixcodec.info_to_wire(req.info)}
    tool = host.tools.event_source(req.source.nspace)
    if tool is not None:  # a tool's (tools.py): the master decides where
        msg["tool_uid"], msg["source"] = tool[0], [tool[1], 0]
    origin = getattr(req, "origin", None)
    if origin is not None or host.users.running():
        # libpmix delivered it to the clients of the server it came from
        # only: this node's other servers get it back from the master
        msg["server"] = host.server_tag(origin)
    host.ask_master(msg, answered)


async def deliver(host: "PmixHost", msg: Message) -> int:
    """The master's ``event``: deliver it to this node's clients in range;
    the first failure of a server, or SUCCESS."""
    from ...pmix import Proc
    from ...pmix import constants as C
    if host.server is None:
        return C.ERR_NOT_SUPPORTED
    rows = msg.get("info") or []
    # every server here passes it to its own clients (libpmix filters by
    # range) -- but the one it came from, which has (``skip``: [node, server])
    skip = msg.get("skip")
    skip = skip[1] if isinstance(skip, list) and len(skip) == 2 and \
        skip[0] == host.node.name else None
    # (the tool server's only clients are its tools: none, nothing to tell)
    # An event libpmix is told not to keep for later clients (a job's end)
    # reaches only processes connected now: a server none of whose
    # processes is connected has nobody to tell -- no request for it (a
    # round trip and libpmix's work per job, for one-rank jobs that never
    # called PMIx_Init), and nothing decoded when no server is left.
    now_only = any(isinstance(r, list) and len(r) == 3 and r[0] == C.EVENT_DO_NOT_CACHE
                   and r[2] is True for r in rows)
    listening = _listening(host) if now_only else None
    targets = [srv for srv in (host.server, *host.users.running())
               if host.server_tag(srv) != skip
               and not (srv is host.users.tool_server and not host.tools.serves(srv))
               and (listening is None
                    or (not isinstance(srv, NoServerHere) if srv is host.server
                        else srv.tools or srv in listening))]
    if not targets:
        return Status.SUCCESS
    src = msg["source"]
    source = Proc(str(src[0]), int(src[1]))
    from . import codec as pmixcodec
    info = pmixcodec.info_from_wire(rows)
    statuses = await asyncio.gather(*[
        srv.notify_event(int(msg["code"]), source, int(msg["range"]), info,
                         timeout=EVENT_TIMEOUT) for srv in targets])
    return next((s for s in statuses if s != Status.SUCCESS), Status.SUCCESS)


def _listening(host: "PmixHost") -> set:
    """The servers with at least one local process connected now."""
    return {host.local_nspaces.get(ns) for ns, _ in host.connected} - {None}
