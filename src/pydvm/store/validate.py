"""Validation of operation arguments: each helper returns the problem (or "")
and the normalised value, so the store can refuse with a message naming it
before it changes anything."""

from __future__ import annotations

from typing import Iterable, Mapping

from ..enums import Persistence, Range
from .model import INT_MAX, INT_MIN, Typed, Value, check_typed

_RANGES = {int(r): r for r in Range}
_PERSISTENCES = {int(p): p for p in Persistence}


def as_range(value) -> Range | None:
    if value.__class__ is bool or not isinstance(value, int):
        return None
    return _RANGES.get(value)


def as_persistence(value) -> Persistence | None:
    if value.__class__ is bool or not isinstance(value, int):
        return None
    return _PERSISTENCES.get(value)


def id_list(values) -> tuple[int, ...] | None:
    if values is None or values == ():
        return ()
    if not isinstance(values, (list, tuple)) and (
            isinstance(values, (str, bytes)) or not isinstance(values, Iterable)):
        return None
    out: list[int] = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0 or v > 2**32 - 1:
            return None
        if v not in out:
            out.append(v)
    return tuple(out)


def check_key(key) -> str:
    if not isinstance(key, str):
        return f"key must be a str, not {type(key).__name__}"
    if not key:
        return "key must not be empty"
    return ""


def check_keys(keys) -> tuple[str, tuple[str, ...]]:
    if not isinstance(keys, (list, tuple)) and (
            isinstance(keys, (str, bytes)) or not isinstance(keys, Iterable)):
        return "keys must be a list of str", ()
    klist: list[str] = []
    for key in keys:
        problem = check_key(key)
        if problem:
            return problem, ()
        if key not in klist:
            klist.append(key)
    if not klist:
        return "empty key list", ()
    return "", tuple(klist)


def check_value(key: str, value) -> str:
    """'' if ``value`` may be stored (under ``key``, named in the problem)."""
    if isinstance(value, bool) or isinstance(value, (str, bytes, float)):
        return ""
    if isinstance(value, int):
        if not INT_MIN <= value <= INT_MAX:
            return f"int value of {key!r} does not fit in 64 bits"
        return ""
    if value.__class__ is Typed:
        problem = check_typed(value)
        return f"value of {key!r}: {problem}" if problem else ""
    return f"unsupported value type {type(value).__name__} for key {key!r}"


def check_pairs(pairs) -> tuple[str, dict[str, Value]]:
    if not isinstance(pairs, dict) and not isinstance(pairs, Mapping):
        return "pairs must be a mapping of key to value", {}
    if not pairs:
        return "nothing to publish (no pairs)", {}
    norm: dict[str, Value] = {}
    for key, value in pairs.items():
        problem = check_key(key) or check_value(key, value)
        if problem:
            return problem, {}
        norm[key] = value
    return "", norm


def item_args(range, persistence, access_uids, access_gids):
    """Validate what a new item is stored with: ``(problem, range,
    persistence, uids, gids)``, problem "" when all is well."""
    rng = as_range(range)
    if rng is None:
        return f"unknown range {range!r}", None, None, None, None
    if persistence is None:
        persist = Persistence.NSPACE
    else:
        persist = as_persistence(persistence)
        if persist is None:
            return f"unknown persistence {persistence!r}", None, None, None, None
        if persist is Persistence.INVALID:
            persist = Persistence.NSPACE
    uids = id_list(access_uids)
    gids = id_list(access_gids)
    if uids is None:
        return "access uids must be a list of non-negative integers", None, None, None, None
    if gids is None:
        return "access gids must be a list of non-negative integers", None, None, None, None
    return "", rng, persist, uids, gids
