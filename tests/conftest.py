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
                 "e2e/test_fuzz.py", "e2e/test_torch.py")


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


# ----------------------------------------------------------------------
# Hypothesis and the per-test timeout: a clock must not make a counterexample
# ----------------------------------------------------------------------

#: The limit of a pure Hypothesis test (no DVM, no I/O): its run time is
#: bounded by its example and step counts (seconds on an idle machine), so
#: the limit only detects a hang; a loaded machine merely stretches it.
HYPOTHESIS_HANG_LIMIT = 900.0


def is_hypothesis_test(item) -> bool:
    """A ``@given`` test, or the ``runTest`` of a state machine's TestCase
    (Hypothesis marks both)."""
    return bool(getattr(getattr(item, "obj", None), "is_hypothesis_test", False))


def pytest_collection_modifyitems(config, items):
    """Hypothesis tests get pytest-timeout's ``thread`` method.

    The default ``signal`` method raises pytest's ``Failed`` in whatever
    code runs when the limit passes, and Hypothesis catches ``Failed`` as the
    test failing: a loaded machine then turns a timeout into a "falsifying
    example" that replays as nothing -- the store's state machine once
    reported ``state = StoreMachine(); state.teardown()``, an empty step
    list whose teardown does nothing.  Whether a Hypothesis test passes must
    depend on its steps only.  With ``thread`` a timeout stops the test's
    process with a stack dump, reported as a timeout and never shrunk; and a
    pure Hypothesis test's limit is raised to :data:`HYPOTHESIS_HANG_LIMIT`,
    so only a hang -- not the machine's load -- can reach it.
    """
    for item in items:
        if not is_hypothesis_test(item):
            continue
        own = item.get_closest_marker("timeout")
        limit = (own.kwargs.get("timeout", own.args[0] if own.args else None)
                 if own is not None else None)
        if limit is None and item.get_closest_marker("e2e") is None:
            limit = max(HYPOTHESIS_HANG_LIMIT, float(config.getini("timeout") or 0))
        item.add_marker(pytest.mark.timeout(limit, method="thread"))
