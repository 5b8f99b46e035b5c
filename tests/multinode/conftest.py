"""Fixtures for the multi-node suite: DVMs whose daemons live on separate test hosts.

Each test host is a network namespace (see hostnet.py); the master listens on
the bridge address and the daemons are started by the real ``ssh`` launcher
with ``plm_ssh_agent "ip netns exec"``.  The ``dvm`` and ``make_dvm`` fixtures
here override the end-to-end suite's ones, so the multi-daemon cases of
``tests/e2e`` re-run unchanged over hosts named ``a``, ``b``, ``c``.

Where namespaces cannot be created (not root, no iproute2) every test here is
skipped with that reason in the output.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "e2e"))

import dvmkit  # noqa: E402
from hostnet import HostNet, start_net_dvm, unavailable_reason  # noqa: E402

_REASON = unavailable_reason()


@pytest.fixture
def hostnet(tmp_path):
    """Three test hosts named a, b, c on a private bridge."""
    if _REASON:
        pytest.skip(f"multi-node tests need test hosts: {_REASON}")
    with HostNet(3, want=["a", "b", "c"]) as net:
        yield net


@pytest.fixture
def dvm(tmp_path, hostnet) -> dvmkit.Dvm:
    with start_net_dvm(tmp_path, hostnet) as d:
        yield d


@pytest.fixture
def make_dvm(tmp_path, hostnet):
    def start(sub: Path, hosts: str = "a,b,c", **mca) -> dvmkit.Dvm:
        if sub.name != "dvm0":  # one DVM per set of test hosts: node names must be unique
            raise AssertionError("make_dvm over test hosts supports one DVM per test")
        return start_net_dvm(sub, hostnet, hosts.split(","), mca)

    with dvmkit.dvm_factory(tmp_path, start) as make:
        yield make


def in_host(net: HostNet, name: str, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """Run a command inside test host ``name``."""
    return subprocess.run(["ip", "netns", "exec", name, *argv], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ))
