"""What the command line says in the places a first-time user stumbles on.

Each test runs the real ``pydvm`` on real DVMs and checks what it prints
and how it exits: a lookup's ``--timeout 0`` (as PMIx: no limit), the
summary of a Ctrl-C'd run whose processes had failed, and a misspelt
``PRTE_MCA_`` variable on a one-shot run.  (What needs no DVM -- usage
errors, commands given no DVM -- is in ``tests/test_cli_usage.py``.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from dvmkit import CMD_TIMEOUT, PYDVM, finish, wait_for

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


def _flat(text: str) -> str:
    return " ".join(text.split())


def _parked(dvm) -> int:
    return sum(s.get("parked", 0) for s in dvm.store().values())


def test_lookup_timeout_0_means_no_limit_as_help_and_cli_page_say(dvm):
    """`lookup --wait --timeout 0` waits until the key comes (PMIX_TIMEOUT 0: no
    limit), and `lookup --help` and the command line page (docs/cli.md) say so."""
    assert "0, as PMIx's PMIX_TIMEOUT 0, means no limit" in _flat(dvm.cmd("lookup",
                                                                         "--help").stdout)
    assert "`--timeout 0` waits as long as no `--timeout` does" in _flat(
        (REPO / "docs" / "cli.md").read_text())
    waiter = dvm.run_bg("-n", "1", "pydvm", "lookup", "late", "--wait", "--timeout", "0")
    try:
        wait_for(lambda: _parked(dvm) == 1 or waiter.poll() is not None, timeout=30,
                 what="the lookup to be parked")
        assert waiter.poll() is None, waiter.communicate()
        dvm.run("-n", "1", "pydvm", "publish", "late=now", "--persistence", "session",
                check=True)
        assert finish(waiter) == 0
    finally:
        if waiter.poll() is None:
            waiter.kill()
    out = waiter.stdout.read()
    assert "FOUND late now from " in out and "STATUS PMIX_SUCCESS" in out, out


def _job_failed(dvm) -> int:
    jobs = json.loads(dvm.cmd("ps", "--json", check=True).stdout)["jobs"]
    return max((j.get("failed") or 0 for j in jobs), default=0)


def test_ctrl_c_after_failures_reports_the_status_it_exits_with(dvm):
    """Two ranks die by SIGSEGV, a third runs on; Ctrl-C then ends the job and pydvm run
    exits 130 -- and its summary line says 130, not the first failure's 139."""
    script = 'if [ "$PYDVM_RANK" -lt 2 ]; then kill -SEGV $$; fi; exec sleep 60'
    proc = dvm.run_bg("-n", "3", "sh", "-c", script)
    try:
        wait_for(lambda: _job_failed(dvm) == 2 or proc.poll() is not None, timeout=30,
                 what="two ranks to fail")
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        code = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read()
    assert code == 130, err
    summary = [ln for ln in err.splitlines() if "of the job's processes failed" in ln]
    assert len(summary) == 1, err
    assert summary[0].endswith("so it exits with status 130"), summary
    assert "SIGINT" in summary[0] and "exits with status 139" not in err, err


def test_a_one_shot_run_warns_about_a_misspelt_prte_mca_variable(tmp_path):
    """PRTE_MCA_prte_data_server_timeuot=9 on a one-shot run: the job runs (the value
    is ignored) and stderr says so in one line naming the closest name."""
    env = {k: v for k, v in os.environ.items()
           if k != "PYDVM_URI" and not k.startswith("PRTE_MCA_")}
    env.update(PYDVM_STATE_DIR=str(tmp_path / "state"), PRTE_MCA_prte_data_server_timeuot="9")
    p = subprocess.run(PYDVM + ["run", "-n", "1", "echo", "ran"], env=env, capture_output=True,
                       text=True, timeout=CMD_TIMEOUT)
    assert p.returncode == 0 and p.stdout == "ran\n", p.stderr
    (line,) = [ln for ln in p.stderr.splitlines() if "PRTE_MCA_" in ln]
    assert "is not a pydvm parameter and is ignored" in line, line
    assert line.endswith("did you mean PRTE_MCA_prte_data_server_timeout?"), line
