"""Fixtures for end-to-end tests: each starts a real DVM with local daemons."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from dvmkit import Dvm, job_script, start_dvm  # noqa: E402
from rawpeers import HeldJob  # noqa: E402


@pytest.fixture
def dvm(tmp_path) -> Dvm:
    """A fresh DVM with three local daemons a, b, c (default parameters)."""
    d = start_dvm(tmp_path)
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
def make_dvm(tmp_path):
    """Factory for DVMs with chosen hosts and --mca parameters; all stopped at the end."""
    made: list[Dvm] = []

    def make(hosts: str = "a,b,c", **mca) -> Dvm:
        sub = tmp_path / f"dvm{len(made)}"
        sub.mkdir()
        d = start_dvm(sub, hosts, mca)
        made.append(d)
        return d

    try:
        yield make
    finally:
        for d in made:
            d.stop()


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
