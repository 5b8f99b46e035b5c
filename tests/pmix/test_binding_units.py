"""Binding pieces that need no running server: version check, values, job info."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest

from pydvm.pmix import DataArray, PmixUnavailable, PmixValueError, Proc, Value, check_version
from pydvm.pmix import _lib as L
from pydvm.pmix import constants as C
from pydvm.pmix.jobinfo import JobLayout, job_info
from pydvm.pmix.values import (build_info, check_key, info_at, proc_at, value_from_c,
                               value_to_c)


def test_version_check_accepts_verified_series():
    lay = check_version("OpenPMIx 4.2.2rc2 (PMIx Standard: 4.2, Stable ABI: 0.0)")
    assert lay.series == (4, 2) and lay.module_slots == 28
    assert check_version("OpenPMIx 4.2.9").series == (4, 2)


@pytest.mark.parametrize("fake", ["OpenPMIx 5.0.1 (PMIx Standard: 5.0)", "OpenPMIx 3.2.3",
                                  "OpenPMIx 4.1.2", "PMIx 9", ""])
def test_version_check_refuses_others(fake):
    with pytest.raises(PmixUnavailable) as e:
        check_version(fake)
    msg = str(e.value)
    assert "not supported" in msg or "cannot parse" in msg
    if "not supported" in msg:
        assert "4.2.x" in msg


def test_import_never_needs_libpmix(tmp_path):
    code = ("import pydvm, pydvm.pmix\n"
            "ok, why, path = pydvm.pmix.available()\n"
            "print(ok); print(why)\n")
    env = dict(os.environ, PYDVM_LIBPMIX=str(tmp_path / "no-such-libpmix.so"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    ok, why = r.stdout.splitlines()[:2]
    assert ok == "False" and "libpmix.so.2 not found" in why


def test_available_reports_version_and_path(libpmix):
    from pydvm.pmix import available
    ok, version, path = available()
    assert ok and version.startswith("OpenPMIx 4.2")
    assert "libpmix.so" in os.path.basename(path) and os.path.exists(path)


def test_default_types():
    assert Value.of("s").type == C.STRING
    assert Value.of(b"b").type == C.BYTE_OBJECT
    assert Value.of(True).type == C.BOOL           # bool before int
    assert Value.of(7).type == C.INT64
    assert Value.of(1.5).type == C.DOUBLE
    with pytest.raises(PmixValueError) as e:
        Value.of(object())
    assert e.value.status == C.ERR_NOT_SUPPORTED


ROUND = [Value("héllo", C.STRING), Value(b"\x00\xff", C.BYTE_OBJECT), Value(True, C.BOOL),
         Value(-5, C.INT8), Value(-300, C.INT16), Value(-70000, C.INT32),
         Value(-(2 ** 63), C.INT64), Value(255, C.UINT8), Value(65535, C.UINT16),
         Value(2 ** 32 - 1, C.UINT32), Value(2 ** 64 - 1, C.UINT64), Value(2 ** 40, C.SIZE),
         Value(1234, C.PID), Value(-9, C.INT), Value(9, C.UINT), Value(0.5, C.FLOAT),
         Value(1e300, C.DOUBLE), Value(-46, C.STATUS), Value(7, C.PROC_RANK),
         Value(5, C.PERSIST), Value(3, C.DATA_RANGE), Value(Proc("ns", 2), C.PROC),
         Value(DataArray(C.UINT32, (1, 2, 3)), C.DATA_ARRAY), Value(None, C.UNDEF)]


@pytest.mark.parametrize("v", ROUND, ids=lambda v: C.type_name(v.type))
def test_value_round_trip_through_c(v):
    keep = []
    cv = L.pmix_value_t()
    value_to_c(v, cv, keep)
    assert value_from_c(cv) == v


def test_info_array_round_trip_with_nested_info():
    keep = []
    nested = Value(DataArray(C.INFO, (("pmix.rank", Value(1, C.PROC_RANK)),
                                      ("x", Value("y", C.STRING)))), C.DATA_ARRAY)
    arr = build_info([("a", 1), ("b", nested)], keep)
    back = info_at(ctypes.addressof(arr), 2)
    assert back[0] == ("a", Value(1, C.INT64))
    assert back[1][1].value.items == nested.value.items
    assert arr[1].flags == C.INFO_ARRAY_END


def _by_fields(addr: int, n: int) -> list:
    """The reference reading of an info array: one ctypes field at a time."""
    out = []
    for i in (L.pmix_info_t * n).from_address(addr):
        key = i.key.decode("utf-8", "surrogateescape")
        try:
            out.append((key, value_from_c(i.value)))
        except PmixValueError as e:
            out.append((key, ("refused", e.status)))
    return out


def test_info_at_reads_every_type_as_the_field_by_field_reading_does():
    """info_at reads an array from one copy of its bytes; what it returns is
    what reading each ctypes field gives, for every type, empty values, the
    longest key and an unsupported type (kept as its refusal)."""
    keep = []
    items = [(f"k{n}", v) for n, v in enumerate(ROUND)]
    items += [("empty-s", Value("", C.STRING)), ("empty-b", Value(b"", C.BYTE_OBJECT)),
              ("f", Value(False, C.BOOL)), ("k" * C.MAX_KEYLEN, Value("long", C.STRING)),
              ("t", Value(0, C.UINT64))]
    arr = build_info(items, keep)
    arr[len(items) - 1].value.type = C.TIMEVAL   # not supported: refused in place
    addr = ctypes.addressof(arr)
    got = [(k, ("refused", v.status) if isinstance(v, PmixValueError) else v)
           for k, v in info_at(addr, len(items))]
    assert got == _by_fields(addr, len(items))
    assert got[-1] == ("t", ("refused", C.ERR_NOT_SUPPORTED))
    assert [v for _, v in got[:len(ROUND)]] == ROUND


@pytest.mark.parametrize("nspace", ["n", "x" * C.MAX_NSLEN])
def test_proc_at_reads_a_proc_as_its_fields_say(nspace):
    p = L.pmix_proc_t()
    p.nspace = nspace.encode()
    p.rank = 2 ** 32 - 2
    assert proc_at(ctypes.addressof(p)) == Proc(nspace, 2 ** 32 - 2)


@pytest.mark.parametrize("v", [Value(256, C.UINT8), Value(-1, C.UINT32), Value(2 ** 63, C.INT64),
                               Value("x", C.INT32), Value(1, C.STRING), Value("a\0b", C.STRING),
                               Value(1e40, C.FLOAT), Value(1, C.BOOL)])
def test_bad_values_refused(v):
    with pytest.raises(PmixValueError) as e:
        value_to_c(v, L.pmix_value_t(), [])
    assert e.value.status == C.ERR_BAD_PARAM


def test_unsupported_type_refused():
    with pytest.raises(PmixValueError) as e:
        value_to_c(Value(0, C.TIME), L.pmix_value_t(), [])
    assert e.value.status == C.ERR_NOT_SUPPORTED
    cv = L.pmix_value_t()
    cv.type = C.TIMEVAL
    with pytest.raises(PmixValueError) as e:
        value_from_c(cv)
    assert e.value.status == C.ERR_NOT_SUPPORTED


def test_key_length_limit():
    assert check_key("k" * C.MAX_KEYLEN)
    for bad in ("k" * (C.MAX_KEYLEN + 1), "", "a\0b", "é" * 256):
        with pytest.raises(PmixValueError) as e:
            check_key(bad)
        assert e.value.status == C.ERR_BAD_PARAM


def test_job_info_mpmd_two_nodes():
    lay = JobLayout("ns@1", {"n0": [0, 1], "n1": [2]}, apps=[2, 1], session_id=9)
    info = job_info(lay, "n0")
    d = {}
    for k, v in info:
        d.setdefault(k, []).append(v)
    assert d[C.NODE_MAP][0].value == "n0,n1"
    assert d[C.PROC_MAP][0].value == "0,1;2"
    assert d[C.JOB_SIZE][0] == Value(3, C.UINT32)
    assert d[C.JOB_NUM_APPS][0] == Value(2, C.UINT32)
    assert d[C.SESSION_ID][0] == Value(9, C.UINT32)
    assert d[C.LOCAL_PEERS][0].value == "0,1"
    apps = [dict(v.value.items) for v in d[C.APP_INFO_ARRAY]]
    assert [(a[C.APPNUM].value, a[C.APP_SIZE].value, a[C.APPLDR].value) for a in apps] == \
        [(0, 2, 0), (1, 1, 2)]
    procs = [dict(v.value.items) for v in d[C.PROC_DATA]]
    p2 = procs[2]
    assert (p2[C.RANK].value, p2[C.APPNUM].value, p2[C.APP_RANK].value,
            p2[C.LOCAL_RANK].value, p2[C.HOSTNAME].value) == (2, 1, 0, 0, "n1")
    assert lay.local_count("n0") == 2
    # and everything in it can be laid out as C structs
    build_info(info, [])


def test_job_info_rejects_inconsistent_layouts():
    with pytest.raises(ValueError):
        job_info(JobLayout("ns", {"a": [0, 2]}), "a")
    with pytest.raises(ValueError):
        job_info(JobLayout("ns", {"a": [0, 1]}, apps=[1]), "a")
