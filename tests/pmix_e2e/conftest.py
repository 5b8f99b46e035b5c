"""Fixtures for PMIx and MPI programs run by ``pydvm run`` on real DVMs.

Every test here runs unchanged PMIx C programs (built with gcc ``-lpmix``),
Open MPI 4.1 programs (mpicc) or mpi4py scripts as jobs of a real DVM whose
nodes host libpmix servers: the head node (served by the master process)
and a daemon node ``far`` on this machine.  They skip, naming the package,
only where libpmix, gcc and the PMIx headers, mpicc or mpi4py are missing
(CI installs all of them and turns a skip into a failure).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
CLIENTS = HERE / "clients"
PMIX_CLIENTS = HERE.parent / "pmix" / "clients"
sys.path.insert(0, str(HERE.parent / "e2e"))

import dvmkit  # noqa: E402

PMIX_INCLUDE = "/usr/lib/x86_64-linux-gnu/pmix2/include"
HEAD = socket.gethostname()
FAR = "far"
#: the two ways a node is served: by the master process, or by a daemon.
NODES = {"head": HEAD, "daemon": FAR}


def pytest_collection_modifyitems(items):
    for item in items:
        if str(item.fspath).startswith(str(HERE)):
            item.add_marker(pytest.mark.pmix)
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def libpmix():
    from pydvm import pmix
    ok, why, _ = pmix.available()
    if not ok:
        pytest.skip(f"libpmix unusable (apt-get install libpmix2): {why}")
    return why


def _pmix_cflags() -> list[str]:
    try:
        out = subprocess.run(["pkg-config", "--cflags", "--libs", "pmix"], capture_output=True,
                             text=True, check=True).stdout.split()
        if out:
            return out
    except (OSError, subprocess.CalledProcessError):
        pass
    if os.path.exists(os.path.join(PMIX_INCLUDE, "pmix.h")):
        return [f"-I{PMIX_INCLUDE}", "-lpmix"]
    return []


@pytest.fixture(scope="session")
def build_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("pmix-e2e-build")


@pytest.fixture(scope="session")
def pmix_ops(libpmix, build_dir):
    """tests/pmix/clients/pmix_ops.c: one PMIx operation per argument."""
    if not shutil.which("gcc"):
        pytest.skip("gcc not installed (apt-get install gcc)")
    flags = _pmix_cflags()
    if not flags:
        pytest.skip("PMIx headers not found (apt-get install libpmix-dev)")
    exe = build_dir / "pmix_ops"
    r = subprocess.run(["gcc", "-O1", "-Wall", "-o", str(exe), str(PMIX_CLIENTS / "pmix_ops.c"),
                        *flags], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return str(exe)


@pytest.fixture(scope="session")
def mpicc(libpmix, build_dir):
    """Build an Open MPI C program by name (clients/<name>.c here, else tests/pmix/clients)."""
    if not shutil.which("mpicc"):
        pytest.skip("mpicc not installed (apt-get install libopenmpi-dev openmpi-bin)")
    built: dict[str, str] = {}

    def build(name: str) -> str:
        if name not in built:
            src = CLIENTS / f"{name}.c"
            if not src.exists():
                src = PMIX_CLIENTS / f"{name}.c"
            exe = build_dir / name
            r = subprocess.run(["mpicc", "-o", str(exe), str(src)], capture_output=True,
                               text=True)
            assert r.returncode == 0, r.stderr
            built[name] = str(exe)
        return built[name]

    return build


@pytest.fixture(scope="session")
def mpi4py_python(libpmix):
    """A Python that has mpi4py (Debian's /usr/bin/python3 with python3-mpi4py)."""
    for py in (sys.executable, "/usr/bin/python3"):
        if py and os.path.exists(py):
            r = subprocess.run([py, "-c", "import mpi4py"], capture_output=True)
            if r.returncode == 0:
                return py
    pytest.skip("mpi4py not installed (apt-get install python3-mpi4py)")


@pytest.fixture(scope="module")
def pdvm(tmp_path_factory, libpmix):
    """One DVM for a module: the head node (this machine's name) and daemon node ``far``."""
    tmp = tmp_path_factory.mktemp("pdvm")
    d = dvmkit.start_dvm(tmp, f"{HEAD}:4,{FAR}:4", {"pydvm_pmix": "on"})
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
def make_pdvm(tmp_path, libpmix):
    """Factory for DVMs with their own parameters (same two nodes); stopped at the end."""
    made: list[dvmkit.Dvm] = []

    def make(**mca) -> dvmkit.Dvm:
        sub = tmp_path / f"dvm{len(made)}"
        sub.mkdir()
        d = dvmkit.start_dvm(sub, f"{HEAD}:4,{FAR}:4", {"pydvm_pmix": "on", **mca})
        made.append(d)
        return d

    try:
        yield make
    finally:
        for d in made:
            d.stop()


def statuses(out: str, prefix: str) -> list[int]:
    """The ``status=N`` of every line starting with ``prefix``."""
    return [int(re.search(r"status=(-?\d+)", ln).group(1))
            for ln in out.splitlines() if ln.startswith(prefix)]


def found(out: str) -> dict[str, tuple[int, str, str]]:
    """FOUND lines of pmix_ops -> {key: (type code, value, publisher)}."""
    got = {}
    for ln in out.splitlines():
        m = re.match(r"FOUND key=(\S+) proc=(\S+) type=(\d+) value=(.*)$", ln)
        if m:
            got[m.group(1)] = (int(m.group(3)), m.group(4), m.group(2))
    return got
