"""A job process's standard streams on its node: what it writes, what it reads.

**Output.**  A job process's stdout is a pseudo-terminal, its stderr a
pipe.  With a terminal on stdout, C's stdio (and Python's ``print``) flush
at each newline, so every line leaves the process as it is written -- a
line printed just before ``abort()`` or a kill is not lost in a buffer, and
a server that prints its port and waits is heard at once.  The terminal is
put in raw mode (:func:`output_pty`): no output processing (``\\n`` stays
``\\n``, never ``\\r\\n``), no echo, no signal characters; bytes pass
unchanged.  It is never the process's controlling terminal.  When its last
writer has closed it, Linux answers a read of the terminal's master side
with EIO once the data written before is read: :func:`read_some` takes that
as end of file.

The node reads each stream as the window allows (:func:`pump_output`, one
per stream) and cuts what it read into messages with :func:`take_chunk`:
whole lines, up to :data:`LINE_LIMIT` bytes per message; a line longer than
that goes in pieces, and an unfinished line goes as it is once nothing more
has come for :data:`PARTIAL_WAIT` seconds (a prompt) or at end of file.
Every message is charged :func:`output_cost` against the job's window: its
bytes plus :data:`OUTPUT_OVERHEAD`, what holding one more message costs the
master, so a job writing one tiny line per message is held to the window as
one writing big ones is.

**Input.**  The stdin of the rank that reads the job's input (rank 0, or
``--stdin N``; every rank with ``--stdin all``) is a pipe fed with what its
``pydvm run`` reads from its own stdin (:class:`StdinFeed`, one per job and
node); every other process's is ``/dev/null``.  The tool may have at most
:data:`STDIN_WINDOW` bytes in flight: it reads its stdin only while every
reading rank's node has acknowledged enough of what went before into its
pipes.
"""

from __future__ import annotations

import asyncio
import bisect
import errno
import logging
import os
import tty
from collections import deque
from dataclasses import dataclass
from typing import Callable

# STDIN_WINDOW: bytes of stdin a ``pydvm run`` may have sent and not yet seen
# written into rank 0's pipe; STDIN_CHUNK: the largest piece it sends at once.
# Defined in the protocol module: the tool reads them without the runtime.
from ...protocol import STDIN_CHUNK, STDIN_WINDOW  # noqa: F401 (re-exported)
from ..shared import jobproc

log = logging.getLogger("pydvm.node")

#: Largest piece of output one message carries; a longer line is split.
LINE_LIMIT = 64 * 1024
#: Bytes charged per output message on top of its data (a frame's header
#: and a queued buffer of the tool's connection in the master take about
#: half of it), so that the window bounds the messages as well as the bytes.
OUTPUT_OVERHEAD = 256
#: An unfinished line is forwarded as it is once its stream has been quiet
#: this long (a prompt); shorter than :data:`PIPE_IDLE`, so it goes
#: before the process's exit is reported.
PARTIAL_WAIT = 0.2
#: After a process exits, how long its pipes may sit idle (held open by a
#: lingering child) before the exit is reported anyway.
PIPE_IDLE = 0.5


def output_cost(n: int) -> int:
    """What an output message carrying ``n`` bytes counts against the window
    (the node charges it, the master acknowledges the same)."""
    return n + OUTPUT_OVERHEAD


def take_chunk(buf: bytearray, final: bool = False) -> bytes:
    """Remove and return the next message's worth of output from ``buf``.

    Whole lines, as many as fit in :data:`LINE_LIMIT` bytes; else the first
    :data:`LINE_LIMIT` bytes of a longer line; else, with ``final`` (end of
    file, or the stream has been quiet), what is there.  ``b""`` when
    ``buf`` holds nothing or only the start of a shorter line.
    """
    if not buf:
        return b""
    cut = buf.rfind(b"\n", 0, LINE_LIMIT) + 1
    if not cut:
        if len(buf) >= LINE_LIMIT:
            cut = LINE_LIMIT
        elif final:
            cut = len(buf)
        else:
            return b""
    out = bytes(buf[:cut])
    del buf[:cut]
    return out


def _wake(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


async def read_some(fd: int, n: int, timeout: float | None = None) -> bytes | None:
    """Read up to ``n`` bytes from the non-blocking ``fd`` once it has some.

    ``b""`` at end of file -- for a pseudo-terminal's master side, EIO (its
    other side is closed and everything written was read) counts as end of
    file; None if nothing came within ``timeout`` seconds.  Nothing is read
    ahead: what is not asked for stays in the kernel, so a writer that is
    not read from blocks.
    """
    loop = asyncio.get_running_loop()
    while True:
        try:
            return os.read(fd, n)
        except BlockingIOError:
            pass
        except OSError as exc:
            if exc.errno == errno.EIO:
                return b""
            raise
        ready = loop.create_future()
        loop.add_reader(fd, _wake, ready)
        try:
            done, _ = await asyncio.wait((ready,), timeout=timeout)
        finally:
            loop.remove_reader(fd)
        if not done:
            return None


_pty_warned = False


@dataclass
class PumpState:
    """What one output pump is doing: ``reading_since`` is the loop time it
    started waiting for data, None while it waits for credit."""

    reading_since: float | None = None


async def pump_output(job, nspace: str, rank: int, fd: int, which: int, state: PumpState,
                      window: int, uplink) -> None:
    """Forward what process ``nspace:rank`` writes on stream ``which`` (1,
    2), read from ``fd`` (closed by the caller once the pump is done), to
    the master over ``uplink`` as ``output`` messages, as the job's window
    allows: whole lines, up to LINE_LIMIT bytes per message.  ``job``
    holds the window's ``credit`` left and the ``credit_ok`` event an
    ``output_ack`` sets; ``window`` is its size.  Nothing is read while the
    window is used up (and never more than one message ahead of it), so
    the process blocks on write."""
    loop = asyncio.get_running_loop()
    buf = bytearray()
    eof = idle = False
    while True:
        chunk = take_chunk(buf, eof or idle)
        while chunk:
            cost = output_cost(len(chunk))
            need = min(cost, window)  # a message never needs more than the whole window
            while job.credit < need:
                state.reading_since = None
                job.credit_ok.clear()
                await job.credit_ok.wait()
            job.credit -= cost
            if not uplink.closed:
                uplink.send({"t": "output", "nspace": nspace, "rank": rank, "fd": which,
                             "data": chunk})
            chunk = take_chunk(buf, eof or idle)
        if eof:
            return
        while job.credit <= 0:
            state.reading_since = None
            job.credit_ok.clear()
            await job.credit_ok.wait()
        state.reading_since = loop.time()
        # An unfinished line waits PARTIAL_WAIT for its end, then goes as it is.
        data = await read_some(fd, LINE_LIMIT - len(buf), PARTIAL_WAIT if buf else None)
        idle = data is None
        if data == b"":
            eof = True
        elif data:
            buf += data


async def drain_output(pumps: list[asyncio.Task], states: list[PumpState]) -> None:
    """Wait for an exited process's pumps to reach end of file, so its last
    output goes before its exit -- unless its streams sit idle for
    :data:`PIPE_IDLE` (a lingering child holds them): then stop waiting.
    A pump held back by flow control is not idle: that output is real."""
    loop = asyncio.get_running_loop()
    while True:
        left = [t for t in pumps if not t.done()]
        if not left:
            return
        await asyncio.wait(left, timeout=PIPE_IDLE / 2)
        now = loop.time()
        if all(st.reading_since is not None and now - st.reading_since > PIPE_IDLE
               for t, st in zip(pumps, states) if not t.done()):
            return


def output_pty() -> tuple[int, int]:
    """``(read end, write end)`` for a job process's stdout: the master and
    slave sides of a new pseudo-terminal in raw mode (no output processing,
    no echo), the read end non-blocking.  Should the system have no
    pseudo-terminal left, a pipe -- logged once."""
    global _pty_warned
    try:
        master, slave = os.openpty()
    except OSError as exc:
        if not _pty_warned:
            _pty_warned = True
            log.warning("no pseudo-terminal for a job's stdout (%s): using a pipe, so "
                        "its C stdio output is block-buffered", exc)
        master, slave = os.pipe()
    else:
        try:
            tty.setraw(slave)
        except BaseException:
            os.close(master)
            os.close(slave)
            raise
    os.set_blocking(master, False)
    return master, slave


class _Reader:
    """One rank's stdin pipe in a :class:`StdinFeed`: its write end, how far
    into the job's input it has been written, whether it waits for room."""

    __slots__ = ("fd", "pos", "waiting")

    def __init__(self, fd: int | None, pos: int) -> None:
        self.fd = fd  # None once end of file was given (the pipe closed)
        self.pos = pos
        self.waiting = False


class StdinFeed:
    """Writes what a job's ``pydvm run`` sends (``stdin`` messages) into the
    stdin pipes of the job's ranks on this node that read it: one rank
    (``--stdin N``, rank 0 by default), or every rank here (``--stdin all``).

    Data may come before the processes have started (:meth:`attach` gives
    each pipe; :meth:`expect` names the ranks to wait for first); it is held
    meanwhile, bounded by the tool's window.  Every reader gets every byte,
    in order: the data is held once, until the last reader has it.  What
    *every* reader here has been given is acknowledged (``ack(n, closed)``),
    which lets the tool read on -- so the slowest reader sets the pace, and a
    reader that takes nothing holds the others at most a window (plus its
    pipe's buffer) ahead of it.  An end of file from the tool closes each
    pipe once everything before it is written there.  A reader that ends or
    closes its stdin (:meth:`gone`, or EPIPE) is dropped and holds nobody
    back any more; when no reader is left -- or the job ends, :meth:`close`
    -- what is held is dropped and acknowledged with ``closed``: the tool
    stops reading.
    """

    def __init__(self, ack: Callable[[int, bool], None]) -> None:
        self._ack = ack
        self._chunks: list[bytes] = []  # what some reader here has not been given yet
        self._starts: list[int] = []  # each chunk's offset in the job's input
        self._first = 0  # index of the first chunk still held
        self._end = 0  # bytes received
        self._acked = 0  # bytes acknowledged (every reader has them)
        self._eof = False
        self._readers: dict[int, _Reader] = {}
        self._expected: set[int] = set()  # ranks announced, not yet attached
        self._started = False  # a reader was announced or attached
        self.closed = False

    @property
    def held(self) -> int:
        return sum(len(c) for c in self._chunks[self._first:])

    def expect(self, ranks) -> None:
        """The ranks here that will read (their pipes are attached next):
        nothing is acknowledged until each has been given it."""
        if self.closed:
            return
        self._started = True
        self._expected.update(r for r in ranks if r not in self._readers)

    def attach(self, rank: int, fd: int) -> None:
        """The pipe's write end (non-blocking) of reader ``rank``, now started."""
        if self.closed:
            os.close(fd)
            return
        self._started = True
        self._expected.discard(rank)
        # from what was last acknowledged: an expected reader's start (nothing
        # is acknowledged while one is awaited)
        self._readers[rank] = _Reader(fd, self._acked)
        self._write(rank)
        self._settle()

    def feed(self, data: bytes, eof: bool) -> None:
        if self.closed:
            self._ack(len(data), True)
            return
        if data:
            self._chunks.append(data)
            self._starts.append(self._end)
            self._end += len(data)
        self._eof = self._eof or eof
        for rank, r in list(self._readers.items()):
            if not r.waiting:
                self._write(rank)
        self._settle()

    def gone(self, rank: int) -> None:
        """Reader ``rank`` ended: it holds nobody back any more."""
        if rank in self._expected:
            self._expected.discard(rank)
        elif rank not in self._readers:
            return
        self._drop(rank)
        self._settle()

    def _write(self, rank: int) -> None:
        """Give reader ``rank`` what it lacks, as far as its pipe takes it."""
        r = self._readers.get(rank)
        if r is None or r.fd is None or self.closed:
            return
        while r.pos < self._end:
            i = bisect.bisect_right(self._starts, r.pos, self._first) - 1
            chunk = memoryview(self._chunks[i])[r.pos - self._starts[i]:]
            try:
                n = os.write(r.fd, chunk)
            except BlockingIOError:
                if not r.waiting:
                    r.waiting = True
                    asyncio.get_running_loop().add_writer(r.fd, self._writable, rank)
                return
            except OSError:  # EPIPE: the process closed its stdin or ended
                self._drop(rank)
                return
            r.pos += n
        if self._eof:
            self._release(r)  # everything is written: its end of file

    def _writable(self, rank: int) -> None:
        r = self._readers.get(rank)
        if r is None or r.fd is None:
            return
        asyncio.get_running_loop().remove_writer(r.fd)
        r.waiting = False
        self._write(rank)
        self._settle()

    def _settle(self) -> None:
        """Acknowledge what every reader has, drop what none lacks; with no
        reader left, close."""
        if self.closed:
            return
        if not self._readers and not self._expected:
            if self._started:
                self.close()
            return
        low = self._acked if self._expected else self._end  # an awaited reader wants it all
        for r in self._readers.values():
            low = min(low, r.pos)
        if low > self._acked:
            self._ack(low - self._acked, False)
            self._acked = low
        while self._first < len(self._chunks) and \
                self._starts[self._first] + len(self._chunks[self._first]) <= low:
            self._chunks[self._first] = b""
            self._first += 1
        if self._first > 64 and self._first * 2 > len(self._chunks):
            del self._chunks[:self._first], self._starts[:self._first]
            self._first = 0
        if self._eof and not self._expected and all(
                r.fd is None for r in self._readers.values()):
            self.closed = True  # every reader has had everything and its end

    @staticmethod
    def _release(r: _Reader) -> None:
        fd, r.fd = r.fd, None
        if fd is None:
            return
        if r.waiting:
            r.waiting = False
            asyncio.get_running_loop().remove_writer(fd)
        os.close(fd)

    def _drop(self, rank: int) -> None:
        r = self._readers.pop(rank, None)
        if r is not None:
            self._release(r)

    def close(self) -> None:
        """Nothing more goes in (every reader ended or closed its stdin, or
        the job ended): close the pipes, drop what is held, tell the tool."""
        if self.closed and not self._readers:
            return
        was_closed = self.closed
        self.closed = True
        for rank in list(self._readers):
            self._drop(rank)
        self._expected.clear()
        self._chunks.clear()
        self._starts.clear()
        self._first = 0
        if not was_closed:
            self._ack(self._end - self._acked, True)
            self._acked = self._end


def start_with_streams(argv: list[str], *, env: dict[str, str], cwd: str | None,
                       stdin: bool, switch: tuple[int, int, list[int]] | None,
                       output: bool = True, death_signal: bool = True,
                       program: str | None = None, pass_fds: tuple[int, ...] = ()):
    """Start a job process (:func:`pydvm.runtime.shared.jobproc.start`) with its
    streams: stdout a pseudo-terminal (line by line, as under mpirun),
    stderr a pipe, stdin a pipe if ``stdin`` (the rank its ``pydvm run``
    feeds) else /dev/null.  Returns the process and the ends kept here:
    ``[stdout's read end, stderr's read end]`` plus stdin's write end; the
    process's own ends are closed here once it has them.  On OSError
    nothing stays open.  ``output`` False (a job whose output is
    discarded): stdout and stderr are /dev/null, and their ends here None.
    ``death_signal``, ``program``, ``pass_fds``: as :func:`pydvm.runtime.shared.jobproc.start`'s."""
    ours: list = []  # the read ends (and stdin's write end) we keep
    theirs: list[int] = []  # the ends the process gets
    try:
        if output:
            out_r, out_w = output_pty()
            ours.append(out_r)
            theirs.append(out_w)
            err_r, err_w = os.pipe()
            ours.append(err_r)
            theirs.append(err_w)
            os.set_blocking(err_r, False)
        else:
            ours += [None, None]
            out_w = err_w = jobproc.DEVNULL
        child_stdin = jobproc.DEVNULL
        if stdin:
            in_r, in_w = os.pipe()
            ours.append(in_w)
            theirs.append(in_r)
            os.set_blocking(in_w, False)
            child_stdin = in_r
        if switch is not None:
            # Its own user may reopen them (/dev/stdout, /dev/stderr, /dev/stdin).
            for fd in theirs:
                os.fchown(fd, switch[0], -1)
        proc = jobproc.start(argv, env=env, cwd=cwd, stdin=child_stdin, stdout=out_w,
                             stderr=err_w, switch=switch, death_signal=death_signal,
                             program=program, pass_fds=pass_fds)
    except OSError:
        for fd in ours + theirs:
            if fd is not None:
                os.close(fd)
        raise
    for fd in theirs:
        os.close(fd)
    return proc, ours
