"""PMIx job control and allocation requests from a job's processes, as under ``mpirun``.

clients/pmix_jctrl.c does what OpenPMIx's ``jctrl.c`` and ``alloc.c``
examples do -- plus signalling, killing and terminating peers -- with
ranks on two nodes.  Each test runs it under ``pydvm run`` and, where
Open MPI 4.1's ``mpirun`` (its ORTE hosting the same libpmix 4.2.2) acts,
under ``mpirun`` too, and compares.  What ORTE does (read in its
``pmix_server_job_ctrl_fn`` and measured): it answers every job control
SUCCESS, acts only on ``PMIX_JOB_CTRL_KILL`` of listed ranks (and on a
TERMINATE with no targets, by halting its whole DVM); a signal is not
delivered.  pydvm does what is asked and refuses clearly what it cannot do
(docs/pmix.md, "Job control and allocation").
"""

from __future__ import annotations

import re

import pytest

from pmixkit import FAR, HEAD

PMIX_ERR_NOT_SUPPORTED = -47
PMIX_ERR_NOT_FOUND = -46
PMIX_ERR_BAD_PARAM = -27


def statuses(out: str, what: str = "JCTRL") -> list[int]:
    return [int(s) for s in re.findall(rf"^{what} rank=\d+ status=(-?\d+)", out, re.M)]


def run(pdvm, exe, mode, *extra, timeout=60):
    return pdvm.run(*extra, "--host", f"{HEAD}:1,{FAR}:1", "-n", "2", exe, mode,
                    timeout=timeout)


def test_rank_0_signals_rank_1_whose_handler_sees_it(pdvm, pmixcc, mpirun):
    """SIGUSR1 reaches rank 1 (on the other node) through PMIx_Job_control;
    both then finish normally.  mpirun 4.1 answers the request SUCCESS too
    but delivers nothing: its rank 1 waits in vain (3 s here)."""
    exe = pmixcc("pmix_jctrl")
    ref = mpirun(2, exe, "signal", "3", timeout=60)
    assert ref.returncode == 0 and statuses(ref.stdout) == [0], ref.stdout + ref.stderr
    assert "SIGNALLED rank=1 sig=0" in ref.stdout, ref.stdout
    p = run(pdvm, exe, "signal")
    assert p.returncode == 0, p.stdout + p.stderr
    assert statuses(p.stdout) == [0], p.stdout
    assert "SIGNALLED rank=1 sig=10" in p.stdout, p.stdout
    assert p.stdout.count("DONE") == 2


def test_rank_0_kills_rank_1_and_the_jobs_end_reports_it(pdvm, pmixcc, mpirun):
    """Under both, the request succeeds, rank 1 dies (it never says SURVIVED)
    and rank 0 finishes: a process killed on request is no failure, the job
    exits 0.  pydvm's run names the killed rank and who asked (mpirun says
    nothing)."""
    exe = pmixcc("pmix_jctrl")
    ref = mpirun(2, exe, "kill", timeout=60)
    assert ref.returncode == 0, ref.stdout + ref.stderr
    assert statuses(ref.stdout) == [0] and "SURVIVED" not in ref.stdout, ref.stdout
    p = run(pdvm, exe, "kill")
    assert p.returncode == 0, p.stdout + p.stderr
    assert statuses(p.stdout) == [0] and "SURVIVED" not in p.stdout, p.stdout
    assert re.search(r"process \[(\S+),1\] on node \S+ was killed by signal SIGKILL \(9\): "
                     r"ended by PMIx_Job_control from \1:0 \(uid \d+\)", p.stderr), p.stderr
    assert "aborted" not in p.stderr


def test_terminating_the_namespace_ends_the_job_saying_who_asked(pdvm, pmixcc):
    """PMIX_JOB_CTRL_TERMINATE of {nspace, PMIX_RANK_WILDCARD}, and of no
    targets (the caller's namespace), ends every rank; pydvm run names the
    requester.  (mpirun 4.1 ignores the first and halts its whole DVM for
    the second: see the module docstring.)"""
    exe = pmixcc("pmix_jctrl")
    for mode in ("term", "self"):
        p = run(pdvm, exe, mode)
        assert p.returncode == 143, p.stdout + p.stderr
        assert "SURVIVED" not in p.stdout, p.stdout
        assert re.search(r"killed by PMIx_Job_control from pydvm-\S+:0 \(uid \d+\); "
                         r"2 processes were killed", p.stderr), p.stderr


def test_statements_about_the_job_are_accepted_as_under_mpirun(pdvm, pmixcc, mpirun):
    """jctrl.c's request (preemptible, a checkpoint method: nothing to act on)
    is answered SUCCESS by both."""
    exe = pmixcc("pmix_jctrl")
    ref = mpirun(2, exe, "notes", timeout=60)
    p = run(pdvm, exe, "notes")
    assert statuses(ref.stdout) == statuses(p.stdout) == [0], ref.stdout + p.stdout + p.stderr
    assert p.returncode == ref.returncode == 0


@pytest.mark.parametrize("mode,status", [("other", PMIX_ERR_NOT_FOUND),
                                         ("badsig", PMIX_ERR_BAD_PARAM),
                                         ("ckpt", PMIX_ERR_NOT_SUPPORTED)])
def test_what_cannot_be_done_is_refused_clearly(pdvm, pmixcc, mode, status):
    """A target that does not exist, signal 0, a checkpoint: refused with
    the Standard's status (mpirun 4.1 answers SUCCESS and does nothing),
    and the job goes on to its normal end."""
    exe = pmixcc("pmix_jctrl")
    p = run(pdvm, exe, mode)
    assert p.returncode == 0, p.stdout + p.stderr
    assert statuses(p.stdout) == [status], p.stdout
    assert p.stdout.count("DONE") == 2


def test_allocation_requests_are_refused_as_under_mpirun(pdvm, pmixcc, mpirun):
    """A new allocation, an extension, a release: PMIX_ERR_NOT_SUPPORTED
    under both (the nodes are fixed); the allocation-status query finds no
    such allocation under both (PMIX_ERR_NOT_FOUND)."""
    exe = pmixcc("pmix_jctrl")
    ref = mpirun(2, exe, "alloc", timeout=60)
    p = run(pdvm, exe, "alloc")
    assert p.returncode == ref.returncode == 0, p.stdout + p.stderr
    for what in ("ALLOC_NEW", "ALLOC_EXTEND", "ALLOC_RELEASE"):
        assert statuses(p.stdout, what) == statuses(ref.stdout, what) == \
            [PMIX_ERR_NOT_SUPPORTED], (what, p.stdout, ref.stdout)
    assert statuses(p.stdout, "ALLOC_QUERY") == statuses(ref.stdout, "ALLOC_QUERY") == \
        [PMIX_ERR_NOT_FOUND], (p.stdout, ref.stdout)


def test_a_process_kills_another_job_of_its_user(pdvm, pmixcc):
    """PMIX_JOB_CTRL_KILL of {another job's nspace, PMIX_RANK_WILDCARD}: that
    job ends as by ``pydvm kill``, its pydvm run naming the requester; the
    requester's own job goes on to its normal end."""
    exe = pmixcc("pmix_jctrl")
    bg = pdvm.run_bg("--host", FAR, "-n", "2", "sh", "-c",
                     'echo "NS=$PMIX_NAMESPACE"; exec sleep 600')
    try:
        line = bg.stdout.readline()
        assert line.startswith("NS="), line
        victim = line.split("=", 1)[1].strip()
        p = pdvm.run("--host", HEAD, "-n", "1", exe, "killns", victim, timeout=60)
        assert p.returncode == 0, p.stdout + p.stderr
        assert statuses(p.stdout) == [0], p.stdout
        _out, err = bg.communicate(timeout=60)
        assert bg.returncode == 143, err
        assert f"{victim}: killed by PMIx_Job_control from " in err, err
    finally:
        if bg.poll() is None:
            bg.kill()
            bg.wait()
