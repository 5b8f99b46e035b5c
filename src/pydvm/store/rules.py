"""The store's rules, each written once as a table or a predicate.

Reading and removing are separate questions with separate predicates:

* **who may read** an item: :func:`may_access` (the accessor lists, or the
  owner's uid/gid) then :func:`range_admits` twice -- the item's range seen
  from its publisher, and the lookup's range seen from the requestor.
  :func:`may_read` composes the three in the SPEC's order.
* **who may remove** an item: :func:`owns`, and nothing else.  An accessor
  list never confers removal, and an owner excluded by its own list may
  still remove what it cannot read.

Lifetimes are the table :data:`EXPIRES_BY`.  Persistence numbers are PMIx
wire values and are *not* ordered by lifetime, so no rule here compares them.
"""

from __future__ import annotations

import enum

from ..enums import Persistence, Range
from .model import Caller, Item


class Side(enum.Enum):
    """Which side of a lookup a range is judged from (SPEC 4, CUSTOM row)."""

    PUBLISHER = "publisher"  # the item's range, anchored at its publisher
    REQUESTER = "requester"  # the lookup's range, anchored at the requestor


# ---------------------------------------------------------------------------
# Who may read
# ---------------------------------------------------------------------------


def lists_admit(subject: Caller, uids: tuple[int, ...], gids: tuple[int, ...]) -> bool:
    """Each accessor list given is a requirement the subject must meet."""
    if uids and subject.uid not in uids:
        return False
    if gids and (subject.gid is None or subject.gid not in gids):
        return False
    return True


def may_access(requestor: Caller, item: Item) -> bool:
    """Check (a), access: the accessor lists, or else the owner's identity.

    With no accessor lists the requestor must present the publisher's uid
    and gid -- uid alone when either gid is unknown.
    """
    if item.access_uids or item.access_gids:
        return lists_admit(requestor, item.access_uids, item.access_gids)
    if requestor.uid != item.uid:
        return False
    if requestor.gid is None or item.gid is None:
        return True
    return requestor.gid == item.gid


def range_admits(
    rng: Range, anchor: Caller, subject: Caller, side: Side, item: Item, dvm_nspace: str
) -> bool:
    """The range table of SPEC 4: does ``rng`` anchored at ``anchor`` admit ``subject``?

    ``item`` supplies the accessor lists for CUSTOM; ``dvm_nspace`` is the
    namespace under which the DVM itself (and its tools) act, for RM.
    """
    if rng in (Range.SESSION, Range.GLOBAL, Range.UNDEF):
        return True
    if rng is Range.NAMESPACE:
        return subject.nspace == anchor.nspace
    if rng is Range.LOCAL:
        return anchor.node is not None and subject.node == anchor.node
    if rng is Range.PROC_LOCAL:
        return subject.proc == anchor.proc
    if rng is Range.RM:
        return subject.nspace == dvm_nspace
    if rng is Range.CUSTOM:
        if side is Side.REQUESTER:
            return False
        if not (item.access_uids or item.access_gids):
            return False
        return lists_admit(subject, item.access_uids, item.access_gids)
    raise AssertionError(f"range {rng!r} missing from the range table")


class ReadVerdict(enum.Enum):
    OK = "ok"
    NO_ACCESS = "no-access"  # refused by check (a): counts for NO_PERMISSIONS
    OUT_OF_RANGE = "out-of-range"  # refused by (b) or (c): reads as NOT_FOUND


def may_read(requestor: Caller, item: Item, lookup_range: Range, dvm_nspace: str) -> ReadVerdict:
    """Checks (a), (b), (c) in the SPEC's order."""
    if not may_access(requestor, item):
        return ReadVerdict.NO_ACCESS
    if not range_admits(item.range, item.owner, requestor, Side.PUBLISHER, item, dvm_nspace):
        return ReadVerdict.OUT_OF_RANGE
    if not range_admits(lookup_range, requestor, item.owner, Side.REQUESTER, item, dvm_nspace):
        return ReadVerdict.OUT_OF_RANGE
    return ReadVerdict.OK


# ---------------------------------------------------------------------------
# Who may remove
# ---------------------------------------------------------------------------


def owns(requestor: Caller, item: Item) -> bool:
    """Ownership: same uid, and same gid when both are known.

    The only predicate for removal (unpublish by key) and for "own"
    collisions under ``replace``.  Never consults range or access lists.
    """
    if requestor.uid != item.uid:
        return False
    if requestor.gid is None or item.gid is None:
        return True
    return requestor.gid == item.gid


# ---------------------------------------------------------------------------
# Lifetimes
# ---------------------------------------------------------------------------

#: Which persistences a purge of each horizon removes (SPEC 5).
#: ``INVALID`` as a horizon is the explicit ``unpublish()`` of a process:
#: everything it published.  INDEF and FIRST_READ appear under no lifetime.
EXPIRES_BY: dict[Persistence, frozenset[Persistence]] = {
    Persistence.PROC: frozenset({Persistence.PROC}),
    Persistence.APP: frozenset({Persistence.PROC, Persistence.APP}),
    Persistence.NSPACE: frozenset({Persistence.PROC, Persistence.APP, Persistence.NSPACE}),
    Persistence.SESSION: frozenset(
        {Persistence.PROC, Persistence.APP, Persistence.NSPACE, Persistence.SESSION}
    ),
    Persistence.INVALID: frozenset(Persistence) - {Persistence.INVALID},
}

#: Horizons that are lifetimes ending (as opposed to an explicit unpublish).
LIFETIME_HORIZONS = frozenset(
    {Persistence.PROC, Persistence.APP, Persistence.NSPACE, Persistence.SESSION}
)


def expires_by(persistence: Persistence, horizon: Persistence) -> bool:
    """Does a purge at ``horizon`` remove an item of ``persistence``?"""
    try:
        return persistence in EXPIRES_BY[horizon]
    except KeyError:
        raise ValueError(f"{horizon!r} is not a purge horizon") from None


def sweep_interval(timeout: float) -> float:
    """The idle sweep's period: ``timeout/4`` clamped to [1 s, 60 s]."""
    return min(60.0, max(1.0, timeout / 4.0))
