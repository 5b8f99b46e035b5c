"""The wire's framing: pack / unpack_body / FrameDecoder, without sockets.

A frame is a 4-byte big-endian length and a msgpack map with a string "t".
Whatever bytes arrive, in whatever chunks, the decoder either yields such
maps or raises FrameError -- never any other exception.
"""

from __future__ import annotations

import struct
import time

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pydvm.wire import (HANDSHAKE_FRAME, HEADER, MAX_FRAME, FrameDecoder, FrameError, pack,
                        unpack_body)

# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

VALUES = {
    "none": None,
    "true": True,
    "false": False,
    "zero": 0,
    "small_int": 7,
    "negative_int": -33,
    "int64_max": 2**63 - 1,
    "int64_min": -(2**63),
    "uint64_max": 2**64 - 1,
    "float": 3.25,
    "negative_float": -1e300,
    "inf": float("inf"),
    "empty_str": "",
    "str": "tcp://10.0.0.1:5555",
    "unicode_str": "naïve ☃ 𝄞",
    "empty_bytes": b"",
    "bytes": b"\x00\xff\x01binary",
    "empty_list": [],
    "list": [1, "two", b"three", None, 4.5, [6]],
    "empty_map": {},
    "map": {"a": 1, "b": {"c": [True, False]}, "bin": b"k"},
    "bytes_key_map": {b"raw": "value"},
    "ext": msgpack.ExtType(5, b"ext-data"),
    "long_str": "x" * 70_000,
    "long_bytes": bytes(range(256)) * 300,
}


def frame_of_body(body: bytes) -> bytes:
    return HEADER.pack(len(body)) + body


def feed_all(chunks: list[bytes], max_frame: int = MAX_FRAME) -> list[dict]:
    dec = FrameDecoder(max_frame)
    out: list[dict] = []
    for c in chunks:
        out.extend(dec.feed(c))
    return out


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at the given offsets (sorted, deduplicated, clipped)."""
    points = sorted({min(max(c, 0), len(data)) for c in cuts})
    pieces, prev = [], 0
    for p in points:
        pieces.append(data[prev:p])
        prev = p
    pieces.append(data[prev:])
    return pieces


# ---------------------------------------------------------------------------
# round trip
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(VALUES))
def test_every_value_type_round_trips_through_pack_and_unpack_body(name):
    """A message carrying any msgpack value type decodes to an equal message."""
    msg = {"t": "publish", "id": 1, "value": VALUES[name]}
    frame = pack(msg)
    (size,) = struct.unpack("!I", frame[:4])
    assert size == len(frame) - 4
    assert unpack_body(frame[4:]) == msg
    assert FrameDecoder().feed(frame) == [msg]


def test_tuples_arrive_as_lists():
    """msgpack has one array type: a tuple is sent and comes back as a list."""
    assert unpack_body(pack({"t": "x", "v": (1, (2, 3))})[4:]) == {"t": "x", "v": [1, [2, 3]]}


def test_str_and_bytes_stay_distinct():
    """A str value arrives as str and a bytes value as bytes (bin type on the wire)."""
    got = unpack_body(pack({"t": "x", "s": "abc", "b": b"abc"})[4:])
    assert type(got["s"]) is str and type(got["b"]) is bytes


def test_message_with_every_value_type_at_once_round_trips():
    """One message holding all the value types at once survives the trip."""
    msg = {"t": "all", **VALUES}
    assert FrameDecoder().feed(pack(msg)) == [msg]


# ---------------------------------------------------------------------------
# chunking
# ---------------------------------------------------------------------------


def test_frame_split_at_every_byte_boundary_reassembles():
    """Cutting a frame in two at any offset yields the message once, after the last piece."""
    msg = {"t": "lookup", "id": 42, "keys": ["a", "bb"], "wait": None, "blob": b"\x00" * 40}
    frame = pack(msg)
    for i in range(len(frame) + 1):
        dec = FrameDecoder()
        first = dec.feed(frame[:i])
        assert first == ([msg] if i == len(frame) else []), i
        assert dec.pending_bytes == (0 if i == len(frame) else i)
        second = dec.feed(frame[i:])
        assert first + second == [msg], i
        assert dec.pending_bytes == 0


def test_frame_fed_one_byte_at_a_time_reassembles():
    """Feeding single bytes yields the message exactly when its last byte arrives."""
    msg = {"t": "publish", "id": 3, "pairs": {"k": "v" * 300}}
    frame = pack(msg)
    dec = FrameDecoder()
    for i, b in enumerate(frame):
        got = dec.feed(bytes([b]))
        assert got == ([msg] if i == len(frame) - 1 else [])


def test_several_frames_in_one_chunk_all_come_out_in_order():
    """A chunk holding many whole frames yields all their messages in order."""
    msgs = [{"t": "m", "id": i, "v": "x" * i} for i in range(20)]
    assert FrameDecoder().feed(b"".join(pack(m) for m in msgs)) == msgs


def test_chunk_ending_inside_a_frame_keeps_the_rest_pending():
    """Whole frames of a chunk come out; the partial one waits for its remainder."""
    a, b, c = ({"t": "m", "id": i} for i in range(3))
    stream = pack(a) + pack(b) + pack(c)
    cut = len(pack(a)) + len(pack(b)) + 3
    dec = FrameDecoder()
    assert dec.feed(stream[:cut]) == [a, b]
    assert dec.pending_bytes == 3
    assert dec.feed(stream[cut:]) == [c]
    assert dec.pending_bytes == 0


def test_header_split_across_chunks_is_reassembled():
    """A length header cut in the middle is read once its last byte arrives."""
    msg = {"t": "m"}
    frame = pack(msg)
    dec = FrameDecoder()
    assert dec.feed(frame[:1]) == []
    assert dec.feed(frame[1:3]) == []
    assert dec.feed(frame[3:]) == [msg]


def test_empty_feed_yields_nothing():
    """Feeding no bytes yields no messages and holds nothing."""
    dec = FrameDecoder()
    assert dec.feed(b"") == []
    assert dec.pending_bytes == 0


# ---------------------------------------------------------------------------
# size limit
# ---------------------------------------------------------------------------


def test_oversized_length_header_raises_before_the_body_arrives():
    """A header announcing more than MAX_FRAME raises, naming the limit, with only 4 bytes fed."""
    dec = FrameDecoder()
    with pytest.raises(FrameError) as ei:
        dec.feed(HEADER.pack(MAX_FRAME + 1))
    assert str(MAX_FRAME) in str(ei.value)
    assert str(MAX_FRAME + 1) in str(ei.value)


def test_largest_possible_length_header_raises():
    """A 0xFFFFFFFF length is refused at once, not waited for."""
    with pytest.raises(FrameError, match="exceeds the limit"):
        FrameDecoder().feed(b"\xff\xff\xff\xff")


def test_custom_limit_is_applied_and_named():
    """With max_frame=N, a header of N+1 raises naming N; a body of exactly N is accepted."""
    with pytest.raises(FrameError, match=r"\b100\b"):
        FrameDecoder(max_frame=100).feed(HEADER.pack(101))
    body = msgpack.packb({"t": "x", "pad": "y" * 80}, use_bin_type=True)
    limit = len(body)
    assert FrameDecoder(max_frame=limit).feed(frame_of_body(body)) == [{"t": "x", "pad": "y" * 80}]
    with pytest.raises(FrameError):
        FrameDecoder(max_frame=limit - 1).feed(frame_of_body(body))


def test_oversized_header_after_a_valid_frame_in_separate_chunk_raises():
    """The limit applies to every frame of the stream, not only the first."""
    dec = FrameDecoder()
    assert dec.feed(pack({"t": "ok"})) == [{"t": "ok"}]
    with pytest.raises(FrameError, match="exceeds"):
        dec.feed(HEADER.pack(MAX_FRAME + 1) + b"abc")


# ---------------------------------------------------------------------------
# bad bodies
# ---------------------------------------------------------------------------

NON_MAP_BODIES = {
    "int": 5,
    "str": "hello",
    "bytes": b"hello",
    "list": [{"t": "x"}],
    "nil": None,
    "bool": True,
    "float": 1.5,
}


@pytest.mark.parametrize("name", sorted(NON_MAP_BODIES))
def test_non_map_body_raises_frame_error(name):
    """A body that decodes to something other than a map is a FrameError."""
    body = msgpack.packb(NON_MAP_BODIES[name], use_bin_type=True)
    with pytest.raises(FrameError, match="not a map"):
        unpack_body(body)
    with pytest.raises(FrameError):
        FrameDecoder().feed(frame_of_body(body))


@pytest.mark.parametrize("t", ["missing", None, 1, b"publish", ["publish"], {"x": 1}, True])
def test_map_without_string_type_raises_frame_error(t):
    """A map whose "t" is absent or not a str is a FrameError."""
    msg = {"id": 1} if t == "missing" else {"t": t, "id": 1}
    body = msgpack.packb(msg, use_bin_type=True)
    with pytest.raises(FrameError, match="'t'"):
        unpack_body(body)
    with pytest.raises(FrameError):
        FrameDecoder().feed(frame_of_body(body))


UNDECODABLE = {
    "empty": b"",
    "never_used_byte": b"\xc1",
    "truncated_array": b"\x92\x01",
    "truncated_str": b"\xa5ab",
    "extra_data": b"\x81\xa1t\xa1x\x80",
    "huge_array_count": b"\xdd\xff\xff\xff\xff",
    "huge_map_count": b"\xdf\xff\xff\xff\xff",
    "huge_bin_len": b"\xc6\xff\xff\xff\xff",
    "deep_nesting": b"\x91" * 100_000 + b"\x00",
    "invalid_utf8_str": b"\x81\xa1t\xa2\xff\xfe",
    "list_map_key": b"\x82\xa1t\xa1x\x91\x01\x02",
}


@pytest.mark.parametrize("body", [
    msgpack.packb({"t": "x", 1: 2}),
    msgpack.packb({"t": "x", "pairs": {7: "v"}}),
    msgpack.packb({"t": "x", 1.5: 2}),
], ids=["int_map_key", "nested_int_map_key", "float_map_key"])
def test_non_str_map_keys_decode_and_are_judged_by_the_handler(body):
    """A map with int/float keys is a frame; the request's handler refuses it with BAD_PARAM."""
    (msg,) = FrameDecoder().feed(frame_of_body(body))
    assert msg["t"] == "x"


@pytest.mark.parametrize("name", sorted(UNDECODABLE))
def test_undecodable_body_raises_frame_error(name):
    """Bytes that are not one msgpack map (with str/bytes keys) raise FrameError, nothing else."""
    body = UNDECODABLE[name]
    with pytest.raises(FrameError):
        unpack_body(body)
    with pytest.raises(FrameError):
        FrameDecoder().feed(frame_of_body(body))


def test_bad_frame_after_good_ones_in_separate_chunks_raises_only_at_the_bad_one():
    """Messages of earlier chunks are delivered; the chunk with the bad frame raises."""
    dec = FrameDecoder()
    assert dec.feed(pack({"t": "a"})) == [{"t": "a"}]
    assert dec.feed(pack({"t": "b"})) == [{"t": "b"}]
    with pytest.raises(FrameError):
        dec.feed(frame_of_body(b"\xc1"))


# ---------------------------------------------------------------------------
# fuzzing
# ---------------------------------------------------------------------------

_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large]
#: Raw bytes are cheap to draw; generated messages are not (runtime budget).
FUZZ_BYTES = settings(max_examples=600, deadline=None, suppress_health_check=_HEALTH)
FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=_HEALTH)

msg_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False) | st.text(max_size=20) | st.binary(max_size=20),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=5), kids, max_size=4),
    max_leaves=10,
)
messages = st.builds(
    lambda t, rest: {**rest, "t": t},
    st.text(max_size=10),
    # "_body" is reserved: it names an envelope's payload (see the tests below).
    st.dictionaries(st.text(max_size=6).filter(lambda k: k != "_body"), msg_values, max_size=4),
)


def _check_stream(chunks: list[bytes], max_frame: int) -> tuple[list[dict], bool, int]:
    """Feed chunks; returns (messages, raised FrameError, pending bytes)."""
    dec = FrameDecoder(max_frame)
    got: list[dict] = []
    for c in chunks:
        try:
            out = dec.feed(c)
        except FrameError:
            return got, True, dec.pending_bytes
        # Any exception other than FrameError propagates and fails the test.
        assert isinstance(out, list)
        for m in out:
            assert isinstance(m, dict)
            assert isinstance(m.get("t"), str)
        got.extend(out)
    return got, False, dec.pending_bytes


@FUZZ_BYTES
@given(data=st.binary(max_size=600), cuts=st.lists(st.integers(0, 600), max_size=12),
       max_frame=st.sampled_from([MAX_FRAME, 0, 1, 16, 64, 300]))
def test_random_bytes_in_random_chunks_yield_typed_maps_or_frame_error(data, cuts, max_frame):
    """Arbitrary bytes fed in arbitrary chunks give dicts with a str "t", or FrameError -- nothing else."""
    _check_stream(split(data, cuts), max_frame)


@st.composite
def corrupted_streams(draw):
    """Valid frames, concatenated, then a few bytes flipped, inserted or dropped."""
    msgs = draw(st.lists(messages, min_size=1, max_size=5))
    stream = bytearray(b"".join(pack(m) for m in msgs))
    for _ in range(draw(st.integers(0, 3))):
        if not stream:
            break
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        i = draw(st.integers(0, len(stream) - 1))
        if op == "flip":
            stream[i] = draw(st.integers(0, 255))
        elif op == "insert":
            stream[i:i] = draw(st.binary(min_size=1, max_size=4))
        elif op == "delete":
            del stream[i]
        else:
            del stream[i:]
    return msgs, bytes(stream)


@FUZZ
@given(case=corrupted_streams(), cuts=st.lists(st.integers(0, 2000), max_size=12))
def test_corrupted_frames_in_random_chunks_yield_typed_maps_or_frame_error(case, cuts):
    """Mutated valid streams give dicts with a str "t", or FrameError -- nothing else."""
    _, stream = case
    _check_stream(split(stream, cuts), 300)


@FUZZ
@given(case=corrupted_streams(), cuts=st.lists(st.integers(0, 2000), max_size=12))
def test_chunking_does_not_change_what_a_stream_decodes_to(case, cuts):
    """However a stream is chunked, it yields the same messages (or also fails) as fed whole."""
    _, stream = case
    whole, whole_failed, whole_pending = _check_stream([stream], 300)
    chunked, chunked_failed, chunked_pending = _check_stream(split(stream, cuts), 300)
    assert chunked_failed == whole_failed
    if not whole_failed:
        # Compared as encoded bytes: a corrupted float may decode to NaN != NaN.
        assert [pack(m) for m in chunked] == [pack(m) for m in whole]
        assert chunked_pending == whole_pending
    else:
        # Fed whole, a failing chunk delivers nothing; chunked, frames before the
        # bad one may come out, but only messages of the stream's valid prefix.
        assert whole == []


@FUZZ
@given(msgs=st.lists(messages, min_size=1, max_size=6), cuts=st.lists(st.integers(0, 3000), max_size=15))
def test_valid_frames_in_random_chunks_reassemble_exactly(msgs, cuts):
    """Uncorrupted frames, chunked any way, come out as exactly the messages sent."""
    stream = b"".join(pack(m) for m in msgs)
    got, failed, pending = _check_stream(split(stream, cuts), MAX_FRAME)
    assert not failed
    assert pending == 0
    assert got == msgs


# ---------------------------------------------------------------------------
# envelopes: a routing header and an opaque payload
# ---------------------------------------------------------------------------

from pydvm.wire import BODY, pack_payload  # noqa: E402


def test_an_envelope_round_trips_with_its_payload_untouched():
    payload = pack_payload({"pairs": {"k": b"\x00" * 1000}, "persist": 5})
    frame = pack({"t": "publish", "id": 3, "range": 4, BODY: payload})
    assert frame[4] == 0xC1
    (msg,) = FrameDecoder().feed(frame)
    assert msg["t"] == "publish" and msg["id"] == 3 and msg["range"] == 4
    assert bytes(msg[BODY]) == payload


def test_an_envelope_passed_on_keeps_the_same_payload_bytes():
    """What a daemon forwards is the payload it got, not a re-encoding of it."""
    payload = pack_payload({"keys": ["a"], "wait": None, "timeout": None})
    (got,) = FrameDecoder().feed(pack({"t": "lookup", "id": 1, BODY: payload}))
    forwarded = pack({"t": "lookup", "id": 99, "rid": 1, "caller": ["n", 0, 0, 0],
                      BODY: got[BODY]})
    assert forwarded.endswith(payload)


def test_a_plain_map_cannot_smuggle_a_payload_field():
    """Only an envelope carries a payload: a plain map's "_body" key is dropped."""
    body = msgpack.packb({"t": "publish", "id": 1, "_body": b"x"})
    (msg,) = FrameDecoder().feed(HEADER.pack(len(body)) + body)
    assert BODY not in msg


@pytest.mark.parametrize("body", [
    b"\xc1",                                    # no header length
    b"\xc1\x00\x00",                            # truncated header length
    b"\xc1\x00\x00\x00\x10\x81",                # header length overruns the frame
    b"\xc1\x00\x00\x00\x01\x92",                # header is not a map
    b"\xc1\x00\x00\x00\x01\x80payload",         # header map without a type
])
def test_malformed_envelopes_raise_frame_error(body):
    with pytest.raises(FrameError):
        FrameDecoder().feed(HEADER.pack(len(body)) + body)


def test_reissue_passes_an_envelope_payload_on_as_the_same_object():
    """dataops.reissue (a daemon forwarding a client request) neither decodes
    nor re-encodes the payload, and an answer the next hop encoded for the
    client is passed back as bytes."""
    from pydvm.runtime.shared import dataops

    payload = memoryview(pack_payload({"pairs": {"k": "v"}}))
    sent, raw, answered = [], [], []

    class To:
        closed = False

        class channel:  # noqa: N801 - a stand-in for the client's channel
            send_raw = raw.append

        def send_answer(self, rid, r):
            answered.append((rid, r))

    def send(msg, cb):
        sent.append((msg, cb))
        return 77

    out: dict = {}
    dataops.reissue(send, To(), {"t": "publish", "id": 5, "range": 4, BODY: payload},
                    {"t": "publish", "caller": ["ns", 0, 1, 1]}, out)
    (fwd, cb), = sent
    assert fwd[BODY] is payload and fwd["rid"] == 5 and fwd["range"] == 4
    assert out == {5: 77}
    cb({"t": "reply", "id": 77, BODY: b"encoded-once"})
    assert raw == [b"encoded-once"] and out == {}
    dataops.reissue(send, To(), {"t": "lookup", "id": 6, "keys": ["k"]}, {"t": "lookup"}, out)
    sent[-1][1]({"t": "reply", "id": 78, "status": -46})
    assert answered == [(6, {"t": "reply", "id": 6, "status": -46})]


# ---------------------------------------------------------------------------
# in-process links: the same request bookkeeping as a socket's Channel
# ---------------------------------------------------------------------------

import asyncio  # noqa: E402

from pydvm.wire import local_pair  # noqa: E402


def test_a_cancelled_call_on_an_in_process_link_withdraws_its_request_at_the_peer():
    """A caller that gives up (its task cancelled) leaves nothing parked at the other end:
    the peer gets a ``cancel`` naming the request, as over a socket."""

    async def scenario():
        ours, theirs = local_pair("here", "there")
        seen: list[dict] = []
        theirs.on_message = lambda ch, m: seen.append(m)  # never answers: a parked lookup
        task = asyncio.ensure_future(ours.call({"t": "lookup", "keys": ["k"]}))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.01)
        return seen

    seen = asyncio.run(scenario())
    assert [m["t"] for m in seen] == ["lookup", "cancel"]
    assert seen[1]["ref"] == seen[0]["id"]


def test_closing_an_in_process_link_answers_outstanding_requests_unreach():
    async def scenario():
        ours, theirs = local_pair("here", "there")
        got: list[dict] = []
        ours.request({"t": "lookup"}, got.append)
        theirs.close("gone")
        await asyncio.sleep(0.01)
        late: list[dict] = []
        ours.request({"t": "lookup"}, late.append)
        return got, late

    got, late = asyncio.run(scenario())
    assert [(r["status"], r["msg"]) for r in got] == [(-25, "link here closed: gone")]
    assert late[0]["status"] == -25 and late[0]["msg"] == "link here is closed"


# ---------------------------------------------------------------------------
# the blocking client's wait: poll for about one round trip, then sleep
# ---------------------------------------------------------------------------

import socket  # noqa: E402
import threading  # noqa: E402

from pydvm import protocol as codec  # noqa: E402
from pydvm import wire as wire_mod  # noqa: E402
from pydvm import channel as channel_mod  # noqa: E402
from pydvm.channel import SPIN_BACKOFF_MAX, BlockingChannel  # noqa: E402


@pytest.mark.parametrize("text,us", [("", 100.0), ("0", 0.0), ("250", 250.0), ("junk", 100.0),
                                     ("-5", 0.0), ("1e9", 10_000.0)])
def test_the_spin_window_comes_from_the_environment(monkeypatch, text, us):
    monkeypatch.setenv("PYDVM_CLIENT_SPIN_US", text)
    assert channel_mod._client_spin() == pytest.approx(us / 1e6)


def _late(b, msg, after=0.03):
    t = threading.Timer(after, lambda: b.sendall(pack(msg)))
    t.start()
    return t


def test_a_reply_is_read_whether_it_comes_during_the_poll_or_after_it(monkeypatch):
    """A reply already there is read by the poll; one that comes later than the
    window is read by the sleeping recv; an empty poll makes the next wait
    sleep at once, and it still gets its reply."""
    monkeypatch.setenv("PYDVM_CLIENT_SPIN_US", "2000")
    a, b = socket.socketpair()
    try:
        ch = BlockingChannel(a)
        b.sendall(pack({"t": "reply", "id": 1}))
        assert ch.recv() == {"t": "reply", "id": 1}
        assert ch._sleepy == 0
        late = _late(b, {"t": "reply", "id": 2})
        assert ch.recv() == {"t": "reply", "id": 2}  # after the 2 ms poll: asleep
        late.join()
        assert ch._sleepy == 1
        b.sendall(pack({"t": "reply", "id": 3}))
        assert ch.recv() == {"t": "reply", "id": 3}  # slept at once
        assert ch._sleepy == 0
    finally:
        a.close()
        b.close()


def test_empty_polls_in_a_row_double_the_sleeps_and_an_answered_poll_resets_them(monkeypatch):
    """One late answer (a hiccup) costs one sleeping wait; a peer that keeps
    answering late (more clients than cores) is polled ever more rarely, up
    to one poll per SPIN_BACKOFF_MAX + 1 waits; once a poll is answered, the
    next empty one again costs a single sleeping wait.

    "Late" is made exact rather than timed: the answer is sent the moment a
    poll has come back empty, so a loaded machine (a poll descheduled past
    a timer's send) cannot turn a late answer into a prompt one."""
    monkeypatch.setenv("PYDVM_CLIENT_SPIN_US", "1000")
    a, b = socket.socketpair()
    polls = []
    late: list[dict] = []
    try:
        ch = BlockingChannel(a)
        real_poll = ch._poll

        def counting_poll():
            if not ch._sleepy:
                polls.append(ch._backoff)
            got = real_poll()
            if got is None and late:
                b.sendall(pack(late.pop()))  # answered just after the poll gave up
            return got
        ch._poll = counting_poll
        sleeps = []
        for i in range(1, 8):  # every answer late: empty polls in a row
            late.append({"t": "reply", "id": i})
            assert ch.recv() == {"t": "reply", "id": i}
            sleeps.append(ch._sleepy)
            while ch._sleepy:  # the sleeping waits, answered at once
                b.sendall(pack({"t": "reply", "id": 0}))
                ch.recv()
        assert sleeps == [1, 2, 4, 8, 16, 32, 64]
        assert len(polls) == 7
        b.sendall(pack({"t": "reply", "id": 100}))
        assert ch.recv()["id"] == 100  # an answered poll
        assert ch._backoff == 1
        late.append({"t": "reply", "id": 101})
        ch.recv()
        assert ch._sleepy == 1
        ch._backoff = SPIN_BACKOFF_MAX
        b.sendall(pack({"t": "reply", "id": 0}))
        ch.recv()  # the one sleeping wait
        late.append({"t": "reply", "id": 102})
        ch.recv()  # polls, finds nothing: the longest backoff
        assert ch._sleepy == SPIN_BACKOFF_MAX
        assert ch._backoff == SPIN_BACKOFF_MAX
    finally:
        a.close()
        b.close()


def test_a_closed_peer_is_seen_during_the_poll(monkeypatch):
    monkeypatch.setenv("PYDVM_CLIENT_SPIN_US", "100000")
    a, b = socket.socketpair()
    ch = BlockingChannel(a)
    b.close()
    t0 = time.monotonic()
    with pytest.raises(ConnectionError):
        ch.recv()
    assert time.monotonic() - t0 < 0.05  # EOF ends the poll at once
    a.close()


# ---------------------------------------------------------------------------
# packb: one reusable Packer per thread
# ---------------------------------------------------------------------------


def test_packb_from_many_threads_at_once_matches_msgpack():
    import sys

    from pydvm.store.model import Typed
    from pydvm.wire import unpackb

    errors = []
    done = []

    def worker(k):
        try:
            for i in range(2000):
                m = {"t": "publish", "id": i, "pairs": {f"k{k}-{i}": "v" * (i % 50)},
                     "typed": Typed(i, 7)}
                if unpackb(wire_mod.packb(m)) != m:
                    errors.append((k, i))
            if wire_mod.packb({"k": k}) != msgpack.packb({"k": k}, use_bin_type=True):
                errors.append((k, "plain"))
            done.append(k)
        except Exception as exc:
            errors.append((k, repr(exc)))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch inside a pack's Typed hook
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
    assert sorted(done) == [0, 1, 2, 3]


def test_packb_reentered_on_one_thread_keeps_both_encodings(monkeypatch):
    """A pack started while another is under way on the same thread (a
    signal handler's) must not write into the first one's buffer."""

    class Hook:
        pass

    inner = {}
    real = codec._default

    def default(obj):
        if isinstance(obj, Hook):
            inner["bytes"] = codec.packb({"inner": [1, 2, 3], "pad": "y" * 300})
            return "hooked"
        return real(obj)

    monkeypatch.setattr(codec, "_default", default)
    codec._packers.p = None  # the next Packer made calls the hook above
    try:
        out = codec.packb({"a": Hook(), "b": "x" * 100})
        assert msgpack.unpackb(out) == {"a": "hooked", "b": "x" * 100}
        assert msgpack.unpackb(inner["bytes"]) == {"inner": [1, 2, 3], "pad": "y" * 300}
        again = codec.packb({"a": Hook()})  # the reused Packer is still sound
        assert msgpack.unpackb(again) == {"a": "hooked"}
    finally:
        codec._packers.p = None  # drop the Packer holding the test's hook


# ---------------------------------------------------------------------------
# the handshake gate: a stranger's frames, read one at a time and capped
# ---------------------------------------------------------------------------


def test_gated_decoder_returns_one_frame_and_keeps_the_rest():
    dec = FrameDecoder(handshake=HANDSHAKE_FRAME)
    auth, run = pack({"t": "auth", "id": 1}), pack({"t": "run", "id": 2, "env": "x" * 100_000})
    assert dec.feed(auth + run) == [{"t": "auth", "id": 1}]
    assert dec.pending_bytes == len(run)
    dec.handshake = None  # the peer is in: the big frame behind it is read
    assert dec.feed(b"") == [{"t": "run", "id": 2, "env": "x" * 100_000}]


def test_gated_decoder_refuses_a_frame_over_the_cap_before_its_body():
    dec = FrameDecoder(handshake=HANDSHAKE_FRAME)
    with pytest.raises(FrameError, match=f"before the handshake exceeds the limit of "
                                         f"{HANDSHAKE_FRAME}") as exc:
        dec.feed(HEADER.pack(HANDSHAKE_FRAME + 1) + b"\0" * 1000)
    assert exc.value.messages == []
    assert dec.pending_bytes == 0  # nothing of it held


def test_gated_decoder_takes_a_frame_of_exactly_the_cap():
    pad = HANDSHAKE_FRAME
    while len(pack({"t": "hello", "pad": b"p" * pad})) - 4 > HANDSHAKE_FRAME:
        pad -= 1
    msg = {"t": "hello", "pad": b"p" * pad}
    frame = pack(msg)
    assert len(frame) - 4 == HANDSHAKE_FRAME
    assert FrameDecoder(handshake=HANDSHAKE_FRAME).feed(frame) == [msg]
    with pytest.raises(FrameError):
        FrameDecoder(handshake=HANDSHAKE_FRAME).feed(pack({"t": "hello", "pad": b"p" * (pad + 1)}))
