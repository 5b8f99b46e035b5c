"""Suite-wide rule: where every system dependency is installed, nothing may skip.

Parts of the suite skip, with the reason, when what they need is missing
here (root, iproute2, libpmix, Open MPI, Slurm...).  CI installs all of it
and sets ``PYDVM_NO_SKIP=1``: there a skip would hide a missing package or a
broken set-up, so every skip is reported as a failure instead.
"""

from __future__ import annotations

import os

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get("PYDVM_NO_SKIP") == "1" and not hasattr(report,
                                                                                 "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped where nothing may skip (PYDVM_NO_SKIP=1): {reason}"


# ----------------------------------------------------------------------
# Parallel runs (pytest-xdist): what must not overlap
# ----------------------------------------------------------------------

#: Parts that use machine-wide resources run as one unit each, on one worker,
#: in order: test hosts named a/b/c (network namespaces), the users the suite
#: creates, the Slurm cluster.  Different units use different namespace
#: names and subnets (see their hostnet/cluster modules), so they may overlap.
SERIAL_DIRS = ("multinode", "multiuser", "slurm")
#: Modules whose module- or session-scoped fixtures are costly (a DVM, a
#: cluster, compiled clients, test hosts): kept on one worker so they are set
#: up once.
WHOLE_MODULES = ("pmix", "pmix_e2e", "e2e/test_snippets.py", "e2e/test_hardening.py",
                 "e2e/test_fuzz.py")


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its directory or module, else itself."""
    path = nodeid.split("::", 1)[0]
    rel = path[len("tests/"):] if path.startswith("tests/") else path
    top = rel.split("/", 1)[0]
    if top in SERIAL_DIRS:
        return top
    if top in WHOLE_MODULES or rel in WHOLE_MODULES:
        return rel
    return nodeid


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Hand out whole units (:func:`unit_of`) to workers, the rest test by test."""
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return UnitScheduling(config, log)
