"""The objects a store holds and the identities it reasons about.

:class:`Caller` is who is asking (a requestor) or who published (an owner).
The store never derives identity itself: the runtime fills uid/gid from the
peer credentials of the connection (or, for a tool's relayed request, from
its ``req_uid``/``req_gid`` claims) and the process fields from its job
records.

:class:`Item` is everything one publish stored.  Its fields are mutable only
through :class:`pydvm.store.DataStore`; the indexes there depend on them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Union

from ..enums import Persistence, Range
from ..protocol import DEFAULT_TYPES, TYPE_CATEGORY, TYPE_NAMES, Typed  # noqa: F401 (re-exported)


def pmix_type_of(value) -> int:
    """The PMIx type code of a stored value (bare values: the default)."""
    if value.__class__ is Typed:
        return value.pmix_type
    return DEFAULT_TYPES[value.__class__]


def check_typed(t: "Typed") -> str:
    """'' if ``t``'s value fits its type, else the problem."""
    cat = TYPE_CATEGORY.get(t.pmix_type) if isinstance(t.pmix_type, int) else None
    v = t.value
    if cat is None:
        return f"unsupported PMIx type {t.pmix_type!r}"
    if cat == "bool":
        ok = isinstance(v, bool)
    elif cat == "str":
        ok = isinstance(v, str)
    elif cat == "bytes":
        ok = isinstance(v, bytes)
    elif cat == "float":
        ok = isinstance(v, float)
    else:
        _, bits, signed = cat
        ok = isinstance(v, int) and not isinstance(v, bool)
        if ok:
            lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
            if not lo <= v <= hi:
                return f"{v} does not fit PMIX_{TYPE_NAMES[t.pmix_type]}"
    if not ok:
        return f"a {type(v).__name__} is not a PMIX_{TYPE_NAMES[t.pmix_type]} value"
    return ""


Value = Union[str, bytes, int, float, bool, Typed]

#: Fixed part of an item's accounted size: the object and its bookkeeping.
#: Each accessor uid or gid adds :data:`ACCESSOR_OVERHEAD` (SPEC 9).
ITEM_OVERHEAD = 128
ACCESSOR_OVERHEAD = 4

#: Values must fit the wire's 64-bit integers.
INT_MIN = -(2**63)
INT_MAX = 2**64 - 1


class Caller(NamedTuple):
    """A process (or tool) as the store sees it (an immutable value).

    ``gid`` is ``None`` when unknown: ownership and the default access rule
    then compare uid alone.  ``node`` is the daemon the process is behind
    (the ``proxy`` of what it publishes); ``None`` never matches any node.
    ``app_idx`` / ``session_id`` are ``None`` when the runtime cannot
    resolve them (a relayed publish from another DVM): no application or
    session horizon then applies to what it publishes, which is the safe
    reading -- the item outlives its purge rather than dying early.
    """

    nspace: str
    rank: int
    uid: int
    gid: int | None = None
    node: str | None = None
    app_idx: int | None = None
    session_id: int | None = None

    @property
    def proc(self) -> tuple[str, int]:
        """``(nspace, rank)``: the process, as answers name a publisher."""
        return (self.nspace, self.rank)


def value_size(value: Value) -> int:
    """Accounted size of one value (SPEC 3). Raises TypeError for others."""
    if value.__class__ is Typed:
        value = value.value  # accounted by category: its width never matters
    # bool before int: bool is a subclass of int.
    if isinstance(value, bool):
        return 1
    if isinstance(value, (int, float)):
        return 8
    if isinstance(value, str):
        return len(value.encode("utf-8"))
    if isinstance(value, bytes):
        return len(value)
    raise TypeError(f"unsupported value type {type(value).__name__}")


def item_nbytes(
    pairs: dict[str, Value], access_uids: tuple[int, ...], access_gids: tuple[int, ...]
) -> int:
    """``sum(len(key utf-8) + value size) + ITEM_OVERHEAD`` (SPEC 3, 9)."""
    total = ITEM_OVERHEAD + ACCESSOR_OVERHEAD * (len(access_uids) + len(access_gids))
    for key, value in pairs.items():
        total += len(key.encode("utf-8")) + value_size(value)
    return total


@dataclass(slots=True, eq=False)
class Item:
    """Everything one publish stored (SPEC 3).

    Invariants (checked by :meth:`DataStore.check_invariants`):

    * ``pairs`` is never empty while the item is in a store;
    * ``nbytes == item_nbytes(pairs, access_uids, access_gids)``;
    * ``last_access`` is the store clock's reading at publish or at the most
      recent lookup that returned one of its keys.
    """

    id: int
    pairs: dict[str, Value]
    owner: Caller
    range: Range
    persistence: Persistence
    access_uids: tuple[int, ...]
    access_gids: tuple[int, ...]
    last_access: float
    nbytes: int = field(default=0)
    #: True from insertion until the removal helper unlinks it.
    live: bool = field(default=False)
    #: the store's touch sequence number at the last touch (see TouchQueue).
    seq: int = field(default=0)

    @property
    def uid(self) -> int:
        """The publisher's uid: whose cap the item counts against, who owns it."""
        return self.owner.uid

    @property
    def gid(self) -> int | None:
        """The publisher's gid (None: unknown; ownership then compares uid alone)."""
        return self.owner.gid

    @property
    def proxy(self) -> str | None:
        """The node whose daemon relayed the publish (what LOCAL range compares)."""
        return self.owner.node

    @property
    def idle_expires(self) -> bool:
        """True when the idle timeout applies (INDEF and FIRST_READ only)."""
        return self.persistence in IDLE_PERSISTENCES


#: Persistences removed by the idle timeout and by no lifetime (SPEC 5).
IDLE_PERSISTENCES = frozenset({Persistence.INDEF, Persistence.FIRST_READ})
