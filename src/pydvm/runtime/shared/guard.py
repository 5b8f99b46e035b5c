"""No orphans: job processes die with their daemon, however the daemon dies.

Two mechanisms, because neither alone covers every case:

* **Parent-death signal.**  Each job process is started with
  ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` set just before it executes its
  program (by ``setpriv``, after any uid switch, which would clear it; see
  :mod:`pydvm.runtime.shared.jobproc`), so the kernel kills it the moment its
  daemon dies -- even by SIGKILL.  It reaches only the direct child, not
  what that child started.
* **A guardian process.**  Before its event loop starts, the daemon forks a
  tiny guardian that does nothing but read a pipe from the daemon: the
  process groups the daemon launched (``+PGID`` / ``-PGID``), the
  directories it must remove (``dPATH``) and the environment entry every
  job process of the daemon carries (``eNAME=VALUE``: its client socket).
  When the pipe reaches end of file -- the daemon exited, for whatever
  reason -- the guardian SIGKILLs every group still listed (so a job
  process's own children, which share its group, go too), then every
  process whose environment holds the entry (one the daemon started but had
  not listed yet, or a child that left its group), removes the directories
  (the client socket's), and exits.  It runs in its own session so a signal
  sent to the daemon's group does not take it first.

The parent-death signal is set only where it costs nothing more (a user
switch runs through ``setpriv`` anyway) or where asked for
(``pydvm_death_signal on``): the guardian alone ends the others, at most
one pause late.

The guardian reads the pipe in bursts, pausing :data:`READ_PAUSE` between
reads: a write into a pipe whose reader is blocked in ``read`` wakes it,
and on a busy node that wake-up preempted the daemon at every spawn and
every reap (a quarter of a millisecond each, half the daemon's work per
one-rank job).  A write while the guardian sleeps wakes nobody; the pipe
holds thousands of entries, far more than a pause's worth; and the end of
file is seen at most one pause late, when the parent-death signal has
already ended each job process itself.

A group stays listed until the daemon knows it is empty: it is dropped when
its leader is reaped and no member is left, or when the job's cleanup has
killed what was left (see :meth:`Guardian.release`) -- never later, so a
recycled process-group id is never signalled.
"""

from __future__ import annotations

import os
import shutil
import signal
import time

#: Seconds the guardian sleeps between reads of its pipe (see the module doc).
READ_PAUSE = 0.05


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_alive(pgid: int) -> bool:
    """True while the process group has at least one member."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Guardian:
    """The daemon's side of the guardian (see the module docstring)."""

    def __init__(self) -> None:
        self._w = -1
        self.pid = 0
        self._groups: set[int] = set()

    def start(self) -> None:
        """Fork the guardian.  Call before any thread or event loop exists."""
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(w)
            _guard(r)  # never returns
        os.close(r)
        self._w, self.pid = w, pid

    def track(self, pgid: int) -> None:
        self._groups.add(pgid)
        self._send(f"+{pgid}\n")

    def release(self, pgid: int) -> None:
        """Stop listing ``pgid``: call only once the group is known empty."""
        self._groups.discard(pgid)
        self._send(f"-{pgid}\n")

    def remove_on_exit(self, path: str) -> None:
        self._send(f"d{path}\n")

    def kill_carriers_on_exit(self, name: str, value: str) -> None:
        """At the end also SIGKILL every process whose environment has
        ``name=value`` (what each job process of this daemon is given)."""
        self._send(f"e{name}={value}\n")

    @property
    def groups(self) -> frozenset[int]:
        return frozenset(self._groups)

    def close(self) -> None:
        """The daemon is exiting cleanly: the guardian cleans up and exits."""
        if self._w >= 0:
            os.close(self._w)
            self._w = -1
        if self.pid:
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
            self.pid = 0

    def _send(self, line: str) -> None:
        if self._w >= 0:
            os.write(self._w, line.encode())


def _kill_carriers(marks: list[bytes]) -> None:
    """SIGKILL every process whose environment holds one of ``marks``
    (``\\0NAME=VALUE\\0``), and its group if it leads one."""
    me = os.getpid()
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                env = b"\0" + f.read()
        except OSError:
            continue  # gone, or not ours to read
        if any(m in env for m in marks):
            pid = int(d)
            try:
                if os.getpgid(pid) == pid:
                    os.killpg(pid, signal.SIGKILL)
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _guard(r: int) -> None:  # pragma: no cover - runs in the forked guardian
    """The guardian's whole life: list groups until EOF, then kill them."""
    try:
        os.setsid()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_IGN)
        try:
            maxfd = os.sysconf("SC_OPEN_MAX")
        except (ValueError, OSError):
            maxfd = 1024
        os.closerange(3, r)
        os.closerange(r + 1, maxfd)
        groups: set[int] = set()
        dirs: list[str] = []
        marks: list[bytes] = []
        buf = b""
        while True:
            try:
                data = os.read(r, 65536)
            except InterruptedError:
                continue
            if not data:
                break
            time.sleep(READ_PAUSE)
            buf += data
            *lines, buf = buf.split(b"\n")
            for line in lines:
                if not line:
                    continue
                op, arg = line[:1], line[1:].decode()
                if op == b"+":
                    groups.add(int(arg))
                elif op == b"-":
                    groups.discard(int(arg))
                elif op == b"d":
                    dirs.append(arg)
                elif op == b"e":
                    marks.append(b"\0" + line[1:] + b"\0")
        for pgid in groups:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except OSError:
                pass
        if marks:
            _kill_carriers(marks)
        for d in dirs:
            if os.path.isdir(d):
                shutil.rmtree(d, ignore_errors=True)
            else:  # a file (the PMIx system server's, runtime/pmixhost/tools.py)
                try:
                    os.unlink(d)
                except OSError:
                    pass
    finally:
        os._exit(0)
