"""Request building and reply reading shared by the blocking and asyncio clients."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping

from ..enums import Persistence, Range
from ..errors import BadParamError, Status, UnreachableError, error_for
from ..protocol import DEFAULT_TYPES, TYPE_NAMES, Message, Typed

TYPE_CHECKING = False  # (not typing's: importing typing costs every job process)
if TYPE_CHECKING:  # for type checkers and the API reference only
    from typing import Any


class Found:
    """One key returned by a lookup: its value and who published it.

    ``value`` is always a plain Python value (str, bytes, int, float, bool);
    ``pmix_type`` names the PMIx type it carries: what a PMIx client
    published it as (``"PMIX_UINT8"``, ``"PMIX_SIZE"``...), else the default
    for its Python type (str ``PMIX_STRING``, bytes ``PMIX_BYTE_OBJECT``,
    int ``PMIX_INT64``, float ``PMIX_DOUBLE``, bool ``PMIX_BOOL``).  To
    publish with a given PMIx type, pass ``pydvm.Typed(value, code)``.
    """

    __slots__ = ("key", "value", "nspace", "rank", "pmix_type")
    _FIELDS = __slots__

    key: str
    value: Any
    nspace: str
    rank: int
    pmix_type: str

    def __init__(self, key: str, value: Any, nspace: str, rank: int,
                 pmix_type: str = "") -> None:
        # immutable: written once here, then __setattr__ refuses
        for name, v in zip(self._FIELDS, (key, value, nspace, rank, pmix_type)):
            object.__setattr__(self, name, v)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"cannot assign to field {name!r} (Found is immutable)")

    __delattr__ = __setattr__

    def _astuple(self) -> tuple:
        return (self.key, self.value, self.nspace, self.rank, self.pmix_type)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not Found:
            return NotImplemented
        return self._astuple() == other._astuple()

    def __hash__(self) -> int:
        return hash(self._astuple())

    def __repr__(self) -> str:
        return ("Found(" + ", ".join(f"{n}={v!r}" for n, v in zip(self._FIELDS, self._astuple()))
                + ")")


class LookupResult(Mapping):
    """The answer to a lookup: a mapping of found key to value.

    ``status`` is ``Status.SUCCESS`` when every key was found and
    ``Status.ERR_PARTIAL_SUCCESS`` when only some were (the others are
    simply absent).  ``found[key]`` gives the :class:`Found` record with the
    publisher's namespace and rank.
    """

    def __init__(self, status: Status, found: dict[str, Found]) -> None:
        self.status = status
        self._found: dict[str, Found] | None = found
        #: key -> (value as answered, nspace, rank), until ``found`` is made
        self._rows: dict[str, tuple[Any, str, int]] | None = None

    @classmethod
    def _of_rows(cls, status: Status, rows: dict[str, tuple[Any, str, int]]) -> "LookupResult":
        """A result whose :class:`Found` records are made on first use of
        ``found``: most callers only read values, and a record costs more
        than the rest of reading the answer."""
        res = cls.__new__(cls)
        res.status, res._found, res._rows = status, None, rows
        return res

    @property
    def found(self) -> dict[str, Found]:
        """key -> :class:`Found`, for every key found."""
        if self._found is None:
            self._found = {key: _found(key, *row) for key, row in self._rows.items()}
            self._rows = None
        return self._found

    def __getitem__(self, key: str) -> Any:
        rows = self._rows
        if rows is None:
            return self.found[key].value
        value = rows[key][0]
        return value.value if value.__class__ is Typed else value

    def __iter__(self) -> Iterator[str]:
        return iter(self.found if self._rows is None else self._rows)

    def __len__(self) -> int:
        return len(self.found if self._rows is None else self._rows)

    @property
    def partial(self) -> bool:
        """True when only some of the keys were found (PARTIAL_SUCCESS)."""
        return self.status is Status.ERR_PARTIAL_SUCCESS

    def publisher(self, key: str) -> tuple[str, int]:
        """``(nspace, rank)`` of the process that published ``key``;
        KeyError if ``key`` was not found."""
        if self._rows is not None:
            _, nspace, rank = self._rows[key]
            return (nspace, rank)
        f = self.found[key]
        return (f.nspace, f.rank)

    def __repr__(self) -> str:
        return f"LookupResult({self.status.pmix_name}, {dict(self)!r})"


def identity_from_env(nspace: str | None, rank: int | None, server: str | None):
    server = server or os.environ.get("PYDVM_SERVER")
    nspace = nspace or os.environ.get("PYDVM_NSPACE")
    if rank is None and os.environ.get("PYDVM_RANK") is not None:
        rank = int(os.environ["PYDVM_RANK"])
    if not server or not nspace or rank is None:
        raise UnreachableError(
            "not inside a pydvm job: PYDVM_SERVER, PYDVM_NSPACE and PYDVM_RANK must be set")
    return server, nspace, rank


def hello_msg(nspace: str, rank: int) -> Message:
    return {"t": "hello", "nspace": nspace, "rank": rank}


#: What msgpack raises for a value it cannot encode (OverflowError: an int
#: past 64 bits); a client answers it with :func:`cannot_encode`.
UNENCODABLE = (TypeError, OverflowError)


def cannot_encode(exc: BaseException) -> BadParamError:
    """The error a client raises for a request msgpack could not encode."""
    return BadParamError(f"cannot encode request: {exc}")


def _request(t: str, rng: int | None, fields: dict) -> Message:
    """A data request: ``fields`` (the callers' own fresh map) with its type and
    range.  Sent as one plain map, which every server decodes once."""
    fields["t"] = t
    if rng is not None:
        fields["range"] = rng
    return fields


def publish_msg(
    data: Mapping[str, Any],
    range: Range | int,
    persistence: Persistence | int | None,
    access_uids: Iterable[int],
    access_gids: Iterable[int],
    replace: bool,
) -> Message:
    if data.__class__ is not dict and not isinstance(data, Mapping):
        raise BadParamError("publish takes a mapping of key to value")
    return _request("publish", int(range), {
        "pairs": dict(data),
        "persist": None if persistence is None else int(persistence),
        "uids": list(access_uids),
        "gids": list(access_gids),
        "replace": bool(replace),
    })


def lookup_msg(keys: Iterable[str] | str, range: Range | int, wait: bool | int,
               timeout: float | None) -> Message:
    if isinstance(keys, str):
        keys = [keys]
    if wait is True:
        w: int | None = 0
    elif wait is False or wait is None:
        w = None
    else:
        w = int(wait)
    return _request("lookup", int(range), {"keys": list(keys), "wait": w, "timeout": timeout})


def update_msg(key: str, op: str, value: Any, expected: Any, range: Range | int,
               persistence: Persistence | int | None, access_uids: Iterable[int],
               access_gids: Iterable[int]) -> Message:
    """An atomic update (``op``: ``add``, ``cas`` or ``append``) of ``key``.
    Fields at their default (no persistence, no accessor lists) are left
    out: updates are small and frequent (a counter), and every field costs
    packing here and unpacking there."""
    fields = {"key": key, "op": op, "value": value}
    if persistence is not None:
        fields["persist"] = int(persistence)
    if access_uids:
        fields["uids"] = list(access_uids)
    if access_gids:
        fields["gids"] = list(access_gids)
    if op == "cas":
        fields["expected"] = expected
    return _request("update", int(range), fields)


def keys_msg(prefix: str, range: Range | int, limit: int | None) -> Message:
    """Count (and list up to ``limit``) the keys under ``prefix``."""
    return _request("keys", int(range), {"prefix": prefix, "limit": limit})


def update_result(r: Message) -> tuple[Any, bool]:
    """``(value the key holds afterwards or None, whether the store changed)``
    of an update's answer; raises the matching PMIxError if it was refused."""
    check(r)
    value = None
    for _key, v, _ns, _rank in r.get("found") or ():
        value = v.value if v.__class__ is Typed else v
    return value, bool(r.get("count"))


def count_of(r: Message) -> int:
    """The ``count`` of a successful answer (absent: 0); raises if it failed."""
    check(r)
    c = r.get("count", 0)
    return c if isinstance(c, int) and not isinstance(c, bool) else 0


def keys_result(r: Message) -> list[str]:
    """The keys a ``keys`` answer listed; raises if it failed."""
    check(r)
    return [k for k in r.get("keys") or () if isinstance(k, str)]


def unpublish_msg(keys: Iterable[str] | str | None, node_only: bool = False) -> Message:
    """An unpublish; ``node_only`` asks the daemon for its node store's part
    only (a client with a direct connection sends the master's part itself)."""
    if isinstance(keys, str):
        keys = [keys]
    msg = _request("unpublish", None, {"keys": None if keys is None else list(keys)})
    if node_only:
        msg["node_only"] = True
    return msg


def node_part_needed(master: Message) -> bool:
    """After the master's answer to a direct unpublish: does the node store
    need its part too?  Not when the master knows the node store holds
    nothing of this uid (``node: false``); when in doubt, yes."""
    return master.get("node") is not False


def combined(master: Message, node: Message) -> Message:
    """One answer for a request served by both stores (``unpublish``): the
    master's, unless only the node store's part failed; on success its
    ``count`` is both stores' (the keys removed from each)."""
    if status_of(master) is Status.SUCCESS and status_of(node) is not Status.SUCCESS:
        return node
    if _succeeded(master) and _succeeded(node) and node.get("count"):
        master = dict(master)
        master["count"] = count_of(master) + count_of(node)
    return master


def status_of(r: Message) -> Status:
    try:
        return Status(r.get("status"))
    except ValueError:
        return Status.ERR_BAD_PARAM


def _succeeded(r: Message) -> bool:
    """``r`` reports SUCCESS (checked without building a Status: the usual case)."""
    st = r.get("status")
    return st == 0 and st.__class__ is int


def check(r: Message) -> None:
    """Raise the matching PMIxError unless ``r`` reports success."""
    if _succeeded(r):
        return
    st = status_of(r)
    if st is not Status.SUCCESS:
        raise error_for(st, str(r.get("msg") or ""))


def lookup_result(r: Message) -> LookupResult:
    st = Status.SUCCESS if _succeeded(r) else status_of(r)
    if st not in (Status.SUCCESS, Status.ERR_PARTIAL_SUCCESS):
        raise error_for(st, str(r.get("msg") or ""))
    rows = {}
    for key, value, ns, rank in r.get("found") or ():
        rows[key] = (value, ns, rank)
    return LookupResult._of_rows(st, rows)


def _found(key: str, value: Any, ns: str, rank: int) -> Found:
    """The record of one answered key (a Typed value: its PMIx type)."""
    if value.__class__ is Typed:
        return Found(key, value.value, ns, rank, value.type_name)
    code = DEFAULT_TYPES.get(value.__class__)
    return Found(key, value, ns, rank, "PMIX_" + TYPE_NAMES[code] if code is not None else "")
