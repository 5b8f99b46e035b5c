"""Fixtures for end-to-end tests: each starts a real DVM with local daemons."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from dvmkit import Dvm, dvm_factory, job_script, start_dvm  # noqa: E402
from rawpeers import HeldJob  # noqa: E402


@pytest.fixture
def dvm(tmp_path) -> Dvm:
    """A fresh DVM with three local daemons a, b, c (default parameters)."""
    with start_dvm(tmp_path) as d:
        yield d


@pytest.fixture
def make_dvm(tmp_path):
    """Factory for DVMs with chosen hosts and --mca parameters; all stopped at the end."""
    with dvm_factory(tmp_path, lambda sub, hosts="a,b,c", **mca: start_dvm(sub, hosts, mca)) \
            as make:
        yield make


@pytest.fixture
def held(dvm, tmp_path):
    """A running job holding a client connection open on its daemon."""
    go = tmp_path / "go"
    proc = dvm.run_bg("-n", "1", *job_script("hold_client"), str(go))
    job = HeldJob(proc, go)
    try:
        _, job.server, job.nspace, rank, job.node = job.line("READY").split()
        job.rank = int(rank)
        yield job
    finally:
        job.kill()
