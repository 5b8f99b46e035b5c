"""The state machine's verdict depends on its steps, never on the clock.

pytest-timeout's default method raises pytest's ``Failed`` inside whatever
runs when the limit passes; Hypothesis catches ``Failed`` as the test
failing, so a loaded machine once turned the suite's 120 s limit into a
"falsifying example" of no steps (``state = StoreMachine();
state.teardown()``).  ``tests/conftest.py`` gives Hypothesis tests the
``thread`` method and a pure one a limit that only a hang reaches; this
runs the real state machine under a limit far below its run time.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: pytest-timeout's limit for the run below: well under the state machine's run time.
LIMIT = 1.0


@pytest.mark.timeout(600)
def test_the_state_machine_passes_whatever_the_per_test_time_limit():
    t0 = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
         "--timeout", str(LIMIT),
         "tests/store/test_properties.py::TestStoreKeepsEveryRuleUnderRandomOperations"],
        cwd=REPO, capture_output=True, text=True, timeout=580)
    took = time.monotonic() - t0
    tail = "\n".join(ln for ln in p.stdout.splitlines() if "WARNING" not in ln)[-3000:]
    assert took > LIMIT, f"ran in {took:.1f}s: the limit was never reached, this proves nothing"
    assert p.returncode == 0, tail
    assert "state.teardown()" not in p.stdout and "1 passed" in p.stdout, tail
