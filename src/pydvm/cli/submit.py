"""A persistent DVM's ``pydvm run``: one socket, one poll loop, no asyncio.

The tool connects to the master (TCP, proving it holds the DVM's secret;
else a multi-user DVM's tool socket, where the master reads who it is from
the socket: the library's :mod:`pydvm.client.connect`, as the job API's),
submits the job, forwards its output and our stdin until the job ends, and
exits with its status.  It loads the protocol module, the library's
connecting and blocking channel, and nothing of the runtime, the store or
asyncio: a ``pydvm run`` starts as fast as the interpreter allows.

The exchange, and what is pipelined::

    tool                                   master
    connect                  ------------>
                             <------------  challenge (nonce, DVM id, signed)
    [seal: our key share]
    auth (MAC of the nonce)
    run                      ------------>  (all in one write; from the auth
                                            on sealed, on a sealed link)
                             <------------  welcome (the auth's reply)
                             <------------  (queued, with --queue,) started,
                                            output, stdin_ack ...
    stdin, kill_job          ------------>
                             <------------  the run's reply: the job ended

The ``run`` request goes right behind the ``auth`` answer, without
waiting for the welcome: the master handles a connection's messages in
order, and a refused auth closes the connection before anything after it
is read -- so nothing a peer sends before it is authenticated ever runs
(``tests/e2e/test_tool_run.py`` checks both).  The challenge itself must
be waited for: its nonce is what the MAC answers.

One ``poll`` waits for the socket, our stdin (when rank 0 may take more)
and the signal wake-up pipe: SIGINT, SIGTERM or SIGHUP asks the master to
kill the job (``kill_job``) and the tool exits with 128 + the signal's
number once the job has ended (its report printed) -- after SIGTERM or
SIGHUP, a batch system's signals, at most
:data:`~pydvm.cli.toolcommon.SIGNAL_EXIT` seconds later, before the
system's SIGKILL, even when the processes ignore SIGTERM: the DVM then ends
them itself, with SIGKILL after its kill grace.  A second signal exits at
once.  Connecting and waiting for the challenge watch the same pipe: a
signal then ends the tool before anything is submitted.  A stdout whose
reader went away (``pydvm run ... | head``) ends the job the same way,
quietly, with 141.
"""

from __future__ import annotations

import os
import select
import time
import _signal  # the C module: ``signal`` wraps it in enums, which costs an import

from .. import _trace
from ..channel import BlockingChannel
from ..client.connect import (  # noqa: F401 (RECV_BUFFER, connect_socket: re-exported)
    POLL_IN as _IN, RECV_BUFFER, DvmUnreachable, Interrupted as _Interrupted, answer,
    check_challenge, connect_socket, wait_ready as _wait)
from ..errors import Status
from ..protocol import HANDSHAKE_TIMEOUT, DvmUri, FrameError, pack
from .toolcommon import (SIGNAL_EXIT, SIGPIPE, JobOutput, StdinSource, ToolError, gave_up,
                          job_exit, run_request, stdin_kind)

#: The signals after which the tool waits at most SIGNAL_EXIT seconds for
#: the job's end (SIGINT, Ctrl-C, waits for it and its report, as before: a
#: second one exits at once).
BOUNDED = (_signal.SIGTERM, _signal.SIGHUP)

#: Request ids of the two requests a run makes.
AUTH_ID, RUN_ID = 1, 2


class _Signals:
    """SIGINT, SIGTERM and SIGHUP, caught and reported through a pipe that ``poll``
    watches (``signal.set_wakeup_fd``): a signal wakes the loop, and is
    handled there, between messages -- never in the middle of one."""

    CAUGHT = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP)

    def __init__(self) -> None:
        self.rfd, self._wfd = os.pipe()
        os.set_blocking(self.rfd, False)
        os.set_blocking(self._wfd, False)
        self._old: dict = {}
        try:
            self._old_fd: int | None = _signal.set_wakeup_fd(self._wfd, warn_on_full_buffer=False)
        except ValueError:  # not the main thread, which alone receives signals
            self._old_fd = None
            return
        self._old = {s: _signal.signal(s, _ignore) for s in self.CAUGHT}

    def pending(self) -> list[int]:
        """The signals caught since the last call, in order."""
        out: list[int] = []
        while True:
            try:
                data = os.read(self.rfd, 64)
            except (BlockingIOError, InterruptedError):
                break
            if not data:
                break
            out.extend(b for b in data if b in self.CAUGHT)
        return out

    def close(self) -> None:
        for s, old in self._old.items():
            _signal.signal(s, old)
        if self._old_fd is not None:
            _signal.set_wakeup_fd(self._old_fd)
        os.close(self.rfd)
        os.close(self._wfd)


def _ignore(signum, frame) -> None:
    """The Python-level handler: the wake-up pipe carries the signal."""


def run_job(uri: DvmUri, apps: list[dict] | None = None, session: int | None = None,
            tag_output: bool = False, env: dict[str, str] | None = None,
            cwd: str | None = None, abort_on_failure: bool | None = None,
            pmix: bool = False, forward_stdin: bool = True, *,
            request: dict | None = None, output: JobOutput | None = None) -> int:
    """Submit a job to the DVM at ``uri``, forward its output, and our stdin
    to its rank 0 (not with ``forward_stdin`` false, nor when stdin is
    closed or /dev/null: rank 0 then reads /dev/null); return its exit
    status.

    Ctrl-C (SIGINT), SIGTERM or SIGHUP asks the master to kill the job; the
    tool then waits for the job's end -- after SIGTERM or SIGHUP at most
    :data:`SIGNAL_EXIT` seconds, after a second signal not at all -- and
    exits with 128 + the signal number (one that comes while connecting --
    before anything is submitted -- ends the tool at once, with the same
    status).  When the job has ended, the processes that failed and who ended it (if it was
    killed) are reported on stderr (:func:`pydvm.cli.formatting.job_end_lines`).
    ``abort_on_failure``: True, the master kills the rest of the job at the
    first failure; False, never; None, as ``mpirun`` would for an MPI job
    (run with ``pmix``, or a failing process that used PMIx), else never.

    ``request`` (a whole ``run`` request, :func:`run_request` and the
    command line's options) and ``output`` (where output goes) replace the
    arguments before them.

    Raises DvmUnreachable if no DVM answers at ``uri`` (or it refuses us),
    ToolError for other failures to submit.
    """
    signals = _Signals()
    if request is None:
        request = run_request(apps or [], session, abort_on_failure, pmix, stdin=False, env=env,
                              cwd=cwd)
    try:
        return _Run(uri, signals, output or JobOutput(tag_output), forward_stdin).run(request)
    finally:
        signals.close()


class _Run:
    """One ``pydvm run``'s connection and loop (see :func:`run_job`)."""

    def __init__(self, uri: DvmUri, signals: _Signals, output: JobOutput,
                 forward_stdin: bool) -> None:
        self.uri = uri
        self.signals = signals
        self.output = output
        self.forward_stdin = forward_stdin
        self.ch: BlockingChannel | None = None
        self.name = ""
        self.nspace: str | None = None
        self.signum: int | None = None
        #: time.monotonic() by which we exit, once a signal came.
        self.exit_by: float | None = None
        self.welcomed = False
        self.result: dict | None = None
        self.stdin: StdinSource | None = None

    # -- connecting -------------------------------------------------------------

    def _handshake(self) -> tuple[BlockingChannel, bytes]:
        """Connect and read the challenge; the channel (sealed when the
        master says the link is) and the bytes of our answer (a sealed
        link's key share, then the auth)."""
        sock, secret, self.name = connect_socket(self.uri, self.signals)
        ch = BlockingChannel(sock)
        ch.gate()  # the challenge alone, until we know whether the rest is sealed
        try:
            challenge = self._challenge(ch)
            first, box = answer(challenge, self.uri, secret, self.name, AUTH_ID)
        except BaseException:
            ch.close()
            raise
        if box is not None:
            ch.seal(box)
        ch.ungate()
        return ch, first

    def _challenge(self, ch: BlockingChannel) -> dict:
        """The master's challenge, checked to come from the DVM named."""
        uri = self.uri
        deadline = time.monotonic() + HANDSHAKE_TIMEOUT
        while True:
            if not _wait(ch.sock.fileno(), _IN, deadline, self.signals):
                raise DvmUnreachable(uri, f"{self.name} closed: no challenge within "
                                          f"{HANDSHAKE_TIMEOUT:.0f}s")
            try:
                msgs, eof = ch.recv_available()
            except (OSError, FrameError) as exc:  # reset, garbage
                raise DvmUnreachable(uri, f"{self.name} closed: {exc}") from None
            if msgs:
                break
            if eof:
                raise DvmUnreachable(uri, f"{self.name} closed: peer closed")
        return check_challenge(msgs[0], uri, "master")

    # -- the loop -----------------------------------------------------------------

    def run(self, run: dict) -> int:
        kind = stdin_kind(0) if self.forward_stdin else None
        run["stdin"] = kind is not None
        run["id"] = RUN_ID
        try:
            for signum in self.signals.pending():
                raise _Interrupted(signum)
            ch, auth = self._handshake()
            for signum in self.signals.pending():
                ch.close()
                raise _Interrupted(signum)
        except _Interrupted as exc:  # nothing was submitted: nothing to kill
            return 128 + exc.signum
        self.ch = ch
        if _trace.PATH:
            _trace.mark("tool.send")
        try:
            ch.sock.sendall(auth + ch.frames(pack(run)))  # the run right behind the auth
        except OSError as exc:
            ch.close()
            raise DvmUnreachable(self.uri, f"{self.name} closed: connection lost: {exc}") \
                from None
        if kind is not None:
            self.stdin = StdinSource(ch.send, kind)
        try:
            self._loop()
        finally:
            if self.stdin is not None:
                self.stdin.stop()
            ch.close()
        assert self.result is not None
        if _trace.PATH:
            _trace.mark("tool.result", self.result.get("nspace") or "")
        return job_exit(self.result, self.signum, self.output)

    def _loop(self) -> None:
        ch = self.ch
        assert ch is not None
        sock_fd = ch.sock.fileno()
        poller = select.poll()
        poller.register(sock_fd, _IN)
        poller.register(self.signals.rfd, _IN)
        polled_stdin: int | None = None
        welcome_by = time.monotonic() + HANDSHAKE_TIMEOUT
        while self.result is None:
            src = self.stdin
            want = src is not None and src.wants_data()
            timeout: float | None = None
            if want and src.kind == "file":
                timeout = 0  # readable now: read it between the socket's messages
            want_poll = want and src.kind != "file"
            if want_poll and src.kind == "tty" and src.background():
                want_poll = False
                timeout = src.BACKGROUND_POLL
            if want_poll and polled_stdin is None:
                poller.register(src.rfd, _IN)
                polled_stdin = src.rfd
            elif not want_poll and polled_stdin is not None:
                poller.unregister(polled_stdin)
                polled_stdin = None
            for by in (None if self.welcomed else welcome_by, self.exit_by):
                if by is not None:
                    left = max(0.0, by - time.monotonic())
                    timeout = left if timeout is None else min(timeout, left)
            events = poller.poll(None if timeout is None else timeout * 1000)
            for signum in self.signals.pending():
                self._interrupted(signum)
            if self.exit_by is not None and time.monotonic() >= self.exit_by:
                self.result = gave_up(RUN_ID, self.nspace, self.signum)
                return
            ready = dict(events)
            if sock_fd in ready:
                try:
                    msgs, eof = ch.recv_available()
                except OSError as exc:  # reset
                    self._lost(f"connection lost: {exc}")
                    return
                except FrameError as exc:
                    self._lost(f"protocol error: {exc}")
                    return
                for msg in msgs:
                    self._on_message(msg)
                    if self.result is not None:
                        return
                if eof:
                    self._lost("peer closed")
                    return
            if not self.welcomed and time.monotonic() >= welcome_by:
                raise DvmUnreachable(self.uri, "master refused the connection: no reply from "
                                               f"{self.name} in {HANDSHAKE_TIMEOUT}s")
            src = self.stdin
            if src is None or not src.wants_data():
                continue
            if polled_stdin is not None and polled_stdin in ready:
                if ready[polled_stdin] & select.POLLNVAL:
                    poller.unregister(polled_stdin)
                    polled_stdin = None
                    src.kind = "file"  # cannot be polled: read it as a file
                elif src.kind == "tty" and src.background():
                    continue
                src.read()
            elif src.kind == "file":
                src.read()
            if src.done and polled_stdin is not None:
                poller.unregister(polled_stdin)
                polled_stdin = None

    def _lost(self, reason: str) -> None:
        """The connection ended before the job's reply."""
        if not self.welcomed:
            raise DvmUnreachable(self.uri, f"{self.name} closed: {reason}")
        self.result = {"t": "reply", "id": RUN_ID, "status": int(Status.ERR_UNREACH),
                       "msg": f"connection to {self.name} lost: {reason}"}

    def _on_message(self, msg: dict) -> None:
        t = msg.get("t")
        if t == "output":
            if self.output.write(msg) and self.signum is None:
                # Our reader is gone (``pydvm run ... | head``): as SIGPIPE
                # would, end quietly -- and take the job down with us.
                self._interrupted(SIGPIPE)
        elif t == "stdin_ack":
            if self.stdin is not None:
                self.stdin.ack(msg.get("bytes"), msg.get("closed") is True)
        elif t == "queued":  # it waits for slots: a signal now takes it off the queue
            self.nspace = msg.get("nspace")
            if self.signum is not None:
                self._kill()
        elif t == "started":
            self.nspace = msg.get("nspace")
            self.output.started(self.nspace, msg.get("size"))
            if self.signum is not None:
                self._kill()
            elif self.stdin is not None and isinstance(self.nspace, str):
                self.stdin.start(self.nspace)
        elif t == "reply" and msg.get("id") == AUTH_ID:
            if msg.get("status") != 0:
                raise DvmUnreachable(self.uri, "master refused the connection: "
                                               f"{msg.get('msg')}")
            self.welcomed = True
        elif t == "reply" and msg.get("id") == RUN_ID:
            self.result = msg

    def _interrupted(self, signum: int) -> None:
        if self.signum is not None:
            if signum != SIGPIPE:
                self.exit_by = time.monotonic()  # a second signal: exit now
            return
        self.signum = signum
        if signum in BOUNDED:  # a batch system's: its SIGKILL follows
            self.exit_by = time.monotonic() + SIGNAL_EXIT
        if self.stdin is not None:
            self.stdin.stop()
        if self.nspace is not None:
            self._kill()

    def _kill(self) -> None:
        assert self.ch is not None
        try:
            self.ch.send({"t": "kill_job", "id": 0, "nspace": self.nspace,
                          "signal": int(self.signum or 0)})
        except OSError:
            pass  # the connection is gone: its end is read next


__all__ = ["run_job", "DvmUnreachable", "ToolError"]
