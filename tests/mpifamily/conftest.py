"""Fixtures of the MPI-family kit (see kit.py): each MPI, installed on first use.

An MPI that cannot be installed here skips its tests with the reason (pip's
error, the Debian package to install); CI sets PYDVM_NO_SKIP=1, which makes
such a skip a failure.
"""

from __future__ import annotations

import pytest

from . import kit


@pytest.fixture(scope="session", params=kit.NAMES)
def mpi(request) -> kit.MPI:
    """Each MPI of the family in turn."""
    return kit.get_or_skip(request.param)


@pytest.fixture(scope="session", params=kit.PMI1_NAMES)
def pmi1_mpi(request) -> kit.MPI:
    """Each MPI that finds its launcher through PMI-1."""
    return kit.get_or_skip(request.param)


@pytest.fixture(scope="session")
def get_mpi():
    """``get_mpi(name)``: one MPI by name (skips saying why it is missing)."""
    return kit.get_or_skip
