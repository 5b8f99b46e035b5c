"""Starting a job process: no Python code between fork and exec.

A node process runs other threads while it launches (libpmix's progress
thread, the metrics server's), so the child of a ``fork`` must not run
Python: a lock another thread held at the fork (the allocator's, an import
lock, a logging handler's) would stay held in the child forever.  And the
master process, which serves the head node, can hold a large store: a real
``fork`` copies its page tables (measured here: ~12 ms of the parent's CPU
and ~15 ms of the child's per spawn at 300 MB, against ~0.5 ms for
``vfork``).  So job processes are started with :class:`subprocess.Popen`,
whose fork/exec is C (``vfork`` where it can), with no ``preexec_fn``.

What the old preexec function did is done instead by ``setpriv`` (util-linux,
present on every mainstream Linux) placed in front of the command: on a
multi-user DVM it switches to the job's user, groups first, then sets the
**parent-death signal** (SIGKILL: the kernel ends the process the moment its
node process dies, even by SIGKILL; a change of credentials would clear it),
then executes the command: same pid, same argv.  Without ``setpriv`` the
user switch is done by ``Popen``'s own ``user``/``group``/``extra_groups``
(C code in the child, a real ``fork``) and the guardian alone stands for the
death signal (:func:`death_signal_available` says which; the node logs it
once).

A process started as the node's own user needs no switch, and the
guardian (:mod:`pydvm.runtime.shared.guard`) ends it -- with its own children,
which the death signal never reached -- within ``READ_PAUSE`` of its node
process's death.  Putting ``setpriv`` in front of it only for the death
signal costs a second ``exec`` and dynamic link: about a millisecond of CPU
per process, twice what ``true`` itself costs, the largest share of a
one-rank job.  So it is done only when asked (``pydvm_death_signal on``);
a process that does go through ``setpriv`` for a user switch always gets
the signal too.

On CPython 3.11 and 3.12 a process is started by :func:`_fork_exec`: the
same C call ``Popen`` makes (``vfork`` and ``exec``, every other
descriptor closed, a new session), as the standard library's
own ``multiprocessing`` makes it, without ``Popen``'s Python around it --
its environment encoded item by item, its ``PATH`` search (the program was
found beforehand), a pipe and an object per process: about a tenth of the
node's CPU per one-rank job.  Other versions, and user switches without
``setpriv``, go through ``Popen``.

The end of a process is seen through a pidfd on the event loop (Linux 5.3+):
no SIGCHLD handler, no waiting thread, and nothing else in the process reaps
it.  A process is ended with its whole group (:func:`end_groups`): SIGTERM,
SIGKILL after a grace period, and SIGKILL to whatever it left in its group.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys

try:
    import _posixsubprocess
except ImportError:  # pragma: no cover - every CPython on Linux has it
    _posixsubprocess = None

DEVNULL = subprocess.DEVNULL

#: Seconds between SIGTERM and SIGKILL when a job's processes are ended.
KILL_GRACE = 3.0

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_setpriv: list[str | None] = []  # [path or None] once looked up


def setpriv_path() -> str | None:
    """Where ``setpriv`` is (looked up once per process), or None."""
    if not _setpriv:
        _setpriv.append(shutil.which("setpriv") or next(
            (p for p in ("/usr/bin/setpriv", "/bin/setpriv") if os.access(p, os.X_OK)), None))
    return _setpriv[0]


def death_signal_available() -> bool:
    """True if job processes get the parent-death signal (``setpriv`` found)."""
    return setpriv_path() is not None


def command_line(argv: list[str], switch: tuple[int, int, list[int]] | None,
                 death_signal: bool = True) -> list[str]:
    """The argv actually executed for ``argv``: through ``setpriv`` when it
    exists and there is something for it to do -- the user switch if
    ``switch`` = (uid, gid, groups), the death signal if ``death_signal``
    or switching --, else ``argv`` itself."""
    sp = setpriv_path()
    if sp is None or (switch is None and not death_signal):
        return list(argv)
    pre = [sp]
    if switch is not None:
        uid, gid, groups = switch
        pre += [f"--reuid={uid}", f"--regid={gid}"]
        pre += [f"--groups={','.join(str(g) for g in groups)}"] if groups else ["--clear-groups"]
    return pre + ["--pdeathsig", "KILL", "--", *argv]


#: Whether :func:`_fork_exec` may be used: the versions whose
#: ``_posixsubprocess.fork_exec`` takes the arguments it passes.
FAST_SPAWN = (_posixsubprocess is not None and sys.version_info[:2] in ((3, 11), (3, 12))
              and bool(getattr(subprocess, "_USE_VFORK", False)))
_devnull: list[int] = []  # one /dev/null descriptor, opened on first use and kept


class Spawned:
    """A process :func:`_fork_exec` started: what :class:`ChildProcess` uses
    of a ``Popen`` (``pid``, ``returncode``, ``poll``)."""

    __slots__ = ("pid", "returncode")

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """Reap it if it has ended (never blocks); its ``returncode``."""
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped by someone else: status lost
                self.returncode = 255
            else:
                if pid == self.pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


def _fork_exec(cmd: list[str], program: str, env: dict[str, str], cwd: str | None,
               stdin: int, stdout: int, stderr: int, pass_fds: tuple[int, ...] = ()) -> Spawned:
    """Start ``cmd`` (``program`` is the file to execute) as ``Popen(cmd,
    executable=program, env=env, cwd=cwd, stdin=..., start_new_session=True,
    close_fds=True, pass_fds=pass_fds)`` would, through the same C call.  Raises OSError as
    ``Popen`` does when the program cannot be executed, ValueError for an
    environment variable name with ``=``."""
    enc, errs = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()
    env_list = []
    for k, v in env.items():
        if "=" in k:
            raise ValueError("illegal environment variable name")
        env_list.append(f"{k}={v}".encode(enc, errs))
    fds = []
    for fd in (stdin, stdout, stderr):
        if fd == subprocess.DEVNULL:
            if not _devnull:
                _devnull.append(os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC))
            fd = _devnull[0]
        fds.append(fd)
    errpipe_read, errpipe_write = os.pipe()
    try:
        try:
            pid = _posixsubprocess.fork_exec(
                cmd, (os.fsencode(program),), True, tuple(sorted({errpipe_write, *pass_fds})),
                cwd, env_list,
                fds[0], -1, -1, fds[1], -1, fds[2], errpipe_read, errpipe_write,
                True, True, -1, None, None, None, -1, None, True)
        finally:
            os.close(errpipe_write)
        data = b""
        while True:  # end of file at the exec (close-on-exec), or why it failed
            part = os.read(errpipe_read, 50000)
            if not part:
                break
            data += part
    finally:
        os.close(errpipe_read)
    if data:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
        name, _, rest = data.partition(b":")
        hex_errno, _, msg = rest.partition(b":")
        try:
            errno = int(hex_errno, 16)
        except ValueError:
            errno = 0
        if name == b"OSError" and errno:
            where = cwd if msg == b"noexec:chdir" else program
            raise OSError(errno, os.strerror(errno), where)
        raise OSError(f"cannot start {program}: {data.decode(errors='replace')}")
    return Spawned(pid)


class ChildProcess:
    """A started job process: ``pid``, ``returncode`` (None while it runs;
    -N if killed by signal N) and :meth:`wait`.  Reaped by this object only,
    when its pidfd becomes readable on the loop."""

    def __init__(self, popen: "subprocess.Popen | Spawned",
                 loop: asyncio.AbstractEventLoop) -> None:
        self._popen = popen
        self.pid = popen.pid
        self._loop = loop
        self._done: asyncio.Future = loop.create_future()
        try:
            self._pidfd: int | None = os.pidfd_open(popen.pid)
        except OSError:
            # Already reaped cannot happen (we are its only reaper); without
            # pidfd support, poll (old kernels only).
            self._pidfd = None
            loop.call_soon(self._poll_later)
        else:
            loop.add_reader(self._pidfd, self._exited)

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    def _exited(self) -> None:
        if self._popen.poll() is None:
            return  # woken early: not a zombie yet
        self._loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._pidfd = None
        if not self._done.done():
            self._done.set_result(self._popen.returncode)

    def _poll_later(self) -> None:
        if self._popen.poll() is None:
            self._loop.call_later(0.01, self._poll_later)
        elif not self._done.done():
            self._done.set_result(self._popen.returncode)

    async def wait(self) -> int:
        """Its exit status (as :attr:`returncode`), once it has ended."""
        return await asyncio.shield(self._done)


def start(argv: list[str], *, env: dict[str, str], cwd: str | None, stdin, stdout: int,
          stderr: int, switch: tuple[int, int, list[int]] | None,
          death_signal: bool = True, program: str | None = None,
          pass_fds: tuple[int, ...] = ()) -> ChildProcess:
    """Start ``argv`` in a new session (its own process group) with the given
    standard streams, as the job's user if ``switch`` says so, with the
    parent-death signal if ``death_signal`` (see the module docstring).
    ``program``: the file ``argv[0]`` was found as (:func:`resolved`),
    executed as it is (argv unchanged) where nothing goes in front of it.
    ``pass_fds``: descriptors the process keeps, under the same numbers (a
    PMI-1 process's ``PMI_FD``).
    Raises OSError if it cannot be started (the program was checked
    beforehand, see :func:`find_program`)."""
    cmd = command_line(argv, switch, death_signal)
    kw: dict = {}
    if program and cmd[0] is argv[0]:
        kw["executable"] = program
    if switch is not None and setpriv_path() is None:
        uid, gid, groups = switch
        kw.update(user=uid, group=gid, extra_groups=groups)
    if FAST_SPAWN and "user" not in kw:
        # a bare name without ``program`` is searched by Popen (relative
        # PATH entries count from the process's cwd, not ours)
        exe = kw.get("executable") or (cmd[0] if "/" in cmd[0] else None)
        if exe:
            return ChildProcess(_fork_exec(cmd, exe, env, cwd, stdin, stdout, stderr,
                                           pass_fds), asyncio.get_running_loop())
    popen = subprocess.Popen(cmd, env=env, cwd=cwd, stdin=stdin, stdout=stdout, stderr=stderr,
                             start_new_session=True, close_fds=True, pass_fds=pass_fds, **kw)
    return ChildProcess(popen, asyncio.get_running_loop())


def credentials(uid: int, gid: int) -> tuple[int, int, list[int]]:
    """(uid, gid, supplementary groups) to start a job process as."""
    import pwd

    try:
        groups = os.getgrouplist(pwd.getpwuid(uid).pw_name, gid)
    except KeyError:
        groups = [gid]
    return uid, gid, groups


def workdir(cwd: str | None) -> str | None:
    """The directory a job process starts in: the job's own where it exists
    on this node, else (None) the node server's."""
    return cwd if cwd and os.path.isdir(cwd) else None


#: (program, PATH, directory) -> the runnable file it was last found as, and
#: the name to execute it by (the ``PATH`` entry joined as it is written, as
#: an ``exec`` that searched ``PATH`` would name it: a script's interpreter
#: gets that name): the next job of the same program checks that one file
#: instead of searching PATH again.
_FOUND: dict[tuple[str, str, str], tuple[str, str]] = {}
_FOUND_MAX = 512


def find_program(exe: str, path: str, cwd: str | None) -> tuple[str, int]:
    """Resolve a job's program as a shell does: ``("", 0)`` when it can be
    run, else a message naming it and the shell's exit status for it (127
    not found, 126 found but not runnable).

    A name with a ``/`` is taken as a path, relative to ``cwd`` (the job's
    working directory, not this process's); a bare name is looked up in
    ``path`` (``PATH``), whose relative entries are relative to ``cwd`` too.
    """
    base = cwd or os.getcwd()
    key = (exe, path, base)
    found = _FOUND.get(key)
    if found is not None and os.access(found[0], os.X_OK) and not os.path.isdir(found[0]):
        return "", 0
    if "/" in exe:
        candidates = [(os.path.join(base, exe), exe)]
    else:
        candidates = [(os.path.join(base, d or ".", exe), os.path.join(d, exe))
                      for d in path.split(os.pathsep)]
    unrunnable = ""
    for c, named in candidates:
        if not os.path.exists(c):
            continue
        if os.path.isdir(c):
            unrunnable = unrunnable or f"{exe}: is a directory"
        elif not os.access(c, os.X_OK):
            unrunnable = unrunnable or f"{exe}: permission denied (the file is not executable)"
        else:
            if len(_FOUND) >= _FOUND_MAX:
                _FOUND.clear()
            _FOUND[key] = (c, named)
            return "", 0
    if unrunnable:
        return unrunnable, 126
    where = f"in {base}" if "/" in exe else "in PATH"
    return f"executable not found: {exe} (looked {where})", 127


def resolved(exe: str, path: str, cwd: str | None) -> str | None:
    """What to execute for a bare program name :func:`find_program` found in
    ``PATH`` (same ``path`` and ``cwd``) without searching again -- named as
    the search would name it (relative ``PATH`` entries stay relative: the
    process starts in ``cwd``) --, or None (a name with a ``/``, executed as
    written, or not found)."""
    if "/" in exe:
        return None
    found = _FOUND.get((exe, path, cwd or os.getcwd()))
    return found[1] if found is not None else None


def signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def signal_all(job: "Any", sig: "Any") -> int:
    """Send ``sig`` to the group of each of a node's job processes still
    running (``job``: the node's ``LocalJob``, or None); how many."""
    if job is None or not isinstance(sig, int) or isinstance(sig, bool) or sig <= 0:
        return 0
    n = 0
    for lp in job.procs.values():
        p = lp.process
        if p is not None and p.returncode is None and not lp.ended:
            signal_group(p.pid, sig)
            n += 1
    return n


async def end_groups(procs: list[ChildProcess], grace: float) -> None:
    """End processes and their groups: SIGTERM to each live one's group,
    SIGKILL to the group of any still running ``grace`` seconds later,
    then SIGKILL to every group (what the processes left behind) once the
    processes have ended."""
    live = [p for p in procs if p.returncode is None]
    for p in live:
        signal_group(p.pid, signal.SIGTERM)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    for p in live:
        try:
            await asyncio.wait_for(asyncio.shield(p.wait()), max(0.0, deadline - loop.time()))
        except asyncio.TimeoutError:
            signal_group(p.pid, signal.SIGKILL)
    for p in live:
        signal_group(p.pid, signal.SIGKILL)  # stragglers in the group
        await p.wait()
