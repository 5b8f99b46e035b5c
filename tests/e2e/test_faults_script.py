"""bench/faults/faults.py's quick cases, as CI runs them: every fault held.

``python bench/faults/faults.py --quick`` freezes a daemon (SIGSTOP, then SIGCONT),
sends big frames to the master's port as a stranger, and SIGTERMs a ``pydvm
run`` whose processes ignore it; it prints a table and ``faults N of M
held``.  The lossy-link and descriptor-storm cases are left to the full run
(see docs/benchmarks.md, "Fault runs").
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "faults" / "faults.py"
#: Bound on the whole quick run (~20 s here).
TIMEOUT = 180


@pytest.mark.skipif(os.geteuid() != 0,
                    reason="bench/faults/faults.py needs root (CI runs as root)")
def test_quick_fault_cases_all_hold():
    p = subprocess.run([sys.executable, str(SCRIPT), "--quick"], capture_output=True, text=True,
                       timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    print(p.stdout)
    rows = [ln for ln in p.stdout.splitlines() if ln.startswith("| ") and "| case |" not in ln]
    assert len(rows) == 3, p.stdout + p.stderr
    assert all(r.rstrip().endswith("| held |") for r in rows), p.stdout + p.stderr
    assert p.stdout.splitlines()[-1] == "faults 3 of 3 held", p.stdout + p.stderr
    assert p.returncode == 0, p.stdout + p.stderr
