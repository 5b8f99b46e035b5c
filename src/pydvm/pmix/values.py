"""Typed values: ``pmix_value_t`` <-> :class:`Value` (a Python value and its PMIx type).

A value keeps the PMIx type it was published with, so a C client that
published a ``PMIX_UINT8`` reads back a ``PMIX_UINT8``.  The host stores
``Value`` objects as they come and hands them back unchanged.

Python values for each PMIx type:

====================================  ========================================
PMIx type                             Python value
====================================  ========================================
STRING                                ``str`` (UTF-8; undecodable bytes kept
                                      with ``surrogateescape``)
BYTE_OBJECT                           ``bytes``
BOOL                                  ``bool``
BYTE, INT8/16/32/64, UINT8/16/32/64,  ``int`` (range-checked for the type)
INT, UINT, SIZE, PID, STATUS,
PROC_RANK, PERSIST, DATA_RANGE
FLOAT, DOUBLE                         ``float``
PROC                                  :class:`Proc`
DATA_ARRAY                            :class:`DataArray`; its items may also
                                      be :class:`ProcInfo` (PROC_INFO) and
                                      :class:`RegAttr` (REGATTR), answers to
                                      queries (host -> libpmix only)
UNDEF                                 ``None``
====================================  ========================================

Default types for native values (:func:`Value.of`): ``str`` -> STRING,
``bytes`` -> BYTE_OBJECT, ``bool`` -> BOOL, ``int`` -> INT64, ``float`` ->
DOUBLE.  ``int`` maps to INT64 because a Python int has no width: INT64 is
the widest signed PMIx integer, it holds every value pydvm's own clients can
store (the store accounts an int as 8 bytes, SPEC 3), and a C reader
checking ``value.type`` gets a fixed-size type it can read without loss.
Integers outside the int64 range are refused rather than silently widened
to UINT64.
"""

from __future__ import annotations

import ctypes
import math
import struct
from dataclasses import dataclass
from typing import Any

from . import constants as C
from . import _lib as L


class PmixValueError(ValueError):
    """A key or value the binding cannot carry; ``status`` is the PMIx status to answer."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Proc:
    """A process identity: namespace and rank (``pmix_proc_t``)."""

    nspace: str
    rank: int

    def __str__(self) -> str:
        r = {C.RANK_WILDCARD: "*", C.RANK_UNDEF: "undef"}.get(self.rank, str(self.rank))
        return f"{self.nspace}:{r}"


@dataclass(frozen=True, slots=True)
class DataArray:
    """A ``pmix_data_array_t``: ``type`` of the elements and the elements.

    For ``type == INFO`` the items are ``(key, Value)`` pairs; otherwise they
    are plain Python values of that element type.
    """

    type: int
    items: tuple


@dataclass(frozen=True, slots=True)
class ProcInfo:
    """A ``pmix_proc_info_t``: one row of a process table (a query's answer).
    ``state`` is a ``PMIX_PROC_STATE_*`` number."""

    proc: Proc
    hostname: str
    executable: str
    pid: int
    exit_code: int
    state: int


@dataclass(frozen=True, slots=True)
class RegAttr:
    """A ``pmix_regattr_t``: an attribute a function supports -- its name
    (``PMIX_RANGE``), its key string (``pmix.range``), its value's type and
    a description, one line per item."""

    name: str
    string: str
    type: int
    description: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Value:
    """A Python value with its PMIx data type code."""

    value: Any
    type: int

    @staticmethod
    def of(v: Any) -> "Value":
        """The default PMIx type for a native Python value (see module doc)."""
        if isinstance(v, Value):
            return v
        if isinstance(v, bool):
            return Value(v, C.BOOL)
        if isinstance(v, int):
            return Value(v, C.INT64)
        if isinstance(v, float):
            return Value(v, C.DOUBLE)
        if isinstance(v, str):
            return Value(v, C.STRING)
        if isinstance(v, (bytes, bytearray, memoryview)):
            return Value(bytes(v), C.BYTE_OBJECT)
        if isinstance(v, Proc):
            return Value(v, C.PROC)
        if isinstance(v, DataArray):
            return Value(v, C.DATA_ARRAY)
        raise PmixValueError(C.ERR_NOT_SUPPORTED,
                             f"no PMIx type for a Python {type(v).__name__}")

    def native(self) -> Any:
        """The plain Python value (str, bytes, int, float, bool, ...)."""
        return self.value

    def nbytes(self) -> int:
        """Payload size: UTF-8 length of a string, length of bytes, else the C size."""
        if self.type == C.STRING:
            return len(_enc(self.value))
        if self.type == C.BYTE_OBJECT:
            return len(self.value)
        return _SIZES.get(self.type, 8)

    def __repr__(self) -> str:
        return f"Value({self.value!r}, {C.type_name(self.type)})"


# integer types: (union field, bits, signed)
_INTS: dict[int, tuple[str, int, bool]] = {
    C.BYTE: ("byte", 8, False),
    C.INT8: ("int8", 8, True), C.INT16: ("int16", 16, True),
    C.INT32: ("int32", 32, True), C.INT64: ("int64", 64, True),
    C.UINT8: ("uint8", 8, False), C.UINT16: ("uint16", 16, False),
    C.UINT32: ("uint32", 32, False), C.UINT64: ("uint64", 64, False),
    C.INT: ("integer", 8 * ctypes.sizeof(ctypes.c_int), True),
    C.UINT: ("uint", 8 * ctypes.sizeof(ctypes.c_uint), False),
    C.SIZE: ("size", 8 * ctypes.sizeof(ctypes.c_size_t), False),
    C.PID: ("pid", 32, True),
    C.STATUS: ("status", 32, True),
    C.PROC_RANK: ("rank", 32, False),
    C.PERSIST: ("persist", 8, False),
    C.DATA_RANGE: ("range", 8, False),
    C.SCOPE: ("scope", 8, False),
    C.PROC_STATE: ("state", 8, False),
}
_SIZES = {t: bits // 8 for t, (_, bits, _) in _INTS.items()}
_SIZES.update({C.BOOL: 1, C.FLOAT: 4, C.DOUBLE: 8})

#: Every type the binding converts in both directions.
SUPPORTED_TYPES = frozenset(_INTS) | {C.BOOL, C.STRING, C.BYTE_OBJECT, C.FLOAT,
                                      C.DOUBLE, C.PROC, C.DATA_ARRAY, C.UNDEF}
#: Types a published value may have (what a store can hold and return).
PUBLISHABLE_TYPES = SUPPORTED_TYPES - {C.PROC, C.DATA_ARRAY, C.UNDEF}


_FLT_MAX = 3.4028234663852886e38


def _enc(s: str) -> bytes:
    return s.encode("utf-8", "surrogateescape")


def _dec(b: bytes) -> str:
    return b.decode("utf-8", "surrogateescape")


#: Keys already checked, encoded (the fixed PMIx keys of every namespace
#: registration and event come back again and again; bounded).
_GOOD_KEYS: dict[str, bytes] = {}


def check_key(key: str) -> bytes:
    """Encode a key; refuse (BAD_PARAM) empty keys, NULs and keys over PMIX_MAX_KEYLEN."""
    good = _GOOD_KEYS.get(key) if type(key) is str else None
    if good is not None:
        return good
    if not isinstance(key, str):
        raise PmixValueError(C.ERR_BAD_PARAM, f"key {key!r} is not a str")
    b = _enc(key)
    if not b:
        raise PmixValueError(C.ERR_BAD_PARAM, "empty key")
    if b"\0" in b:
        raise PmixValueError(C.ERR_BAD_PARAM, f"key {key!r} contains a NUL byte")
    if len(b) > C.MAX_KEYLEN:
        raise PmixValueError(C.ERR_BAD_PARAM,
                             f"key of {len(b)} bytes is longer than PMIX_MAX_KEYLEN "
                             f"({C.MAX_KEYLEN})")
    if type(key) is str and key.startswith("pmix."):
        if len(_GOOD_KEYS) >= 1024:
            _GOOD_KEYS.clear()
        _GOOD_KEYS[key] = b
    return b


def check_nspace(nspace: str) -> bytes:
    b = _enc(nspace)
    if not b or len(b) > C.MAX_NSLEN or b"\0" in b:
        raise PmixValueError(C.ERR_BAD_PARAM,
                             f"namespace {nspace!r} must be 1..{C.MAX_NSLEN} bytes, no NUL")
    return b


# --------------------------------------------------------------------------
# C -> Python


def cstr(addr: int | None) -> str | None:
    if not addr:
        return None
    return _dec(ctypes.string_at(addr))


_PROC_SIZE = ctypes.sizeof(L.pmix_proc_t)
_RANK_AT = L.pmix_proc_t.rank.offset
_U32 = struct.Struct("=I")


#: pmix_proc_t bytes -> Proc: the same few processes ask again and again.
_procs_seen: dict[bytes, Proc] = {}
_PROCS_SEEN_MAX = 4096


def proc_at(addr: int) -> Proc:
    """The ``pmix_proc_t`` at ``addr``, read in one copy of its bytes."""
    raw = ctypes.string_at(addr, _PROC_SIZE)
    p = _procs_seen.get(raw)
    if p is None:
        end = raw.find(b"\0", 0, _RANK_AT)
        p = Proc(_dec(raw[:end if end >= 0 else _RANK_AT]), _U32.unpack_from(raw, _RANK_AT)[0])
        if len(_procs_seen) >= _PROCS_SEEN_MAX:
            _procs_seen.clear()
        _procs_seen[raw] = p
    return p


def procs_at(addr: int, n: int) -> list[Proc]:
    if not addr or not n:
        return []
    return [proc_at(addr + i * _PROC_SIZE) for i in range(n)]


def value_from_c(v: L.pmix_value_t) -> Value:
    """Copy a ``pmix_value_t`` into a :class:`Value`; unsupported types raise PmixValueError."""
    t = int(v.type)
    d = v.data
    if t in _INTS:
        return Value(int(getattr(d, _INTS[t][0])), t)
    if t == C.STRING:
        return Value(cstr(d.string) or "", t)
    if t == C.BOOL:
        return Value(bool(d.flag), t)
    if t == C.BYTE_OBJECT:
        n = int(d.bo.size)
        return Value(ctypes.string_at(d.bo.bytes, n) if n and d.bo.bytes else b"", t)
    if t == C.FLOAT:
        return Value(float(d.fval), t)
    if t == C.DOUBLE:
        return Value(float(d.dval), t)
    if t == C.PROC:
        return Value(proc_at(d.proc) if d.proc else None, t)
    if t == C.UNDEF:
        return Value(None, t)
    if t == C.DATA_ARRAY:
        return Value(_darray_from_c(d.darray), t)
    raise PmixValueError(C.ERR_NOT_SUPPORTED,
                         f"values of type {C.type_name(t)} are not supported")


def _darray_from_c(addr: int) -> DataArray | None:
    if not addr:
        return None
    da = L.pmix_data_array_t.from_address(addr)
    et, n = int(da.type), int(da.size)
    if not n or not da.array:
        return DataArray(et, ())
    if et == C.INFO:
        arr = (L.pmix_info_t * n).from_address(da.array)
        return DataArray(et, tuple((_dec(i.key), value_from_c(i.value)) for i in arr))
    if et == C.PROC:
        return DataArray(et, tuple(procs_at(da.array, n)))
    if et == C.STRING:
        arr = (ctypes.c_void_p * n).from_address(da.array)
        return DataArray(et, tuple(cstr(a) for a in arr))
    if et in _INTS or et in (C.BOOL, C.FLOAT, C.DOUBLE):
        ctype = _ctype_for(et)
        arr = (ctype * n).from_address(da.array)
        conv = bool if et == C.BOOL else float if et in (C.FLOAT, C.DOUBLE) else int
        return DataArray(et, tuple(conv(x) for x in arr))
    raise PmixValueError(C.ERR_NOT_SUPPORTED,
                         f"data arrays of {C.type_name(et)} are not supported")


def _ctype_for(t: int):
    if t == C.BOOL:
        return ctypes.c_bool
    if t == C.FLOAT:
        return ctypes.c_float
    if t == C.DOUBLE:
        return ctypes.c_double
    name = _INTS[t][0]
    return dict(L._value_data._fields_)[name]


# An info array is read from one copy of its bytes: a ctypes field access
# costs about a microsecond, and an upcall reads several per entry (the
# progress thread waits meanwhile).  Scalars, strings and byte objects are
# decoded here; any other type goes through value_from_c.
_INFO_SIZE = ctypes.sizeof(L.pmix_info_t)
_KEY_LEN = L.pmix_info_t.flags.offset          # the key field, NUL-padded
_TYPE_AT = L.pmix_info_t.value.offset + L.pmix_value_t.type.offset
_DATA_AT = L.pmix_info_t.value.offset + L.pmix_value_t.data.offset
_U16 = struct.Struct("=H")
_PTR_SIZE = struct.Struct("@PN")               # a pointer, a size_t (byte object)
_INT_FORMATS = {8: "b", 16: "h", 32: "i", 64: "q"}


def _scalar_readers() -> dict[int, Any]:
    readers: dict[int, Any] = {}
    for t, (_name, bits, signed) in _INTS.items():
        f = _INT_FORMATS[bits]
        readers[t] = struct.Struct("=" + (f if signed else f.upper()))
    readers[C.FLOAT] = struct.Struct("=f")
    readers[C.DOUBLE] = struct.Struct("=d")
    return readers


_SCALARS = _scalar_readers()


def _value_in(raw: bytes, base: int, addr: int) -> Value:
    t = _U16.unpack_from(raw, base + _TYPE_AT)[0]
    at = base + _DATA_AT
    if t == C.STRING:
        ptr = _PTR_SIZE.unpack_from(raw, at)[0]
        return Value(ctypes.string_at(ptr).decode("utf-8", "surrogateescape") if ptr else "",
                     t)
    reader = _SCALARS.get(t)
    if reader is not None:
        return Value(reader.unpack_from(raw, at)[0], t)
    if t == C.BOOL:
        return Value(raw[at] != 0, t)
    if t == C.BYTE_OBJECT:
        ptr, n = _PTR_SIZE.unpack_from(raw, at)
        return Value(ctypes.string_at(ptr, n) if n and ptr else b"", t)
    return value_from_c(L.pmix_value_t.from_address(addr + base + _TYPE_AT))


def info_at(addr: int, n: int, skip: frozenset = frozenset()
            ) -> list[tuple[str, Value | PmixValueError]]:
    """Read an info array; a value we cannot convert is kept as its PmixValueError.
    Entries whose key is in ``skip`` are left out, their values unread."""
    out: list[tuple[str, Value | PmixValueError]] = []
    if not addr or not n:
        return out
    raw = ctypes.string_at(addr, n * _INFO_SIZE)
    for base in range(0, n * _INFO_SIZE, _INFO_SIZE):
        end = raw.find(b"\0", base, base + _KEY_LEN)
        key = raw[base:end if end >= 0 else base + _KEY_LEN].decode("utf-8", "surrogateescape")
        if key in skip:
            continue
        try:
            out.append((key, _value_in(raw, base, addr)))
        except PmixValueError as e:
            out.append((key, e))
    return out


def argv_at(addr: int) -> list[str] | None:
    """A NULL-terminated ``char **`` -> list of str (None for a NULL pointer)."""
    if not addr:
        return None
    out = []
    pp = ctypes.cast(addr, ctypes.POINTER(ctypes.c_void_p))
    i = 0
    while pp[i]:
        out.append(cstr(pp[i]))
        i += 1
    return out


# --------------------------------------------------------------------------
# Python -> C.  Every buffer a C struct points to is appended to ``keep``:
# the caller holds ``keep`` until libpmix is done with the struct.


def _int_fits(v: int, bits: int, signed: bool) -> bool:
    if signed:
        return -(1 << (bits - 1)) <= v < (1 << (bits - 1))
    return 0 <= v < (1 << bits)


def validate(value: Value, max_size: int | None = None) -> None:
    """Check that ``value`` can be carried (type supported, in range, within ``max_size``)."""
    t = value.type
    v = value.value
    if t in _INTS:
        if isinstance(v, bool) or not isinstance(v, int):
            raise PmixValueError(C.ERR_BAD_PARAM, f"{C.type_name(t)} needs an int, not {v!r}")
        _, bits, signed = _INTS[t]
        if not _int_fits(v, bits, signed):
            raise PmixValueError(C.ERR_BAD_PARAM, f"{v} does not fit {C.type_name(t)}")
    elif t == C.STRING:
        if not isinstance(v, str):
            raise PmixValueError(C.ERR_BAD_PARAM, f"PMIX_STRING needs a str, not {v!r}")
        if "\0" in v:
            raise PmixValueError(C.ERR_BAD_PARAM, "a PMIX_STRING cannot contain NUL")
    elif t == C.BYTE_OBJECT:
        if not isinstance(v, (bytes, bytearray, memoryview)):
            raise PmixValueError(C.ERR_BAD_PARAM, f"PMIX_BYTE_OBJECT needs bytes, not {v!r}")
    elif t == C.BOOL:
        if not isinstance(v, bool):
            raise PmixValueError(C.ERR_BAD_PARAM, f"PMIX_BOOL needs a bool, not {v!r}")
    elif t in (C.FLOAT, C.DOUBLE):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise PmixValueError(C.ERR_BAD_PARAM, f"{C.type_name(t)} needs a float, not {v!r}")
        if t == C.FLOAT and math.isfinite(v) and abs(v) > _FLT_MAX:
            raise PmixValueError(C.ERR_BAD_PARAM, f"{v} does not fit PMIX_FLOAT")
    elif t == C.PROC:
        if not isinstance(v, Proc):
            raise PmixValueError(C.ERR_BAD_PARAM, f"PMIX_PROC needs a Proc, not {v!r}")
    elif t == C.DATA_ARRAY:
        if not isinstance(v, DataArray):
            raise PmixValueError(C.ERR_BAD_PARAM, "PMIX_DATA_ARRAY needs a DataArray")
    elif t == C.UNDEF:
        pass
    else:
        raise PmixValueError(C.ERR_NOT_SUPPORTED,
                             f"values of type {C.type_name(t)} are not supported")
    if max_size is not None and t in (C.STRING, C.BYTE_OBJECT) \
            and len(v) * (4 if t == C.STRING else 1) > max_size and value.nbytes() > max_size:
        raise PmixValueError(C.ERR_BAD_PARAM,
                             f"value of {value.nbytes()} bytes exceeds the limit of "
                             f"{max_size} bytes")


def value_to_c(value: Value, dest: L.pmix_value_t, keep: list) -> None:
    """Fill ``dest`` from ``value`` (validated first)."""
    validate(value)
    t = value.type
    v = value.value
    dest.type = t
    d = dest.data
    if t in _INTS:
        setattr(d, _INTS[t][0], v)
    elif t == C.STRING:
        buf = ctypes.create_string_buffer(_enc(v))
        keep.append(buf)
        d.string = ctypes.addressof(buf)
    elif t == C.BYTE_OBJECT:
        raw = bytes(v)
        buf = ctypes.create_string_buffer(raw, len(raw) or 1)
        keep.append(buf)
        d.bo.bytes = ctypes.addressof(buf)
        d.bo.size = len(raw)
    elif t == C.BOOL:
        d.flag = v
    elif t == C.FLOAT:
        d.fval = v
    elif t == C.DOUBLE:
        d.dval = v
    elif t == C.PROC:
        p = L.pmix_proc_t()
        proc_to_c(v, p)
        keep.append(p)
        d.proc = ctypes.addressof(p)
    elif t == C.DATA_ARRAY:
        da = L.pmix_data_array_t()
        keep.append(da)
        _darray_to_c(v, da, keep)
        d.darray = ctypes.addressof(da)


def _darray_to_c(arr: DataArray, da: L.pmix_data_array_t, keep: list) -> None:
    et = arr.type
    n = len(arr.items)
    da.type = et
    da.size = n
    if not n:
        da.array = None
        return
    if et == C.INFO:
        infos = build_info(arr.items, keep)
        da.array = ctypes.addressof(infos)
    elif et == C.PROC:
        procs = (L.pmix_proc_t * n)()
        for p, x in zip(procs, arr.items):
            proc_to_c(x, p)
        keep.append(procs)
        da.array = ctypes.addressof(procs)
    elif et == C.STRING:
        strs = (ctypes.c_void_p * n)()
        for i, s in enumerate(arr.items):
            b = ctypes.create_string_buffer(_enc(s))
            keep.append(b)
            strs[i] = ctypes.addressof(b)
        keep.append(strs)
        da.array = ctypes.addressof(strs)
    elif et == C.PROC_INFO:
        rows = (L.pmix_proc_info_t * n)()
        for row, x in zip(rows, arr.items):
            proc_to_c(x.proc, row.proc)
            row.hostname = _keep_str(x.hostname, keep)
            row.executable_name = _keep_str(x.executable, keep)
            row.pid, row.exit_code, row.state = int(x.pid), int(x.exit_code), int(x.state)
        keep.append(rows)
        da.array = ctypes.addressof(rows)
    elif et == C.REGATTR:
        rows = (L.pmix_regattr_t * n)()
        for row, x in zip(rows, arr.items):
            row.name = _keep_str(x.name, keep)
            row.string = check_key(x.string) if x.string else b""
            row.type = int(x.type)
            lines = (ctypes.c_void_p * (len(x.description) + 1))()
            for i, line in enumerate(x.description):
                lines[i] = _keep_str(line, keep)
            keep.append(lines)
            row.description = ctypes.addressof(lines)
        keep.append(rows)
        da.array = ctypes.addressof(rows)
    elif et in _INTS or et in (C.BOOL, C.FLOAT, C.DOUBLE):
        for x in arr.items:
            validate(Value(x, et))
        a = (_ctype_for(et) * n)(*arr.items)
        keep.append(a)
        da.array = ctypes.addressof(a)
    else:
        raise PmixValueError(C.ERR_NOT_SUPPORTED,
                             f"data arrays of {C.type_name(et)} are not supported")


def _keep_str(s: str | None, keep: list) -> int | None:
    """A C string of ``s`` held in ``keep`` (NULL for None)."""
    if s is None:
        return None
    buf = ctypes.create_string_buffer(_enc(s))
    keep.append(buf)
    return ctypes.addressof(buf)


def proc_to_c(p: Proc, dest: L.pmix_proc_t) -> None:
    dest.nspace = check_nspace(p.nspace)
    dest.rank = p.rank


def build_info(items, keep: list) -> ctypes.Array:
    """A ``pmix_info_t`` array from ``(key, Value or native)`` pairs; appended to ``keep``."""
    items = list(items)
    arr = (L.pmix_info_t * max(len(items), 1))()
    for i, (key, val) in enumerate(items):
        arr[i].key = check_key(key)
        value_to_c(Value.of(val), arr[i].value, keep)
    if items:
        arr[len(items) - 1].flags = C.INFO_ARRAY_END
    keep.append(arr)
    return arr
