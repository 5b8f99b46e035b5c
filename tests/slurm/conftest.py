"""Fixtures for tests that need a real Slurm cluster (see cluster.py).

``slurm_cluster`` is module-scoped: one 3-node cluster (sn1..sn3) per test
module.  Bring-up takes about 1.5 s and tear-down well under 1 s, so a fresh
cluster per module costs little and keeps modules independent (a module that
kills a node or changes the cluster's state cannot break another); sharing it
between the tests of a module keeps the suite fast.  Tests that share it
must leave the queue empty: :func:`slurm` (the per-test view of the module's
cluster) cancels whatever a test left behind and fails that test if nodes
are not idle again.

``make_slurm_cluster`` builds extra, short-lived clusters with their own
names (``tag`` and ``prefix``), for tests that break nodes, need different
slurm.conf settings, or check bring-up and tear-down themselves.

Where a cluster cannot be made (not root, Slurm/munge not installed) every
test using these fixtures is skipped with the reason, unless
``PYDVM_REQUIRE_SLURM=1`` is set (CI sets it once it installs the packages):
then they fail instead, so a broken CI set-up cannot hide behind skips.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

from cluster import SlurmCluster, need_cluster, unavailable_reason  # noqa: E402

_REASON = unavailable_reason()


def _need_cluster() -> None:
    need_cluster()


@pytest.fixture(scope="module")
def slurm_cluster():
    """A running 3-node cluster shared by the tests of one module."""
    _need_cluster()
    with SlurmCluster() as c:
        yield c


@pytest.fixture
def slurm(slurm_cluster):
    """The module's cluster, checked clean after each test."""
    yield slurm_cluster
    leftover = {j: st for j, st in slurm_cluster.jobs().items() if st != "COMPLETING"}
    slurm_cluster.cancel_all()
    slurm_cluster.wait_idle(30)
    assert not leftover, f"test left jobs in the queue: {leftover}"


def _factory():
    _need_cluster()
    made: list[SlurmCluster] = []

    def make(**kw) -> SlurmCluster:
        c = SlurmCluster(**kw)
        made.append(c)
        c.__enter__()
        return c

    try:
        yield make
    finally:
        for c in made:
            c.down()


@pytest.fixture
def make_slurm_cluster():
    """Factory for extra clusters, torn down after the test:
    ``make_slurm_cluster(tag=8, prefix="sx", slurmd_timeout=5, ...)``.
    Give each its own ``tag`` (subnet, links) and ``prefix`` (node names)."""
    yield from _factory()


@pytest.fixture(scope="module")
def make_slurm_cluster_module():
    """Like make_slurm_cluster, torn down after the module."""
    yield from _factory()
