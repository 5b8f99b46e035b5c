"""Waiting lookups end to end (SPEC 4, lookup with wait): parked in the master
store, woken by a publish relayed through another daemon, or ended by their timeout."""

from __future__ import annotations

import time

import pytest

from dvmkit import finish, lines, status, wait_for

pytestmark = pytest.mark.e2e


def _parked(dvm) -> int:
    return dvm.store()["master"]["parked"]


def test_waiting_lookup_on_one_daemon_is_answered_by_a_publish_on_another(dvm):
    """`lookup --wait --timeout 20` on b parks; a publish from a on a later job answers it."""
    bg = dvm.run_bg("--host", "b", "-n", "1", "pydvm", "lookup", "wk", "--wait",
                    "--timeout", "20")
    try:
        wait_for(lambda: _parked(dvm) >= 1, timeout=20, interval=0.1,
                 what="the lookup to park in the master store")
        assert bg.poll() is None, "the waiting lookup returned before anything was published"
        p = dvm.run("--host", "a", "-n", "1", "sh", "-c",
                    'echo "NS $PYDVM_NSPACE"; exec pydvm publish wk=hello')
        assert lines(p, "PUBLISHED") == ["PUBLISHED wk"], p.stdout + p.stderr
        ns = lines(p, "NS ")[0].split()[1]
        rc = finish(bg, 20)
    finally:
        if bg.poll() is None:
            bg.kill()
            bg.wait(10)
    out = bg.stdout.read()
    assert rc == 0, out + bg.stderr.read()
    assert [ln for ln in out.splitlines() if ln.startswith("FOUND")] == \
        [f"FOUND wk hello from {ns}:0"], out
    assert out.strip().endswith("STATUS PMIX_SUCCESS"), out
    assert _parked(dvm) == 0


def test_waiting_lookup_ends_with_timeout_after_its_timeout(dvm):
    """`lookup K --wait --timeout 1`: PMIX_ERR_TIMEOUT, exit 1, after >= 1 s and promptly."""
    t0 = time.monotonic()
    p = dvm.run("--host", "b", "-n", "1", "pydvm", "lookup", "never", "--wait",
                "--timeout", "1", timeout=30)
    elapsed = time.monotonic() - t0
    assert status(p) == "PMIX_ERR_TIMEOUT", p.stdout + p.stderr
    assert lines(p, "FOUND") == []
    assert p.returncode == 1
    assert 1.0 <= elapsed < 15.0, elapsed
    assert _parked(dvm) == 0


def test_wait_count_lookup_returns_once_that_many_keys_are_published(dvm):
    """`lookup w1 w2 --wait-count 1` returns with w2 (partial) once w2 alone is published."""
    bg = dvm.run_bg("--host", "c", "-n", "1", "pydvm", "lookup", "w1", "w2", "--wait-count",
                    "1", "--timeout", "20")
    try:
        wait_for(lambda: _parked(dvm) >= 1, timeout=20, interval=0.1,
                 what="the lookup to park in the master store")
        p = dvm.run("--host", "a", "-n", "1", "pydvm", "publish", "w2=two",
                    "--persistence", "session")
        assert lines(p, "PUBLISHED") == ["PUBLISHED w2"], p.stdout + p.stderr
        rc = finish(bg, 20)
    finally:
        if bg.poll() is None:
            bg.kill()
            bg.wait(10)
    out = bg.stdout.read()
    found = [ln for ln in out.splitlines() if ln.startswith("FOUND")]
    assert len(found) == 1 and found[0].startswith("FOUND w2 two from "), out
    assert out.strip().endswith("STATUS PMIX_ERR_PARTIAL_SUCCESS"), out
    assert rc == 1  # not PMIX_SUCCESS: one of the two keys is missing
    assert _parked(dvm) == 0
