"""PMIx job control: what directives ask for (pmix/jobctl.py), the master's
checks and actions (runtime/pmixhost/jobctl.py) from real job records and a
stand-in node table, and the requests crossing a user's agent link."""

from __future__ import annotations

import asyncio

import pytest

from pydvm.errors import Status
from pydvm.pmix import constants as C
from pydvm.pmix import jobctl as J
from pydvm.pmix.requests import Allocate, JobControl
from pydvm.pmix.values import DataArray, Proc, Value
from pydvm.runtime.pmixhost import jobctl as PJ
from pydvm.runtime.shared.jobs import AppRecord, JobRecord, ProcRecord, ProcState
from pydvm.runtime.pmixhost.codec import decode_request, encode_request

W = C.RANK_WILDCARD


def b(x=True):
    return Value(x, C.BOOL)


def i(x):
    return Value(x, C.INT)


@pytest.mark.parametrize("dirs,want", [
    ({J.JOB_CTRL_KILL: b()}, ("kill", 0)),
    ({J.JOB_CTRL_TERMINATE: b()}, ("terminate", 0)),
    ({J.JOB_CTRL_SIGNAL: i(10)}, ("signal", 10)),
    ({J.JOB_CTRL_PAUSE: b()}, ("signal", 19)),
    ({J.JOB_CTRL_RESUME: b()}, ("signal", 18)),
    ({J.JOB_CTRL_KILL: b(False)}, None),
    ({J.JOB_CTRL_PREEMPTIBLE: b(), J.JOB_CTRL_ID: Value("x", C.STRING),
      J.JOB_CTRL_CHECKPOINT_METHOD: Value(DataArray(C.INFO, ()), C.DATA_ARRAY)}, None),
    ({J.JOB_CTRL_SIGNAL: i(12), "pmix.timeout": i(5)}, ("signal", 12)),
])
def test_what_directives_ask_for(dirs, want):
    assert J.action_of(dirs) == want


@pytest.mark.parametrize("dirs,unreadable,status", [
    ({J.JOB_CTRL_SIGNAL: i(0)}, (), C.ERR_BAD_PARAM),
    ({J.JOB_CTRL_SIGNAL: i(65)}, (), C.ERR_BAD_PARAM),
    ({J.JOB_CTRL_SIGNAL: Value("TERM", C.STRING)}, (), C.ERR_BAD_PARAM),
    ({J.JOB_CTRL_KILL: i(1)}, (), C.ERR_BAD_PARAM),
    ({J.JOB_CTRL_KILL: b(), J.JOB_CTRL_SIGNAL: i(10)}, (), C.ERR_BAD_PARAM),
    ({}, (J.JOB_CTRL_SIGNAL,), C.ERR_BAD_PARAM),
    ({J.JOB_CTRL_CHECKPOINT: Value("c1", C.STRING)}, (), C.ERR_NOT_SUPPORTED),
    ({J.JOB_CTRL_PROVISION: Value("n1", C.STRING)}, (), C.ERR_NOT_SUPPORTED),
    ({"pmix.jctrl.future": b()}, (), C.ERR_NOT_SUPPORTED),
])
def test_what_cannot_be_done_is_refused_with_the_standards_status(dirs, unreadable, status):
    with pytest.raises(J.Refused) as e:
        J.action_of(dirs, unreadable)
    assert e.value.status == status


def job(ns: str, uid: int | None, states=(ProcState.RUNNING, ProcState.RUNNING)) -> JobRecord:
    procs = {r: ProcRecord(r, 0, "n1" if r == 0 else "n2", st) for r, st in enumerate(states)}
    j = JobRecord(ns, 0, [AppRecord(0, ["/bin/prog"], list(procs))], procs)
    j.uid = uid
    return j


class Processes:
    def __init__(self, *jobs):
        self.jobs = {j.nspace: j for j in jobs}
        self.killed = []

    def kill(self, ns, why):
        self.killed.append((ns, why))

    def end_requested(self, ns, ranks, why):
        self.killed.append((ns, list(ranks), why))


class Nodes:
    def __init__(self):
        self.sent = []

    async def broadcast(self, msg, nodes, what=""):
        self.sent.append((sorted(nodes), msg))
        return [(n, {"status": 0, "procs": len(msg["ranks"])}) for n in sorted(nodes)]


class Daemon:
    def __init__(self):
        self.sent = []

    def send(self, msg):
        self.sent.append(msg)


def ask(mjc, uid, targets, action="signal", sig=10, requester=("a@1", 0)):
    d = Daemon()
    asyncio.run(mjc.request(d, {"t": "jobctl", "id": 1, "uid": uid,
                                "requester": list(requester), "targets": targets,
                                "action": action, "signal": sig}))
    (r,) = d.sent
    return r["status"], r


def test_a_signal_goes_to_the_nodes_of_the_targets_only():
    nodes = Nodes()
    mjc = PJ.MasterJobControl(Processes(job("a@1", 1001)), nodes)
    status, r = ask(mjc, 1001, [["a@1", 1]])
    assert (status, r["procs"]) == (Status.SUCCESS, 1)
    assert nodes.sent == [(["n2"], {"t": "jobctl", "nspace": "a@1", "ranks": [1],
                                    "action": "signal", "signal": 10})]
    nodes.sent.clear()
    assert ask(mjc, 1001, [["a@1", W]])[1]["procs"] == 2
    assert sorted(n for n, _ in nodes.sent) == [["n1"], ["n2"]]


def test_killing_a_namespace_is_the_jobs_kill_naming_the_requester():
    procs, nodes = Processes(job("a@1", 1001)), Nodes()
    status, r = ask(PJ.MasterJobControl(procs, nodes), 1001, [["a@1", W]], "terminate", 0)
    assert (status, r["procs"]) == (Status.SUCCESS, 2)
    assert procs.killed == [("a@1", "killed by PMIx_Job_control from a@1:0 (uid 1001)")]
    assert nodes.sent == []


def test_killing_ranks_ends_only_those_that_run():
    nodes = Nodes()
    mjc = PJ.MasterJobControl(Processes(job("a@1", 1001, (ProcState.RUNNING,
                                                          ProcState.ENDED))), nodes)
    status, r = ask(mjc, 1001, [["a@1", 0], ["a@1", 1]], "kill", 0)
    assert (status, r["procs"]) == (Status.SUCCESS, 1)
    assert [m["ranks"] for _, m in nodes.sent] == [[0]]
    assert mjc._processes.killed == [("a@1", [0], "PMIx_Job_control from a@1:0 (uid 1001)")]


def test_only_the_jobs_own_uid_or_root_may_and_nothing_is_done_on_a_refusal():
    procs, nodes = Processes(job("a@1", 1001), job("b@2", 1002)), Nodes()
    mjc = PJ.MasterJobControl(procs, nodes)
    assert ask(mjc, 1001, [["a@1", 0], ["b@2", 0]], "kill", 0)[0] == Status.ERR_NO_PERMISSIONS
    assert nodes.sent == [] and procs.killed == []
    assert ask(mjc, 0, [["b@2", W]], "kill", 0)[0] == Status.SUCCESS
    assert procs.killed and procs.killed[0][0] == "b@2"


@pytest.mark.parametrize("bad", [{"uid": "root"}, {"action": "explode"}, {"targets": []},
                                 {"targets": [["a@1"]]}, {"requester": None}])
def test_a_malformed_request_is_answered_bad_param_and_changes_nothing(bad):
    procs, nodes = Processes(job("a@1", 1001)), Nodes()
    d = Daemon()
    msg = {"t": "jobctl", "id": 3, "uid": 1001, "requester": ["a@1", 0],
           "targets": [["a@1", W]], "action": "kill", "signal": 0, **bad}
    asyncio.run(PJ.MasterJobControl(procs, nodes).request(d, msg))
    assert [(m["id"], m["status"]) for m in d.sent] == [(3, Status.ERR_BAD_PARAM)]
    assert procs.killed == [] and nodes.sent == []


def test_unknown_targets_and_bad_requests():
    mjc = PJ.MasterJobControl(Processes(job("a@1", 1001)), Nodes())
    assert ask(mjc, 1001, [["z@9", 0]])[0] == Status.ERR_NOT_FOUND
    assert ask(mjc, 1001, [["a@1", 7]])[0] == Status.ERR_BAD_PARAM
    assert ask(mjc, 1001, [["a@1", 0]], sig=0)[0] == Status.ERR_BAD_PARAM


def test_the_requests_cross_an_agents_link():
    jc = JobControl(Proc("a@1", 0), [Proc("a@1", W)], {J.JOB_CTRL_SIGNAL: i(10)}, [])
    back = decode_request(encode_request(jc))
    assert (back.kind, back.proc, back.procs, back.directives, back.unreadable) == \
        ("job_control", jc.proc, jc.procs, jc.directives, [])
    al = Allocate(Proc("a@1", 0), J.ALLOC_NEW, {"pmix.alloc.nnodes": Value(12, C.UINT64)})
    back = decode_request(encode_request(al))
    assert (back.kind, back.directive, back.info) == ("allocate", J.ALLOC_NEW, al.info)


class Channel:
    def __init__(self):
        self.sent = []

    def send(self, msg):
        self.sent.append(msg)


class Node:
    jobs: dict = {}


@pytest.mark.parametrize("msg", [
    {"nspace": "a@1", "ranks": [0], "action": "explode", "signal": 0},
    {"nspace": "a@1", "ranks": [[0]], "action": "kill", "signal": 0},
    {"nspace": "a@1", "ranks": [0], "action": "signal", "signal": None},
    {"nspace": "a@1", "ranks": "0", "action": "signal", "signal": 10},
])
def test_a_node_refuses_a_malformed_jobctl_and_answers_it(msg):
    ch = Channel()
    PJ.on_master(Node(), ch, {"t": "jobctl", "id": 7, **msg})
    assert [(m["id"], m["status"]) for m in ch.sent] == [(7, Status.ERR_BAD_PARAM)]


def test_a_node_answers_a_jobctl_for_a_job_it_no_longer_has():
    ch = Channel()
    PJ.on_master(Node(), ch, {"t": "jobctl", "id": 8, "nspace": "gone@1", "ranks": [0],
                              "action": "signal", "signal": 10})
    assert [(m["status"], m["procs"]) for m in ch.sent] == [(Status.SUCCESS, 0)]
