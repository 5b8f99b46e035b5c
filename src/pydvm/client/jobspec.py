"""What the job API sends and what it hands back, without a connection.

:mod:`pydvm.client.jobs` (blocking) and :mod:`pydvm.client.aiojobs`
(asyncio) share it: a job's ``run`` request built from keyword arguments
(:func:`run_request` -- through the very option table and request model
``pydvm run`` uses, :mod:`pydvm.client.options` and :mod:`pydvm.client.request`,
so the two cannot drift), where its output goes (:func:`output_sinks`),
what it reads on stdin (:class:`StdinFeed`), and the values a program
gets back: :class:`JobResult`, :class:`ProcessFailure`, :class:`JobInfo`,
:class:`JobEvent`.  Nothing here loads asyncio or the runtime.
"""

from __future__ import annotations

import os

from ..errors import PMIxError, Status
from ..protocol import STDIN_CHUNK, STDIN_WINDOW, parse_host_list

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Iterable

#: Job states as :attr:`pydvm.jobs.Job.state` names them, in order.
SUBMITTED, QUEUED, RUNNING, ENDED = "submitted", "queued", "running", "ended"


class JobFailedError(RuntimeError):
    """A job ended with a non-zero status (raised by :meth:`JobResult.check`);
    ``result`` is its :class:`JobResult`."""

    def __init__(self, result: "JobResult") -> None:
        self.result = result
        why = f": {result.reason}" if result.reason else ""
        super().__init__(f"job {result.nspace} exited {result.returncode}{why}")


class UnsupportedError(PMIxError):
    """The DVM's master does not know this request (it predates it): e.g.
    job events (``subscribe``) from an older DVM."""

    status = Status.ERR_BAD_PARAM


def unknown_request(reply: dict) -> bool:
    """Whether ``reply`` refuses a request the master does not know."""
    return reply.get("status") == Status.ERR_BAD_PARAM and \
        str(reply.get("msg") or "").startswith("unknown message type")


# ----------------------------------------------------------------------
# what to run
# ----------------------------------------------------------------------


class App:
    """One app context of an MPMD job (``pydvm run``'s ``:``-separated
    parts): ``command`` (a string, split as a shell would, or a list) run
    ``n`` times, on ``hosts`` (as ``submit``'s), with ``env`` added to the
    job's environment, in ``cwd``, with ``path`` put before ``PATH``.
    ``n=None`` lets ``npernode``/``ppr`` decide, as ``pydvm run`` without
    ``-n`` does."""

    __slots__ = ("argv", "n", "hosts", "env", "cwd", "path")

    def __init__(self, command: "str | Iterable[str]", n: int | None = 1, *,
                 hosts: Any = None, env: dict[str, str] | None = None,
                 cwd: "str | os.PathLike | None" = None,
                 path: "str | os.PathLike | None" = None) -> None:
        self.argv = split_command(command)
        self.n = n
        self.hosts = hosts
        self.env = env
        self.cwd = cwd
        self.path = path

    def __repr__(self) -> str:
        return f"App({self.argv!r}, n={self.n!r})"


class JobSpec:
    """A job to submit later: ``submit``'s arguments, kept
    (``dvm.submit(spec)``, ``dvm.submit_many([spec, ...])``).  ``command``
    and ``options`` are :meth:`pydvm.jobs.Dvm.submit`'s; ``with_options``
    returns a copy with some changed."""

    __slots__ = ("command", "n", "options")

    def __init__(self, command: Any, n: int | None = 1, **options: Any) -> None:
        self.command = command
        self.n = n
        self.options = options

    def with_options(self, **options: Any) -> "JobSpec":
        """A copy with ``options`` added or changed."""
        return JobSpec(self.command, self.n, **{**self.options, **options})

    def __repr__(self) -> str:
        opts = "".join(f", {k}={v!r}" for k, v in self.options.items())
        return f"JobSpec({self.command!r}, n={self.n!r}{opts})"


def split_command(command: Any) -> list[str]:
    """``command`` as an argv: a string is split as a shell splits it, a
    list (of str or paths) taken as it is.  ValueError if it is empty."""
    if isinstance(command, str):
        if " " in command or "'" in command or '"' in command or "\\" in command:
            import shlex

            argv = shlex.split(command)
        else:
            argv = [command] if command else []
    elif isinstance(command, (list, tuple)):
        argv = [a if isinstance(a, str) else os.fspath(a) for a in command]
    elif isinstance(command, os.PathLike):
        argv = [os.fspath(command)]
    else:
        raise TypeError(f"a command is a string or a list of arguments, not "
                        f"{type(command).__name__}")
    if not argv:
        raise ValueError("empty command")
    return argv


def _hosts(hosts: Any) -> list[list] | None:
    """``hosts`` (``"a,b:2"``, ``["a", "b:2"]`` or ``[("a", 1), ...]``) as a
    request's host list."""
    if hosts is None:
        return None
    if isinstance(hosts, str):
        return [[h, s] for h, s in parse_host_list(hosts)]
    out: list[list] = []
    for h in hosts:
        if isinstance(h, str):
            out += [[n, s] for n, s in parse_host_list(h)]
        elif isinstance(h, (list, tuple)) and len(h) == 2:
            out.append([h[0], h[1]])
        else:
            raise ValueError(f"a host is 'NAME', 'NAME:SLOTS' or (NAME, SLOTS), not {h!r}")
    return out


def _app_opts(app: App) -> dict[str, Any]:
    """``app`` as an app context of a job's options (:func:`pydvm.client.request.new_opts`)."""
    return {"argv": app.argv, "n": app.n, "hosts": _hosts(app.hosts),
            "env": dict(app.env or {}),
            "cwd": os.path.abspath(app.cwd) if app.cwd is not None else None,
            "path": os.path.abspath(app.path) if app.path is not None else None}


def run_request(command: Any, n: int | None = 1, *, hosts: Any = None,
                env: dict[str, str | None] | None = None, inherit_env: bool = True,
                cwd: "str | os.PathLike | None" = None, path: Any = None,
                session: int | None = None, pmix: bool = False, mpi: str | None = None,
                abort_on_failure: bool | None = None, timeout: float | None = None,
                mca: dict[str, Any] | None = None, **placement: Any) -> dict[str, Any]:
    """The ``run`` request (without its id) of ``submit``'s arguments.

    ``env``: added to the caller's environment as it is now (a value of
    None removes that variable); with ``inherit_env=False`` it is the whole
    environment.  ``mca``: Open MPI's parameters (``OMPI_MCA_NAME``, as
    ``pydvm run --mca``).  ``placement``: the keywords of
    :data:`pydvm.client.options.KEYWORDS`.  ValueError or TypeError for what
    can be told wrong here; the DVM checks the rest (the job then fails with
    :class:`~pydvm.errors.BadParamError`)."""
    from .request import apply_keywords, build_request, is_pydvm_param, new_opts

    opts = new_opts()
    if isinstance(command, (list, tuple)) and command and isinstance(command[0], App):
        if n != 1 or hosts is not None or path is not None:
            raise ValueError("an MPMD job's n, hosts and path are each App's")
        opts["apps"] = [_app_opts(a) for a in command]
    else:
        opts["apps"] = [_app_opts(App(command, n, hosts=hosts, path=path))]
    opts["session"] = session
    opts["abort_on_failure"] = abort_on_failure
    opts["pmix"] = bool(pmix)
    if mpi is not None:
        if mpi not in ("auto", "pmix", "pmi1", "none"):
            raise ValueError(f"mpi must be 'auto', 'pmix', 'pmi1' or 'none', not {mpi!r}")
        opts["mpi"] = mpi
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or \
                not timeout > 0:
            raise ValueError(f"timeout must be a number of seconds > 0, not {timeout!r}")
        opts["timeout"] = timeout
    if mca:
        for name, value in mca.items():
            if is_pydvm_param(name):
                raise ValueError(f"mca {name}: pydvm's parameters are set on 'pydvm start'")
            opts["mca"].append((name, str(value)))
    if placement:
        apply_keywords(opts, placement)
    environ = dict(os.environ) if inherit_env else {}
    if env:
        for k, v in env.items():
            if v is None:
                environ.pop(k, None)
            else:
                environ[k] = v
    return build_request(opts, environ,
                         os.path.abspath(cwd) if cwd is not None else os.getcwd())


# ----------------------------------------------------------------------
# where output goes
# ----------------------------------------------------------------------


class _Capture:
    """Output kept in memory (``"capture"``): every rank's, in arrival order."""

    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, rank: int, data: bytes) -> None:
        self.parts.append(data)

    def value(self) -> bytes:
        return b"".join(self.parts)

    def close(self) -> None:
        pass


class _File:
    """Output written to a binary file (a path we opened, or the caller's file)."""

    __slots__ = ("f", "own", "users")

    def __init__(self, f: Any, own: bool) -> None:
        self.f = f
        self.own = own
        self.users = 1  # stdout and stderr may share one

    def write(self, rank: int, data: bytes) -> None:
        self.f.write(data)

    def value(self) -> None:
        return None

    def close(self) -> None:
        self.users -= 1
        if self.users:
            return
        try:
            self.f.close() if self.own else self.f.flush()
        except (OSError, ValueError):
            pass


class _Lines:
    """Output handed to ``fn(rank, line)`` a line at a time (decoded as
    UTF-8, invalid bytes replaced, without its newline)."""

    __slots__ = ("fn", "partial")

    def __init__(self, fn: Callable[[int, str], Any]) -> None:
        self.fn = fn
        self.partial: dict[int, bytes] = {}

    def write(self, rank: int, data: bytes) -> None:
        head = self.partial.pop(rank, b"")
        if head:
            data = head + data
        lines = data.split(b"\n")
        if lines[-1]:
            self.partial[rank] = lines[-1]
        for ln in lines[:-1]:
            self.fn(rank, ln.decode("utf-8", "replace"))

    def value(self) -> None:
        return None

    def close(self) -> None:
        partial, self.partial = self.partial, {}
        for rank, ln in partial.items():
            self.fn(rank, ln.decode("utf-8", "replace"))


def _sink(where: Any, what: str):
    if where is None or where == "discard":
        return None
    if where == "capture":
        return _Capture()
    if where == "inherit":
        import sys

        return _File(sys.stdout.buffer if what == "stdout" else sys.stderr.buffer, False)
    if isinstance(where, (str, os.PathLike)):
        return _File(open(where, "wb"), True)
    if hasattr(where, "write"):
        if hasattr(where, "encoding"):  # a text stream (sys.stdout): its bytes underneath
            if not hasattr(where, "buffer"):
                raise TypeError(f"{what}: a text stream without a binary buffer: give a "
                                "binary file")
            where.flush()
            where = where.buffer
        return _File(where, False)
    if callable(where):
        return _Lines(where)
    raise TypeError(f"{what} is None, 'capture', 'inherit', a path, a binary file or a "
                    f"callable, not {where!r}")


def output_sinks(stdout: Any, stderr: Any) -> tuple[Any, Any]:
    """Where a job's stdout and stderr go: None (discarded), ``"capture"``
    (kept: :attr:`JobResult.stdout`), ``"inherit"`` (our own stdout and
    stderr), a path (written there; both streams to one path share the
    file), a file object (binary, or a text stream such as ``sys.stderr``:
    its buffer is written), or a callable ``fn(rank, line)``."""
    out = _sink(stdout, "stdout")
    if stderr is not None and stderr is stdout and isinstance(out, _File):
        out.users += 1
        return out, out
    if isinstance(stderr, (str, os.PathLike)) and isinstance(stdout, (str, os.PathLike)) \
            and stderr not in ("capture", "inherit", "discard") \
            and os.fspath(stderr) == os.fspath(stdout):
        out.users += 1
        return out, out
    return out, _sink(stderr, "stderr")


# ----------------------------------------------------------------------
# stdin
# ----------------------------------------------------------------------


class StdinFeed:
    """What a job's rank 0 reads on stdin: ``bytes``, a path or a binary
    file, sent in pieces within the DVM's window (:data:`STDIN_WINDOW`
    bytes unacknowledged at most), then end of file."""

    __slots__ = ("data", "pos", "file", "own", "credit", "done")

    def __init__(self, source: Any) -> None:
        self.data: bytes | memoryview | None = None
        self.file = None
        self.own = False
        self.pos = 0
        self.credit = STDIN_WINDOW
        self.done = False
        if isinstance(source, (bytes, bytearray, memoryview)):
            self.data = memoryview(bytes(source))
        elif isinstance(source, (str, os.PathLike)):
            self.file = open(source, "rb")
            self.own = True
        elif hasattr(source, "read"):
            self.file = source
        else:
            raise TypeError(f"stdin is bytes, a path or a binary file, not {source!r}")

    def pieces(self, nspace: str) -> list[dict]:
        """The ``stdin`` messages the window allows now (the last with ``eof``)."""
        out: list[dict] = []
        while not self.done and self.credit > 0:
            n = min(STDIN_CHUNK, self.credit)
            if self.data is not None:
                chunk = bytes(self.data[self.pos:self.pos + n])
                self.pos += len(chunk)
            else:
                try:
                    chunk = self.file.read(n) or b""
                except (OSError, ValueError):
                    chunk = b""
            if not chunk:
                out.append({"t": "stdin", "nspace": nspace, "data": b"", "eof": True})
                self.stop()
                break
            self.credit -= len(chunk)
            out.append({"t": "stdin", "nspace": nspace, "data": chunk})
        return out

    def ack(self, n: Any, closed: bool) -> None:
        """A ``stdin_ack``: ``n`` more bytes are in rank 0's pipe (``closed``:
        it takes no more)."""
        if closed:
            self.stop()
        elif isinstance(n, int) and not isinstance(n, bool) and n > 0:
            self.credit = min(STDIN_WINDOW, self.credit + n)

    def stop(self) -> None:
        if self.done:
            return
        self.done = True
        self.data = None
        if self.own and self.file is not None:
            try:
                self.file.close()
            except OSError:
                pass


# ----------------------------------------------------------------------
# what comes back
# ----------------------------------------------------------------------


class ProcessFailure:
    """A process that failed on its own: ``rank``, ``app`` (its app
    context's index), ``node``, ``status`` (its exit status, or 128+N when
    signal N ended it), ``signal`` (0 if none), ``unfinalized`` (it used
    PMIx and exited without finalizing)."""

    __slots__ = ("rank", "app", "node", "status", "signal", "unfinalized")

    def __init__(self, row: list) -> None:
        row = list(row) + [None] * (6 - len(row))
        self.rank, self.app, self.node, self.status, self.signal, fin = row[:6]
        self.signal = self.signal or 0
        self.unfinalized = bool(fin)

    def __repr__(self) -> str:
        sig = f", signal={self.signal}" if self.signal else ""
        return (f"ProcessFailure(rank={self.rank}, app={self.app}, node={self.node!r}, "
                f"status={self.status}{sig})")


class JobResult:
    """How a job ended (what its Future resolves to).

    ``returncode``: the job's exit status, as ``pydvm run``'s (the first
    non-zero exit of its processes, 128+N for one killed by signal N, 110
    after its ``timeout``); ``nspace`` and ``size``; ``failures``: the
    :class:`ProcessFailure` of the first processes that failed on their
    own (at most 20), ``failed``: how many did; ``killed``: how many were
    ended by a kill; ``reason``: who or what ended the job, in words (a
    kill, its time limit, a failure to launch), else None; ``stdout`` and
    ``stderr``: the output captured (``"capture"``), else None.
    """

    __slots__ = ("returncode", "nspace", "size", "failures", "failed", "killed", "reason",
                 "stdout", "stderr")

    def __init__(self, reply: dict, size: int | None, stdout: bytes | None,
                 stderr: bytes | None) -> None:
        self.returncode = int(reply.get("exit") or 0)
        self.nspace = reply.get("nspace")
        self.size = size
        self.failures = [ProcessFailure(r) for r in reply.get("failures") or ()]
        self.failed = int(reply.get("failed") or 0)
        self.killed = int(reply.get("killed") or 0)
        self.reason = reply.get("msg") or None
        self.stdout = stdout
        self.stderr = stderr

    @property
    def ok(self) -> bool:
        """The job exited 0."""
        return self.returncode == 0

    def check(self) -> "JobResult":
        """This result if the job exited 0, else raise :class:`JobFailedError`."""
        if self.returncode:
            raise JobFailedError(self)
        return self

    def __repr__(self) -> str:
        why = f", reason={self.reason!r}" if self.reason else ""
        return f"JobResult(nspace={self.nspace!r}, returncode={self.returncode}{why})"


class JobInfo:
    """One job as ``pydvm ps`` lists it: ``nspace``, ``uid``, ``session``,
    ``state`` (the DVM's word: ``queued``, ``starting``, ``running``,
    ``killing``, ``ending``), ``started`` (seconds since the epoch),
    ``apps`` (``[{"argv", "n"}]``), ``ranks_per_node`` (``{node: n}``),
    ``procs``, ``ended`` and ``failed`` (counts); ``raw`` is the whole row."""

    __slots__ = ("nspace", "uid", "session", "state", "started", "apps", "ranks_per_node",
                 "procs", "ended", "failed", "raw")

    def __init__(self, row: dict) -> None:
        self.raw = row
        for name in self.__slots__[:-1]:
            setattr(self, name, row.get(name))

    @property
    def nodes(self) -> list[str]:
        """The nodes the job runs on (or will, while it is queued)."""
        return list(self.ranks_per_node or ())

    def __repr__(self) -> str:
        return f"JobInfo(nspace={self.nspace!r}, state={self.state!r}, procs={self.procs!r})"


class JobEvent:
    """Something that happened to a job (``dvm.events()``, ``dvm.on_event``):
    ``kind`` (``queued``, ``started``, ``proc_exit``, ``ended``), ``nspace``,
    ``time`` (the master's clock, seconds since the epoch), and the kind's
    fields as attributes and in ``fields``: started ``size``, ``nodes``
    (``{node: [ranks]}``); proc_exit ``rank``, ``node``, ``status``,
    ``signal``; ended ``exit``, ``failed``, ``killed``, ``reason`` ('' for
    a normal end); queued ``position`` (1: next to start); every kind
    ``session``."""

    __slots__ = ("kind", "nspace", "time", "fields")

    def __init__(self, msg: dict) -> None:
        self.kind = msg.get("kind")
        self.nspace = msg.get("nspace")
        self.time = msg.get("time")
        self.fields = {k: v for k, v in msg.items()
                       if k not in ("t", "ref", "kind", "nspace", "time")}

    def __getattr__(self, name: str) -> Any:
        try:
            return self.fields[name]
        except KeyError:
            raise AttributeError(name) from None

    def __repr__(self) -> str:
        extra = "".join(f", {k}={v!r}" for k, v in self.fields.items())
        return f"JobEvent({self.kind!r}, {self.nspace!r}{extra})"


class ProcessInfo:
    """One process of a running job (:meth:`pydvm.jobs.Job.processes`):
    ``rank``, ``node``, ``pid`` (on its node; 0 before it has started),
    ``state`` (``pending``: not started yet, ``running``, ``ended``),
    ``status`` (once ended: its exit status, 128+N for signal N; else None)
    and ``signal`` (the signal that ended it, 0 if none)."""

    __slots__ = ("rank", "node", "pid", "state", "status", "signal")

    def __init__(self, row: list) -> None:
        row = list(row) + [None] * (6 - len(row))
        self.rank, self.node, self.pid, self.state, self.status, self.signal = row[:6]
        self.pid = self.pid or 0
        self.signal = self.signal or 0

    def __repr__(self) -> str:
        end = f", status={self.status}" if self.state == "ended" else ""
        return (f"ProcessInfo(rank={self.rank}, node={self.node!r}, pid={self.pid}, "
                f"state={self.state!r}{end})")


class NodeInfo:
    """One node of a DVM (:meth:`pydvm.jobs.Dvm.nodes`): ``name``, ``slots``,
    ``state`` (``launching``, ``joining``, ``up``, ``lost``, ``stopped``)
    and, for a lost node, ``reason`` (else None); ``up``: it runs jobs."""

    __slots__ = ("name", "slots", "state", "reason")

    def __init__(self, row: list, reason: str | None = None) -> None:
        row = list(row) + [None] * (3 - len(row))
        self.name, self.slots, self.state = row[:3]
        self.reason = reason or None

    @property
    def up(self) -> bool:
        """The node is up: it runs jobs."""
        return self.state == "up"

    def __repr__(self) -> str:
        why = f", reason={self.reason!r}" if self.reason else ""
        return f"NodeInfo({self.name!r}, slots={self.slots}, state={self.state!r}{why})"


def signal_number(sig: Any) -> int:
    """A signal as the DVM takes it: a number, a :class:`signal.Signals`, or
    a name (``"SIGUSR1"``, ``"USR1"``, any case).  ValueError names what is
    not a signal of this system."""
    import signal as _signal

    if isinstance(sig, str):
        name = sig.strip().upper()
        name = name if name.startswith("SIG") else "SIG" + name
        try:
            return int(_signal.Signals[name])
        except KeyError:
            if name.startswith("SIGRTMIN+") or name.startswith("SIGRTMAX-"):
                base, _, k = name[3:].partition("+" if "+" in name else "-")
                if k.isdigit():
                    return signal_number(int(getattr(_signal, "SIG" + base))
                                         + (int(k) if "+" in name else -int(k)))
            raise ValueError(f"not a signal name: {sig!r}") from None
    if isinstance(sig, int) and not isinstance(sig, bool):
        if sig > 0 and sig in _signal.valid_signals():
            return int(sig)
        raise ValueError(f"not a signal number of this system: {sig!r}")
    raise TypeError(f"a signal is a number or a name, not {type(sig).__name__}")
