"""Debugger bookkeeping (runtime/master/debugging.py) and the job-level items it
registers (pmix/jobinfo.py): pure units, real job records, no libpmix."""

from __future__ import annotations

import asyncio

import pytest

from pydvm.pmix import constants as C
from pydvm.pmix.jobinfo import JobLayout, job_info
from pydvm.pmix.values import Proc, Value
from pydvm.runtime.master import debugging as D
from pydvm.runtime.pmixhost.debugger import spawn_directives
from pydvm.runtime.shared.jobs import AppRecord, JobRecord, ProcRecord, ProcState
from pydvm.runtime.pmixhost.codec import job_layout

W = C.RANK_WILDCARD


def job(ns="j@1", nodes=("n1", "n1", "n2"), uid=1000, stop=True) -> JobRecord:
    procs = {r: ProcRecord(r, 0, n, ProcState.RUNNING) for r, n in enumerate(nodes)}
    j = JobRecord(ns, 0, [AppRecord(0, ["/bin/prog"], list(procs))], procs)
    j.uid, j.stop_in_init = uid, stop
    return j


def test_stop_in_init_is_registered_only_for_jobs_that_stop():
    lay = {"nodes": {"n1": [0]}, "apps": [1]}
    plain = dict(job_info(job_layout("j@1", lay, 0), "n1"))
    assert C.DEBUG_STOP_IN_INIT not in plain and C.DEBUG_TARGET not in plain
    held = dict(job_info(job_layout("j@1", {**lay, "stop_in_init": True,
                                            "debug_target": ["t@2", W]}, 0), "n1"))
    # libpmix 4.2's client stops whenever the key is there: rank WILDCARD, as PRRTE has it
    assert held[C.DEBUG_STOP_IN_INIT] == Value(W, C.PROC_RANK)
    assert held[C.DEBUG_TARGET] == Value(Proc("t@2", W), C.PROC)
    assert held[C.DEBUG_JOB] == Value("t@2", C.STRING)
    assert JobLayout("x", {"n": [0]}).extra == []


@pytest.mark.parametrize("info, want", [
    ({C.DEBUG_STOP_IN_INIT: Value(True, C.BOOL)}, {"stop_in_init": True}),
    ({C.DEBUG_STOP_IN_INIT: Value(False, C.BOOL)}, {}),
    ({C.DEBUG_STOP_IN_INIT: Value(W, C.PROC_RANK)}, {"stop_in_init": True}),
    ({C.DEBUG_TARGET: Value(Proc("t@2", 1), C.PROC),
      C.DEBUG_DAEMONS_PER_NODE: Value(2, C.UINT16)},
     {"debug_target": ["t@2", 1], "daemons_per_node": 2}),
    ({"pmix.mapby": Value("slot", C.STRING)}, {}),
    ({C.DEBUG_JOB: Value("t@2", C.STRING), C.DEBUGGER_DAEMONS: Value(True, C.BOOL)},
     {"debug_target": ["t@2", W]}),                 # what examples/debugger.c sends
])
def test_spawn_directives(info, want):
    assert spawn_directives(info) == want


@pytest.mark.parametrize("info, status", [
    ({C.DEBUG_STOP_IN_INIT: Value(1, C.PROC_RANK)}, C.ERR_NOT_SUPPORTED),  # one rank: all or none
    ({C.DEBUG_STOP_ON_EXEC: Value(True, C.BOOL)}, C.ERR_NOT_SUPPORTED),
    ({C.DEBUG_TARGET: Value("t@2", C.STRING)}, C.ERR_BAD_PARAM),
    ({C.DEBUG_DAEMONS_PER_NODE: Value(1, C.UINT16)}, C.ERR_BAD_PARAM),    # no target
    ({C.DEBUG_TARGET: Value(Proc("t@2", W), C.PROC),
      C.DEBUG_DAEMONS_PER_PROC: Value(0, C.UINT16)}, C.ERR_BAD_PARAM),
])
def test_spawn_directives_refused(info, status):
    assert spawn_directives(info)["refused"][0] == status


def test_daemons_go_next_to_the_target():
    t = job()
    assert D.daemon_hosts(t, W, None, None) == [["n1", 1], ["n2", 1]]
    assert D.daemon_hosts(t, W, 3, None) == [["n1", 3], ["n2", 3]]
    assert D.daemon_hosts(t, W, None, 2) == [["n1", 4], ["n2", 2]]
    assert D.daemon_hosts(t, 2, None, None) == [["n2", 1]]
    with pytest.raises(D.SpawnRefused) as e:
        D.daemon_hosts(t, 7, None, None)
    assert e.value.status == C.ERR_BAD_PARAM


def test_a_release_event_marks_only_the_senders_jobs_released():
    mine, theirs, whole = job("a@1"), job("b@2", uid=2000), job("c@3")
    jobs = {j.nspace: j for j in (mine, theirs, whole)}
    rng = [C.EVENT_CUSTOM_RANGE, C.DATA_ARRAY, [C.PROC, [["a@1", W], ["b@2", W], ["c@3", 0]]]]
    D.released_by_event(jobs, C.DEBUGGER_RELEASE, C.RANGE_CUSTOM, [rng], 1000)
    assert (mine.released, theirs.released, whole.released) == (True, False, False)
    D.released_by_event(jobs, C.DEBUGGER_RELEASE + 1, C.RANGE_CUSTOM, [rng], 0)
    assert not theirs.released
    D.released_by_event(jobs, C.DEBUGGER_RELEASE, C.RANGE_CUSTOM, [rng], 0)   # root
    assert theirs.released and not whole.released     # rank 0 of 3
    for r in (1, 2):
        D.released_by_event(jobs, C.DEBUGGER_RELEASE, C.RANGE_CUSTOM,
                            [[C.EVENT_CUSTOM_RANGE, C.PROC, ["c@3", r]]], 1000)
    assert whole.released and whole.state == "running"


def test_state_and_release():
    j = job()
    assert j.state == "stopped"
    D.note_ready(j, "n2")
    assert j.debug_ready == {"n2"}

    class Nodes:
        sent = []

        async def deliver_event(self, nodes, code, source, rng, info):
            self.sent.append((sorted(nodes), code, source, rng, info))

    n = Nodes()
    assert asyncio.run(D.release(n, j, ("dvm", 0), "test"))
    assert j.released and j.state == "running"
    ((nodes, code, _src, rng, info),) = n.sent
    assert (nodes, code, rng) == (["n1", "n2"], C.DEBUGGER_RELEASE, C.RANGE_CUSTOM)
    assert [C.EVENT_CUSTOM_RANGE, C.PROC, ["j@1", W]] in info
    assert not asyncio.run(D.release(n, job(stop=False), ("dvm", 0), "test"))
