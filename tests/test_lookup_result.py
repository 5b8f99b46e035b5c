"""What a lookup's answer turns into for the caller (pydvm.client.proto.lookup_result):
values, Found records, publishers, the PMIx type names, partial answers."""

import pytest

from pydvm import Typed
from pydvm.client.proto import Found, LookupResult, lookup_result
from pydvm.errors import NotFoundError, Status

ROWS = [["addr", "tcp://10.0.0.1:5", "job-a", 3],
        ["port", 5555, "job-a", 3],
        ["blob", b"\x00\x01", "job-b", 0],
        ["u8", Typed(200, 12), "job-b", 1],
        ["ok", True, "job-c", 2],
        ["pi", 3.25, "job-c", 2]]


def answer(rows=ROWS, status=0):
    return {"t": "reply", "id": 1, "status": status, "msg": "", "found": rows}


def test_values_records_and_publishers():
    r = lookup_result(answer())
    assert r.status is Status.SUCCESS and not r.partial
    assert dict(r) == {"addr": "tcp://10.0.0.1:5", "port": 5555, "blob": b"\x00\x01",
                       "u8": 200, "ok": True, "pi": 3.25}
    assert list(r) == ["addr", "port", "blob", "u8", "ok", "pi"] and len(r) == 6
    assert "addr" in r and "nope" not in r and r.get("nope") is None
    assert r.publisher("port") == ("job-a", 3) and r.publisher("u8") == ("job-b", 1)
    with pytest.raises(KeyError):
        r.publisher("nope")
    assert r.found["addr"] == Found("addr", "tcp://10.0.0.1:5", "job-a", 3, "PMIX_STRING")
    assert r.found["u8"] == Found("u8", 200, "job-b", 1, "PMIX_UINT8")
    assert {k: f.pmix_type for k, f in r.found.items()} == {
        "addr": "PMIX_STRING", "port": "PMIX_INT64", "blob": "PMIX_BYTE_OBJECT",
        "u8": "PMIX_UINT8", "ok": "PMIX_BOOL", "pi": "PMIX_DOUBLE"}
    assert r.found is r.found  # made once
    assert "PMIX_SUCCESS" in repr(r) and "'port': 5555" in repr(r)


def test_values_read_before_and_after_the_records_agree():
    early = lookup_result(answer())
    values = dict(early)
    _ = early.found
    assert dict(early) == values
    assert early.publisher("blob") == ("job-b", 0)


def test_partial_and_refused_answers():
    r = lookup_result(answer(ROWS[:1], int(Status.ERR_PARTIAL_SUCCESS)))
    assert r.partial and dict(r) == {"addr": "tcp://10.0.0.1:5"}
    with pytest.raises(NotFoundError):
        lookup_result({"t": "reply", "id": 1, "status": int(Status.ERR_NOT_FOUND), "msg": "no"})


def test_a_result_built_by_hand_still_works():
    f = Found("k", "v", "ns", 0, "PMIX_STRING")
    r = LookupResult(Status.SUCCESS, {"k": f})
    assert dict(r) == {"k": "v"} and r.found == {"k": f} and r.publisher("k") == ("ns", 0)
