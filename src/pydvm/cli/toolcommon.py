"""What both ``pydvm run`` tools share: output, stdin, the job's end.

A persistent DVM's ``pydvm run`` is blocking (:mod:`pydvm.cli.submit`); a
one-shot DVM's runs on the asyncio loop its master runs on
(:mod:`pydvm.cli.tool`).  Both forward the job's output the same way
(:class:`JobOutput`), read their stdin for the job's reading ranks the same way
(:class:`StdinSource`: only the waiting differs) and end the same way
(:func:`job_exit`).  How to reach a DVM, and what fails there
(:class:`ToolError`: the library's :class:`~pydvm.client.connect.DvmError`,
:class:`DvmUnreachable`, :func:`resolve_uri`), is the library's
(:mod:`pydvm.client.connect`), named here as the command line always named
it.  Nothing here loads asyncio or the runtime.
"""

from __future__ import annotations

import os
import sys

from ..client.connect import (  # noqa: F401 (re-exported: the command line's names)
    START_HINT, DvmError as ToolError, DvmUnreachable, resolve_uri)
from ..client.request import run_request  # noqa: F401 (re-exported)
from ..errors import Status
from ..protocol import STDIN_CHUNK, STDIN_WINDOW

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

#: SIGPIPE's number (Linux): what a ``pydvm run`` whose stdout reader went
#: away exits with, 128 + this (the signal module is not needed for it).
SIGPIPE = 13

#: After SIGTERM or SIGHUP, how long a ``pydvm run`` waits for its job's
#: end (the report) before it exits anyway with 128 + the signal: a batch
#: system sends SIGKILL some seconds after SIGTERM, and processes that
#: ignore SIGTERM are ended by the DVM itself (SIGKILL after its kill grace).
#: After Ctrl-C (SIGINT) it waits for the end; a second signal exits at once.
SIGNAL_EXIT = 1.0

_SIGNAL_NAMES = {1: "SIGHUP", 2: "SIGINT", 15: "SIGTERM"}


def gave_up(rid: int, nspace: "str | None", signum: "int | None") -> dict:
    """The reply a ``pydvm run`` makes up when it stops waiting for a job a
    signal ended (:data:`SIGNAL_EXIT`); :func:`job_exit` reports it."""
    return {"t": "reply", "id": rid, "status": 0, "gave_up": True, "nspace": nspace,
            "signal": signum}


def status_name(st: Any) -> str:
    """A reply's status as its PMIx name (``status N`` if it has none)."""
    try:
        return Status(st).pmix_name
    except ValueError:
        return f"status {st}"


def silence(fd: int) -> None:
    """Point ``fd`` at /dev/null so nothing more (not even the interpreter's
    final flush) fails on a reader that went away."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


# ----------------------------------------------------------------------
# output
# ----------------------------------------------------------------------


def tag_lines(data: bytes, prefix: bytes, mid_line: bool) -> tuple[bytes, bool]:
    """``data`` (one or more lines of one stream of one process) with
    ``prefix`` before every line that starts in it -- not before the first
    if the previous piece ended ``mid_line``.  Returns the tagged bytes and
    whether they end mid-line."""
    if not data:
        return data, mid_line
    parts = data.split(b"\n")
    out: list[bytes] = []
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if last and not part:
            break
        if i or not mid_line:
            out.append(prefix)
        out.append(part)
        if not last:
            out.append(b"\n")
    return b"".join(out), not data.endswith(b"\n")


class JobOutput:
    """Writes a job's ``output`` messages to our stdout and stderr.

    ``tag``: each line prefixed ``[NSPACE,RANK] ``; ``timestamp``: with the
    time and its stream, as ``mpirun --timestamp-output`` writes it
    (``Thu Dec  3 19:29:31 2026<stdout>:``, the tag inside it);
    ``merge_stderr``: the processes' stderr goes to our stdout; ``files``: a
    directory where each rank's streams are also written, laid out as
    ``mpirun --output-filename`` lays them out: ``DIR/JOB/rank.N/stdout``
    and ``stderr`` (with ``merge_stderr``, ``stdout`` alone, holding both),
    every rank's files made -- emptied if they were there -- when the job
    starts.  JOB is numbered as ``mpirun`` numbers its jobs, whatever the
    DVM's numbers: 1 for the job of this ``pydvm run``, 2, 3 ... for the
    jobs it spawns, in the order their output first comes.  ``quiet``: no
    report of failures at the end.

    A stream whose reader went away (``pydvm run ... | head``) is pointed at
    /dev/null and written no more (:attr:`closed`); :meth:`write` says when
    that happened to stdout, which should end the job as SIGPIPE would.
    """

    def __init__(self, tag: bool, *, timestamp: bool = False, merge_stderr: bool = False,
                 files: str | None = None, quiet: bool = False) -> None:
        self.tag = tag
        self.timestamp = timestamp
        self.merge_stderr = merge_stderr
        self.files = files
        self.quiet = quiet
        self.out = sys.stdout.buffer
        self.err = sys.stderr.buffer
        #: our own fds (1, 2) whose reader went away
        self.closed: set[int] = set()
        self._mid_line: set[tuple[Any, Any]] = set()  # (rank, fd) last seen without a newline
        self._open: dict[tuple[str, Any, int], Any] = {}  # (nspace, rank, fd) -> its file
        self._numbers: dict[str, int] = {}  # nspace -> its number under --output-filename

    def started(self, nspace: Any, size: Any) -> None:
        """The job ``nspace`` of ``size`` ranks has started: make its files."""
        if self.files is None or not isinstance(nspace, str) or not isinstance(size, int):
            return
        for rank in range(size):
            for fd in ((1,) if self.merge_stderr else (1, 2)):
                self._file(nspace, rank, fd)

    def _file(self, nspace: str, rank: Any, fd: int):
        if self.merge_stderr:
            fd = 1  # both streams in DIR/JOB/rank.N/stdout, as mpirun writes them
        f = self._open.get((nspace, rank, fd))
        if f is None and self.files is not None and isinstance(rank, int) and rank >= 0:
            number = self._numbers.setdefault(nspace, len(self._numbers) + 1)
            d = os.path.join(self.files, str(number), f"rank.{rank}")
            try:
                os.makedirs(d, exist_ok=True)
                f = open(os.path.join(d, "stderr" if fd == 2 else "stdout"), "wb")
            except OSError as exc:
                sys.stderr.write(f"pydvm run: --output-filename: {exc}\n")
                self.files = None  # said once; the terminal still gets everything
                return None
            self._open[(nspace, rank, fd)] = f
        return f

    def close(self) -> None:
        """Close the output files (the job has ended)."""
        for f in self._open.values():
            try:
                f.close()
            except OSError:
                pass
        self._open.clear()

    def _prefix(self, msg: dict, fd: int) -> bytes | None:
        if self.timestamp:
            import time

            tag = f"[{msg.get('nspace')},{msg.get('rank')}]" if self.tag else ""
            stream = "stderr" if fd == 2 else "stdout"
            return f"{time.ctime()}{tag}<{stream}>:".encode()
        if self.tag:
            return f"[{msg.get('nspace')},{msg.get('rank')}] ".encode()
        return None

    def write(self, msg: dict) -> bool:
        """Write one ``output`` message; True if stdout's reader just went away."""
        data = msg.get("data") or b""
        fd = 2 if msg.get("fd") == 2 else 1
        # rank -1: pydvm's own lines (the map, --report-bindings, a spawn's failure),
        # untagged as mpirun's are
        prefix = self._prefix(msg, fd) if msg.get("rank") != -1 else None
        if prefix is not None:
            where = (msg.get("rank"), msg.get("fd"))
            data, mid = tag_lines(data, prefix, where in self._mid_line)
            if mid:
                self._mid_line.add(where)
            else:
                self._mid_line.discard(where)
        if self.files is not None and isinstance(msg.get("nspace"), str):
            f = self._file(msg["nspace"], msg.get("rank"), fd)
            if f is not None:
                try:
                    f.write(data)
                    f.flush()
                except OSError as exc:
                    sys.stderr.write(f"pydvm run: --output-filename: {exc}\n")
                    self.files = None
        if fd == 2 and self.merge_stderr and isinstance(msg.get("rank"), int) \
                and msg["rank"] >= 0:
            fd = 1  # a process's stderr, not pydvm's own messages
        if fd in self.closed:
            return False
        stream = self.err if fd == 2 else self.out
        try:
            stream.write(data)
            stream.flush()
        except BrokenPipeError:
            self.closed.add(fd)
            silence(fd)
            return fd == 1
        return False


def job_exit(r: dict, signum: int | None, output: JobOutput) -> int:
    """The exit status of a ``pydvm run`` whose job ended with reply ``r``
    (``signum``: the signal that interrupted it, if any), after reporting on
    stderr who failed and who ended the job
    (:func:`pydvm.cli.formatting.job_end_lines`)."""
    if 1 not in output.closed:
        try:
            output.out.flush()
        except BrokenPipeError:
            silence(1)
            return 128 + SIGPIPE
    if r.get("status") != 0:
        sys.stderr.write(f"pydvm run: {status_name(r.get('status'))}: {r.get('msg')}\n")
        return 1
    code = 128 + signum if signum is not None else int(r.get("exit") or 0)
    output.close()
    if r.get("gave_up"):
        name = _SIGNAL_NAMES.get(signum or 0, f"signal {signum}")
        job = r.get("nspace") or "the job"
        if 2 not in output.closed:
            try:
                sys.stderr.write(f"pydvm run: {name}: {job} was told to end; not waiting for "
                                 "it: the DVM ends processes that outlive SIGTERM with SIGKILL "
                                 "after its kill grace\n")
                sys.stderr.flush()
            except (BrokenPipeError, OSError):
                pass
        return code
    if output.quiet or not r.get("failures") and not r.get("failed") and not r.get(
            "ended") and (not r.get("msg") or signum is not None):
        return code  # nothing to report (the usual end: not worth an import)
    from .formatting import job_end_lines

    report = job_end_lines(r, interrupted=signum is not None, exit_status=code)
    if report and 2 not in output.closed:
        try:
            sys.stderr.write("".join(f"{ln}\n" for ln in report))
            sys.stderr.flush()
        except BrokenPipeError:
            silence(2)
    return code


# ----------------------------------------------------------------------
# stdin
# ----------------------------------------------------------------------


def stdin_kind(fd: int = 0) -> str | None:
    """How ``pydvm run`` forwards its stdin ``fd`` to rank 0: ``"tty"`` (a
    terminal: read while in the foreground), ``"poll"`` (a pipe or socket:
    read when it has data), ``"file"`` (a regular file or a device other than
    /dev/null: read as the window allows), or None -- closed or /dev/null:
    nothing to forward, rank 0 gets /dev/null."""
    import stat

    try:
        st = os.fstat(fd)
    except OSError:
        return None
    if stat.S_ISCHR(st.st_mode):
        if os.isatty(fd):
            return "tty"
        try:
            if st.st_rdev == os.stat(os.devnull).st_rdev:
                return None
        except OSError:
            pass
        return "file"
    if stat.S_ISREG(st.st_mode) or stat.S_ISBLK(st.st_mode):
        return "file"
    return "poll"


class StdinSource:
    """What ``pydvm run`` reads on its stdin for its job's rank 0 (or the
    rank ``--stdin`` names, or every rank), and sends.

    At most :data:`STDIN_WINDOW` bytes are in flight: the source is read
    only while the nodes have acknowledged enough into the ranks' pipes
    (:meth:`ack`), so a huge stdin is never held anywhere but in its
    source.  End of file is passed on; a ``closed`` acknowledgement (every
    reading rank ended or closed its stdin, or the job is gone) stops the
    reading.  A
    terminal is read only while ``pydvm run`` is in its foreground process
    group (:meth:`background`: a background ``pydvm run`` is never stopped
    by SIGTTIN; it waits until it is brought to the foreground, as a shell
    job would).

    When to read is the caller's: while :meth:`wants_data`, a ``"file"`` at
    once, a pipe or terminal once :attr:`rfd` polls readable.
    """

    #: seconds between checks whether a background pydvm run is in the foreground again
    BACKGROUND_POLL = 0.5

    def __init__(self, send: Callable[[dict], None], kind: str, fd: int = 0) -> None:
        self.send = send
        self.kind = kind
        self.fd = fd
        self.credit = STDIN_WINDOW
        self.nspace: str | None = None
        self.done = False
        #: the descriptor polled and read: for a pipe or terminal, one opened
        #: anew (its own open file description) -- polling makes a descriptor
        #: non-blocking, which must not leak to the shell or to whoever
        #: shares our stdin; else ``fd`` itself, its flags restored at stop.
        self.rfd = fd
        self._restore: int | None = None
        if kind != "file":
            try:
                self.rfd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK
                                   | os.O_NOCTTY | os.O_CLOEXEC)
            except OSError:  # a socket, another user's pipe, no /proc
                import fcntl

                try:
                    self._restore = fcntl.fcntl(fd, fcntl.F_GETFL)
                except OSError:
                    pass

    def start(self, nspace: str) -> None:
        """The job has started as ``nspace``: reading may begin."""
        self.nspace = nspace

    def wants_data(self) -> bool:
        """True while the window has room and the job can take more."""
        return not self.done and self.nspace is not None and self.credit > 0

    def ack(self, n: Any, closed: bool) -> None:
        """A ``stdin_ack``: ``n`` more bytes are in every reading rank's pipe, or (with
        ``closed``) nothing more goes in."""
        if closed:
            self.stop()
            return
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            self.credit = min(STDIN_WINDOW, self.credit + n)

    def background(self) -> bool:
        """True when our terminal's foreground process group is not ours."""
        try:
            return os.tcgetpgrp(self.fd) != os.getpgrp()
        except OSError:
            return False  # not our controlling terminal: reading it stops nobody

    def read(self) -> None:
        """Read what the window allows and send it (at end of file, say so
        and stop).  Nothing to read yet is no error."""
        if not self.wants_data():
            return
        try:
            data = os.read(self.rfd if self.kind != "file" else self.fd,
                           min(STDIN_CHUNK, self.credit))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""  # an unreadable stdin ends there
        if not data:
            self.send({"t": "stdin", "nspace": self.nspace, "data": b"", "eof": True})
            self.stop()
            return
        self.credit -= len(data)
        self.send({"t": "stdin", "nspace": self.nspace, "data": data})

    def stop(self) -> None:
        """Read no more; give back what was opened or changed."""
        if self.done:
            return
        self.done = True
        if self.rfd != self.fd:
            os.close(self.rfd)
            self.rfd = self.fd
        elif self._restore is not None:
            import fcntl

            try:
                fcntl.fcntl(self.fd, fcntl.F_SETFL, self._restore)
            except OSError:
                pass
