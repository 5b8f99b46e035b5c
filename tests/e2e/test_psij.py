"""The PSI/J executor ``pydvm`` against a real DVM (local daemons a, b, c):
states and callbacks, exit codes, resources (node count, processes per
node), environment, directory, the three streams, cancel, list/attach,
walltime, pre/post-launch scripts, and a DVM of the executor's own.

psij-python's own executor suite (its ``tests/``, run with
``--executors pydvm``) is not in its installed package; docs/workflows.md
says how it was run and what it gave.  Each behaviour that suite checks of
an executor is checked here too, in our own words.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest

psij = pytest.importorskip("psij")
from psij import (InvalidJobException, Job, JobAttributes, JobExecutor,  # noqa: E402
                  JobSpec, JobState, ResourceSpecV1)

from dvmkit import start_dvm  # noqa: E402

pytestmark = pytest.mark.e2e

WAIT = timedelta(seconds=60)


@pytest.fixture(scope="module")
def dvm(tmp_path_factory):
    """One DVM of three local daemons for the module's jobs."""
    with start_dvm(tmp_path_factory.mktemp("psij"), hosts="a,b,c") as d:
        yield d


@pytest.fixture
def ex(dvm, monkeypatch):
    """A ``pydvm`` executor on the module's DVM, reached through its URL
    (the DVM's secret in our state directory, as its owner's)."""
    monkeypatch.setenv("PYDVM_STATE_DIR", dvm.env["PYDVM_STATE_DIR"])
    monkeypatch.delenv("PYDVM_URI", raising=False)
    return JobExecutor.get_instance("pydvm", url=dvm.uri)


def run(ex, spec: JobSpec, states: list | None = None):
    """Submit a job, wait for its end; its final status."""
    job = Job(spec)
    if states is not None:
        job.set_job_status_callback(lambda j, s: states.append(s.state))
    ex.submit(job)
    status = job.wait(timeout=WAIT)
    assert status is not None, f"{job} did not end"
    return job, status


def test_registered_under_its_name_and_jobs_complete_with_exit_0(ex):
    assert ex.name == "pydvm"
    job, st = run(ex, JobSpec("/bin/true"))
    assert st.state == JobState.COMPLETED and st.exit_code == 0
    assert job.native_id.startswith("pydvm-") and st.metadata["nativeId"] == job.native_id


def test_the_job_goes_through_queued_active_then_its_end(ex):
    """Job and executor callbacks both see each state once, in order (PSI/J's model)."""
    seen_ex: list = []
    ex.set_job_status_callback(lambda j, s: seen_ex.append(s.state))
    states: list = []
    run(ex, JobSpec("/bin/date"), states)
    assert states == [JobState.QUEUED, JobState.ACTIVE, JobState.COMPLETED]
    states = []
    _, st = run(ex, JobSpec("/bin/bash", ["-c", "exit 3"]), states)
    assert states == [JobState.QUEUED, JobState.ACTIVE, JobState.FAILED]
    assert st.exit_code == 3 and st.metadata["failures"][0]["status"] == 3
    assert seen_ex == [JobState.QUEUED, JobState.ACTIVE, JobState.COMPLETED,
                       JobState.QUEUED, JobState.ACTIVE, JobState.FAILED]


def test_a_missing_executable_fails_naming_it(ex):
    _, st = run(ex, JobSpec("/no/such/exe"))
    assert st.state == JobState.FAILED and st.exit_code == 127
    assert "/no/such/exe" in st.message


def test_streams_go_to_their_paths_and_stdin_comes_from_its_file(ex, tmp_path):
    (tmp_path / "in").write_text("from stdin\n")
    spec = JobSpec("/bin/bash", ["-c", "cat; echo to-out; echo to-err >&2"],
                   stdin_path=tmp_path / "in", stdout_path=tmp_path / "out",
                   stderr_path=str(tmp_path / "err"))
    _, st = run(ex, spec)
    assert st.state == JobState.COMPLETED, st
    assert (tmp_path / "out").read_text() == "from stdin\nto-out\n"
    assert (tmp_path / "err").read_text() == "to-err\n"


def test_directory_is_the_working_directory_and_relative_paths_are_in_it(ex, tmp_path):
    (tmp_path / "wd").mkdir()
    _, st = run(ex, JobSpec("/bin/pwd", directory=tmp_path / "wd", stdout_path="pwd.txt"))
    assert st.state == JobState.COMPLETED, st
    assert (tmp_path / "wd" / "pwd.txt").read_text().strip() == str(tmp_path / "wd")


def test_environment_added_to_ours_or_alone(ex, tmp_path, monkeypatch):
    monkeypatch.setenv("PSIJ_TEST_OURS", "ours")
    out = tmp_path / "env"
    script = 'echo "$TEST_VAR$TEST_INT|${PSIJ_TEST_OURS:-unset}"'
    run(ex, JobSpec("/bin/bash", ["-c", script], stdout_path=out,
                    environment={"TEST_VAR": "_y_", "TEST_INT": 1}))
    assert out.read_text() == "_y_1|ours\n"
    run(ex, JobSpec("/bin/bash", ["-c", script], stdout_path=out, inherit_environment=False,
                    environment={"TEST_VAR": "_z_"}))
    assert out.read_text() == "_z_|unset\n"


def node_counts(text: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for line in text.split():
        counts[line] = counts.get(line, 0) + 1
    return counts


def test_node_count_and_processes_per_node(ex, tmp_path):
    """2 nodes x 2 processes: four processes, two on each of the DVM's first two nodes;
    PSIJ_NODEFILE lists one node a process."""
    out = tmp_path / "nodes"
    _, st = run(ex, JobSpec("/bin/bash", ["-c", 'echo $PYDVM_NODE; [ "$(wc -l < '
                                          '$PSIJ_NODEFILE)" = 4 ]'], stdout_path=out,
                            resources=ResourceSpecV1(node_count=2, processes_per_node=2)))
    assert st.state == JobState.COMPLETED, st
    assert node_counts(out.read_text()) == {"a": 2, "b": 2}
    _, st = run(ex, JobSpec("/bin/bash", ["-c", "echo $PYDVM_NODE"], stdout_path=out,
                            resources=ResourceSpecV1(process_count=3, node_count=3)))
    assert node_counts(out.read_text()) == {"a": 1, "b": 1, "c": 1}


@pytest.mark.parametrize("custom", [{}, {"pydvm.hosts": "c,b"}, {"pydvm.rank_by": "node"}])
def test_each_process_runs_on_the_node_the_nodefile_gives_it(ex, tmp_path, custom):
    """Without a node count the DVM places the processes; the nodefile,
    computed before, says where each rank went."""
    out = tmp_path / "where"
    script = 'echo "$PMIX_RANK $PYDVM_NODE $(sed -n "$((PMIX_RANK + 1))p" $PSIJ_NODEFILE)"'
    _, st = run(ex, JobSpec("/bin/bash", ["-c", script], stdout_path=out,
                            attributes=JobAttributes(custom_attributes=custom),
                            resources=ResourceSpecV1(process_count=5)))
    assert st.state == JobState.COMPLETED, st
    rows = sorted(line.split() for line in out.read_text().splitlines())
    assert [r[0] for r in rows] == ["0", "1", "2", "3", "4"]
    assert all(r[1] == r[2] for r in rows), rows
    if custom.get("pydvm.hosts"):
        assert {r[1] for r in rows} == {"b", "c"}


def test_the_nodefile_is_gone_after_the_job(ex, tmp_path):
    out = tmp_path / "nf"
    _, st = run(ex, JobSpec("/bin/bash", ["-c", "echo $PSIJ_NODEFILE"], stdout_path=out,
                            resources=ResourceSpecV1(process_count=2)))
    names = set(out.read_text().split())
    assert st.state == JobState.COMPLETED and len(names) == 1
    assert not Path(names.pop()).exists()


def test_the_single_launcher_runs_one_process_with_the_allocation_in_the_nodefile(ex,
                                                                                  tmp_path):
    out = tmp_path / "single"
    _, st = run(ex, JobSpec("/bin/bash", ["-c", "echo $PYDVM_NODE; cat $PSIJ_NODEFILE"],
                            stdout_path=out, launcher="single",
                            resources=ResourceSpecV1(node_count=2, processes_per_node=2)))
    assert st.state == JobState.COMPLETED, st
    assert out.read_text().split() == ["a", "a", "a", "b", "b"]


def test_what_the_dvm_cannot_hold_is_refused_and_the_job_stays_new(ex):
    job = Job(JobSpec("/bin/true", resources=ResourceSpecV1(node_count=4)))
    with pytest.raises(InvalidJobException, match="4 nodes; the DVM has 3 up"):
        ex.submit(job)
    assert job.status.state == JobState.NEW and job.executor is None
    job.spec.resources = ResourceSpecV1(node_count=3)
    ex.submit(job)  # the same job, fixed, goes
    assert job.wait(timeout=WAIT).state == JobState.COMPLETED
    job = Job(JobSpec("/bin/true", attributes=JobAttributes(
        custom_attributes={"pydvm.map_by": "sideways"})))
    with pytest.raises(InvalidJobException, match="sideways"):
        ex.submit(job)
    assert job.status.state == JobState.NEW


def test_cancel_ends_a_running_job_canceled_and_the_dvm_forgets_it(ex, dvm):
    job = Job(JobSpec("/bin/sleep", ["600"]))
    ex.submit(job)
    assert job.wait(timeout=WAIT, target_states=[JobState.ACTIVE]).state == JobState.ACTIVE
    assert job.native_id in ex.list()
    job.cancel()
    st = job.wait(timeout=WAIT)
    assert st is not None and st.state == JobState.CANCELED
    assert st.message.startswith("canceled") and st.metadata["killed"] == 1
    assert job.native_id not in ex.list()
    job.cancel()  # a final job: nothing happens
    assert job.status.state == JobState.CANCELED


def test_walltime_ends_the_job_failed(ex):
    _, st = run(ex, JobSpec("/bin/sleep", ["600"],
                            attributes=JobAttributes(duration=timedelta(seconds=1))))
    assert st.state == JobState.FAILED and st.exit_code == 110  # as pydvm run --timeout
    assert "time limit of 1 s" in st.message


def test_attach_follows_a_job_to_its_end_from_another_executor(ex, dvm, tmp_path):
    go = tmp_path / "go"
    job = Job(JobSpec("/bin/bash", ["-c", f"while [ ! -e {go} ]; do sleep 0.05; done"]))
    ex.submit(job)
    job.wait(timeout=WAIT, target_states=[JobState.ACTIVE])
    other = JobExecutor.get_instance("pydvm", url=dvm.uri)
    follower = Job()
    states: list = []
    follower.set_job_status_callback(lambda j, s: states.append(s.state))
    other.attach(follower, job.native_id)
    assert follower.native_id == job.native_id
    assert follower.status.state == JobState.ACTIVE
    go.touch()
    assert job.wait(timeout=WAIT).state == JobState.COMPLETED
    assert follower.wait(timeout=WAIT).state == JobState.COMPLETED
    assert states == [JobState.QUEUED, JobState.ACTIVE, JobState.COMPLETED]
    with pytest.raises(InvalidJobException, match="no job 'pydvm-nope@1'"):
        other.attach(Job(), "pydvm-nope@1")


def pushes_events(dvm) -> bool:
    """Whether the DVM pushes job events (a master with ``subscribe``)."""
    from pydvm.client import jobs

    with jobs.connect(dvm.uri) as conn:
        try:
            conn.events().close()
        except jobs.UnsupportedError:
            return False
    return True


def test_an_attached_job_ends_with_the_dvms_status_where_it_pushes_events(ex, dvm):
    """With job events the follower learns the job's own exit status; without,
    it COMPLETES once the DVM no longer lists the job (as PSI/J's local does)."""
    job = Job(JobSpec("/bin/sleep", ["600"]))
    ex.submit(job)
    follower = Job()
    JobExecutor.get_instance("pydvm", url=dvm.uri).attach(follower, job.native_id)
    job.cancel()
    st = follower.wait(timeout=WAIT)
    assert st is not None
    if pushes_events(dvm):
        assert st.state == JobState.FAILED and st.exit_code == 143
    else:
        assert st.state == JobState.COMPLETED and st.exit_code == 0


def test_attaching_to_a_job_of_the_same_executor_gives_its_report_to_both(ex, tmp_path):
    go = tmp_path / "go"
    job = Job(JobSpec("/bin/bash", ["-c", f"while [ ! -e {go} ]; do sleep 0.05; done; exit 3"]))
    ex.submit(job)
    follower = Job()
    ex.attach(follower, job.native_id)
    go.touch()
    for j in (job, follower):
        st = j.wait(timeout=WAIT)
        assert st is not None and st.state == JobState.FAILED and st.exit_code == 3
    # the first job is still the one a cancel reaches
    job = Job(JobSpec("/bin/sleep", ["600"]))
    ex.submit(job)
    follower = Job()
    ex.attach(follower, job.native_id)
    job.cancel()
    assert job.wait(timeout=WAIT).state == JobState.CANCELED
    assert follower.wait(timeout=WAIT).state == JobState.FAILED


def test_a_callback_may_submit_the_next_job(ex):
    """PSI/J's throttling example: each job's end submits the next, from its callback."""
    done = threading.Event()
    finished: list = []

    def next_one(job, status):
        if not status.final:
            return
        finished.append(status.state)
        if len(finished) < 5:
            ex.submit(Job(JobSpec("/bin/true")))
        else:
            done.set()

    ex.set_job_status_callback(next_one)
    ex.submit(Job(JobSpec("/bin/true")))
    assert done.wait(60), finished
    assert finished == [JobState.COMPLETED] * 5


def test_pre_launch_sets_the_jobs_environment_and_post_launch_runs_after(ex, tmp_path):
    pre, post, out = tmp_path / "pre.sh", tmp_path / "post.sh", tmp_path / "out"
    pre.write_text("export FROM_PRE=yes\n")
    post.write_text(f'echo "post $FROM_PRE" > {tmp_path / "post.out"}\n')
    _, st = run(ex, JobSpec("/bin/bash", ["-c", "echo $FROM_PRE"], stdout_path=out,
                            pre_launch=pre, post_launch=post))
    assert st.state == JobState.COMPLETED, st
    assert out.read_text() == "yes\n"
    assert (tmp_path / "post.out").read_text() == "post yes\n"
    pre.write_text("exit 4\n")
    job = Job(JobSpec("/bin/true", pre_launch=pre))
    with pytest.raises(psij.SubmitException, match="pre-launch script .* failed"):
        ex.submit(job)
    assert job.status.state == JobState.NEW


def test_pydvm_uri_names_the_dvm_when_no_url_is_given(dvm, monkeypatch):
    monkeypatch.setenv("PYDVM_STATE_DIR", dvm.env["PYDVM_STATE_DIR"])
    monkeypatch.setenv("PYDVM_URI", dvm.uri)
    _, st = run(JobExecutor.get_instance("pydvm"), JobSpec("/bin/true"))
    assert st.state == JobState.COMPLETED


def test_an_unreachable_dvm_is_a_submit_exception(dvm, monkeypatch, tmp_path):
    monkeypatch.setenv("PYDVM_STATE_DIR", str(tmp_path))
    bad = JobExecutor.get_instance("pydvm", url="tcp://127.0.0.1:1/deadbeef")
    job = Job(JobSpec("/bin/true"))
    with pytest.raises(psij.SubmitException, match="cannot reach the DVM"):
        bad.submit(job)
    assert job.status.state == JobState.NEW


def test_without_a_uri_the_executor_runs_a_dvm_of_its_own_until_exit(tmp_path):
    """No url, no PYDVM_URI: a DVM of this machine starts with the first job
    and stops when the program exits (nothing of it is left)."""
    code = (
        "import psij, sys\n"
        "ex = psij.JobExecutor.get_instance('pydvm')\n"
        "job = psij.Job(psij.JobSpec('/bin/bash', ['-c', 'echo $PYDVM_NSPACE'],"
        " stdout_path=sys.argv[1], resources=psij.ResourceSpecV1(process_count=2)))\n"
        "ex.submit(job)\n"
        "print(job.wait().state)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYDVM_URI"}
    env["PYDVM_STATE_DIR"] = str(tmp_path / "state")
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-c", code, str(out)], env=env, capture_output=True,
                       text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "COMPLETED"
    nspaces = set(out.read_text().split())
    assert len(nspaces) == 1 and nspaces.pop().startswith("pydvm-"), out.read_text()
    # the DVM stopped before the program exited: nothing of it is listed
    dvms = subprocess.run([sys.executable, "-m", "pydvm", "dvms"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert dvms.returncode == 0, dvms.stderr
    assert "no running DVM of yours" in dvms.stdout + dvms.stderr, dvms.stdout


# ----------------------------------------------------------------------
# the pydvm launcher: another executor starting a job through pydvm run
# ----------------------------------------------------------------------


def test_the_pydvm_launcher_starts_the_processes_of_a_local_job_with_pydvm_run(dvm, tmp_path,
                                                                             monkeypatch):
    """PSI/J's local executor, launcher "pydvm": the launcher script runs
    ``pydvm run`` on the DVM of PYDVM_URI (node count and processes per
    node as -N); the exit status is the job's."""
    monkeypatch.setenv("PYDVM_STATE_DIR", dvm.env["PYDVM_STATE_DIR"])
    monkeypatch.setenv("PYDVM_URI", dvm.uri)
    local = JobExecutor.get_instance("local")
    out = tmp_path / "out"
    _, st = run(local, JobSpec("/bin/bash", ["-c", "echo $PYDVM_NODE -n"], stdout_path=out,
                               launcher="pydvm",
                               resources=ResourceSpecV1(node_count=2, processes_per_node=2)))
    assert st.state == JobState.COMPLETED, st
    assert sorted(out.read_text().splitlines()) == ["a -n", "a -n", "b -n", "b -n"]
    _, st = run(local, JobSpec("/bin/bash", ["-c", "exit 7"], launcher="pydvm"))
    assert st.state == JobState.FAILED and st.exit_code == 7


def test_the_pydvm_launcher_without_a_uri_runs_a_one_shot_dvm(tmp_path, monkeypatch):
    monkeypatch.setenv("PYDVM_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("PYDVM_URI", raising=False)
    out = tmp_path / "out"
    _, st = run(JobExecutor.get_instance("local"),
                JobSpec("/bin/bash", ["-c", "echo $PYDVM_NSPACE"], stdout_path=out,
                        launcher="pydvm", resources=ResourceSpecV1(process_count=2)))
    assert st.state == JobState.COMPLETED, st
    nspaces = out.read_text().split()
    assert len(nspaces) == 2 and len(set(nspaces)) == 1 and nspaces[0].startswith("pydvm-")


def test_the_executors_own_dvm_takes_its_nodes_and_parameters_from_the_config(tmp_path):
    code = (
        "import psij, sys\n"
        "from pydvm.psij.executor import PydvmJobExecutorConfig\n"
        "cfg = PydvmJobExecutorConfig(hosts='a,b', params={'pydvm_heartbeat_interval': 1.5})\n"
        "ex = psij.JobExecutor.get_instance('pydvm', config=cfg)\n"
        "job = psij.Job(psij.JobSpec('/bin/bash', ['-c', 'echo $PYDVM_NODE'],"
        " stdout_path=sys.argv[1], resources=psij.ResourceSpecV1(node_count=2)))\n"
        "ex.submit(job)\n"
        "print(job.wait().state)\n"
        "dvm = ex._connect()\n"
        "print(dvm._call({'t': 'info'})['params']['pydvm_heartbeat_interval'][0])\n")
    env = {k: v for k, v in os.environ.items() if k != "PYDVM_URI"}
    env["PYDVM_STATE_DIR"] = str(tmp_path / "state")
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-c", code, str(out)], env=env, capture_output=True,
                       text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split()[0] == "COMPLETED"
    assert float(p.stdout.split()[1]) == 1.5
    assert sorted(out.read_text().split()) == ["a", "b"]


def test_a_job_that_waits_for_slots_is_queued_until_they_free(ex, dvm, tmp_path):
    """pydvm.queue: on a DVM of three one-slot nodes, a job of three
    processes holds every slot; the next waits QUEUED (the DVM queues it)
    and turns ACTIVE when the first has ended."""
    go = tmp_path / "go"
    queue = JobAttributes(custom_attributes={"pydvm.queue": True})
    first = Job(JobSpec("/bin/bash", ["-c", f"while [ ! -e {go} ]; do sleep 0.05; done"],
                        attributes=queue, resources=ResourceSpecV1(process_count=3)))
    ex.submit(first)
    assert first.wait(timeout=WAIT, target_states=[JobState.ACTIVE]).state == JobState.ACTIVE
    states: list = []
    second = Job(JobSpec("/bin/true", attributes=queue))
    second.set_job_status_callback(lambda j, s: states.append((s.state, first.status.state)))
    ex.submit(second)
    assert second.status.state == JobState.QUEUED
    go.touch()
    assert second.wait(timeout=WAIT).state == JobState.COMPLETED
    assert [s for s, _ in states] == [JobState.QUEUED, JobState.ACTIVE, JobState.COMPLETED]
    assert states[0][1] == JobState.ACTIVE  # queued while the first ran


def test_without_job_events_a_queued_job_turns_active_with_nothing_polled(dvm, tmp_path,
                                                                          monkeypatch):
    """A DVM that pushes no job events (the subscription refused): a job the
    executor submitted still goes QUEUED -> ACTIVE -> COMPLETED, told by
    the job API's own answers -- no watcher thread looks at the DVM."""
    import pydvm.psij.executor as pex

    monkeypatch.setenv("PYDVM_STATE_DIR", dvm.env["PYDVM_STATE_DIR"])
    monkeypatch.setattr(pex, "_listen", lambda d, ex: False)
    ex = pex.PydvmJobExecutor(url=dvm.uri)
    go = tmp_path / "go"
    queue = JobAttributes(custom_attributes={"pydvm.queue": True})
    first = Job(JobSpec("/bin/bash", ["-c", f"while [ ! -e {go} ]; do sleep 0.05; done"],
                        attributes=queue, resources=ResourceSpecV1(process_count=3)))
    ex.submit(first)
    assert first.wait(timeout=WAIT, target_states=[JobState.ACTIVE]).state == JobState.ACTIVE
    states: list = []
    second = Job(JobSpec("/bin/true", attributes=queue))
    second.set_job_status_callback(lambda j, s: states.append(s.state))
    ex.submit(second)
    assert second.status.state == JobState.QUEUED and ex._events is False
    go.touch()
    assert second.wait(timeout=WAIT).state == JobState.COMPLETED
    assert states == [JobState.QUEUED, JobState.ACTIVE, JobState.COMPLETED]
    assert first.wait(timeout=WAIT).state == JobState.COMPLETED
    assert ex._watcher is None  # nothing polled the DVM
