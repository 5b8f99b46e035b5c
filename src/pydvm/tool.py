"""Tool-side helpers: talk to a DVM's master (used by the command line).

A tool is any process that connects to the master directly rather than
through a daemon: ``pydvm run``, ``stop``, ``session``, ``store``, ``info``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

from .cli_format import job_end_lines
from .errors import Status
from .runtime.auth import DvmUri, UriError, connect, read_secret, tool_socket_path
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


def _status_name(st: Any) -> str:
    try:
        return Status(st).pmix_name
    except ValueError:
        return f"status {st}"


async def run_job(uri: DvmUri, apps: list[dict], session: int | None, tag_output: bool,
                  env: dict[str, str] | None = None, cwd: str | None = None,
                  abort_on_failure: bool | None = None, pmix: bool = False) -> int:
    """Submit a job and forward its output; return its exit status.

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

    def on_message(ch: Channel, msg: Message) -> None:
        t = msg.get("t")
        if t == "output":
            data = msg.get("data") or b""
            fd = 2 if msg.get("fd") == 2 else 1
            if fd in closed:
                return
            if tag_output:
                where = (msg.get("rank"), msg.get("fd"))
                if where not in mid_line:
                    data = f"[{msg.get('nspace')},{msg.get('rank')}] ".encode() + data
                if data.endswith(b"\n"):
                    mid_line.discard(where)
                else:
                    mid_line.add(where)
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
        elif t == "started":
            state["nspace"] = msg.get("nspace")
            if state["signal"] is not None:
                ch.send({"t": "kill_job", "id": 0, "nspace": state["nspace"],
                         "signal": int(state["signal"])})

    ch = await open_tool(uri, on_message)
    loop = asyncio.get_running_loop()

    def interrupted(signum: int) -> None:
        if state["signal"] is not None:
            return
        state["signal"] = signum
        if state["nspace"] is not None:
            ch.send({"t": "kill_job", "id": 0, "nspace": state["nspace"], "signal": int(signum)})

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, interrupted, sig)
    try:
        r = await ch.call({
            "t": "run", "apps": apps, "session": session, "abort_on_failure": abort_on_failure,
            "env": dict(os.environ if env is None else env),
            "cwd": cwd or os.getcwd(), "pmix": pmix,
        })
    finally:
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
