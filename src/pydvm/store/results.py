"""What the data store takes and returns: its parameters, replies, statistics.

Plain value types with no behaviour of their own, kept apart from
:mod:`pydvm.store.store` so the store's module holds only its mechanics.
"""

# No ``from __future__ import annotations`` here: the NamedTuples' fields
# must be real types, not strings, because typing.NamedTuple builds their
# ``__new__`` in a namespace of its own, where the reference generator
# (pdoc) cannot resolve a string such as 'Value' or 'Status'.
from dataclasses import dataclass, field
from typing import Hashable, Mapping, NamedTuple

from ..enums import Persistence, Range
from ..errors import Status
from .model import Value

#: Default parameter values (SPEC 6).
DEFAULT_TIMEOUT = 300.0
DEFAULT_MAX_SIZE = 16 * 1024 * 1024

@dataclass(frozen=True, slots=True)
class StoreParams:
    """The store's three parameters, read once at construction (SPEC 6).

    ``timeout``: idle seconds before INDEF / unread FIRST_READ items go; 0
    disables.  ``max_size``: bytes per uid in this store; 0 disables.
    ``verbose``: trace level (1 traces removals, 2 every operation).
    """

    timeout: float = DEFAULT_TIMEOUT
    max_size: int = DEFAULT_MAX_SIZE
    verbose: int = 0


class FoundKey(NamedTuple):
    """One answered key: its value and the process that published it.  (What
    a client is handed for it is :class:`pydvm.Found`, built from the reply.)"""

    key: str
    value: Value
    publisher: tuple[str, int]


class Reply(NamedTuple):
    """The outcome of one store operation.

    ``found`` holds what a lookup found (SUCCESS or PARTIAL_SUCCESS), and
    the key an :meth:`~pydvm.store.DataStore.update` leaves behind (its
    value and owner; empty when the key is absent afterwards).
    ``message`` explains refusals (always set for BAD_PARAM).  ``count``
    is what an operation counted: the keys an unpublish removed, 1 when an
    update changed the store (0: a compare-and-set that did not match),
    the keys :meth:`~pydvm.store.DataStore.keys` matched.  ``keys`` are
    the keys a ``keys`` request listed.
    """

    status: Status
    found: tuple[FoundKey, ...] = ()
    message: str = ""
    count: int = 0
    keys: tuple[str, ...] = ()


def bad_param(message: str) -> Reply:
    """The refusal of a request with a bad parameter, ``message`` naming it."""
    return Reply(Status.ERR_BAD_PARAM, message=message)


class Pending(NamedTuple):
    """A lookup was parked; its answer will reach ``on_answer(ticket, Reply)``."""

    ticket: Hashable


class KeyInfo(NamedTuple):
    """One key of one item, as :meth:`DataStore.describe_uid` shows it.

    ``idle``: seconds since the item was last accessed (published, or
    returned by a lookup) -- what ``OBJECT IDLETIME`` tells a Redis user.
    ``expires_in``: seconds until the idle timeout removes it, for INDEF
    and FIRST_READ items while the timeout is on (``TTL``); None when only
    a lifetime (or an unpublish, or eviction) removes it.  ``size``: the
    key's share of the accounting, ``len(key utf-8) + value size``;
    ``item_bytes``: the whole item's ``nbytes``, overhead included.
    """

    key: str
    persistence: Persistence
    range: Range
    idle: float
    expires_in: float | None
    size: int
    item_bytes: int
    publisher: tuple[str, int]


@dataclass(frozen=True, slots=True)
class StoreStats:
    """A snapshot of one store's gauges and counters (``pydvm store``, the
    metrics endpoint, tests).  Counters only grow over the store's life.

    ``items``, ``bytes_by_uid`` (the usage the cap applies to; no entry for
    a uid holding nothing) and ``parked`` (waiting lookups) are what the
    store holds now.  ``removed_keys[reason]`` counts keys removed by each
    rule and ``removed_items[reason]`` items that left the store, under the
    reason that removed their last key; both have an entry for every
    :data:`Reason.ALL`.  ``evictions`` and ``expiries`` are items
    (``removed_items`` of EVICTED and EXPIRED), ``consumed`` keys
    (``removed_keys`` of CONSUMED).  ``sweep_passes`` counts idle sweeps
    run, ``sweep_budget_exhausted`` those that stopped at their budget with
    stale items left (the next pass then runs at once).
    """

    items: int
    bytes_by_uid: Mapping[int, int]
    parked: int
    evictions: int
    expiries: int
    consumed: int
    removed_keys: Mapping[str, int] = field(default_factory=dict)
    removed_items: Mapping[str, int] = field(default_factory=dict)
    sweep_passes: int = 0
    sweep_budget_exhausted: int = 0


class Reason:
    """Why something left the store: the word in trace lines and the key of
    the removal counters (:attr:`StoreStats.removed_keys`)."""

    UNPUBLISHED = "unpublished"  # unpublish(keys), or unpublish() of a process
    REPLACED = "replaced"  # a publish with replace=True took the key over
    CONSUMED = "consumed"  # returned by a lookup of a FIRST_READ item
    PURGED_PROC = "purged_proc"  # its process ended
    PURGED_APP = "purged_app"  # its application ended
    PURGED_NSPACE = "purged_nspace"  # its job ended
    PURGED_SESSION = "purged_session"  # its session ended
    EXPIRED = "expired"  # idle longer than prte_data_server_timeout
    EVICTED = "evicted"  # its uid went over prte_data_server_max_size

    #: every reason, in the order above.
    ALL = (UNPUBLISHED, REPLACED, CONSUMED, PURGED_PROC, PURGED_APP, PURGED_NSPACE,
           PURGED_SESSION, EXPIRED, EVICTED)


#: The reason a purge at each horizon records.  ``INVALID`` is the explicit
#: ``unpublish()`` of a process, which is an unpublish, not a lifetime.
PURGE_REASON: dict[Persistence, str] = {
    Persistence.PROC: Reason.PURGED_PROC,
    Persistence.APP: Reason.PURGED_APP,
    Persistence.NSPACE: Reason.PURGED_NSPACE,
    Persistence.SESSION: Reason.PURGED_SESSION,
    Persistence.INVALID: Reason.UNPUBLISHED,
}
