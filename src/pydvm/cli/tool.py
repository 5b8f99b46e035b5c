"""The asyncio tool: talk to a DVM's master from an event loop.

A tool is any process that connects to the master directly rather than
through a daemon: ``pydvm run``, ``stop``, ``session``, ``store``, ``info``,
``ps``, ``kill``, ``dvms``.  Their requests go through :func:`call`; a
one-shot DVM's ``pydvm run`` (its master runs on this process's loop) is
:func:`run_job`.  A persistent DVM's ``pydvm run`` is blocking instead, with
no asyncio (:mod:`pydvm.cli.submit`); what both share is
:mod:`pydvm.cli.toolcommon`'s (re-exported here).
"""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from ..runtime.shared.auth import DvmUri, UriError, connect, read_secret, tool_socket_path
from .toolcommon import (DvmUnreachable, JobOutput, StdinSource, ToolError,  # noqa: F401
                          gave_up, job_exit, resolve_uri, run_request, stdin_kind, tag_lines)
from .toolcommon import SIGNAL_EXIT
from .toolcommon import silence as _silence  # noqa: F401 (re-exported)
from .toolcommon import status_name as _status_name
from ..wire import Channel, Message


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


class StdinForwarder(StdinSource):
    """A :class:`~pydvm.tool_common.StdinSource` read as the event loop
    says: a pipe or terminal when it polls readable, a file as the window
    allows, a background terminal checked every :attr:`BACKGROUND_POLL`
    seconds."""

    def __init__(self, ch: Channel, kind: str, fd: int = 0) -> None:
        super().__init__(ch.send, kind, fd)
        self.ch = ch
        self._watching = False
        self._scheduled: asyncio.Handle | None = None
        self._loop = asyncio.get_running_loop()

    def start(self, nspace: str) -> None:
        super().start(nspace)
        self._resume()

    def ack(self, n: Any, closed: bool) -> None:
        super().ack(n, closed)
        self._resume()

    def stop(self) -> None:
        if self.done:
            return
        self._unwatch()
        if self._scheduled is not None:
            self._scheduled.cancel()
            self._scheduled = None
        super().stop()

    def _resume(self) -> None:
        if not self.wants_data():
            return
        if self._scheduled is not None:
            return  # a read, or a check of the foreground, is due anyway
        if self.kind == "file":
            self._scheduled = self._loop.call_soon(self._read)
        elif not self._watching:
            try:
                self._loop.add_reader(self.rfd, self._ready)
            except (OSError, ValueError, NotImplementedError):
                self.kind = "file"  # cannot be polled: read it as a file
                self._resume()
                return
            self._watching = True

    def _unwatch(self) -> None:
        if self._watching:
            self._watching = False
            self._loop.remove_reader(self.rfd)

    def _ready(self) -> None:
        if self.kind == "tty" and self.background():
            self._unwatch()
            self._scheduled = self._loop.call_later(self.BACKGROUND_POLL, self._retry)
            return
        self._read()

    def _retry(self) -> None:
        self._scheduled = None
        self._resume()

    def _read(self) -> None:
        self._scheduled = None
        if not self.wants_data():
            self._unwatch()
            return
        self.read()
        if self.done:
            return
        if self.credit <= 0:
            self._unwatch()
        elif self.kind == "file":
            self._resume()


async def run_job(uri: DvmUri, apps: list[dict] | None = None, session: int | None = None,
                  tag_output: bool = False, env: dict[str, str] | None = None,
                  cwd: str | None = None, abort_on_failure: bool | None = None,
                  pmix: bool = False, forward_stdin: bool = True, *,
                  request: dict | None = None, output: JobOutput | None = None) -> int:
    """Submit a job from an event loop (a one-shot DVM's ``pydvm run``: its
    master runs on the same loop), forward its output, and our stdin to its
    rank 0 (:class:`StdinForwarder`; not with ``forward_stdin`` false, nor
    when stdin is closed or /dev/null: rank 0 then reads /dev/null); return
    its exit status.  What it does is what the blocking
    :func:`pydvm.cli.submit.run_job` does (see there, also for ``request``
    and ``output``).
    """
    output = output or JobOutput(tag_output)
    if request is None:
        request = run_request(apps or [], session, abort_on_failure, pmix, stdin=False,
                              env=env, cwd=cwd)
    state: dict[str, Any] = {"nspace": None, "signal": None}
    feeder: StdinForwarder | None = None  # set once connected, if stdin is forwarded

    def on_message(ch: Channel, msg: Message) -> None:
        t = msg.get("t")
        if t == "output":
            if output.write(msg) and state["signal"] is None:
                # Our reader is gone (``pydvm run ... | head``): as SIGPIPE
                # would, end quietly -- and take the job down with us.
                interrupted(signal.SIGPIPE)
        elif t == "stdin_ack":
            if feeder is not None:
                feeder.ack(msg.get("bytes"), msg.get("closed") is True)
        elif t == "queued":  # waits for slots (--queue): a signal takes it off the queue
            state["nspace"] = msg.get("nspace")
            if state["signal"] is not None:
                ch.send({"t": "kill_job", "id": 0, "nspace": state["nspace"],
                         "signal": int(state["signal"])})
        elif t == "started":
            state["nspace"] = msg.get("nspace")
            output.started(state["nspace"], msg.get("size"))
            if state["signal"] is not None:
                ch.send({"t": "kill_job", "id": 0, "nspace": state["nspace"],
                         "signal": int(state["signal"])})
            elif feeder is not None and isinstance(state["nspace"], str):
                feeder.start(state["nspace"])

    ch = await open_tool(uri, on_message)
    loop = asyncio.get_running_loop()
    kind = stdin_kind(0) if forward_stdin else None
    feeder = StdinForwarder(ch, kind) if kind else None

    bounded = loop.create_future()  # SIGTERM or SIGHUP: wait SIGNAL_EXIT at most
    again = loop.create_future()  # a second signal: stop waiting at once

    def interrupted(signum: int) -> None:
        if state["signal"] is not None:
            if signum != signal.SIGPIPE and not again.done():
                again.set_result(signum)
            return
        state["signal"] = signum
        if signum in (signal.SIGTERM, signal.SIGHUP):
            bounded.set_result(signum)
        if feeder is not None:
            feeder.stop()
        if state["nspace"] is not None:
            ch.send({"t": "kill_job", "id": 0, "nspace": state["nspace"], "signal": int(signum)})

    for sig in CAUGHT:
        loop.add_signal_handler(sig, interrupted, sig)
    job = asyncio.ensure_future(ch.call(dict(request, stdin=feeder is not None)))
    try:
        await asyncio.wait([job, bounded, again], return_when=asyncio.FIRST_COMPLETED)
        if not job.done() and not again.done():  # the job's end, SIGNAL_EXIT at most
            await asyncio.wait([job, again], timeout=SIGNAL_EXIT,
                               return_when=asyncio.FIRST_COMPLETED)
        if job.done():
            r = job.result()
        else:
            job.cancel()
            r = gave_up(0, state["nspace"], state["signal"])
    finally:
        if not job.done():
            job.cancel()
        if feeder is not None:
            feeder.stop()
        for sig in CAUGHT:
            loop.remove_signal_handler(sig)
        ch.close("done")
    return job_exit(r, state["signal"], output)


#: The signals that end a ``pydvm run`` (and its job): 128 + the number.
CAUGHT = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
