"""The head node: served by the master process itself, with the same rules.

Node ``a`` of these DVMs is the head node (``pydvm_head_node=a``): its
clients, processes and node store are handled inside the master process, one
hop from the master store; ``b`` and ``c`` keep their daemons.  The
end-to-end cases below are imported unchanged from the other modules and run
again here, so every rule they check holds for a head-node client too (and
between head-node and daemon clients); the tests at the end are about the
head node itself.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from dvmkit import LineReader, dvm_factory, finish, pid_alive, start_dvm, wait_for
from test_jobs import (  # noqa: F401
    test_ctrl_c_on_run_kills_the_job_and_exits_130,
    test_job_exit_status_is_the_process_status_or_128_plus_the_signal,
    test_mpmd_app_contexts_have_their_app_idx_hosts_and_ranks_numbered_across_the_job,
    test_stdout_and_stderr_are_forwarded_line_by_line_tagged_with_nspace_and_rank,
)
from test_liveness import (  # noqa: F401
    test_a_cancelled_waiting_lookup_is_withdrawn_from_its_store,
    test_a_lingering_child_cannot_act_for_its_reaped_process,
    test_lingering_children_are_ended_with_their_job,
    test_one_connection_may_hold_at_most_its_cap_of_waiting_lookups,
)
from test_lookup_rules import (  # noqa: F401
    test_duplicate_publish_is_refused_unless_replace,
    test_item_restricted_to_another_uid_is_refused_to_us_but_we_own_and_may_unpublish_it,
    test_local_range_item_is_held_by_its_daemon_and_seen_only_from_its_node,
    test_lookup_of_one_found_and_one_missing_key_is_partial_success,
)
from test_retention import (  # noqa: F401
    test_app_item_goes_with_its_application_while_nspace_item_stays_until_job_end,
    test_first_read_item_survives_its_publishers_job_and_goes_with_the_first_read,
    test_local_app_item_goes_with_its_application_while_another_app_runs_on_its_node,
    test_nspace_item_survives_an_early_finishing_daemons_share_of_the_job,
    test_one_uids_flood_at_the_cap_evicts_its_own_oldest_items,
    test_proc_item_goes_when_its_process_exits_while_a_sibling_runs,
    test_session_item_survives_its_job_and_goes_when_the_session_ends,
    test_unpublish_without_keys_removes_everything_the_calling_process_published,
)
from test_smoke import (  # noqa: F401
    test_job_ranks_spread_over_hosts_by_default_mapping,
    test_publish_on_one_node_is_found_from_another,
)
from test_waiting import (  # noqa: F401
    test_wait_count_lookup_returns_once_that_many_keys_are_published,
    test_waiting_lookup_ends_with_timeout_after_its_timeout,
    test_waiting_lookup_on_one_daemon_is_answered_by_a_publish_on_another,
)

pytestmark = pytest.mark.e2e

HEAD = {"pydvm_head_node": "a"}


@pytest.fixture
def dvm(tmp_path):
    """Nodes a, b, c; a is served by the master process."""
    with start_dvm(tmp_path, "a,b,c", HEAD) as d:
        yield d


def _start_headed(sub, hosts: str = "a,b,c", **mca):
    """A DVM whose first host is its head node."""
    return start_dvm(sub, hosts, {"pydvm_head_node": hosts.split(",")[0], **mca})


@pytest.fixture
def make_dvm(tmp_path):
    with dvm_factory(tmp_path, _start_headed) as make:
        yield make


def test_head_node_clients_are_served_inside_the_master_process(dvm):
    """Node a has no daemon process; its client socket belongs to the master
    process, and `pydvm info` says so."""
    assert "a" not in dvm.daemon_pids and {"b", "c"} <= set(dvm.daemon_pids)
    p = dvm.run("--host", "a", "-n", "1", "sh", "-c",
                'echo "$(cat "$(dirname "$PYDVM_SERVER")/owner")"; '
                'pydvm publish onhead=1 --persistence session')
    assert p.returncode == 0, p.stderr
    owner_pid = int(p.stdout.split()[0])
    assert owner_pid == dvm.pid
    assert "head node a: served by the master process" in dvm.cmd("info").stdout
    q = dvm.run("--host", "c", "-n", "1", "pydvm", "lookup", "onhead")
    assert "FOUND onhead 1 from " in q.stdout


def test_sigkilled_master_takes_the_head_nodes_job_processes_along(tmp_path):
    """kill -9 of the master: the head node's job processes and their children
    die with it (parent-death signal and the master's guardian), and the other
    nodes' daemons follow."""
    dvm = start_dvm(tmp_path, "a,b", {**HEAD, "pydvm_heartbeat_interval": "0.5"})
    job = dvm.run_bg("--host", "a", "-n", "1", "sh", "-c", 'sleep 300 & echo PIDS $$ $!; wait')
    reader = LineReader(job.stdout)
    try:
        pids = [int(x) for x in reader.wait_line("PIDS").split()[1:]]
        os.kill(dvm.pid, signal.SIGKILL)
        wait_for(lambda: not any(pid_alive(p) for p in pids + [dvm.daemon_pids["b"]]),
                 timeout=15, what="the head node's processes and b's daemon to exit")
        base = Path(f"/tmp/pydvm-{os.getuid()}")
        dvmid = dvm.uri.rsplit("/", 1)[1]
        wait_for(lambda: not list(base.glob(f"{dvmid}-*")), timeout=10,
                 what="the socket directories to be removed")
    finally:
        finish(job)
        dvm.stop()


def test_one_shot_run_serves_its_only_node_in_the_master(tmp_path):
    """A one-shot `pydvm run` has one node, named like this machine: the head
    node.  Its clients reach the master store in one hop (no daemon exists)."""
    import subprocess
    import sys

    env = dict(os.environ)
    env.pop("PYDVM_URI", None)
    env["PYDVM_STATE_DIR"] = str(tmp_path / "state")
    p = subprocess.run([sys.executable, "-m", "pydvm", "run", "-n", "2", "sh", "-c",
                        'echo "$(cat "$(dirname "$PYDVM_SERVER")/owner")"; echo PARENT $PPID'],
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    owners = {ln.split()[0] for ln in p.stdout.splitlines() if not ln.startswith("PARENT")}
    parents = {ln.split()[1] for ln in p.stdout.splitlines() if ln.startswith("PARENT")}
    assert owners == parents and len(owners) == 1  # the `pydvm run` process hosts the node


def test_daemons_do_not_import_scripts_of_the_directory_the_dvm_was_started_in(tmp_path):
    """``pydvm start`` (its console script) in a directory holding a script
    named like a module the runtime imports: the local daemons it launches
    run in that directory too, and must not import it (they once did, with
    ``python -m``: a ``queue.py`` there ended every daemon at start)."""
    import shutil
    import subprocess
    import sys

    here = tmp_path / "work"
    here.mkdir()
    marker = tmp_path / "imported"
    for name in ("queue", "selectors", "signal"):
        (here / f"{name}.py").write_text(
            f"open({str(marker)!r}, 'a').write({name!r} + '\\n')\n"
            f"raise SystemExit('the caller\\'s {name}.py ran')\n")
    script = shutil.which("pydvm", path=str(Path(sys.executable).parent))
    assert script, "the pydvm console script next to this interpreter"
    env = dict(os.environ, PYDVM_STATE_DIR=str(tmp_path / "state"))
    env.pop("PYDVM_URI", None)
    p = subprocess.run([script, "start", "--daemonize", "--hosts", "a,b",
                        "--log-dir", str(tmp_path / "logs")], cwd=here, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    uri = p.stdout.strip().splitlines()[-1]
    try:
        r = subprocess.run([script, "run", "--dvm", uri, "--map-by", "node", "-n", "2",
                            "sh", "-c", "echo $PYDVM_NODE"], cwd=here, env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert sorted(r.stdout.split()) == ["a", "b"]
        assert not marker.exists(), marker.read_text()
    finally:
        subprocess.run([script, "stop", "--dvm", uri], env=env, capture_output=True, timeout=120)
