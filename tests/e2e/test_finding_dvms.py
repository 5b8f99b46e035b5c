"""DVMs and data you can find (issue 11).

``pydvm dvms`` lists this user's running DVMs; a stale ``PYDVM_URI`` is
explained; a second ``export PYDVM_URI=$(pydvm start ...)`` warns naming the
first DVM, which stays findable; a one-shot ``pydvm run`` that throws away
data a persistent DVM would have kept says so.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from dvmkit import CMD_TIMEOUT, PYDVM, Dvm, pid_alive, start_dvm, wait_for

pytestmark = pytest.mark.e2e


def _pydvm(env: dict, *args: str, uri: str | None = None, stdin: str | None = None):
    e = dict(env)
    e.pop("PYDVM_URI", None)
    if uri:
        e["PYDVM_URI"] = uri
    return subprocess.run(PYDVM + list(args), env=e, capture_output=True, text=True,
                          timeout=CMD_TIMEOUT, input=stdin)


def _dvms(env: dict, uri: str | None = None) -> dict[str, dict]:
    p = _pydvm(env, "dvms", "--json", uri=uri)
    assert p.returncode == 0, p.stderr
    return {d["uri"]: d for d in json.loads(p.stdout)["dvms"]}


@pytest.fixture
def two_dvms(tmp_path):
    """Two DVMs of this user sharing one state directory."""
    state = tmp_path / "state"
    made: list[Dvm] = []
    for i, hosts in enumerate(("a,b", "c")):
        sub = tmp_path / f"dvm{i}"
        sub.mkdir()
        made.append(start_dvm(sub, hosts, state_dir=state))
    try:
        yield made
    finally:
        for d in made:
            d.stop()


def test_dvms_lists_each_running_dvm_with_uri_hosts_start_and_jobs(two_dvms):
    """Both DVMs are listed with their hosts and job counts; the one in PYDVM_URI is marked."""
    first, second = two_dvms
    got = _dvms(first.env, uri=first.uri)
    assert set(got) == {first.uri, second.uri}
    assert got[first.uri]["hosts"] == ["a", "b"] and got[second.uri]["hosts"] == ["c"]
    assert got[first.uri]["jobs"] == 0 and got[first.uri]["started"] > 0
    assert got[first.uri]["current"] and not got[second.uri]["current"]
    plain = _pydvm(first.env, "dvms", uri=first.uri)
    assert plain.stdout.splitlines()[0].split() == ["DVM", "URI", "HOSTS", "STARTED", "JOBS"]
    (row,) = [ln for ln in plain.stdout.splitlines() if first.uri in ln]
    assert row.rstrip().endswith("*") and " a,b " in row, plain.stdout
    assert _pydvm(first.env, "dvms", "-q").stdout.split() == \
        [d for d in (first.uri, second.uri)]


def test_dvms_counts_running_jobs(two_dvms):
    """A job holding on the first DVM makes its count 1."""
    first, _ = two_dvms
    bg = first.run_bg("-n", "1", "sleep", "60")
    try:
        wait_for(lambda: _dvms(first.env)[first.uri]["jobs"] == 1, timeout=20,
                 what="the job to be counted")
    finally:
        bg.kill()
        bg.wait(10)


def test_dvms_drops_records_of_dvms_that_died(two_dvms):
    """A DVM whose master was SIGKILLed leaves the list, and its record the state directory."""
    first, second = two_dvms
    os.kill(first.pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(first.pid), what="the killed master to go")
    wait_for(lambda: not any(pid_alive(p) for p in first.daemon_pids.values()),
             what="its daemons to follow it")
    assert set(_dvms(first.env)) == {second.uri}
    dvmid = first.uri.rsplit("/", 1)[1]
    state = first.env["PYDVM_STATE_DIR"]
    assert not os.path.exists(os.path.join(state, f"{dvmid}.json"))


def test_a_stale_pydvm_uri_is_explained_naming_the_variable_and_what_to_do(tmp_path):
    """After `pydvm stop`, commands using the old PYDVM_URI say so; run does not fall back."""
    dvm = start_dvm(tmp_path, "a")
    dvm.stop()
    for args in (("store",), ("ps",), ("run", "-n", "1", "sh", "-c", "echo RAN")):
        p = _pydvm(dvm.env, *args, uri=dvm.uri)
        assert p.returncode == 1, (args, p.stdout, p.stderr)
        assert "RAN" not in p.stdout
        first, hint = p.stderr.splitlines()
        assert first.startswith(f"pydvm: PYDVM_URI={dvm.uri}: ") and "not running" in first
        assert "unset PYDVM_URI" in hint and "pydvm dvms" in hint and "pydvm start" in hint
    # --dvm names the option instead of the variable.
    p = _pydvm(dvm.env, "store", "--dvm", dvm.uri)
    assert p.returncode == 1 and p.stderr.startswith(f"pydvm: --dvm {dvm.uri}: "), p.stderr


def test_a_malformed_pydvm_uri_is_a_usage_error_naming_the_variable(tmp_path):
    """PYDVM_URI=garbage: exit 2, the message names PYDVM_URI."""
    env = dict(os.environ, PYDVM_STATE_DIR=str(tmp_path / "state"))
    p = _pydvm(env, "ps", uri="garbage")
    assert p.returncode == 2 and p.stderr.startswith("pydvm: PYDVM_URI: not a pydvm URI"), \
        p.stderr


def test_starting_again_while_pydvm_uri_names_a_live_dvm_warns_naming_it(tmp_path):
    """`export PYDVM_URI=$(pydvm start)` twice: the second start prints only its URI on
    stdout, warns on stderr naming the first, and `pydvm dvms` lists both."""
    first = start_dvm(tmp_path, "a")
    try:
        p = _pydvm(first.env, "start", "--daemonize", "--hosts", "z", "--log-dir",
                   str(tmp_path / "logs2"), uri=first.uri)
        assert p.returncode == 0, p.stderr
        second_uri = p.stdout.strip()
        assert second_uri.startswith("tcp://") and len(p.stdout.splitlines()) == 1
        try:
            (warning,) = p.stderr.splitlines()
            assert warning.startswith("pydvm start: warning: PYDVM_URI names DVM ")
            assert first.uri in warning and "pydvm dvms" in warning
            assert set(_dvms(first.env)) == {first.uri, second_uri}
        finally:
            _pydvm(first.env, "stop", "--dvm", second_uri)
    finally:
        first.stop()


def test_one_shot_run_that_ends_holding_kept_data_warns_once_with_the_command(tmp_path):
    """No PYDVM_URI: a first-read publish is thrown away with the one-shot DVM -> one line."""
    env = dict(os.environ, PYDVM_STATE_DIR=str(tmp_path / "state"))
    p = _pydvm(env, "run", "-n", "1", "pydvm", "publish", "token=abc", "--persistence",
               "first-read")
    assert p.returncode == 0 and "STATUS PMIX_SUCCESS" in p.stdout, p.stderr
    (warning,) = p.stderr.splitlines()
    assert warning.startswith("pydvm run: warning: this one-shot DVM ended holding 1 key")
    assert "token (first-read)" in warning
    assert "export PYDVM_URI=$(pydvm start --daemonize)" in warning


def test_one_shot_run_whose_data_ends_with_the_job_anyway_prints_no_warning(tmp_path):
    """NSPACE items (the default) die with the job on any DVM: nothing is lost, nothing said."""
    env = dict(os.environ, PYDVM_STATE_DIR=str(tmp_path / "state"))
    p = _pydvm(env, "run", "-n", "1", "pydvm", "publish", "k=v")
    assert p.returncode == 0 and p.stderr == "", p.stderr


def test_one_shot_warning_counts_session_indef_and_local_items_on_nodes(tmp_path):
    """SESSION on the master and a LOCAL-range INDEF on a node store: both are counted."""
    env = dict(os.environ, PYDVM_STATE_DIR=str(tmp_path / "state"))
    p = _pydvm(env, "run", "-n", "1", "sh", "-c",
               "pydvm publish s=1 --persistence session && "
               "pydvm publish l=2 --persistence indef --range local")
    assert p.returncode == 0, p.stderr
    (warning,) = p.stderr.splitlines()
    assert "holding 2 keys" in warning and "s (session)" in warning \
        and "l (indef)" in warning, warning
