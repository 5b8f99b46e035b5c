"""Fixtures for the PMIx binding tests: the real libpmix, real processes.

Tests skip (with the reason) only when a prerequisite is missing: libpmix
(Debian: libpmix2), its headers and gcc for the C clients (libpmix-dev,
gcc), mpicc and Open MPI (openmpi-bin, libopenmpi-dev), mpi4py
(python3-mpi4py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
CLIENTS = HERE / "clients"
HARNESS = HERE / "harness.py"
PMIX_INCLUDE = "/usr/lib/x86_64-linux-gnu/pmix2/include"


def pytest_collection_modifyitems(items):
    for item in items:
        if str(item.fspath).startswith(str(HERE)):
            item.add_marker(pytest.mark.pmix)


@pytest.fixture(scope="session")
def libpmix():
    from pydvm import pmix
    ok, why, path = pmix.available()
    if not ok:
        pytest.skip(f"libpmix unusable: {why}")
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
    return tmp_path_factory.mktemp("pmix-build")


@pytest.fixture(scope="session")
def pmix_ops(libpmix, build_dir):
    """The scriptable C client (tests/pmix/clients/pmix_ops.c), built with gcc -lpmix."""
    if not shutil.which("gcc"):
        pytest.skip("gcc not installed (apt-get install gcc)")
    flags = _pmix_cflags()
    if not flags:
        pytest.skip("PMIx headers not found (apt-get install libpmix-dev)")
    exe = build_dir / "pmix_ops"
    r = subprocess.run(["gcc", "-O1", "-Wall", "-o", str(exe), str(CLIENTS / "pmix_ops.c"),
                        *flags], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return str(exe)


@pytest.fixture(scope="session")
def mpicc_build(libpmix, build_dir):
    """Build an Open MPI C client by name (clients/<name>.c) with mpicc."""
    if not shutil.which("mpicc"):
        pytest.skip("mpicc not installed (apt-get install libopenmpi-dev openmpi-bin)")
    built: dict[str, str] = {}

    def build(name: str) -> str:
        if name not in built:
            exe = build_dir / name
            r = subprocess.run(["mpicc", "-o", str(exe), str(CLIENTS / f"{name}.c")],
                               capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            built[name] = str(exe)
        return built[name]

    return build


@pytest.fixture(scope="session")
def mpi4py_python(libpmix):
    """A Python interpreter that has mpi4py (this one, else Debian's /usr/bin/python3)."""
    for py in (sys.executable, "/usr/bin/python3"):
        if py and os.path.exists(py):
            r = subprocess.run([py, "-c", "import mpi4py"], capture_output=True)
            if r.returncode == 0:
                return py
    pytest.skip("mpi4py not installed (apt-get install python3-mpi4py)")


#: What Open MPI 4.1 needs to accept a direct launch (see docs/pmix.md).
OMPI_DIRECT_LAUNCH_ENV = {"OMPI_MCA_schizo": "^orte"}


class HarnessResult:
    def __init__(self, report: dict, stderr: str):
        self.report = report
        self.stderr = stderr
        self.clients = {c["rank"]: c for c in report["clients"]}
        self.requests = report["requests"]

    def out(self, rank: int) -> list[str]:
        return self.clients[rank]["stdout"].splitlines()

    def lines(self, rank: int, prefix: str) -> list[str]:
        return [l for l in self.out(rank) if l.startswith(prefix)]

    def kinds(self, kind: str) -> list[dict]:
        return [r for r in self.requests if r["kind"] == kind]

    def ok(self) -> "HarnessResult":
        for rank, c in self.clients.items():
            assert c["rc"] == 0, f"rank {rank} rc={c['rc']}\n{c['stdout']}\n{c['stderr']}"
        return self


@pytest.fixture
def harness(tmp_path):
    """Run tests/pmix/harness.py with a spec; return a HarnessResult."""

    def run(spec: dict, *, env: dict | None = None, timeout: float = 60) -> HarnessResult:
        spec = dict(spec)
        spec.setdefault("tmpdir", str(tmp_path / "srv"))
        path = tmp_path / f"spec{len(list(tmp_path.glob('spec*.json')))}.json"
        path.write_text(json.dumps(spec))
        full_env = dict(os.environ)
        full_env.update(env or {})
        r = subprocess.run([sys.executable, str(HARNESS), str(path)], capture_output=True,
                           text=True, timeout=timeout, env=full_env)
        reports = [l for l in r.stdout.splitlines() if l.startswith("REPORT ")]
        assert r.returncode == 0 and reports, f"harness failed rc={r.returncode}\n{r.stderr}"
        return HarnessResult(json.loads(reports[-1][7:]), r.stderr)

    return run
