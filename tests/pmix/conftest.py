"""Fixtures for the PMIx binding tests: the real libpmix, real processes.

Tests skip (with the reason) only when a prerequisite is missing: libpmix
(Debian: libpmix2), its headers and gcc for the C clients (libpmix-dev,
gcc), mpicc and Open MPI (openmpi-bin, libopenmpi-dev), mpi4py
(python3-mpi4py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

from cbuild import (build_pmix_ops, find_mpi4py_python, mpicc_builder,  # noqa: E402
                    require_libpmix)

CLIENTS = HERE / "clients"
HARNESS = HERE / "harness.py"


def pytest_collection_modifyitems(items):
    for item in items:
        if str(item.fspath).startswith(str(HERE)):
            item.add_marker(pytest.mark.pmix)


@pytest.fixture(scope="session")
def libpmix():
    return require_libpmix()


@pytest.fixture(scope="session")
def build_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("pmix-build")


@pytest.fixture(scope="session")
def pmix_ops(libpmix, build_dir):
    """The scriptable C client (tests/pmix/clients/pmix_ops.c), built with gcc -lpmix."""
    return build_pmix_ops(build_dir)


@pytest.fixture(scope="session")
def mpicc_build(libpmix, build_dir):
    """Build an Open MPI C client by name (clients/<name>.c) with mpicc."""
    return mpicc_builder(build_dir, CLIENTS)


@pytest.fixture(scope="session")
def mpi4py_python(libpmix):
    """A Python interpreter that has mpi4py (this one, else Debian's /usr/bin/python3)."""
    return find_mpi4py_python()


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
