"""Fixtures for tests with real uids: a multi-user DVM started by root, and users.

The suite (root in CI) creates three users with ``useradd`` and removes them
at the end.  Their processes cannot use an interpreter under a private home
(``/root`` is 0700), so the DVM and every user run pydvm from a venv made
from the system Python in a world-readable directory: ``PYDVM_MU_PYTHON``
if set, else one built here once per run (``python3 -m venv`` + ``pip
install`` of this checkout).  Skipped, with the reason, when not root or
when no such interpreter can be made.
"""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "e2e"))

from dvmkit import pid_alive, wait_for  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
USERS = ("pdvmtesta", "pdvmtestb", "pdvmtestc")
SYSTEM_PYTHON = "/usr/bin/python3"
RUNUSER = shutil.which("runuser") or "/usr/sbin/runuser"


def _why_not() -> str:
    if os.geteuid() != 0:
        return "tests with real uids need root (CI runs as root)"
    if not shutil.which("useradd") or not shutil.which("runuser"):
        return "useradd/runuser are not installed"
    return ""


@pytest.fixture(scope="session")
def mu_python(tmp_path_factory) -> str:
    why = _why_not()
    if why:
        pytest.skip(why)
    given = os.environ.get("PYDVM_MU_PYTHON")
    if given:
        yield given   # (a generator fixture: a plain return would yield nothing)
        return
    if not os.path.exists(SYSTEM_PYTHON):
        pytest.skip(f"no system Python at {SYSTEM_PYTHON} for other users to run")
    base = Path(tempfile.mkdtemp(prefix="pydvm-mu-venv-"))
    os.chmod(base, 0o755)
    venv = base / "venv"
    p = subprocess.run([SYSTEM_PYTHON, "-m", "venv", str(venv)], capture_output=True, text=True,
                       timeout=300)
    if p.returncode != 0:
        pytest.skip(f"cannot make a venv with {SYSTEM_PYTHON}: {p.stderr.strip()[-300:]}")
    src = base / "src"  # a world-readable copy of this checkout to install from
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".venv", ".git", "__pycache__",
                                                              "*.egg-info", "build"))
    p = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(src)],
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        pytest.skip(f"cannot install pydvm for other users: {p.stderr.strip()[-300:]}")
    for d, _, files in os.walk(base):
        os.chmod(d, 0o755)
    yield str(venv / "bin" / "python")
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def users(mu_python) -> dict[str, int]:
    """Three throw-away users; name -> uid.  Removed at the end of the run.

    The users are machine-wide, so a second run on this machine (another
    checkout) waits on a lock file until this one has removed them.
    """
    lock = os.open("/run/lock/pydvm-test-users.lock" if os.path.isdir("/run/lock")
                   else "/tmp/pydvm-test-users.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    made = {}
    try:
        for name in USERS:
            try:
                pwd.getpwnam(name)
            except KeyError:
                subprocess.run(["useradd", "-M", "-s", "/bin/sh", name], check=True, timeout=30)
            made[name] = pwd.getpwnam(name).pw_uid
        yield made
    finally:
        for name in made:
            subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True, timeout=30)
            subprocess.run(["userdel", name], capture_output=True, timeout=30)
        os.close(lock)


#: Open MPI between the DVM's nodes (all on this machine) over loopback only:
#: by default its TCP transport also lists the host side of other tests'
#: network namespaces, which come and go while it runs (an MPI job of two
#: nodes was seen hanging once in a full run of the suite).
MPI_LOOPBACK = {"OMPI_MCA_btl_tcp_if_include": "lo"}


@dataclass
class MultiUserDvm:
    uri: str
    python: str
    log_dir: Path
    root_env: dict

    def _env(self) -> dict[str, str]:
        """The environment of a ``pydvm`` command run as a user."""
        return {"PATH": f"{Path(self.python).parent}:/usr/bin:/bin", "HOME": "/tmp",
                "PYDVM_URI": self.uri, "LANG": "C.UTF-8", **MPI_LOOPBACK}

    def _as(self, user: str, env: dict[str, str], *args: str) -> list[str]:
        """``pydvm ARGS...`` run as ``user`` with exactly ``env``."""
        return [RUNUSER, "-u", user, "--", "env", *[f"{k}={v}" for k, v in env.items()],
                self.python, "-m", "pydvm", *args]

    def as_user(self, user: str | None, *args: str, timeout: float = 60
                ) -> subprocess.CompletedProcess:
        """``pydvm ARGS...`` as ``user`` (None: as root)."""
        env = self._env()
        if user is not None:
            cmd = self._as(user, env, *args)
        else:
            cmd = [self.python, "-m", "pydvm", *args]
            env = {**self.root_env, **env}
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd="/tmp",
                              env=env)

    def popen_as(self, user: str, *args: str) -> subprocess.Popen:
        """A long-running ``pydvm ARGS...`` as ``user`` (stdout piped)."""
        return subprocess.Popen(self._as(user, self._env(), *args), stdout=subprocess.PIPE,
                                text=True, cwd="/tmp")

    def as_user_python(self, user: str, *args: str) -> subprocess.CompletedProcess:
        """Run this DVM's Python as ``user`` (for raw-socket probes)."""
        return subprocess.run([RUNUSER, "-u", user, "--", self.python, *args],
                              capture_output=True, text=True, timeout=30, cwd="/tmp")

    def run(self, user: str, *args: str, **kw) -> subprocess.CompletedProcess:
        """``pydvm run -n 1 pydvm ARGS...`` as ``user``: one in-job command."""
        return self.as_user(user, "run", "-n", "1", "pydvm", *args, **kw)

    def store(self, user: str | None = None) -> dict:
        p = self.as_user(user, "store", "--json")
        assert p.returncode == 0, p.stderr
        return {s["store"]: s for s in json.loads(p.stdout)["stores"]}


def start_multi_user(tmp: Path, python: str, env: dict | None = None, **mca) -> MultiUserDvm:
    """A multi-user DVM of nodes a and b (no head node unless ``mca`` names
    one), started by root with ``env`` over this environment.  A multi-user
    DVM is the machine's PMIx system server by default, its file in the
    system tmpdir: unless ``env`` gives the DVM a ``TMPDIR`` of its own, it
    writes that file in a directory of its own (``PMIX_SYSTEM_TMPDIR``), so
    that DVMs of other tests and checkouts running meanwhile never find it."""
    given = env or {}
    env = dict(os.environ)
    env["PYDVM_STATE_DIR"] = str(tmp / "state")
    env.pop("PYDVM_URI", None)
    env.pop("PMIX_SYSTEM_TMPDIR", None)
    if "TMPDIR" not in given:
        (tmp / "systmp").mkdir()
        env["PMIX_SYSTEM_TMPDIR"] = str(tmp / "systmp")
    env.update(given)
    args = [python, "-m", "pydvm", "start", "--daemonize", "--multi-user", "--hosts", "a,b",
            "--log-dir", str(tmp / "logs")]
    for k, v in mca.items():
        args += ["--mca", k, str(v)]
    p = subprocess.run(args, capture_output=True, text=True, timeout=60, env=env, cwd="/tmp")
    assert p.returncode == 0, p.stderr
    return MultiUserDvm(p.stdout.strip(), python, tmp / "logs", env)


@pytest.fixture
def mudvm(tmp_path, mu_python, users):
    d = start_multi_user(tmp_path, mu_python)
    try:
        yield d
    finally:
        _stop(d)


@pytest.fixture
def make_mudvm(tmp_path, mu_python, users):
    made = []

    def make(env: dict | None = None, **mca):
        sub = tmp_path / f"dvm{len(made)}"
        sub.mkdir()
        made.append(start_multi_user(sub, mu_python, env, **mca))
        return made[-1]

    try:
        yield make
    finally:
        for d in made:
            _stop(d)


def _stop(d: MultiUserDvm) -> None:
    p = d.as_user(None, "info")
    pids = []
    if p.returncode == 0:
        code = ("import asyncio, json; from pydvm.cli.tool import call, resolve_uri;"
                "r = asyncio.run(call(resolve_uri(None), {'t': 'info'}));"
                "print(json.dumps([r['pid'], *r['daemon_pids'].values()]))")
        q = subprocess.run([d.python, "-c", code], capture_output=True, text=True, timeout=30,
                           env={**d.root_env, "PYDVM_URI": d.uri}, cwd="/tmp")
        if q.returncode == 0:
            pids = json.loads(q.stdout)
    d.as_user(None, "stop", timeout=60)
    wait_for(lambda: not any(pid_alive(p) for p in pids), timeout=20, what="the DVM to exit")


@pytest.fixture
def readable_script():
    """Factory: ``write(text)`` puts a script where every test user can read
    it and returns its path; the directory goes at the end of the test."""
    made = []

    def write(text: str) -> str:
        shared = Path(tempfile.mkdtemp(prefix="pydvm-probe-"))
        made.append(shared)
        path = shared / "probe.py"
        path.write_text(text)
        os.chmod(shared, 0o755)
        os.chmod(path, 0o644)
        return str(path)

    yield write
    for d in made:
        shutil.rmtree(d, ignore_errors=True)
