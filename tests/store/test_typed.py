"""Typed values: a value published with a PMIx type keeps it through the store and the wire."""

from __future__ import annotations

import pytest

from pydvm import wire
from pydvm.store import Typed, item_nbytes, pmix_type_of, value_size
from storekit import Status, alice, alice2, found_map

UINT8, SIZE, INT32, FLOAT, STRING, BYTE_OBJECT, BOOL, INT64 = 12, 4, 9, 16, 3, 27, 1, 10


@pytest.mark.parametrize("value,size", [
    (Typed(200, UINT8), 8), (Typed(2**64 - 1, SIZE), 8), (Typed(-5, INT32), 8),
    (Typed(1.5, FLOAT), 8), (Typed("héllo", STRING), 6), (Typed(b"\x00\x01", BYTE_OBJECT), 2),
    (Typed(True, BOOL), 1),
], ids=repr)
def test_typed_values_are_accounted_by_category_not_width(value, size):
    """SPEC 3: every integer width and float/double count 8, whatever the PMIx type."""
    assert value_size(value) == size
    assert item_nbytes({"k": value}, (), ()) == item_nbytes({"k": value.value}, (), ())


@pytest.mark.parametrize("bad", [
    Typed(256, UINT8), Typed(-1, SIZE), Typed("x", UINT8), Typed(1, STRING),
    Typed(1.0, INT32), Typed(1, 18), Typed(1, "int"), Typed(True, UINT8),
], ids=repr)
def test_a_typed_value_that_does_not_fit_its_type_is_refused_and_stores_nothing(store, bad):
    r = store.publish(alice, {"k": bad})
    assert r.status is Status.ERR_BAD_PARAM and len(store) == 0


def test_a_typed_value_comes_back_with_its_type(store):
    assert store.publish(alice, {"u8": Typed(200, UINT8), "s": "plain"}).status is Status.SUCCESS
    got = found_map(store.lookup(alice2, ["u8", "s"]))
    assert got["u8"][0] == Typed(200, UINT8)
    assert pmix_type_of(got["u8"][0]) == UINT8 and pmix_type_of(got["s"][0]) == STRING
    assert pmix_type_of(3) == INT64 and pmix_type_of(True) == BOOL


def test_typed_values_cross_the_wire_as_msgpack_extensions():
    msg = {"t": "reply", "found": [["k", Typed(200, UINT8), "ns", 0], ["s", "x", "ns", 1]]}
    back = wire.unpack_body(wire.pack(msg)[4:])
    assert back["found"][0][1] == Typed(200, UINT8) and back["found"][1][1] == "x"


def test_a_malformed_typed_extension_is_refused_by_the_store_not_the_connection(store):
    import msgpack
    body = msgpack.packb({"t": "publish", "pairs": {"k": msgpack.ExtType(1, b"\xc1")}},
                         use_bin_type=True)
    msg = wire.unpack_body(body)  # decodes: the frame is not dropped
    assert store.publish(alice, msg["pairs"]).status is Status.ERR_BAD_PARAM
