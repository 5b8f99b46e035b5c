"""The pure pieces of a job's I/O path: cutting output into messages, tagging
lines, the stdin feed over a real pipe, reading a terminal to its end."""

from __future__ import annotations

import asyncio
import os
import subprocess

import pytest

from pydvm.runtime.node.jobio import (LINE_LIMIT, StdinFeed, output_cost, output_pty, read_some,
                                 take_chunk)
from pydvm.cli.tool import stdin_kind, tag_lines


def test_take_chunk_gives_whole_lines_and_keeps_an_unfinished_one():
    buf = bytearray(b"one\ntwo\nthr")
    assert take_chunk(buf) == b"one\ntwo\n"
    assert buf == b"thr"
    assert take_chunk(buf) == b""  # waits for the end of the line
    assert take_chunk(buf, final=True) == b"thr"
    assert buf == b"" and take_chunk(buf, final=True) == b""


def test_take_chunk_splits_only_what_does_not_fit_one_message():
    line = b"x" * (LINE_LIMIT + 10) + b"\n"
    buf = bytearray(line)
    assert take_chunk(buf) == line[:LINE_LIMIT]
    assert take_chunk(buf) == line[LINE_LIMIT:]
    many = b"".join(b"%d\n" % i for i in range(40000))  # more than one message's worth
    buf = bytearray(many)
    pieces = []
    while chunk := take_chunk(buf):
        assert len(chunk) <= LINE_LIMIT and chunk.endswith(b"\n")
        pieces.append(chunk)
    assert b"".join(pieces) == many and len(pieces) > 1


def test_every_message_costs_more_than_its_bytes():
    assert output_cost(0) > 0 and output_cost(2) - 2 == output_cost(0)


@pytest.mark.parametrize("data,mid,want,after", [
    (b"a\nb\n", False, b"P a\nP b\n", False),
    (b"a\nb", False, b"P a\nP b", True),
    (b"rest\nnext\n", True, b"rest\nP next\n", False),
    (b"more", True, b"more", True),
    (b"\n", False, b"P \n", False),
    (b"", True, b"", True),
])
def test_tag_lines_prefixes_each_line_that_starts_in_the_piece(data, mid, want, after):
    assert tag_lines(data, b"P ", mid) == (want, after)


def test_stdin_kind(tmp_path):
    f = tmp_path / "f"
    f.write_bytes(b"x")
    with open(os.devnull) as null, open(f) as reg:
        assert stdin_kind(null.fileno()) is None
        assert stdin_kind(reg.fileno()) == "file"
    r, w = os.pipe()
    try:
        assert stdin_kind(r) == "poll"
    finally:
        os.close(r)
        os.close(w)
    m, s = os.openpty()
    try:
        assert stdin_kind(s) == "tty"
    finally:
        os.close(m)
        os.close(s)
    assert stdin_kind(987) is None  # not open


def test_stdin_feed_writes_in_order_acknowledges_and_closes_at_eof():
    async def main():
        acks = []
        feed = StdinFeed(lambda n, closed: acks.append((n, closed)))
        feed.feed(b"before start ", False)  # held until the process has its pipe
        r, w = os.pipe()
        os.set_blocking(w, False)
        feed.attach(0, w)
        big = os.urandom(300_000)  # more than a pipe holds: written as it drains
        feed.feed(big, True)
        got = bytearray()
        os.set_blocking(r, False)
        while True:
            try:
                chunk = os.read(r, 65536)
            except BlockingIOError:
                await asyncio.sleep(0.001)
                continue
            if not chunk:
                break
            got += chunk
        os.close(r)
        return bytes(got), acks, big

    got, acks, big = asyncio.run(main())
    assert got == b"before start " + big
    assert sum(n for n, _ in acks) == len(got) and not any(c for _, c in acks)


def test_stdin_feed_of_a_reader_that_went_away_says_closed():
    async def main():
        acks = []
        feed = StdinFeed(lambda n, closed: acks.append((n, closed)))
        r, w = os.pipe()
        os.set_blocking(w, False)
        os.close(r)  # rank 0 closed its stdin
        feed.attach(0, w)
        feed.feed(b"lost", False)
        feed.feed(b"more", False)
        return acks, feed.closed

    acks, closed = asyncio.run(main())
    assert closed and (4, True) in acks and acks[-1] == (4, True)


def _pipe() -> tuple[int, int]:
    r, w = os.pipe()
    os.set_blocking(w, False)
    os.set_blocking(r, False)
    return r, w


def _drain(fd: int) -> bytes:
    """What the pipe holds now (b"" at end of file, None if empty and open)."""
    got = bytearray()
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return bytes(got)
        if not chunk:
            return bytes(got) if got else b"<EOF>"
        got += chunk


def test_stdin_feed_to_several_readers_acknowledges_what_the_slowest_has():
    """--stdin all on one node: each reader gets every byte; what is
    acknowledged is what every reader has been given, and nothing before
    the readers announced have all attached."""
    async def main():
        acks = []
        feed = StdinFeed(lambda n, closed: acks.append((n, closed)))
        feed.expect([0, 1])
        feed.feed(b"early ", False)
        r0, w0 = _pipe()
        feed.attach(0, w0)
        assert acks == []  # rank 1 has nothing yet
        r1, w1 = _pipe()
        feed.attach(1, w1)
        assert acks == [(6, False)]
        big = b"z" * 200_000  # more than a pipe holds
        feed.feed(big, False)
        assert _drain(r0).startswith(b"early ")  # rank 0 reads; rank 1 does not
        await asyncio.sleep(0.01)
        assert sum(n for n, _ in acks) < 6 + len(big)  # rank 1's pipe is full
        got1 = bytearray()
        for _ in range(2000):  # rank 1 reads now: it gets the rest as its pipe drains
            _drain(r0)
            got1 += _drain(r1)
            await asyncio.sleep(0.001)
            if len(got1) >= 6 + len(big):
                break
        feed.feed(b"", True)
        assert _drain(r0) == b"<EOF>" and _drain(r1) == b"<EOF>"
        assert bytes(got1) == b"early " + big
        assert sum(n for n, _ in acks) == 6 + len(big) and not any(c for _, c in acks)
        assert feed.closed and feed.held == 0
        for fd in (r0, r1):
            os.close(fd)

    asyncio.run(main())


def test_stdin_feed_reader_that_ends_holds_nobody_back_and_the_last_closes_it():
    async def main():
        acks = []
        feed = StdinFeed(lambda n, closed: acks.append((n, closed)))
        feed.expect([0, 1])
        r0, w0 = _pipe()
        r1, w1 = _pipe()
        feed.attach(0, w0)
        feed.attach(1, w1)
        feed.feed(b"x" * 100_000, False)  # more than rank 1's pipe holds
        _drain(r0)
        await asyncio.sleep(0.01)
        _drain(r0)
        held = feed.held
        assert held > 0 and sum(n for n, _ in acks) < 100_000
        feed.gone(1)  # rank 1 ended without reading it all
        assert sum(n for n, _ in acks) == 100_000 and not acks[-1][1]
        assert feed.held == 0
        feed.gone(0)
        assert acks[-1] == (0, True) and feed.closed
        feed.feed(b"late", False)
        assert acks[-1] == (4, True)
        for fd in (r0, r1):
            os.close(fd)

    asyncio.run(main())


def test_stdin_feed_expected_reader_that_never_starts_is_dropped_by_gone():
    async def main():
        acks = []
        feed = StdinFeed(lambda n, closed: acks.append((n, closed)))
        feed.expect([3])
        feed.feed(b"held", False)
        assert acks == [] and feed.held == 4
        feed.gone(3)
        return acks, feed.closed

    acks, closed = asyncio.run(main())
    assert closed and acks == [(4, True)]


def test_a_terminal_is_read_to_its_end_after_its_writer_exits():
    """Everything written before the writer exits is read; then EIO counts as end of file."""
    async def main():
        m, s = output_pty()
        p = subprocess.Popen(["sh", "-c", "head -c 100000 /dev/zero | tr '\\0' y; "
                              "printf 'a\\r\\nEND'"], stdout=s)
        os.close(s)
        await asyncio.sleep(0.3)  # the writer blocks on a full terminal meanwhile
        got = bytearray()
        while True:
            chunk = await read_some(m, 65536, timeout=10)
            assert chunk is not None, "timed out"
            if not chunk:
                break
            got += chunk
        os.close(m)
        assert p.wait(10) == 0
        return bytes(got)

    got = asyncio.run(main())
    assert got == b"y" * 100000 + b"a\r\nEND"  # raw: nothing translated
