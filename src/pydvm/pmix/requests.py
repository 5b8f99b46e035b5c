"""The requests libpmix hands to the host, as small typed objects.

Each upcall of ``pmix_server_module_t`` becomes one of the dataclasses below,
built on libpmix's progress thread (everything is copied out of C memory
there) and delivered to the host's handler on its asyncio event loop.  Every
request carries ``reply``: the object the host calls, once, to answer (see
:mod:`pydvm.pmix.server` for the reply contract).  A request is data: which
reply it carries is the server's choice, made when it builds the request,
and this module knows only the contract all replies keep (:class:`Reply`),
not the reply classes (:mod:`pydvm.pmix.replies`, which import nothing of
this module either).  What each request's reply takes:

- ``reply(status)``: ClientConnected, ClientFinalized, Abort, Publish,
  Unpublish, Connect, Disconnect, RegisterEvents, DeregisterEvents,
  NotifyEvent (``OpReply``);
- ``reply(status, found)``: Lookup (``LookupReply``);
- ``reply(status, data=b"")``: Fence, DirectModex (``ModexReply``);
- ``reply(status, nspace=None)``: Spawn (``SpawnReply``);
- ``reply(status, info=())``: Group, JobControl, Allocate, Query (``InfoReply``).

Identity: ``proc`` is the requesting process as libpmix authenticated it at
connect (its registered namespace and rank).  The ``pmix.euid`` a client
packs into publish/lookup/unpublish is its own claim and is dropped here: the
host must use the uid/gid it registered for that proc.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from .values import Proc, ProcInfo, RegAttr, Value  # noqa: F401 (the agents' codec)


class Reply(Protocol):
    """How the host answers a request: ``request.reply(status, ...)``, once,
    from any thread (later calls do nothing and return False); ``fail(status)``
    answers an error with no data; ``done`` tells whether it was answered."""

    kind: str

    @property
    def done(self) -> bool: ...

    def __call__(self, status: int = ..., *answer: Any) -> bool: ...

    def fail(self, status: int) -> bool: ...


@dataclass(eq=False)
class Request:
    kind = "request"


@dataclass(eq=False)
class ClientConnected(Request):
    """A registered client completed ``PMIx_Init`` (``client_connected2``)."""

    proc: Proc
    info: dict[str, Value]
    reply: Reply = field(repr=False, default=None)
    kind = "client_connected"


@dataclass(eq=False)
class ClientFinalized(Request):
    """A client called ``PMIx_Finalize``.  A client that dies without it sends nothing."""

    proc: Proc
    reply: Reply = field(repr=False, default=None)
    kind = "client_finalized"


@dataclass(eq=False)
class Abort(Request):
    """``PMIx_Abort``: ``procs`` empty means the caller's whole namespace."""

    proc: Proc
    status: int
    message: str | None
    procs: list[Proc]
    reply: Reply = field(repr=False, default=None)
    kind = "abort"


@dataclass(eq=False)
class Fence(Request):
    """``fence_nb``: all local participants of ``procs`` have arrived.

    ``data`` is this server's contribution (opaque bytes); with ``collect``
    the host gathers every participating server's contribution and replies
    with their concatenation (any order), otherwise it replies with ``b""``.
    ``timeout`` is seconds (``None``: not given).
    """

    procs: list[Proc]
    data: bytes
    collect: bool
    timeout: int | None
    info: dict[str, Value]
    reply: Reply = field(repr=False, default=None)
    kind = "fence"


@dataclass(eq=False)
class DirectModex(Request):
    """``direct_modex``: a local client wants data posted by ``proc`` on another node.

    The host asks the server of ``proc``'s node (there:
    :meth:`PmixServer.dmodex_request`) and replies with the bytes it got.
    """

    proc: Proc
    info: dict[str, Value]
    reply: Reply = field(repr=False, default=None)
    kind = "direct_modex"


@dataclass(eq=False)
class Publish(Request):
    """``PMIx_Publish``.

    ``pairs``: the published key/values (the info entries that are not
    ``pmix.*`` attributes), each with its PMIx type.  ``range`` and
    ``persistence`` are the integer codes whatever their encoding
    (PMIX_DATA_RANGE / PMIX_PERSIST / PMIX_INT ...), or ``None`` when the
    client gave none (the host applies its defaults).  ``access_uids`` /
    ``access_gids``: PMIX_ACCESS_USERIDS / GRPIDS if given.  ``directives``:
    the remaining ``pmix.*`` attributes.
    """

    proc: Proc
    pairs: dict[str, Value]
    range: int | None
    persistence: int | None
    access_uids: tuple[int, ...] | None
    access_gids: tuple[int, ...] | None
    directives: dict[str, Value]
    reply: Reply = field(repr=False, default=None)
    kind = "publish"


@dataclass(eq=False)
class Lookup(Request):
    """``PMIx_Lookup``.

    ``wait``: ``None`` = answer now; otherwise park until ``wait`` keys are
    found (``0`` = all of them).  ``timeout``: seconds from PMIX_TIMEOUT
    (``None`` not given; PMIx reads ``0`` as "no timeout").  libpmix parks
    and times out nothing: both are the host's job.
    """

    proc: Proc
    keys: list[str]
    range: int | None
    wait: int | None
    timeout: int | None
    directives: dict[str, Value]
    reply: Reply = field(repr=False, default=None)
    kind = "lookup"

    @property
    def wait_count(self) -> int:
        """Keys needed before answering: 0 for no wait, else ``wait`` or all keys."""
        if self.wait is None:
            return 0
        return min(self.wait, len(self.keys)) if self.wait else len(self.keys)


@dataclass(eq=False)
class Unpublish(Request):
    """``PMIx_Unpublish``: ``keys`` is ``None`` for "everything the caller published"."""

    proc: Proc
    keys: list[str] | None
    range: int | None
    directives: dict[str, Value]
    reply: Reply = field(repr=False, default=None)
    kind = "unpublish"


@dataclass(eq=False)
class App:
    """One application of a spawn request (``pmix_app_t``)."""

    cmd: str | None
    argv: list[str]
    env: list[str]
    cwd: str | None
    maxprocs: int
    info: dict[str, Value]


@dataclass(eq=False)
class Spawn(Request):
    """``PMIx_Spawn`` (MPI_Comm_spawn): reply with the new namespace once launched."""

    proc: Proc
    job_info: dict[str, Value]
    apps: list[App]
    reply: Reply = field(repr=False, default=None)
    kind = "spawn"


@dataclass(eq=False)
class Connect(Request):
    """``PMIx_Connect`` (MPI_Comm_accept/connect): all local participants arrived.

    A collective across the servers hosting ``procs``: reply once every
    server involved has seen its own participants (one node: at once).
    """

    procs: list[Proc]
    info: dict[str, Value]
    reply: Reply = field(repr=False, default=None)
    kind = "connect"


@dataclass(eq=False)
class Disconnect(Request):
    """``PMIx_Disconnect``: the same collective as :class:`Connect`."""

    procs: list[Proc]
    info: dict[str, Value]
    reply: Reply = field(repr=False, default=None)
    kind = "disconnect"


@dataclass(eq=False)
class RegisterEvents(Request):
    """A client registered an event handler for ``codes`` (empty: every event).

    Informational: the host may use it to route events; answering SUCCESS
    is enough, libpmix itself keeps the handlers and filters events."""

    codes: list[int]
    info: dict[str, Value]
    reply: Reply = field(repr=False, default=None)
    kind = "register_events"


@dataclass(eq=False)
class DeregisterEvents(Request):
    """A client removed its handlers for ``codes``."""

    codes: list[int]
    reply: Reply = field(repr=False, default=None)
    kind = "deregister_events"


@dataclass(eq=False)
class NotifyEvent(Request):
    """``PMIx_Notify_event`` by a local client, with a range beyond this node.

    libpmix has already delivered it to this server's own clients in
    ``range``; the host passes it to the servers of the other nodes in
    range, which deliver it with ``PmixServer.notify_event``.  ``info`` is
    the event's info, in order (``PMIX_EVENT_CUSTOM_RANGE``,
    ``PMIX_EVENT_AFFECTED_PROC``...), minus entries the binding cannot copy.
    """

    code: int
    source: Proc
    range: int
    info: list[tuple[str, Value]]
    reply: Reply = field(repr=False, default=None)
    kind = "notify_event"


@dataclass(eq=False)
class Group(Request):
    """``PMIx_Group_construct`` / ``_destruct``: every local member arrived.

    ``op``: ``"construct"`` or ``"destruct"``; ``grpid`` the group's name;
    ``procs`` its members.  ``directives`` are the first local caller's
    (``PMIX_GROUP_ASSIGN_CONTEXT_ID``, ``PMIX_TIMEOUT``, and this server's
    contribution as the bytes of ``PMIX_GROUP_ENDPT_DATA``).  A collective
    like :class:`Fence`: reply once every server hosting members has
    contributed, with ``(status, info)`` -- for a construct, the
    concatenation of every server's ``PMIX_GROUP_ENDPT_DATA`` bytes and, if
    asked, a ``PMIX_GROUP_CONTEXT_ID``.
    """

    op: str
    grpid: str
    procs: list[Proc]
    directives: dict[str, Value]
    reply: Reply = field(repr=False, default=None)
    kind = "group"


@dataclass(eq=False)
class JobControl(Request):
    """``PMIx_Job_control``: act on ``procs`` (a rank of ``PMIX_RANK_WILDCARD``
    stands for its whole namespace; none at all for the requester's own).

    ``proc`` is the requester as libpmix authenticated it.  ``directives``
    are the copied ones (``PMIX_JOB_CTRL_KILL``, ``_SIGNAL``, ...);
    ``unreadable`` names those the binding could not copy.  Libpmix serves
    cleanup registrations (``PMIX_REGISTER_CLEANUP``...) itself and never
    hands those on.  Answer with ``(status, info)``.
    """

    proc: Proc
    procs: list[Proc]
    directives: dict[str, Value]
    unreadable: list[str]
    reply: Reply = field(repr=False, default=None)
    kind = "job_control"


@dataclass(eq=False)
class Allocate(Request):
    """``PMIx_Allocation_request``: ``directive`` is a ``PMIX_ALLOC_*`` number
    (new, extend, release, reacquire, external); ``info`` describes what is
    asked.  Answer with ``(status, info)``."""

    proc: Proc
    directive: int
    info: dict[str, Value]
    reply: Reply = field(repr=False, default=None)
    kind = "allocate"


@dataclass(eq=False)
class QueryItem:
    """One ``pmix_query_t``: its keys and its qualifiers."""

    keys: list[str]
    qualifiers: dict[str, Value]


@dataclass(eq=False)
class Query(Request):
    """``PMIx_Query_info`` that libpmix could not answer from its own data.

    libpmix 4.2 names no requester: ``server`` is the identity of the
    server the query reached (its ``PMIX_SERVER_NSPACE`` and rank), so the
    host can tell at most *whose server* was asked.  Answer with
    ``(status, info)``: one ``(query key, Value)`` per answered key;
    PMIX_QUERY_PARTIAL_SUCCESS when only some were, PMIX_ERR_NOT_SUPPORTED
    (or NOT_FOUND) when none were.
    """

    server: Proc
    queries: list[QueryItem]
    reply: Reply = field(repr=False, default=None)
    kind = "query"


def info_dict(items) -> dict[str, Any]:
    return {k: v for k, v in items}


REQUEST_TYPES = (ClientConnected, ClientFinalized, Abort, Fence, DirectModex, Publish,
                 Lookup, Unpublish, Spawn, Connect, Disconnect, RegisterEvents,
                 DeregisterEvents, NotifyEvent, Group, Query, JobControl, Allocate)
