"""The value arithmetic of :meth:`DataStore.update <pydvm.store.DataStore.update>`:
add, compare-and-set and append, on plain and typed values.

Pure functions: the store decides who may update what and keeps its
accounting; these say what the new value is, or why there is none.
"""

from __future__ import annotations

import re

from .model import INT_MAX, INT_MIN, Typed, Value, check_typed
from .validate import check_key, check_value, item_args

#: The operations of :meth:`DataStore.update <pydvm.store.DataStore.update>`.
UPDATE_OPS = ("add", "cas", "append")


def update_args(op, key, value, expected, range, persistence, access_uids, access_gids):
    """Validate the arguments of an update: ``(problem, delta, range,
    persistence, uids, gids)`` -- ``problem`` "" when all is well (else the
    rest is None), ``delta`` the integer an ``add`` adds (None for the other
    operations), the rest as :func:`~pydvm.store.validate.item_args` gives
    them for an item the update may create."""
    if not isinstance(op, str) or op not in UPDATE_OPS:
        return (f"unknown update operation {op!r} (one of {', '.join(UPDATE_OPS)})",
                None, None, None, None, None)
    problem = check_key(key) or check_value(key, value)
    if not problem and op == "cas" and expected is not None:
        problem = check_value(key, expected)
        if problem:
            problem = f"expected: {problem}"
    if problem:
        return problem, None, None, None, None, None
    problem, rng, persist, uids, gids = item_args(range, persistence, access_uids, access_gids)
    if problem:
        return problem, None, None, None, None, None
    delta = None
    if op == "add":
        delta = as_int(value)
        if delta is None:
            return (f"add needs an integer (int or decimal text), not {describe(value)}",
                    None, None, None, None, None)
    if op == "append" and plain_of(value).__class__ not in (str, bytes):
        return f"append needs str or bytes, not {describe(value)}", None, None, None, None, None
    return "", delta, rng, persist, uids, gids


def plain_of(value):
    """The plain Python value of a stored value (a Typed one unwrapped)."""
    return value.value if value.__class__ is Typed else value


def describe(value) -> str:
    plain = plain_of(value)
    text = repr(plain)
    return f"{type(plain).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


#: Decimal text an ``add`` accepts: an optional sign and ASCII digits.
_DECIMAL = re.compile(r"[+-]?[0-9]+")


def as_int(value) -> int | None:
    """The integer ``value`` holds -- an int, a typed PMIx integer, or
    decimal text as str or bytes -- else None (a bool, a float, other text)."""
    plain = plain_of(value)
    cls = plain.__class__
    if cls is int:
        return plain
    if cls is str or cls is bytes:
        text = plain.decode("ascii", "replace") if cls is bytes else plain
        if len(text) <= 40 and _DECIMAL.fullmatch(text):
            return int(text)
    return None


def same(a, b) -> bool:
    """Compare-and-set's equality: same plain Python type, equal values."""
    a, b = plain_of(a), plain_of(b)
    return a.__class__ is b.__class__ and a == b


def updated(op: str, current, operand, expected, delta: int | None
             ) -> tuple[str, Value | None]:
    """``(problem, new value)`` of an update (``delta``: an add's operand as
    an int); new value None: no change (a compare-and-set that did not
    match)."""
    if op == "cas":
        if current is None:
            matches = expected is None or (plain_of(expected).__class__ in (str, bytes)
                                           and not plain_of(expected))
        else:
            matches = expected is not None and same(current, expected)
        return "", operand if matches else None
    if current is None:
        return "", operand
    if op == "add":
        base = as_int(current)
        if base is None:
            return f"the value is not an integer ({describe(current)})", None
        total = base + delta
        plain = plain_of(current)
        if current.__class__ is Typed:
            new: Value = Typed(total, current.pmix_type)
            problem = check_typed(new)
            return (f"the result {problem}", None) if problem else ("", new)
        if not INT_MIN <= total <= INT_MAX:
            return f"the result {total} does not fit in 64 bits", None
        if plain.__class__ is int:
            return "", total
        text = str(total)
        return "", text.encode("ascii") if plain.__class__ is bytes else text
    # append
    plain, extra = plain_of(current), plain_of(operand)
    if plain.__class__ is not extra.__class__ or plain.__class__ not in (str, bytes):
        return (f"cannot append {type(extra).__name__} to {type(plain).__name__}", None)
    if current.__class__ is Typed:
        return "", Typed(plain + extra, current.pmix_type)
    return "", plain + extra
