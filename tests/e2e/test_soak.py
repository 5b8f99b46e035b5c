"""A DVM running 150 jobs ends holding only what the retention rules keep (issue 8.11).

The 1,000-job version is ``python bench/memory/soak.py``; this runs the same driver
at the size the suite can afford and applies the same checks: every store
holds exactly the INDEF items and the one unread first-read token, nothing
is parked, the master's records are back to an idle DVM's (the default
session used to keep one history entry per job for ever), and the master's
RSS after job 150 is within 10 % of its value after job 100.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "memory"))

import soak  # noqa: E402

pytestmark = pytest.mark.e2e


def test_150_jobs_leave_only_indef_and_unread_items_and_bounded_records(tmp_path):
    out = soak.soak(150, every=50, workdir=str(tmp_path))
    assert not out["problems"], out["problems"]
    assert out["records"]["session_history"] == 0
    master = next(s for s in out["stores"] if s["store"] == "master")
    assert master["items"] == 16  # 15 INDEF (every tenth job) + the last token
