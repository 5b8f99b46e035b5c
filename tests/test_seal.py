"""Sealed links, without sockets: the handshake's keys, and frames that a
network attacker can neither read nor change unnoticed.

What is checked here is the pure module (pydvm/seal.py) and the frame
decoder reading a sealed stream.  For any frames sent in any chunks, the
receiver gets exactly those frames; after any single change an attacker
makes to the byte stream -- a bit flipped, a frame dropped, replayed,
reordered, spliced in from elsewhere, the stream cut -- it gets a prefix of
what was sent and then an error (or, cut inside a frame, an incomplete one),
never a frame that was not sent where it stands.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pydvm import seal
from pydvm.protocol import HEADER, FrameDecoder, FrameError, pack, packb
from pydvm.seal import (TAG, Answer, Box, Offer, SealError, Sealer, challenge_sig,
                        is_loopback, must_seal)

SECRET = bytes(range(32))
DVM = "d0d0cafe"


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def handshake(psk_master: bytes = SECRET, psk_peer: bytes = SECRET, role: str = "tool",
              **box_kw) -> tuple[Box, Box]:
    """A sealed handshake run through, messages re-decoded as the wire
    would: (the master's box, the peer's box)."""
    offer = Offer(DVM, SECRET, True)
    challenge = wire_copy(offer.challenge)
    ans = Answer(challenge, dvm=DVM, role=role, secret=SECRET)
    assert ans.sealed and ans.message is not None
    master_box = offer.accept(wire_copy(ans.message), psk_master, **box_kw)
    return master_box, ans.box(psk_peer, **box_kw)


def wire_copy(msg: dict) -> dict:
    """``msg`` as the other side decodes it."""
    dec = FrameDecoder()
    (out,) = dec.feed(pack(msg))
    return out


def msg(i: int, size: int = 0) -> dict:
    return {"t": "run", "id": i, "env": {"SECRET": "hunter2"}, "pad": b"x" * size}


def sealed_frames(box: Box, messages: list[dict]) -> list[bytes]:
    return [box.sealer.frame(packb(m)) for m in messages]


def read(box: Box, stream: bytes, chunks: list[int] | None = None) -> tuple[list, Exception | None, int]:
    """Feed ``stream`` (cut at ``chunks``) to a decoder opening with ``box``:
    (messages, the error if any, bytes left incomplete)."""
    dec = FrameDecoder()
    dec.open_with(box.opener.open, TAG)
    out: list = []
    cuts = sorted(set(c % (len(stream) + 1) for c in (chunks or [])))
    pieces, last = [], 0
    for c in cuts + [len(stream)]:
        pieces.append(stream[last:c])
        last = c
    try:
        for p in pieces:
            out.extend(dec.feed(p))
    except FrameError as exc:
        return out + exc.messages, exc, dec.pending_bytes
    return out, None, dec.pending_bytes


bodies = st.lists(st.integers(min_value=0, max_value=3000), min_size=1, max_size=8)


# ---------------------------------------------------------------------------
# which links
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("host,loop", [
    ("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("10.250.7.1", False), ("0.0.0.0", False), ("::", False), ("fe80::1", False),
    ("localhost", False), ("", False), ("127.0.0", False), ("127.0.0.256", False),
    ("::ffff:10.0.0.1", False)])
def test_loopback_is_127_slash_8_and_colon_colon_1_only(host, loop):
    assert is_loopback(host) is loop


def test_which_links_each_mode_seals():
    assert [must_seal(m, lo) for m in ("network", "all", "off") for lo in (False, True)] == \
        [True, False, True, True, False, False]
    with pytest.raises(ValueError):
        must_seal("sometimes", True)


def test_the_parameter_takes_the_modules_modes():
    from pydvm import params
    assert params.REGISTRY["pydvm_seal"].default == "network"
    assert params.resolve([("pydvm_seal", "ALL")])["pydvm_seal"].value == "all"
    with pytest.raises(params.ParamError, match="network, all or off"):
        params.resolve([("pydvm_seal", "on")])


# ---------------------------------------------------------------------------
# the handshake
# ---------------------------------------------------------------------------


def test_both_sides_derive_the_same_two_keys_and_each_way_differs():
    m, p = handshake()
    f = m.sealer.frame(b"to the peer")
    assert p.opener.open(f[:4], f[4:]) == b"to the peer"
    f = p.sealer.frame(b"to the master")
    assert m.opener.open(f[:4], f[4:]) == b"to the master"
    # a frame sent back where it came from (reflected) does not open
    m2, p2 = handshake()
    f = m2.sealer.frame(b"x")
    with pytest.raises(SealError):
        m2.opener.open(f[:4], f[4:])


def test_every_connection_has_its_own_keys():
    m1, _ = handshake()
    _, p2 = handshake()
    f = m1.sealer.frame(b"for connection 1")
    with pytest.raises(SealError, match="frame #0 does not open"):
        p2.opener.open(f[:4], f[4:])


def test_a_peer_without_the_secret_gets_keys_that_open_nothing():
    m, p = handshake(psk_peer=os.urandom(32))
    f = p.sealer.frame(packb({"t": "auth", "role": "tool"}))
    with pytest.raises(SealError, match="peer lacks the key"):
        m.opener.open(f[:4], f[4:])


@pytest.mark.parametrize("field", ["nonce", "kx", "dvm", "seal", "extra"])
def test_a_changed_challenge_is_refused_by_a_peer_holding_the_secret(field):
    offer = Offer(DVM, SECRET, True)
    ch = wire_copy(offer.challenge)
    if field == "nonce":
        ch["nonce"] = os.urandom(32)
    elif field == "kx":
        ch["kx"] = Offer(DVM, SECRET, True).challenge["kx"]
    elif field == "dvm":
        ch["dvm"] = "other"
    elif field == "seal":
        ch["seal"] = False  # a downgrade: strip the seal off
        del ch["kx"]
    else:
        ch["extra"] = 1  # not signed, but hashed into the keys
        ans = Answer(ch, dvm=DVM, role="tool", secret=SECRET)
        with pytest.raises(SealError):
            p = ans.box(SECRET)
            m = offer.accept(wire_copy(ans.message), SECRET)
            f = p.sealer.frame(b"auth")
            m.opener.open(f[:4], f[4:])
        return
    with pytest.raises(SealError):
        Answer(ch, dvm=DVM, role="tool", secret=SECRET)


def test_a_challenge_from_a_master_without_the_secret_is_refused():
    fake = Offer(DVM, os.urandom(32), True)
    with pytest.raises(SealError, match="not signed with DVM d0d0cafe's secret"):
        Answer(wire_copy(fake.challenge), dvm=DVM, role="daemon", secret=SECRET)
    unsigned = Offer(DVM, None, False)
    with pytest.raises(SealError, match="not signed"):
        Answer(wire_copy(unsigned.challenge), dvm=DVM, role="tool", secret=SECRET)


def test_a_clear_challenge_where_a_seal_is_required_is_refused():
    clear = Offer(DVM, SECRET, False)
    with pytest.raises(SealError, match="must be sealed"):
        Answer(wire_copy(clear.challenge), dvm=DVM, role="client", secret=None, need_seal=True)
    ans = Answer(wire_copy(clear.challenge), dvm=DVM, role="tool", secret=SECRET)
    assert not ans.sealed and ans.message is None


def test_a_changed_seal_message_gives_the_master_other_keys():
    offer = Offer(DVM, SECRET, True)
    ans = Answer(wire_copy(offer.challenge), dvm=DVM, role="tool", secret=SECRET)
    changed = wire_copy(ans.message)
    changed["role"] = "daemon"
    m = offer.accept(changed, SECRET)
    p = ans.box(SECRET)
    f = p.sealer.frame(b"auth")
    with pytest.raises(SealError):
        m.opener.open(f[:4], f[4:])


@pytest.mark.parametrize("bad", [
    {"t": "auth"}, {"v": 2}, {"role": 3}, {"nonce": b"short"}, {"kx": b"\0" * 31},
    {"kx": "text"}, {"kx": b"\0" * 32}])
def test_a_malformed_or_weak_seal_message_is_refused(bad):
    offer = Offer(DVM, SECRET, True)
    ans = Answer(wire_copy(offer.challenge), dvm=DVM, role="tool", secret=SECRET)
    m = dict(ans.message)
    m.update(bad)
    with pytest.raises(SealError):
        offer.accept(m, SECRET)


def test_an_offer_accepts_one_seal_message_only():
    offer = Offer(DVM, SECRET, True)
    ans = Answer(wire_copy(offer.challenge), dvm=DVM, role="tool", secret=SECRET)
    offer.accept(wire_copy(ans.message), SECRET)
    with pytest.raises(SealError):
        offer.accept(wire_copy(ans.message), SECRET)
    with pytest.raises(SealError, match="not sealed"):
        Offer(DVM, SECRET, False).accept(wire_copy(ans.message), SECRET)


def test_the_signature_covers_what_the_challenge_says():
    base = challenge_sig(SECRET, DVM, b"n" * 32, True, b"k" * 32)
    assert base != challenge_sig(SECRET, DVM, b"n" * 32, False, b"k" * 32)
    assert base != challenge_sig(SECRET, "other", b"n" * 32, True, b"k" * 32)
    assert base != challenge_sig(os.urandom(32), DVM, b"n" * 32, True, b"k" * 32)


def test_no_key_no_seal():
    with pytest.raises(SealError):
        seal.derive(b"", b"s" * 32, b"t" * 32)
    with pytest.raises(ValueError):
        Sealer(b"short")


# ---------------------------------------------------------------------------
# frames: what the receiver gets
# ---------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(sizes=bodies, chunks=st.lists(st.integers(min_value=0, max_value=10**6), max_size=12))
def test_sealed_frames_arrive_as_sent_in_any_chunks(sizes, chunks):
    m, p = handshake()
    sent = [msg(i, s) for i, s in enumerate(sizes)]
    stream = b"".join(sealed_frames(m, sent))
    got, err, pending = read(p, stream, chunks)
    assert err is None and pending == 0 and got == sent


def test_nothing_of_a_frame_is_readable_on_the_wire():
    m, _ = handshake()
    stream = b"".join(sealed_frames(m, [msg(i, 100) for i in range(5)]))
    assert b"hunter2" not in stream and b"SECRET" not in stream and b"run" not in stream


@settings(max_examples=150, deadline=None)
@given(sizes=bodies, data=st.data())
def test_any_bit_flipped_is_detected_and_nothing_after_it_is_read(sizes, data):
    m, p = handshake()
    sent = [msg(i, s) for i, s in enumerate(sizes)]
    frames = sealed_frames(m, sent)
    stream = bytearray(b"".join(frames))
    at = data.draw(st.integers(min_value=0, max_value=len(stream) - 1))
    stream[at] ^= 1 << data.draw(st.integers(min_value=0, max_value=7))
    got, err, pending = read(p, bytes(stream))
    hit = _frame_at(frames, at)
    assert got == sent[:len(got)] and len(got) <= hit
    assert err is not None or pending > 0  # an error, or a frame that never completes


def _frame_at(frames: list[bytes], offset: int) -> int:
    for i, f in enumerate(frames):
        if offset < len(f):
            return i
        offset -= len(f)
    raise AssertionError("offset past the stream")


@settings(max_examples=80, deadline=None)
@given(n=st.integers(min_value=2, max_value=8), data=st.data())
def test_a_replayed_frame_is_detected(n, data):
    m, p = handshake()
    sent = [msg(i, 10) for i in range(n)]
    frames = sealed_frames(m, sent)
    i = data.draw(st.integers(min_value=0, max_value=n - 1))
    at = data.draw(st.integers(min_value=i + 1, max_value=n))
    tampered = frames[:at] + [frames[i]] + frames[at:]
    got, err, _ = read(p, b"".join(tampered))
    assert got == sent[:at] and isinstance(err, SealError)


@settings(max_examples=80, deadline=None)
@given(n=st.integers(min_value=2, max_value=8), data=st.data())
def test_reordered_frames_are_detected(n, data):
    m, p = handshake()
    sent = [msg(i, 10) for i in range(n)]
    frames = sealed_frames(m, sent)
    i = data.draw(st.integers(min_value=0, max_value=n - 2))
    j = data.draw(st.integers(min_value=i + 1, max_value=n - 1))
    frames[i], frames[j] = frames[j], frames[i]
    got, err, _ = read(p, b"".join(frames))
    assert got == sent[:i] and isinstance(err, SealError)


@settings(max_examples=80, deadline=None)
@given(n=st.integers(min_value=2, max_value=8), data=st.data())
def test_a_dropped_frame_is_detected_at_the_next(n, data):
    m, p = handshake()
    sent = [msg(i, 10) for i in range(n)]
    frames = sealed_frames(m, sent)
    i = data.draw(st.integers(min_value=0, max_value=n - 2))
    got, err, _ = read(p, b"".join(frames[:i] + frames[i + 1:]))
    assert got == sent[:i] and isinstance(err, SealError)


@settings(max_examples=80, deadline=None)
@given(sizes=bodies, data=st.data())
def test_a_stream_cut_short_yields_a_prefix_and_says_so_inside_a_frame(sizes, data):
    """Cut at a frame boundary, a stream is a shorter stream (the link has
    ended: every peer takes that as the link's loss); cut inside a frame, the
    decoder holds an incomplete one -- the channel's 'ended inside a frame'."""
    m, p = handshake()
    sent = [msg(i, s) for i, s in enumerate(sizes)]
    frames = sealed_frames(m, sent)
    stream = b"".join(frames)
    cut = data.draw(st.integers(min_value=0, max_value=len(stream) - 1))
    got, err, pending = read(p, stream[:cut])
    assert err is None and got == sent[:len(got)]
    boundary = sum(len(f) for f in frames[:len(got)])
    assert pending == cut - boundary
    assert (pending == 0) == (cut in {sum(len(f) for f in frames[:k]) for k in range(len(frames))})


@settings(max_examples=80, deadline=None)
@given(n=st.integers(min_value=1, max_value=6), data=st.data(),
       kind=st.sampled_from(["clear", "other_link", "same_link_later"]))
def test_an_injected_frame_is_detected_wherever_it_is_put(n, data, kind):
    m, p = handshake()
    sent = [msg(i, 10) for i in range(n)]
    frames = sealed_frames(m, sent)
    forged = {"t": "run", "id": 99, "argv": ["rm", "-rf", "/"]}
    if kind == "clear":
        extra = pack(forged)
    elif kind == "other_link":
        other, _ = handshake()
        extra = other.sealer.frame(packb(forged))
    else:  # a frame of this link's own key, from further on than anywhere it is put
        for _ in range(3):
            m.sealer.frame(b"skipped")
        extra = m.sealer.frame(packb(forged))
    at = data.draw(st.integers(min_value=0, max_value=n))
    tampered = frames[:at] + [extra] + frames[at:]
    got, err, pending = read(p, b"".join(tampered))
    assert forged not in got
    assert got == sent[:at] and (err is not None or pending > 0)


def test_after_a_failure_nothing_more_opens():
    m, p = handshake()
    a, b = m.sealer.frame(b"one"), m.sealer.frame(b"two")
    bad = bytearray(a)
    bad[-1] ^= 1
    with pytest.raises(SealError):
        p.opener.open(bytes(bad[:4]), bytes(bad[4:]))
    with pytest.raises(SealError):
        p.opener.open(a[:4], a[4:])  # the genuine frame: the stream is not trusted any more
    with pytest.raises(SealError):
        p.opener.open(b[:4], b[4:])


def test_a_frame_shorter_than_its_tag_is_refused():
    _, p = handshake()
    with pytest.raises(SealError, match="shorter than its tag"):
        p.opener.open(HEADER.pack(3), b"abc")


def test_a_sealed_frame_may_be_a_tag_longer_than_a_clear_one_and_no_more():
    m, p = handshake()
    dec = FrameDecoder(max_frame=1000)
    dec.open_with(p.opener.open, TAG)
    body = packb({"t": "x", "p": b"y" * 980})
    assert len(body) <= 1000
    assert dec.feed(m.sealer.frame(body)) == [{"t": "x", "p": b"y" * 980}]
    with pytest.raises(FrameError, match="exceeds the limit"):
        dec.feed(m.sealer.frame(packb({"t": "x", "p": b"y" * 1000})))


# ---------------------------------------------------------------------------
# key limits
# ---------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(min_value=0, max_value=300), min_size=1, max_size=40),
       rekey_bytes=st.integers(min_value=1, max_value=2000),
       rekey_records=st.integers(min_value=1, max_value=10))
def test_both_ends_move_to_new_keys_together(sizes, rekey_bytes, rekey_records):
    m, p = handshake(rekey_bytes=rekey_bytes, rekey_records=rekey_records)
    sent = [msg(i, s) for i, s in enumerate(sizes)]
    got, err, pending = read(p, b"".join(sealed_frames(m, sent)))
    assert err is None and got == sent
    assert p.opener.keys_used == m.sealer.keys_used
    assert m.sealer.keys_used >= 1 + len(sizes) // rekey_records


def test_a_frame_sealed_under_a_forgotten_key_does_not_open():
    m, p = handshake(rekey_records=2)
    frames = [m.sealer.frame(b"%d" % i) for i in range(4)]
    assert m.sealer.keys_used == 3
    # frame 2 (first of the second key) re-sealed with the first key: refused
    first_key = Sealer(bytes(32))  # any other key
    first_key.count = 2
    forged = first_key.frame(b"2")
    for f in frames[:2]:
        p.opener.open(f[:4], f[4:])
    with pytest.raises(SealError):
        p.opener.open(forged[:4], forged[4:])


def test_a_direction_ends_at_two_to_the_64_frames():
    s = Sealer(bytes(32), start=seal.COUNTER_LIMIT - 1)
    s.frame(b"last")
    with pytest.raises(SealError, match="2\\^64"):
        s.frame(b"one too many")


# ---------------------------------------------------------------------------
# the blocking clients' pieces
# ---------------------------------------------------------------------------


def test_clear_frames_are_resealed_one_by_one_in_order():
    m, p = handshake()
    sent = [msg(i, 7 * i) for i in range(5)]
    stream = m.sealer.frames(b"".join(pack(x) for x in sent))
    got, err, pending = read(p, stream)
    assert err is None and pending == 0 and got == sent
    for bad in (pack(sent[0])[:-1], pack(sent[0]) + b"\0\0"):
        with pytest.raises(ValueError, match="not whole frames"):
            m.sealer.frames(bad)


def test_a_blocking_channel_reads_what_came_with_the_challenge_sealed():
    """The challenge and a frame right behind it in one segment: the frame
    is not read until the challenge is answered, and then read sealed -- a
    clear frame spliced in there is refused, never taken as the master's."""
    import socket

    from pydvm.channel import BlockingChannel

    for spliced in (False, True):
        a, b = socket.socketpair()
        try:
            offer = Offer(DVM, SECRET, True)
            ch = BlockingChannel(b)
            ch.gate()
            behind = pack({"t": "run", "id": 66}) if spliced else b""
            a.sendall(pack(offer.challenge) + behind)
            challenge = ch.recv(5)
            ans = Answer(challenge, dvm=DVM, role="tool", secret=SECRET)
            box = ans.box(SECRET)
            ch.seal(box)
            ch.ungate()
            master = offer.accept(wire_copy(ans.message), SECRET)
            if not spliced:
                a.sendall(master.sealer.frame(packb({"t": "reply", "id": 0, "status": 0})))
                assert ch.recv(5) == {"t": "reply", "id": 0, "status": 0}
                ch.send({"t": "ps", "id": 1})
                data = a.recv(65536)
                assert master.opener.open(data[:4], data[4:]) == packb({"t": "ps", "id": 1})
            else:
                with pytest.raises(SealError):
                    ch.recv(5)
        finally:
            a.close()
            b.close()
