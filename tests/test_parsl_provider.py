"""pydvm's Parsl provider without a DVM: the status mapping (a block's job in
each state and each way of ending, as the job API's reader sets them), the
mpiexec of MPI apps, the values the provider refuses, and Parsl's provider
unit-test patterns (submit/status/cancel bookkeeping) where no DVM is needed.

The e2e half (real DVMs, Parsl's own tests) is tests/e2e/test_parsl.py."""

from __future__ import annotations

import pytest

pytest.importorskip("parsl")

from parsl.jobs.states import JobState  # noqa: E402
from parsl.launchers import SimpleLauncher, SrunLauncher  # noqa: E402
from parsl.providers.errors import SubmitException  # noqa: E402

from pydvm.errors import BadParamError, Status  # noqa: E402
from pydvm.jobs import Job  # noqa: E402
from pydvm.parsl.mpiexec import PMI, run_args  # noqa: E402
from pydvm.parsl.provider import PydvmProvider, _walltime_seconds, job_status  # noqa: E402


class _NoConnection:
    """What a Job asks of its connection before it is done (only whether the
    caller is the reader thread): these Jobs are fed by hand, as the reader would."""

    def _on_reader_thread(self) -> bool:
        return False


def job(state: str = "submitted") -> Job:
    j = Job(_NoConnection(), 1, None, None, None)
    if state in ("queued", "running"):
        j._named("pydvm-x@1", state)
    return j


def ended(exit: int = 0, msg: str | None = None, failed: int = 0, killed: int = 0,
          failures: list | None = None) -> Job:
    j = job("running")
    j._ended({"status": 0, "nspace": "pydvm-x@1", "exit": exit, "msg": msg, "failed": failed,
              "killed": killed, "failures": failures or []})
    return j


def test_waiting_and_running_jobs_are_pending_and_running():
    assert job("submitted").state == "submitted"
    assert job_status(job("submitted")).state == JobState.PENDING
    assert job_status(job("queued")).state == JobState.PENDING
    assert job_status(job("running")).state == JobState.RUNNING
    assert not job_status(job("running")).terminal


def test_an_exit_0_is_completed_with_its_output_paths():
    st = job_status(ended(0), stdout_path="/s/b.sh.out", stderr_path="/s/b.sh.err")
    assert (st.state, st.exit_code) == (JobState.COMPLETED, 0)
    assert (st.stdout_path, st.stderr_path) == ("/s/b.sh.out", "/s/b.sh.err")


def test_a_failing_block_is_failed_with_its_exit_and_the_failure_named():
    st = job_status(ended(3, failed=1, failures=[[0, 0, "a", 3, 0, False]]))
    assert (st.state, st.exit_code) == (JobState.FAILED, 3)
    assert st.message == "rank 0 on a exited 3"
    st = job_status(ended(127, msg="cannot start: no such file", failed=1))
    assert st.state == JobState.FAILED and "no such file" in st.message


def test_our_cancel_is_cancelled_and_someone_elses_kill_too_with_its_reason():
    assert job_status(ended(143, killed=2), cancelled=True).state == JobState.CANCELLED
    st = job_status(ended(143, msg="killed by pydvm kill (uid 0)", killed=2))
    assert st.state == JobState.CANCELLED and "pydvm kill" in st.message
    # a process that failed on its own among the killed ones: a failure
    assert job_status(ended(143, killed=1, failed=1)).state == JobState.FAILED


def test_the_time_limit_is_timeout_only_when_the_block_has_one():
    assert job_status(ended(110, msg="time limit", killed=1), walltime=True).state \
        == JobState.TIMEOUT
    assert job_status(ended(110, failed=1)).state == JobState.FAILED  # its own exit 110


def test_a_block_the_dvm_refused_or_lost_is_failed_with_the_error():
    j = job()
    j._ended({"status": int(Status.ERR_BAD_PARAM), "msg": "no such host zz"})
    st = job_status(j)
    assert st.state == JobState.FAILED and "BadParamError" in st.message \
        and "zz" in st.message
    assert isinstance(j.exception(0), BadParamError)


def test_walltime_is_parsl_spelling_or_seconds():
    assert _walltime_seconds("00:10:00") == 600
    assert _walltime_seconds("1:00:30") == 3630
    assert _walltime_seconds(90) == 90 and _walltime_seconds(None) is None
    for bad in ("ten minutes", "1:2:3:4", 0, "-5", True):
        with pytest.raises(ValueError, match="walltime"):
            _walltime_seconds(bad)


def test_values_the_provider_refuses_name_what_to_give():
    with pytest.raises(ValueError, match="SimpleLauncher"):
        PydvmProvider(launcher=SrunLauncher())
    with pytest.raises(ValueError, match="pmi 'pmi9'.*pmix"):
        PydvmProvider(pmi="pmi9")
    with pytest.raises(ValueError, match="nodes_per_block"):
        PydvmProvider(nodes_per_block=0)
    with pytest.raises(ValueError, match="walltime"):
        PydvmProvider(walltime="soon")
    p = PydvmProvider(launcher=SimpleLauncher(), nodes_per_block=2, max_blocks=3)
    assert "nodes_per_block=2" in repr(p) and "max_blocks=3" in repr(p)
    assert p.label == "pydvm" and p.status_polling_interval >= 1


def test_a_block_that_cannot_be_sent_is_a_submit_exception(tmp_path, monkeypatch):
    """No DVM at the URI given: Parsl's SubmitException, naming the block, at once."""
    monkeypatch.setenv("PYDVM_STATE_DIR", str(tmp_path / "state"))
    p = PydvmProvider("tcp://127.0.0.1:9/00000000")
    p.script_dir = str(tmp_path)
    with pytest.raises(SubmitException, match="did not take the block"):
        p.submit("true", 1, "parsl.test")
    assert p.resources == {}


def test_status_and_cancel_of_blocks_it_does_not_have():
    p = PydvmProvider()
    assert p.status(["nope"])[0].state == JobState.UNKNOWN
    assert p.cancel(["nope"]) == [False]


# -- mpiexec: Parsl's $PARSL_MPI_PREFIX as pydvm run's arguments -------------------


def test_parsl_mpiexec_prefix_becomes_pydvm_run_on_those_nodes():
    # what Parsl 2026.10.26 composes: mpiexec -n R -ppn P -hosts A,B LAUNCHER_OPTIONS
    assert run_args("-n 4 -ppn 2 -hosts a,b ./app x".split()) == \
        ["--no-queue", "-n", "4", "--npernode", "2", "--host", "a,b", "./app", "x"]
    # num_ranks/num_nodes only: Parsl computes ranks_per_node as a float
    assert run_args(["-n", "2", "-ppn", "1.0", "-hosts", "a,b", "./app"])[1:5] == \
        ["-n", "2", "--npernode", "1"]
    # launcher_options pass on (pydvm run takes mpirun's), their values in order
    assert run_args("-n 2 -ppn 1 -hosts a --bind-to core ./app".split()) == \
        ["--no-queue", "-n", "2", "--npernode", "1", "--host", "a", "--bind-to", "core",
         "./app"]
    assert run_args(["-np=2", "--", "-weird-name"]) == ["--no-queue", "-n", "2", "-weird-name"]
    assert run_args(["-n", "2", "-ppn", "None", "./app"]) == ["--no-queue", "-n", "2", "./app"]


def test_mpiexec_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="no command"):
        run_args(["-n", "2", "-hosts", "a,b"])
    with pytest.raises(ValueError, match="needs a value"):
        run_args(["-n"])
    with pytest.raises(ValueError, match="whole number"):
        run_args(["-n", "2", "-ppn", "1.5", "./app"])
    with pytest.raises(ValueError, match="PMI 'pmi2'"):
        run_args(["./app"], pmi="pmi2")
    assert "pmix" in PMI and PMI["pmix"] == []
    assert run_args(["-n", "2", "./app"], pmi="pmi1")[:3] == ["--no-queue", "--mpi", "pmi1"]


def test_import_pydvm_parsl_loads_neither_parsl_nor_the_job_api():
    import json
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", "import pydvm, pydvm.parsl, sys, json; "
                        "print(json.dumps(sorted(sys.modules)))"],
                       capture_output=True, text=True, timeout=60)
    mods = json.loads(p.stdout)
    assert "parsl" not in mods and "pydvm.client.jobs" not in mods
