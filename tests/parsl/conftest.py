"""Fixtures of the Parsl tests here: a DVM of two local nodes, and a small
MPI program built with each MPI family Debian ships.

A test needing a system package (an MPI's compiler, libpmix) skips here
with the package to install; CI installs them all and sets
``PYDVM_NO_SKIP=1``, which turns such a skip into a failure."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
E2E = HERE.parent / "e2e"
sys.path.insert(0, str(E2E))
sys.path.insert(0, str(HERE.parent / "pmix"))
sys.path.insert(0, str(HERE))

from dvmkit import start_dvm  # noqa: E402
from parslkit import apps_env, build_or_skip  # noqa: E402


@pytest.fixture(scope="module")
def mpi_sum(tmp_path_factory):
    """``mpi_sum(family)``: the program built with that family's mpicc, once."""
    out = tmp_path_factory.mktemp("mpi_sum")
    built: dict[str, str] = {}

    def get(family: str) -> str:
        if family not in built:
            built[family] = build_or_skip(family, out)
        return built[family]

    return get


@pytest.fixture(scope="module")
def dvm2(tmp_path_factory):
    """A DVM of two local nodes of two slots, ``a`` and ``b``, serving PMIx
    (Open MPI) and PMI-1 (MPICH)."""
    with start_dvm(tmp_path_factory.mktemp("parsl-dvm2"), "a:2,b:2",
                   {"pydvm_pmix": "on", "pydvm_pmix_isolate": "auto"}) as d:
        yield d


@pytest.fixture
def on_dvm(dvm2, monkeypatch, tmp_path):
    """The test runs against ``dvm2`` (``$PYDVM_URI``), as :func:`apps_env` says."""
    monkeypatch.setenv("PYDVM_STATE_DIR", dvm2.env["PYDVM_STATE_DIR"])
    monkeypatch.setenv("PYDVM_URI", dvm2.uri)
    apps_env(monkeypatch, tmp_path)
    return dvm2

