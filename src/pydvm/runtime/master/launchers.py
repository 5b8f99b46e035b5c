"""Starting and ending a DVM's daemons: the ``local``, ``ssh`` and ``slurm`` launchers.

A launcher starts one daemon per node and tells the master when a daemon it
started is gone; the master does the rest (registration, heartbeats, node
loss) the same way whichever launcher started the daemon.  Two shapes:

* **one process per node** (:class:`LocalLauncher`, :class:`SshLauncher`):
  ``python -m pydvm daemon --master URI --node NAME``, for ``ssh`` prefixed
  with the ``plm_ssh_agent`` command and the host name (``ssh n1 ...`` on a
  cluster, ``ip netns exec n1 ...`` for network-namespace test hosts).  On
  the remote side the daemon is found as the same Python interpreter path as
  the master's (a shared install or identical images);
  ``pydvm_remote_python`` overrides it.
* **one process for all nodes** (:class:`SlurmLauncher`): one ``srun`` job
  step inside the Slurm allocation, one task per node (see
  :mod:`pydvm.runtime.master.slurm` for the line and why each option is there).
  Every task runs the same command; each daemon takes its node name from
  ``SLURMD_NODENAME``.

The DVM secret is written to the daemon's standard input (srun's
``--input=all`` copies it to every task), so it never appears in a process
listing or an environment.

**Standard error.**  Every daemon's stderr comes back to the master on a
pipe (through ssh or srun for remote ones), so a daemon that dies before
reporting in -- ssh refused, no Python or no pydvm at the remote path, srun
refusing the step -- can be explained: the launcher keeps the last
:data:`TAIL_LINES` lines of each daemon and the master quotes them in its
start-up error.  Everything read is also passed on: to the master's stderr
when the master logs there, else to the master's log, so nothing a daemon
writes is lost once it runs.  srun runs with ``--label``: each task line
starts with the task number, and srun's own ``srun: error: NODE: task T:
...`` lines say which node a task ran on and how it ended.

Where the daemons' logs go (:func:`pydvm.runtime.shared.logs.setup_logging`): ``LOG_DIR/NODE.log``
when the master was given a log directory (``--log-dir``, or the per-DVM
default of a ``--daemonize``'d DVM, :func:`default_log_dir`), else stderr.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import re
import shlex
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..shared.logs import setup_logging  # noqa: F401 (its old home: re-exported)

LAUNCHERS = ("local", "ssh", "slurm")
#: Lines of a daemon's standard error kept for the start-up error.
TAIL_LINES = 20

log = logging.getLogger("pydvm.launch")


class LaunchError(RuntimeError):
    """A launcher could not start the daemons (the message says why).

    Raised by :meth:`Launcher.start`; the master turns it into its start-up
    error and tears down whatever was started.
    """


@dataclass(frozen=True)
class DaemonCommand:
    """What every daemon of one DVM runs, less its node name."""

    master_uri: str
    log_dir: str | None
    #: interpreter on the node (``pydvm_remote_python``, else the master's).
    python: str = sys.executable

    def argv(self, node: str | None) -> list[str]:
        """The daemon's command; without ``node`` it reads ``SLURMD_NODENAME``."""
        # -P: never the working directory on sys.path (a script there named
        # like a module the daemon imports would be imported instead)
        cmd = [self.python, "-P", "-m", "pydvm", "daemon", "--master", self.master_uri]
        if node is not None:
            cmd += ["--node", node]
        if self.log_dir:
            cmd += ["--log-dir", self.log_dir]
        return cmd


class StderrTail:
    """The last :data:`TAIL_LINES` lines each daemon wrote on stderr.

    ``sink(who, line)`` receives every line as it is read (where it goes is
    the master's choice: see :func:`stderr_sink`).
    """

    def __init__(self, sink: Callable[[str, str], None] | None = None) -> None:
        self._lines: dict[str, collections.deque[str]] = {}
        self.sink = sink

    def add(self, who: str, line: str) -> None:
        self._lines.setdefault(who, collections.deque(maxlen=TAIL_LINES)).append(line)
        if self.sink is not None:
            self.sink(who, line)

    def lines(self, who: str) -> list[str]:
        return list(self._lines.get(who, ()))

    def rename(self, old: str, new: str) -> None:
        """Lines kept under ``old`` now belong to ``new`` (before its own)."""
        moved = self._lines.pop(old, None)
        if moved:
            moved.extend(self._lines.get(new, ()))
            self._lines[new] = moved


def stderr_sink(log_dir: str | None) -> Callable[[str, str], None]:
    """Where daemons' stderr goes once read: the master's stderr as it is
    (what an inherited stderr would have shown) when the master logs to
    stderr, else a warning line in the master's log naming the daemon."""
    if log_dir is None:
        def to_stderr(who: str, line: str) -> None:
            try:
                sys.stderr.write(line + "\n")
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
        return to_stderr
    return lambda who, line: log.warning("daemon %s stderr: %s", who, line)


async def _read_lines(stream: asyncio.StreamReader, each: Callable[[str], None]) -> None:
    """Call ``each`` with every line of ``stream`` (decoded, without newline)."""
    while True:
        try:
            raw = await stream.readline()
        except ValueError:  # a line over the reader's limit: take what is there
            raw = await stream.read(64 * 1024)
        except (ConnectionError, OSError):
            return
        if not raw:
            return
        each(raw.decode(errors="replace").rstrip("\n"))


async def _hand_secret(proc: asyncio.subprocess.Process, secret: bytes) -> None:
    """Write the secret line to ``proc``'s stdin and close it."""
    assert proc.stdin is not None
    try:
        proc.stdin.write(secret.hex().encode() + b"\n")
        await proc.stdin.drain()
    except (BrokenPipeError, ConnectionResetError, RuntimeError):
        # it died already (uvloop refuses a write to a closed pipe with
        # RuntimeError): its exit and its stderr say why
        pass
    proc.stdin.close()


def _exit_reason(rc: int) -> str:
    return f"was killed by signal {-rc}" if rc < 0 else f"exited with status {rc}"


class Launcher:
    """Starts the daemons of one DVM and reports when they are gone.

    What the master relies on:

    * :meth:`start` starts a daemon for each node and returns once they are
      started (not registered: that is the master's to wait for).  Raises
      :class:`LaunchError` if it cannot.
    * :meth:`gone` is a future per node, done with a reason (``"exited with
      status 1"``) once the launcher knows that node's daemon has ended --
      before or after it reported in.
    * :meth:`stderr_tail` is the last lines that daemon wrote on stderr.
    * :attr:`on_ended`, if the master sets it, is called once with a reason
      when the launcher has lost every daemon for good (the srun step
      ended) while the DVM was not stopping.
    * :meth:`finish`, once the master has told the daemons to shut down,
      waits for what the launcher started to exit and kills what overstays.
    * :attr:`name` and :attr:`source` are what ``pydvm info`` shows: the
      launcher, and where the DVM's nodes came from.
    """

    name = ""

    def __init__(self, source: str = "") -> None:
        self.source = source
        self.tail = StderrTail()
        self.on_ended: Callable[[str], None] | None = None
        self._gone: dict[str, asyncio.Future] = {}
        self._tasks: set[asyncio.Task] = set()

    async def start(self, nodes: Sequence[str], cmd: DaemonCommand, secret: bytes,
                    values: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def gone(self, node: str) -> asyncio.Future:
        if node not in self._gone:
            self._gone[node] = asyncio.get_running_loop().create_future()
        return self._gone[node]

    def _set_gone(self, node: str, reason: str) -> None:
        f = self.gone(node)
        if not f.done():
            f.set_result(reason)

    def stderr_tail(self, node: str) -> list[str]:
        return self.tail.lines(node)

    def processes(self) -> dict[str, asyncio.subprocess.Process]:
        """The local process started for each node, where there is one."""
        return {}

    async def finish(self, timeout: float = 10.0) -> None:
        raise NotImplementedError

    def _spawn(self, coro) -> asyncio.Task:
        t = asyncio.ensure_future(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    def _cancel_readers(self) -> None:
        for t in list(self._tasks):
            t.cancel()


class _PerNodeLauncher(Launcher):
    """One local process per node (the ``local`` and ``ssh`` launchers)."""

    def __init__(self, source: str = "") -> None:
        super().__init__(source)
        self.procs: dict[str, asyncio.subprocess.Process] = {}

    def argv(self, node: str, cmd: DaemonCommand, values: Mapping[str, Any]) -> list[str]:
        raise NotImplementedError

    async def start(self, nodes, cmd, secret, values) -> None:
        for node in nodes:
            argv = self.argv(node, cmd, values)
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.PIPE, start_new_session=True)
            except OSError as exc:
                raise LaunchError(f"cannot start the daemon for {node} ({argv[0]}): {exc}")
            self.procs[node] = proc
            assert proc.stderr is not None
            self._spawn(_read_lines(proc.stderr, lambda line, n=node: self.tail.add(n, line)))
            self._spawn(self._watch(node, proc))
            await _hand_secret(proc, secret)

    async def _watch(self, node: str, proc: asyncio.subprocess.Process) -> None:
        self._set_gone(node, _exit_reason(await proc.wait()))

    def processes(self) -> dict[str, asyncio.subprocess.Process]:
        return dict(self.procs)

    async def finish(self, timeout: float = 10.0) -> None:
        for node, proc in self.procs.items():
            if proc.returncode is None:
                try:
                    await asyncio.wait_for(proc.wait(), timeout)
                except asyncio.TimeoutError:
                    log.warning("daemon %s did not exit; killing it", node)
                    proc.kill()
                    await proc.wait()
        await asyncio.sleep(0)  # let readers take what is left in the pipes
        self._cancel_readers()


class LocalLauncher(_PerNodeLauncher):
    """Daemons on this machine (test hosts, a one-shot DVM)."""

    name = "local"

    def argv(self, node, cmd, values) -> list[str]:
        return cmd.argv(node)


class SshLauncher(_PerNodeLauncher):
    """``AGENT HOST python -m pydvm daemon ...`` per host (``plm_ssh_agent``)."""

    name = "ssh"

    def argv(self, node, cmd, values) -> list[str]:
        return shlex.split(values["plm_ssh_agent"]) + [node] + cmd.argv(node)


# ``srun --label`` output: ``T: text`` for task T, and srun's own end-of-task lines.
_TASK_LINE = re.compile(r"(\d+): (.*)")
_TASK_END = re.compile(r"srun: error: (\S+): tasks? ([\d,\-]+): (.*)")


def _expand_tasks(text: str) -> list[int]:
    """``0-2,5`` -> ``[0, 1, 2, 5]``."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


class SlurmLauncher(Launcher):
    """All daemons as ONE ``srun`` step inside the Slurm allocation.

    The step survives losing a daemon or a node (``--kill-on-bad-exit=0
    --no-kill --wait=0``): a dead daemon task is one lost node, not a lost
    DVM.  srun's stderr says, per node, when a task ended; that ends the
    node's :meth:`gone` future.  srun exiting ends every node still running
    and, unless the DVM is stopping, calls :attr:`on_ended`: the step is gone
    (the allocation ended, or someone cancelled the step), so the DVM cannot
    get its daemons back.

    Ending the step cleanly is the master's job: it shuts the daemons down
    over their own connections, and srun exits when its last task has.  Only
    a step that overstays that is ended by SIGTERM to srun (which SIGKILLs
    every task).  ``scancel`` is never used: it would SIGKILL the daemons at
    once, before they could end their jobs.
    """

    name = "slurm"

    def __init__(self, source: str = "", srun: str = "srun") -> None:
        super().__init__(source)
        self.srun_path = srun
        self.srun: asyncio.subprocess.Process | None = None
        self.argv: list[str] = []
        #: Slurm task number -> node, as srun's end-of-task lines tell it.
        self._task_node: dict[int, str] = {}
        self._nodes: list[str] = []
        self._finishing = False

    async def start(self, nodes, cmd, secret, values) -> None:
        from .slurm import srun_argv

        self._nodes = list(nodes)
        for n in nodes:
            self.gone(n)
        try:
            self.argv = srun_argv(nodes, cmd.argv(None), values["plm_slurm_args"],
                                  label=True, srun=self.srun_path)
        except ValueError as exc:
            raise LaunchError(f"cannot build the srun line: {exc}") from None
        log.info("starting the daemons: %s", shlex.join(self.argv))
        try:
            self.srun = await asyncio.create_subprocess_exec(
                *self.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            raise LaunchError(f"cannot run {self.argv[0]}: {exc}") from None
        assert self.srun.stderr is not None
        self._spawn(_read_lines(self.srun.stderr, self._on_line))
        self._spawn(self._watch())
        await _hand_secret(self.srun, secret)

    def _on_line(self, line: str) -> None:
        m = _TASK_LINE.fullmatch(line)
        if m:
            task = int(m.group(1))
            self.tail.add(self._task_node.get(task, f"slurm task {task}"), m.group(2))
            return
        self.tail.add("srun", line)
        m = _TASK_END.fullmatch(line)
        if not m:
            return
        from .slurm import SlurmEnvError, expand_hosts

        try:
            names = expand_hosts(m.group(1))
            tasks = _expand_tasks(m.group(2))
        except (SlurmEnvError, ValueError):
            return
        if len(names) == len(tasks):
            for task, name in zip(tasks, names):
                self._task_node[task] = name
                self.tail.rename(f"slurm task {task}", name)  # lines read before we knew
        for name in names:
            if name in self._nodes:
                self._set_gone(name, f"ended ({m.group(3)})")

    async def _watch(self) -> None:
        assert self.srun is not None
        rc = await self.srun.wait()
        # srun's last lines may still be in the pipe: give the reader a moment.
        await asyncio.sleep(0.1)
        reason = f"srun (the daemons' job step) {_exit_reason(rc)}"
        for n in self._nodes:
            self._set_gone(n, reason)
        if not self._finishing and self.on_ended is not None:
            self.on_ended(reason)

    def stderr_tail(self, node: str) -> list[str]:
        """The node's task lines; once srun has exited, srun's own lines too
        (they say why a step could not start)."""
        lines = self.tail.lines(node)
        if self.srun is not None and self.srun.returncode is not None:
            lines += [ln for ln in self.tail.lines("srun") if ln not in lines]
        return lines

    async def finish(self, timeout: float = 10.0) -> None:
        self._finishing = True
        p = self.srun
        if p is not None and p.returncode is None:
            try:
                await asyncio.wait_for(p.wait(), timeout)
            except asyncio.TimeoutError:
                log.warning("the daemons' srun step did not end; terminating srun")
                p.send_signal(signal.SIGTERM)  # srun then SIGKILLs every task
                try:
                    await asyncio.wait_for(p.wait(), 10)
                except asyncio.TimeoutError:
                    p.kill()
                    await p.wait()
        await asyncio.sleep(0)
        self._cancel_readers()


def make_launcher(name: str, source: str = "") -> Launcher:
    """The launcher called ``name`` (``local``, ``ssh``, ``slurm``)."""
    kinds: dict[str, type[Launcher]] = {"local": LocalLauncher, "ssh": SshLauncher,
                                        "slurm": SlurmLauncher}
    if name not in kinds:
        raise ValueError(f"unknown launcher {name!r}; expected one of {', '.join(LAUNCHERS)}")
    return kinds[name](source)


def default_log_dir(dvmid: str) -> Path:
    """Where a ``--daemonize``'d DVM without ``--log-dir`` logs:
    ``$PYDVM_STATE_DIR/logs/<dvmid>`` (default state directory ``~/.pydvm``),
    created mode 0700.  Daemons on other nodes write their own files there,
    so on a cluster it should be on a shared filesystem (home directories
    usually are); a daemon that cannot write it logs to its stderr, which
    reaches the master's log."""
    from ..shared.auth import state_dir

    d = state_dir() / "logs" / dvmid
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    return d
