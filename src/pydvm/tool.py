"""Tool-side helpers: talk to a DVM's master (used by the command line).

A tool is any process that connects to the master directly rather than
through a daemon: ``pydvm run``, ``stop``, ``session``, ``store``, ``info``.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import stat
import sys
from typing import Any

from .cli_format import job_end_lines
from .errors import Status
from .runtime.auth import DvmUri, UriError, connect, read_secret, tool_socket_path
from .runtime.jobio import STDIN_CHUNK, STDIN_WINDOW
from .wire import Channel, Message


class ToolError(RuntimeError):
    """A tool request failed; the message is meant for the user."""


class DvmUnreachable(ToolError):
    """No DVM answers at the URI (nothing listens there, or this user has no
    credentials for it): the URI is probably stale.  The command line
    explains what to do (:func:`pydvm.cli_dvms.unreachable_lines`)."""

    def __init__(self, uri: DvmUri, why: str) -> None:
        super().__init__(why)
        self.uri = uri


def resolve_uri(text: str | None) -> DvmUri:
    text = text or os.environ.get("PYDVM_URI")
    if not text:
        from .cli_dvms import START_HINT

        raise ToolError("no DVM given: use --dvm URI or set PYDVM_URI ('pydvm dvms' lists your "
                        f"running DVMs; '{START_HINT}' starts one)")
    return DvmUri.parse(text)


async def open_tool(uri: DvmUri, on_message=None) -> Channel:
    """Connect as a tool: with the DVM's secret if this user has it, else
    through a multi-user DVM's tool socket (identity by peer credentials)."""
    on_message = on_message or (lambda ch, m: None)
    try:
        try:
            secret = read_secret(uri.dvmid)
        except UriError:
            sock = tool_socket_path(uri.dvmid)
            if not sock.exists():
                raise
            ch, _ = await connect(uri, None, "tool", on_message, unix_path=str(sock))
        else:
            ch, _ = await connect(uri, secret, "tool", on_message)
    except (ConnectionError, UriError) as exc:
        raise DvmUnreachable(uri, str(exc)) from None
    except ValueError as exc:
        raise ToolError(str(exc)) from None
    return ch


async def call(uri: DvmUri, msg: Message, timeout: float | None = None) -> Message:
    ch = await open_tool(uri)
    try:
        r = await ch.call(msg, timeout)
    finally:
        ch.close("done")
    if r.get("status") != 0:
        name = _status_name(r.get("status"))
        raise ToolError(f"{name}: {r.get('msg') or 'request failed'}")
    return r


def _silence(fd: int) -> None:
    """Point ``fd`` at /dev/null so nothing more (not even the interpreter's
    final flush) fails on a reader that went away."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


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


def stdin_kind(fd: int = 0) -> str | None:
    """How ``pydvm run`` forwards its stdin ``fd`` to rank 0: ``"tty"`` (a
    terminal: read while in the foreground), ``"poll"`` (a pipe or socket:
    read when it has data), ``"file"`` (a regular file or a device other than
    /dev/null: read as the window allows), or None -- closed or /dev/null:
    nothing to forward, rank 0 gets /dev/null."""
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


class StdinForwarder:
    """Sends what ``pydvm run`` reads on its stdin to its job's rank 0.

    At most :data:`STDIN_WINDOW` bytes are in flight: the forwarder reads
    only while the node has acknowledged enough into rank 0's pipe
    (``stdin_ack``), so a huge stdin is never held anywhere but in its
    source.  End of file is passed on; a ``closed`` acknowledgement (rank 0
    ended or closed its stdin, or the job is gone) stops the reading.  A
    terminal is read only while ``pydvm run`` is in its foreground process
    group (a background ``pydvm run`` is never stopped by SIGTTIN: it waits
    until it is brought to the foreground, as a shell job would).
    """

    #: seconds between checks whether a background pydvm run is in the foreground again
    BACKGROUND_POLL = 0.5

    def __init__(self, ch: Channel, kind: str, fd: int = 0) -> None:
        self.ch = ch
        self.kind = kind
        self.fd = fd
        self.credit = STDIN_WINDOW
        self.nspace: str | None = None
        self.done = False
        self._watching = False
        self._scheduled: asyncio.Handle | None = None
        self._loop = asyncio.get_running_loop()
        #: the descriptor polled and read: for a pipe or terminal, one opened
        #: anew (its own open file description) -- polling makes a descriptor
        #: non-blocking, which must not leak to the shell or to whoever
        #: shares our stdin; else ``fd`` itself, its flags restored at stop.
        self._rfd = fd
        self._restore: int | None = None
        if kind != "file":
            try:
                self._rfd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK
                                    | os.O_NOCTTY | os.O_CLOEXEC)
            except OSError:  # a socket, another user's pipe, no /proc
                try:
                    self._restore = fcntl.fcntl(fd, fcntl.F_GETFL)
                except OSError:
                    pass

    def start(self, nspace: str) -> None:
        self.nspace = nspace
        self._resume()

    def ack(self, n: Any, closed: bool) -> None:
        if closed:
            self.stop()
            return
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            self.credit = min(STDIN_WINDOW, self.credit + n)
        self._resume()

    def stop(self) -> None:
        if self.done:
            return
        self.done = True
        self._unwatch()
        if self._scheduled is not None:
            self._scheduled.cancel()
            self._scheduled = None
        if self._rfd != self.fd:
            os.close(self._rfd)
            self._rfd = self.fd
        elif self._restore is not None:
            try:
                fcntl.fcntl(self.fd, fcntl.F_SETFL, self._restore)
            except OSError:
                pass

    def _resume(self) -> None:
        if self.done or self.nspace is None or self.credit <= 0:
            return
        if self._scheduled is not None:
            return  # a read, or a check of the foreground, is due anyway
        if self.kind == "file":
            self._scheduled = self._loop.call_soon(self._read)
        elif not self._watching:
            try:
                self._loop.add_reader(self._rfd, self._ready)
            except (OSError, ValueError, NotImplementedError):
                self.kind = "file"  # cannot be polled: read it as a file
                self._resume()
                return
            self._watching = True

    def _unwatch(self) -> None:
        if self._watching:
            self._watching = False
            self._loop.remove_reader(self._rfd)

    def _background(self) -> bool:
        try:
            return os.tcgetpgrp(self.fd) != os.getpgrp()
        except OSError:
            return False  # not our controlling terminal: reading it stops nobody

    def _ready(self) -> None:
        if self.kind == "tty" and self._background():
            self._unwatch()
            self._scheduled = self._loop.call_later(self.BACKGROUND_POLL, self._retry)
            return
        self._read()

    def _retry(self) -> None:
        self._scheduled = None
        self._resume()

    def _read(self) -> None:
        self._scheduled = None
        if self.done:
            return
        n = min(STDIN_CHUNK, self.credit)
        if n <= 0:
            self._unwatch()
            return
        try:
            data = os.read(self._rfd if self.kind != "file" else self.fd, n)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""  # an unreadable stdin ends there
        if not data:
            self.ch.send({"t": "stdin", "nspace": self.nspace, "data": b"", "eof": True})
            self.stop()
            return
        self.credit -= len(data)
        self.ch.send({"t": "stdin", "nspace": self.nspace, "data": data})
        if self.credit <= 0:
            self._unwatch()
        elif self.kind == "file":
            self._resume()


def _status_name(st: Any) -> str:
    try:
        return Status(st).pmix_name
    except ValueError:
        return f"status {st}"


async def run_job(uri: DvmUri, apps: list[dict], session: int | None, tag_output: bool,
                  env: dict[str, str] | None = None, cwd: str | None = None,
                  abort_on_failure: bool | None = None, pmix: bool = False,
                  forward_stdin: bool = True) -> int:
    """Submit a job, forward its output, and our stdin to its rank 0
    (:class:`StdinForwarder`; not with ``forward_stdin`` false, nor when
    stdin is closed or /dev/null: rank 0 then reads /dev/null); return its
    exit status.

    Ctrl-C (SIGINT) or SIGTERM asks the master to kill the job; the tool then
    waits for the job's end and exits with 128 + the signal number.  When
    the job has ended, the processes that failed and who ended it (if it was
    killed) are reported on stderr (:func:`pydvm.cli_format.job_end_lines`).
    ``abort_on_failure``: True, the master kills the rest of the job at the
    first failure; False, never; None, as ``mpirun`` would for an MPI job
    (run with ``pmix``, or a failing process that used PMIx), else never.
    """
    out = sys.stdout.buffer
    err = sys.stderr.buffer
    state: dict[str, Any] = {"nspace": None, "signal": None}
    closed: set[int] = set()  # our own fds (1, 2) whose reader went away
    mid_line: set[tuple[Any, Any]] = set()  # (rank, fd) whose last piece had no newline
    feeder: StdinForwarder | None = None  # set once connected, if stdin is forwarded

    def on_message(ch: Channel, msg: Message) -> None:
        t = msg.get("t")
        if t == "output":
            data = msg.get("data") or b""
            fd = 2 if msg.get("fd") == 2 else 1
            if fd in closed:
                return
            if tag_output:
                where = (msg.get("rank"), msg.get("fd"))
                prefix = f"[{msg.get('nspace')},{msg.get('rank')}] ".encode()
                data, mid = tag_lines(data, prefix, where in mid_line)
                if mid:
                    mid_line.add(where)
                else:
                    mid_line.discard(where)
            stream = err if fd == 2 else out
            try:
                stream.write(data)
                stream.flush()
            except BrokenPipeError:
                # Our reader is gone (``pydvm run ... | head``): as SIGPIPE
                # would, end quietly -- and take the job down with us.
                closed.add(fd)
                _silence(fd)
                if fd == 1 and state["signal"] is None:
                    interrupted(signal.SIGPIPE)
        elif t == "stdin_ack":
            if feeder is not None:
                feeder.ack(msg.get("bytes"), msg.get("closed") is True)
        elif t == "started":
            state["nspace"] = msg.get("nspace")
            if state["signal"] is not None:
                ch.send({"t": "kill_job", "id": 0, "nspace": state["nspace"],
                         "signal": int(state["signal"])})
            elif feeder is not None and isinstance(state["nspace"], str):
                feeder.start(state["nspace"])

    ch = await open_tool(uri, on_message)
    loop = asyncio.get_running_loop()
    kind = stdin_kind(0) if forward_stdin else None
    feeder = StdinForwarder(ch, kind) if kind else None

    def interrupted(signum: int) -> None:
        if state["signal"] is not None:
            return
        state["signal"] = signum
        if feeder is not None:
            feeder.stop()
        if state["nspace"] is not None:
            ch.send({"t": "kill_job", "id": 0, "nspace": state["nspace"], "signal": int(signum)})

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, interrupted, sig)
    try:
        r = await ch.call({
            "t": "run", "apps": apps, "session": session, "abort_on_failure": abort_on_failure,
            "env": dict(os.environ if env is None else env),
            "cwd": cwd or os.getcwd(), "pmix": pmix, "stdin": feeder is not None,
        })
    finally:
        if feeder is not None:
            feeder.stop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        ch.close("done")
    if 1 not in closed:
        try:
            out.flush()
        except BrokenPipeError:
            _silence(1)
            return 128 + signal.SIGPIPE
    if r.get("status") != 0:
        sys.stderr.write(f"pydvm run: {_status_name(r.get('status'))}: {r.get('msg')}\n")
        return 1
    code = 128 + state["signal"] if state["signal"] is not None else int(r.get("exit") or 0)
    report = job_end_lines(r, interrupted=state["signal"] is not None, exit_status=code)
    if report and 2 not in closed:
        try:
            sys.stderr.write("".join(f"{ln}\n" for ln in report))
            sys.stderr.flush()
        except BrokenPipeError:
            _silence(2)
    return code
