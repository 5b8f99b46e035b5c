"""The master's answers to PMIx queries (runtime/pmixhost/query.py), from real job
records and a stand-in node table: which jobs each user sees, each key's
form, the statuses of refused and partly answered queries; and that a
process table crosses a user's agent link (the agents' codec)."""

from __future__ import annotations

import asyncio

from pydvm.errors import Status
from pydvm.pmix import constants as C
from pydvm.pmix.values import DataArray, ProcInfo, Proc, Value
from pydvm.runtime.pmixhost import query as PQ
from pydvm.runtime.shared.jobs import AppRecord, JobRecord, ProcRecord, ProcState
from pydvm.runtime.pmixhost.codec import decode, encode


def job(ns: str, uid: int, states=(ProcState.RUNNING, ProcState.RUNNING)) -> JobRecord:
    procs = {r: ProcRecord(r, 0, "n1" if r == 0 else "n2", st) for r, st in enumerate(states)}
    j = JobRecord(ns, 0, [AppRecord(0, ["/bin/prog", "-x"], list(procs))], procs)
    j.uid = uid
    return j


class Processes:
    def __init__(self, *jobs):
        self.jobs = {j.nspace: j for j in jobs}


class Nodes:
    def __init__(self):
        self.asked = []

    def up_names(self):
        return ["n1", "n2", "n3"]

    async def broadcast(self, msg, nodes, what=""):
        self.asked.append((msg["nspace"], sorted(nodes)))
        return [(n, {"pids": [[0 if n == "n1" else 1, 100 if n == "n1" else 200]]})
                for n in sorted(nodes)]


class Daemon:
    def __init__(self):
        self.sent = []

    def send(self, msg):
        self.sent.append(msg)


def ask(mq, uid, *queries, node="n1"):
    d = Daemon()
    asyncio.run(mq.request(d, {"t": "query", "id": 1, "uid": uid, "node": node,
                               "queries": [list(q) for q in queries]}))
    (r,) = d.sent
    return r["status"], {k: (form, data) for k, form, data in r.get("results") or ()}


def test_each_user_sees_only_their_jobs_and_root_all():
    mq = PQ.MasterQueries(Processes(job("a@1", 1001), job("b@2", 1002)), Nodes())
    assert ask(mq, 1001, (["pmix.qry.ns"], {}))[1] == {"pmix.qry.ns": ("str", "a@1")}
    assert ask(mq, 0, (["pmix.qry.ns"], {}))[1] == {"pmix.qry.ns": ("str", "a@1,b@2")}
    status, res = ask(mq, 1001, (["pmix.qry.ptable"], {"pmix.nspace": "b@2"}))
    assert (status, res) == (Status.ERR_NOT_FOUND, {})


def test_forms_of_the_answered_keys():
    nodes = Nodes()
    mq = PQ.MasterQueries(Processes(job("a@1", 1001, (ProcState.RUNNING, ProcState.ENDED))),
                          nodes)
    mq._processes.jobs["a@1"].procs[1].exit_status = 3
    status, res = ask(mq, 1001, (["pmix.qry.ptable", "pmix.qry.lptable", "pmix.job.size",
                                  "pmix.nlist", "pmix.qry.jst"], {"pmix.nspace": "a@1"}),
                      (["pmix.num.nodes", "pmix.qry.nsinfo"], {}))
    assert status == Status.SUCCESS
    assert res["pmix.qry.ptable"] == ("ptable", [["a@1", 0, "n1", "/bin/prog", 100, 0, 5],
                                                 ["a@1", 1, "n2", "/bin/prog", 200, 3, 62]])
    assert res["pmix.qry.lptable"] == ("ptable", [["a@1", 0, "n1", "/bin/prog", 100, 0, 5]])
    assert nodes.asked == [("a@1", ["n1", "n2"]), ("a@1", ["n1"])]
    assert res["pmix.job.size"] == ("u32", 2)
    assert res["pmix.nlist"] == ("str", "n1,n2")
    assert res["pmix.qry.jst"] == ("status", Status.SUCCESS)
    assert res["pmix.num.nodes"] == ("u32", 3)
    assert res["pmix.qry.nsinfo"] == ("nsinfo", [["a@1", "/bin/prog -x"]])


def test_refusals_and_partial_answers():
    mq = PQ.MasterQueries(Processes(job("a@1", 1001)), Nodes())
    assert ask(mq, 1001, (["pmix.qry.mem"], {}))[0] == C.ERR_NOT_SUPPORTED
    assert ask(mq, 1001, (["pmix.query.alloc"], {"pmix.alloc.id": "x"}))[0] == \
        Status.ERR_NOT_FOUND
    assert ask(mq, 1001, (["pmix.qry.ptable"], {}))[0] == Status.ERR_BAD_PARAM
    status, res = ask(mq, 1001, (["pmix.qry.ns", "pmix.qry.mem"], {}))
    assert status == PQ.Q.PARTIAL_SUCCESS and set(res) == {"pmix.qry.ns"}


def test_a_process_table_crosses_an_agents_link():
    _key, v = PQ.to_pmix("pmix.qry.ptable", "ptable", [["a@1", 0, "n1", "/bin/p", 9, 0, 5]])
    assert decode(encode(v)) == v == Value(DataArray(C.PROC_INFO, (
        ProcInfo(Proc("a@1", 0), "n1", "/bin/p", 9, 0, 5),)), C.DATA_ARRAY)
