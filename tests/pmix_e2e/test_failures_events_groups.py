"""MPI and PMIx jobs fail, notify and group as under ``mpirun``.

* A process of an MPI job that exits non-zero, is killed, exits without
  finalizing or calls ``MPI_Abort(N)`` ends the whole job: the same program
  under ``mpirun`` in the same test is the reference for the exit status,
  and neither may hang.  ``--no-abort-on-failure`` keeps the others running.
* Events: the processes that registered for ``PMIX_ERR_PROC_ABORTED`` hear
  of a failed peer on every node before the job is torn down; a client's
  own ``PMIx_Notify_event`` reaches its range across nodes; a job's end
  reaches a process that registered for ``PMIX_EVENT_JOB_END``.
* Groups: ``PMIx_Group_construct`` / ``_destruct`` across nodes, with the
  members' data and a context id; a member that dies fails the construct
  with ``PMIX_GROUP_CONSTRUCT_ABORT`` instead of hanging.
"""

from __future__ import annotations

import re
import time

import pytest

from pmixkit import CLIENTS, FAR, HEAD

#: (HOW, the job's exit status under mpirun and pydvm)
FAILURES = [("exit:3", 3), ("nofin", 1), ("abort:5", 5), ("kill", 137)]
PMIX_ERR_PROC_ABORTED = -7
PMIX_EVENT_JOB_END = -145
PMIX_GROUP_CONSTRUCT_ABORT = -165


@pytest.mark.parametrize("how,status", FAILURES, ids=[f[0] for f in FAILURES])
def test_a_failing_mpi_rank_ends_the_job_as_under_mpirun(pdvm, mpicc, mpirun, how, status):
    """Rank 1 of 3 fails while ranks 0 and 2 wait in MPI_Barrier: under mpirun the
    job ends with STATUS; under pydvm too -- ranks on two nodes -- and the report
    names the process (MPI_Abort: the abort)."""
    exe = mpicc("mpi_fail")
    ref = mpirun(3, exe, "1", how, timeout=60)
    if how == "kill":
        # mpirun reports a rank killed by a signal with its own status
        assert ref.returncode != 0, ref.stdout + ref.stderr
    else:
        assert ref.returncode == status, ref.stdout + ref.stderr
    t0 = time.monotonic()
    p = pdvm.run("--host", f"{HEAD}:1,{FAR}:2", "-n", "3", exe, "1", how, timeout=60)
    took = time.monotonic() - t0
    assert p.returncode == status, p.stdout + p.stderr
    assert "PAST" not in p.stdout, p.stdout
    ns = re.search(r"pydvm-\w+@\d+", p.stderr)
    assert ns, p.stderr
    if how.startswith("abort"):
        assert f"process {ns.group(0)}:1 called PMIx_Abort with status 5" in p.stderr, p.stderr
    else:
        assert f"process [{ns.group(0)},1] on node {FAR}" in p.stderr, p.stderr
        assert "aborted because process" in p.stderr, p.stderr
    if how == "nofin":
        assert "without finalizing" in p.stderr, p.stderr
    assert took < 30, f"the job took {took:.1f}s to end"


def test_an_mpi4py_rank_that_raises_ends_the_job_as_under_mpirun(pdvm, mpi4py_python, mpirun):
    """``python3 -m mpi4py``: an uncaught exception in rank 1 aborts the job, with
    the same status under mpirun and under pydvm (ranks on two nodes)."""
    args = ["-m", "mpi4py", str(CLIENTS / "mpi4py_world.py"), "fail", "1"]
    ref = mpirun(3, mpi4py_python, *args, timeout=60)
    assert ref.returncode != 0, ref.stdout + ref.stderr
    p = pdvm.run("--host", f"{HEAD}:1,{FAR}:2", "-n", "3", mpi4py_python, *args, timeout=60)
    assert p.returncode == ref.returncode, p.stdout + p.stderr
    assert "SUM" not in p.stdout
    assert "rank 1 fails on purpose" in p.stderr


def test_no_abort_on_failure_keeps_the_others_running(pdvm, pmixcc):
    """With --no-abort-on-failure the survivors run to their end; the job still
    exits with the failed process's status."""
    exe = pmixcc("pmix_events")
    p = pdvm.run("--no-abort-on-failure", "--tag-output", "--host", f"{HEAD}:2,{FAR}:1",
                 "-n", "3", exe, "fence", "exit:2:4", "sleep:1500", timeout=60)
    assert p.returncode == 4, p.stdout + p.stderr
    assert p.stdout.count("DONE status=0") == 2, p.stdout
    assert "aborted because" not in p.stderr, p.stderr


def test_a_plain_job_keeps_its_default_a_failure_does_not_end_the_others(pdvm):
    """A job that is not PMIx (no --pmix, nothing connected to PMIx) keeps today's
    default: one failing process does not kill its siblings."""
    p = pdvm.run("--host", f"{HEAD}:2", "-n", "2", "sh", "-c",
                 'if [ "$PYDVM_RANK" = 0 ]; then exit 2; fi; sleep 1; echo survived',
                 timeout=60)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "survived" in p.stdout


def events(out: str) -> list[tuple[int, int, str, str]]:
    """(rank, code, source, affected) of every EVENT line of pmix_events --tag-output."""
    got = []
    for ln in out.splitlines():
        m = re.match(r"\[[^,]+,(\d+)\] EVENT code=(-?\d+) source=(\S+) affected=(\S+)", ln)
        if m:
            got.append((int(m.group(1)), int(m.group(2)), m.group(3), m.group(4)))
    return got


@pytest.mark.parametrize("abort", [True, False], ids=["default", "no-abort"])
def test_a_failed_peer_is_notified_on_every_node_before_the_job_ends(pdvm, pmixcc, abort):
    """Four ranks on two nodes register for PMIX_ERR_PROC_ABORTED; rank 3 exits 1:
    ranks 0, 1 and 2 hear of it, naming rank 3 -- also when the job is then
    killed (the default for a PMIx job)."""
    exe = pmixcc("pmix_events")
    extra = [] if abort else ["--no-abort-on-failure"]
    p = pdvm.run(*extra, "--tag-output", "--host", f"{HEAD}:2,{FAR}:2", "-n", "4", exe,
                 "register:aborted", "fence", "exit:3:1", "waitmine:1:20000", timeout=60)
    assert p.returncode == 1, p.stdout + p.stderr
    got = events(p.stdout)
    ns = re.search(r"\[(pydvm-\w+@\d+),", p.stdout).group(1)
    assert sorted(r for r, *_ in got) == [0, 1, 2], p.stdout
    for _rank, code, source, affected in got:
        assert code == PMIX_ERR_PROC_ABORTED
        assert source == affected == f"{ns}:3"


@pytest.mark.parametrize("rng", ["namespace", "custom", "session", "global"])
def test_a_clients_event_reaches_its_range_across_nodes(pdvm, pmixcc, rng):
    """Rank 0 (head node) raises an event; the ranks on the other node, registered
    for that code, receive it with rank 0 as the source -- once each.  (libpmix
    keeps events for processes that register later: events of earlier jobs of
    this module may come too, naming their own raiser as the affected process.)"""
    exe = pmixcc("pmix_events")
    p = pdvm.run("--tag-output", "--host", f"{HEAD}:1,{FAR}:2", "-n", "3", exe,
                 "register:-3001", "fence", f"notify:{rng}:-3001", "waitmine:1:20000", "fence",
                 timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    ns = re.search(r"\[(pydvm-\w+@\d+),", p.stdout).group(1)
    mine = [e for e in events(p.stdout) if e[2] == e[3] == f"{ns}:0"]
    assert sorted(r for r, *_ in mine) == [0, 1, 2], p.stdout
    assert all(code == -3001 for _, code, _, _ in mine)


def test_a_jobs_end_reaches_a_process_that_registered_for_it(pdvm, pmixcc):
    """A parent registers for PMIX_EVENT_JOB_END and spawns a child job: it hears of
    the child's end (affected: the child's namespace), and of no earlier job's."""
    exe = pmixcc("pmix_events")
    assert pdvm.run("-n", "1", "true").returncode == 0  # an earlier job, ended
    p = pdvm.run("--tag-output", "--host", FAR, "-n", "1", exe, "register:jobend",
                 "spawn:/bin/true", "wait:1:20000", "sleep:500", timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    child = re.search(r"SPAWN status=0 nspace=(\S+)", p.stdout).group(1)
    got = events(p.stdout)
    assert [(code, affected) for _, code, _, affected in got] == \
        [(PMIX_EVENT_JOB_END, f"{child}:4294967294")], p.stdout


def test_group_construct_and_destruct_across_nodes_with_data_and_a_context_id(pdvm, pmixcc):
    exe = pmixcc("pmix_group")
    p = pdvm.run("--tag-output", "--host", f"{HEAD}:2,{FAR}:2", "-n", "4", exe, "put",
                 "construct:g1:ctxid", "get:0", "get:3", "destruct:g1", "construct:g2:ctxid",
                 timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    ctx1 = set(re.findall(r"CONSTRUCT status=0 ctxid=(\d+)\n", out)[::2])
    firsts = [ln for ln in out.splitlines() if "CONSTRUCT" in ln]
    assert len(firsts) == 8 and all("status=0" in ln for ln in firsts), out
    ids = {}
    for ln in firsts:
        rank = int(re.search(r",(\d+)\]", ln).group(1))
        ids.setdefault(rank, []).append(int(re.search(r"ctxid=(\d+)", ln).group(1)))
    assert len({v[0] for v in ids.values()}) == 1          # every member the same id
    assert len({v[1] for v in ids.values()}) == 1
    assert ids[0][0] != ids[0][1]                          # a new group, a new id
    assert ctx1
    assert out.count("GET rank=0 status=0 value=100") == 4
    assert out.count("GET rank=3 status=0 value=103") == 4
    assert out.count("DESTRUCT status=0") == 4


def test_a_member_that_dies_fails_the_construct_instead_of_hanging(pdvm, pmixcc):
    """Ranks 0 and 1 (head node) construct a group with rank 2 (the other node),
    which exits first: they get PMIX_GROUP_CONSTRUCT_ABORT and go on."""
    exe = pmixcc("pmix_group")
    p = pdvm.run("--no-abort-on-failure", "--tag-output", "--host", f"{HEAD}:2,{FAR}:1",
                 "-n", "3", exe, "put", "exit:2:0", "construct:g1", timeout=60)
    assert p.returncode == 1, p.stdout + p.stderr   # rank 2 ended without finalizing
    got = re.findall(r",(\d)\] CONSTRUCT status=(-?\d+)", p.stdout)
    assert sorted(got) == [("0", str(PMIX_GROUP_CONSTRUCT_ABORT)),
                           ("1", str(PMIX_GROUP_CONSTRUCT_ABORT))], p.stdout
    assert p.stdout.count("DONE status=0") == 2
