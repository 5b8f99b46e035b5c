"""Reading what a client asked for: the directives of an upcall's info array.

libpmix hands each upcall its client's request as an info array: the
``pmix.*`` attributes (directives such as ``PMIX_RANGE``, ``PMIX_WAIT``,
``PMIX_TIMEOUT``) and, appended by libpmix itself, the client's identity
*claims* (``PMIX_USERID``, ``PMIX_GRPID``), which the binding never passes
on: who a client is, the host knows from its registration.  Here those
arrays become dicts of :class:`~pydvm.pmix.values.Value`, and attribute
values become the plain integers the request classes carry, accepting
every integer encoding a client may use (``PMIX_DATA_RANGE``, ``PMIX_INT``,
``PMIX_UINT32`` ...).  A value that cannot be used raises
:class:`~pydvm.pmix.values.PmixValueError` with ``PMIX_ERR_BAD_PARAM``:
the upcall refuses the request.
"""

from __future__ import annotations

from . import constants as C
from .values import PmixValueError, Value, info_at

INT_TYPES = frozenset({C.BYTE, C.INT, C.INT8, C.INT16, C.INT32, C.INT64, C.UINT, C.UINT8,
                       C.UINT16, C.UINT32, C.UINT64, C.SIZE, C.PID, C.STATUS, C.PROC_RANK,
                       C.PERSIST, C.DATA_RANGE})
RANGES = frozenset(range(0, 8)) | {C.RANGE_INVALID}
PERSISTENCES = frozenset(range(0, 6)) | {C.PERSIST_INVALID}
#: Attributes a client adds to every request as a *claim*: never passed on.
CLAIMS = frozenset({C.USERID, C.GRPID})


def directives(info, ninfo) -> dict[str, Value]:
    """Info array -> dict, minus the client's identity claims; bad values refuse."""
    out: dict[str, Value] = {}
    for key, val in info_at(info, ninfo, CLAIMS):
        if isinstance(val, PmixValueError):
            raise val
        out[key] = val
    return out


def lenient(info, ninfo) -> dict[str, Value]:
    """Info array -> dict, minus identity claims and entries the binding cannot copy."""
    return {k: v for k, v in info_at(info, ninfo, CLAIMS)
            if not isinstance(v, PmixValueError)}


def int_of(v: Value, what: str) -> int:
    if v.type in INT_TYPES and isinstance(v.value, int):
        return int(v.value)
    raise PmixValueError(C.ERR_BAD_PARAM,
                         f"{what} given as {C.type_name(v.type)}: an integer type is needed")


def _code_of(v: Value | None, attr: str, codes: frozenset, what: str) -> int | None:
    """Attribute ``attr`` as one of ``codes`` in any integer encoding, or None."""
    if v is None:
        return None
    code = int_of(v, attr)
    if code not in codes:
        raise PmixValueError(C.ERR_BAD_PARAM, f"unknown {what} {code}")
    return code


def range_of(v: Value | None) -> int | None:
    """PMIX_RANGE in any integer encoding (DATA_RANGE, INT, UINT...) -> int or None."""
    return _code_of(v, C.RANGE, RANGES, "range")


def persistence_of(v: Value | None) -> int | None:
    """PMIX_PERSISTENCE in any integer encoding (PERSIST, INT...) -> int or None.

    Accepts 5 (pydvm's NSPACE, which PMIx 4.2.2 lacks) and 255 (INVALID)."""
    return _code_of(v, C.PERSISTENCE, PERSISTENCES, "persistence")


def wait_of(v: Value | None) -> int | None:
    """PMIX_WAIT: bool (true: all keys) or a count (0: all).  None: no wait."""
    if v is None:
        return None
    if v.type == C.BOOL:
        return 0 if v.value else None
    n = int_of(v, C.WAIT)
    if n < 0:
        raise PmixValueError(C.ERR_BAD_PARAM, f"negative wait count {n}")
    return n


def ids_of(v: Value | None, what: str) -> tuple[int, ...] | None:
    if v is None:
        return None
    if v.type == C.DATA_ARRAY and v.value is not None:
        items = v.value.items
        if all(isinstance(x, int) and not isinstance(x, bool) for x in items):
            return tuple(int(x) for x in items)
    elif v.type in INT_TYPES:
        return (int(v.value),)
    raise PmixValueError(C.ERR_BAD_PARAM, f"{what} must be an array of integer ids")
