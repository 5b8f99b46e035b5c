"""Queued jobs (issue 32): ``run`` with ``queue``, ``pydvm run --queue``, ``pydvm_queue``.

A DVM of known slots (``a:2``) and jobs that hold their slots until the test
touches a file: the order jobs start in, the no-starvation rule, refusals,
``pydvm ps`` and ``pydvm kill`` of a queued job, a tool that goes away,
``run_many`` and output discarded at the source.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest

from dvmkit import finish, wait_for
from rawpeers import tool

pytestmark = pytest.mark.e2e

#: A rank that holds its slot until the file named by its argument exists.
HOLD = ("import os, sys, time\n"
        "while not os.path.exists(sys.argv[1]):\n"
        "    time.sleep(0.02)\n")

OUT_OF_RESOURCE = -29
BAD_PARAM = -27


def run_msg(rid, argv, n=1, **extra) -> dict:
    return {"t": "run", "id": rid, "apps": [{"argv": argv, "n": n}], "env": dict(os.environ),
            "cwd": os.getcwd(), "queue": True, **extra}


def hold(go) -> list[str]:
    return [sys.executable, "-c", HOLD, str(go)]


class Inbox:
    """A raw tool connection's messages, kept as they are read."""

    def __init__(self, peer) -> None:
        self.peer = peer
        self.seen: list[dict] = []

    def until(self, pred, what: str, timeout: float = 30) -> dict:
        for m in self.seen:
            if pred(m):
                return m
        while True:
            m = self.peer.recv(timeout)
            self.seen.append(m)
            if pred(m):
                return m

    def call(self, msg: dict) -> dict:
        """Send a request; its reply (what comes before it is kept)."""
        self.peer.send(msg)
        return self.first("reply", msg["id"])

    def first(self, t: str, ref) -> dict:
        key = "id" if t == "reply" else "ref"
        return self.until(lambda m: m.get("t") == t and m.get(key) == ref, f"{t} of {ref}")

    def index(self, t: str, ref) -> int:
        key = "id" if t == "reply" else "ref"
        return next(i for i, m in enumerate(self.seen) if m.get("t") == t and m.get(key) == ref)


def ps(dvm) -> dict[str, str]:
    return {j["nspace"]: j["state"] for j in json.loads(dvm.cmd("ps", "--json",
                                                               check=True).stdout)["jobs"]}


def records(dvm) -> dict:
    """The master's record counts (``pydvm info``'s ``records``)."""
    peer = tool(dvm)
    try:
        return peer.call({"t": "info"})["records"]
    finally:
        peer.close()


def test_jobs_start_in_order_and_a_big_job_is_not_starved_by_small_ones(make_dvm, tmp_path):
    """a:2 runs a 1-rank job; a 2-rank job then waits for the whole node, and
    the 1-rank jobs submitted after it -- which would fit the free slot --
    wait behind it (they share its node): it starts first, they follow."""
    dvm = make_dvm("a:2")
    t = Inbox(tool(dvm))
    go = {k: tmp_path / k for k in ("first", "big", "small")}
    t.peer.send(run_msg(1, hold(go["first"])))
    t.first("started", 1)
    t.peer.send(run_msg(2, hold(go["big"]), n=2))
    q = t.first("queued", 2)
    assert q["position"] == 1 and q["nspace"]
    for i in range(3, 6):  # a stream of small jobs, each of which fits the free slot
        t.peer.send(run_msg(i, hold(go["small"])))
        assert t.first("queued", i)["position"] == i - 1
    states = ps(dvm)
    assert states[q["nspace"]] == "queued"
    assert sum(1 for s in states.values() if s == "queued") == 4
    go["first"].touch()
    assert t.first("reply", 1)["exit"] == 0
    t.first("started", 2)
    # The big job holds both slots: the small ones still wait.
    assert all(ps(dvm)[t.first("queued", i)["nspace"]] == "queued" for i in range(3, 6))
    assert not any(m.get("t") == "started" and m.get("ref") in (3, 4, 5) for m in t.seen)
    go["big"].touch()
    assert t.first("reply", 2)["exit"] == 0
    for i in (3, 4):  # two fit the node; the third waits for them
        t.first("started", i)
    assert t.index("started", 2) < min(t.index("started", i) for i in (3, 4))
    assert ps(dvm)[t.first("queued", 5)["nspace"]] == "queued"
    go["small"].touch()
    for i in range(3, 6):
        assert t.first("reply", i)["exit"] == 0
    wait_for(lambda: records(dvm)["queued_jobs"] == 0 and records(dvm)["jobs"] == 0,
             what="nothing left at the master")


def test_a_job_on_other_nodes_passes_a_waiting_one(make_dvm, tmp_path):
    """Passing is allowed where it takes nothing the waiting job needs: a
    job on node b starts while a job on a waits."""
    dvm = make_dvm("a:1,b:1")
    t = Inbox(tool(dvm))
    go = tmp_path / "go"
    t.peer.send(run_msg(1, hold(go)) | {"apps": [{"argv": hold(go), "n": 1,
                                                              "hosts": [["a", 1]]}]})
    t.first("started", 1)
    t.peer.send(run_msg(2, hold(go)) | {"apps": [{"argv": hold(go), "n": 1,
                                                  "hosts": [["a", 1]]}]})
    t.first("queued", 2)
    t.peer.send(run_msg(3, hold(go)) | {"apps": [{"argv": hold(go), "n": 1,
                                                  "hosts": [["b", 1]]}]})
    t.first("started", 3)
    go.touch()
    for i in (1, 2, 3):
        assert t.first("reply", i)["exit"] == 0


def test_a_job_larger_than_its_hosts_is_refused_at_once(make_dvm, tmp_path):
    dvm = make_dvm("a:2")
    t = Inbox(tool(dvm))
    t.peer.send(run_msg(1, hold(tmp_path / "go"), n=3))
    r = t.first("reply", 1)
    assert r["status"] == OUT_OF_RESOURCE, r
    assert "3 on node a, which has 2 slots" in r["msg"], r["msg"]
    # Without queue it runs at once, oversubscribing, as before.
    (tmp_path / "go").touch()
    t.peer.send(run_msg(2, hold(tmp_path / "go"), n=3, queue=False))
    assert t.first("reply", 2)["exit"] == 0
    assert records(dvm)["queued_jobs"] == 0


def test_kill_of_a_queued_job_answers_its_run_as_killed(make_dvm, tmp_path):
    dvm = make_dvm("a:1")
    t = Inbox(tool(dvm))
    go = tmp_path / "go"
    t.peer.send(run_msg(1, hold(go)))
    t.first("started", 1)
    t.peer.send(run_msg(2, hold(go)))
    ns = t.first("queued", 2)["nspace"]
    k = dvm.cmd("kill", ns)
    assert k.returncode == 0, k.stderr
    r = t.first("reply", 2)
    assert r["status"] == 0 and r["exit"] != 0 and r["nspace"] == ns
    assert r["msg"].startswith("killed while queued by 'pydvm kill' from "), r["msg"]
    assert ns not in ps(dvm)
    assert not any(m.get("t") == "started" and m.get("ref") == 2 for m in t.seen)
    go.touch()
    assert t.first("reply", 1)["exit"] == 0


def test_a_queued_jobs_tool_going_away_removes_it(make_dvm, tmp_path):
    dvm = make_dvm("a:1")
    t = Inbox(tool(dvm))
    go = tmp_path / "go"
    t.peer.send(run_msg(1, hold(go)))
    t.first("started", 1)
    other = Inbox(tool(dvm))
    other.peer.send(run_msg(7, hold(go)))
    ns = other.first("queued", 7)["nspace"]
    assert ps(dvm)[ns] == "queued"
    other.peer.close()
    wait_for(lambda: ns not in ps(dvm), what="the queued job gone with its tool")
    assert records(dvm)["queued_jobs"] == 0
    go.touch()
    assert t.first("reply", 1)["exit"] == 0


def test_pydvm_run_queue_waits_shows_in_ps_and_is_killed_while_queued(make_dvm, tmp_path):
    """The command line: --queue on a DVM of a:1 holding its slot waits; ps
    says queued; pydvm kill ends it with a report and a non-zero status."""
    dvm = make_dvm("a:1")
    go = tmp_path / "go"
    first = dvm.run_bg("-n", "1", *hold(go))
    wait_for(lambda: "running" in ps(dvm).values(), what="the first job running")
    waiting = dvm.run_bg("--queue", "-n", "1", sys.executable, "-c", "print('ran')")
    ns = wait_for(lambda: next((n for n, s in ps(dvm).items() if s == "queued"), None),
                  what="the job queued")
    rows = dvm.cmd("ps", check=True).stdout.splitlines()
    assert any(r.startswith(ns + " ") and " queued " in r for r in rows), rows
    assert dvm.cmd("kill", ns).returncode == 0
    assert finish(waiting, 30) == 143
    err = waiting.stderr.read()
    assert "killed while queued by 'pydvm kill'" in err, err
    assert "ran" not in waiting.stdout.read()
    # Ctrl-C on a queued pydvm run takes its job off the queue.
    again = dvm.run_bg("--queue", "-n", "1", sys.executable, "-c", "print('ran')")
    ns = wait_for(lambda: next((n for n, s in ps(dvm).items() if s == "queued"), None),
                  what="the job queued")
    again.send_signal(signal.SIGINT)
    assert finish(again, 30) == 130
    assert ns not in ps(dvm) and "ran" not in again.stdout.read()
    go.touch()
    assert finish(first, 30) == 0


def test_pydvm_queue_on_makes_queueing_the_default(make_dvm, tmp_path):
    dvm = make_dvm("a:1", pydvm_queue="on")
    go = tmp_path / "go"
    first = dvm.run_bg("-n", "1", *hold(go))
    wait_for(lambda: "running" in ps(dvm).values(), what="the first job running")
    second = dvm.run_bg("-n", "1", sys.executable, "-c", "print('second ran')")
    wait_for(lambda: "queued" in ps(dvm).values(), what="the second job queued")
    # --no-queue starts at once even so (oversubscribing, as without a queue).
    p = dvm.cmd("run", "--no-queue", "-n", "1", sys.executable, "-c", "print('now')")
    assert p.returncode == 0 and p.stdout == "now\n", p.stderr
    go.touch()
    assert finish(first, 30) == 0
    assert finish(second, 30) == 0
    assert second.stdout.read() == "second ran\n"


def test_output_discarded_at_the_source(dvm):
    t = Inbox(tool(dvm))
    code = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"
    t.peer.send(run_msg(1, [sys.executable, "-c", code], n=3, queue=False, output="discard"))
    r = t.first("reply", 1)
    assert r["status"] == 0 and r["exit"] == 3, r
    assert not [m for m in t.seen if m.get("t") == "output"], t.seen
    t.peer.send(run_msg(2, [sys.executable, "-c", code], n=1, queue=False))
    assert t.first("reply", 2)["exit"] == 3
    assert [m for m in t.seen if m.get("t") == "output"]
    t.peer.send(run_msg(3, [sys.executable, "-c", code], output="elsewhere"))
    assert t.first("reply", 3)["status"] == BAD_PARAM


def test_run_many_answers_every_job_and_refuses_a_malformed_one_alone(make_dvm, tmp_path):
    """200 jobs in one request (one malformed): the batch reply lists each;
    every accepted job is then answered as a single run, most of them after
    waiting in the queue of a DVM with 4 slots."""
    dvm = make_dvm("a:2,b:2")
    t = Inbox(tool(dvm))
    code = "import os; print(os.environ['PYDVM_RANK'])"
    specs = [{"id": 100 + i, "apps": [{"argv": [sys.executable, "-c", code], "n": 1}],
              "env": dict(os.environ), "cwd": os.getcwd(), "queue": True,
              "output": "discard" if i % 2 else "forward"} for i in range(200)]
    specs[17] = {"id": 117, "apps": "nothing"}
    t.peer.send({"t": "run_many", "id": 1, "jobs": specs})
    r = t.first("reply", 1)
    assert r["status"] == 0 and len(r["results"]) == 200
    for sid, status, what in r["results"]:
        if sid == 117:
            assert status == BAD_PARAM and "app context" in what
        else:
            assert status == 0 and what.startswith("pydvm-"), (sid, status, what)
    assert len({w for _, _, w in r["results"]}) == 200
    for i in range(200):
        if i != 17:
            end = t.first("reply", 100 + i)
            assert end["status"] == 0 and end["exit"] == 0, end
    assert not any(m.get("id") == 117 and m is not r for m in t.seen if m.get("t") == "reply")
    outputs = [m for m in t.seen if m.get("t") == "output"]
    assert len({m["nspace"] for m in outputs}) == 100  # the forwarded half only
    wait_for(lambda: records(dvm)["queued_jobs"] == 0 and records(dvm)["jobs"] == 0,
             what="nothing left at the master")
    bad = tool(dvm)
    too_many = bad.call({"t": "run_many", "jobs": [{"id": i} for i in range(10_001)]})
    assert too_many["status"] == BAD_PARAM and "at most 10000" in too_many["msg"]


def test_jobs_submitted_together_reach_each_node_in_one_launch_message(make_dvm, monkeypatch):
    """50 jobs of one rank per node in one run_many: every node is sent one
    message carrying its 50 shares (its log says so), not 50 launches."""
    monkeypatch.setenv("PYDVM_DEBUG", "1")
    dvm = make_dvm("a,b,c")
    t = Inbox(tool(dvm))
    specs = [{"id": 100 + i, "apps": [{"argv": ["true"], "n": 3}], "env": dict(os.environ),
              "cwd": "/", "placement": {"map_by": "node"}} for i in range(50)]
    r = t.call({"t": "run_many", "id": 1, "jobs": specs})
    assert [s for _, s, _ in r["results"]] == [0] * 50
    for i in range(50):
        assert t.first("reply", 100 + i)["exit"] == 0
    for node in "abc":
        said = [ln for ln in dvm.log(node).splitlines() if "in one message" in ln]
        assert len(said) == 1 and f"{node}: 50 jobs' launches in one message" in said[0], said


def test_a_lost_node_replans_the_queued_jobs_that_still_fit_and_refuses_the_others(
        make_dvm, tmp_path):
    """Jobs waiting on a node that is lost are laid out again on the nodes
    left, as a job submitted now would be: one that still fits waits on (and
    runs there), one that no longer can is refused, saying why; the others
    are left alone."""
    dvm = make_dvm("a:1,b:1,c:1")
    t = Inbox(tool(dvm))
    go = tmp_path / "go"

    def on(rid, hosts, n=1, argv=None):
        argv = argv or hold(go)
        app = {"argv": argv, "n": n}
        if hosts:
            app["hosts"] = [[h, 1] for h in hosts]
        return run_msg(rid, argv) | {"apps": [app]}
    t.peer.send(on(1, "a"))
    t.first("started", 1)
    t.peer.send(on(2, "", n=2, argv=["true"]))  # the DVM's nodes: a and b
    ns2 = t.first("queued", 2)["nspace"]
    t.peer.send(on(3, "ab", n=2))  # asks for a and b by name
    t.first("queued", 3)
    t.peer.send(on(4, "a", argv=["true"]))
    ns4 = t.first("queued", 4)["nspace"]
    assert [j["ranks_per_node"] for j in _ps_jobs(dvm) if j["nspace"] == ns2] == [
        {"a": 1, "b": 1}]
    os.kill(dvm.daemon_pids["b"], signal.SIGKILL)
    r = t.first("reply", 3)
    assert r["status"] == 0 and r["exit"] == 255, r
    assert r["msg"].startswith("node b was lost while the job was queued"), r["msg"]
    assert "the nodes left cannot run it" in r["msg"] and "node a" in r["msg"], r["msg"]
    # job 2 is laid out again on a and c, and still waits for a
    wait_for(lambda: [j["ranks_per_node"] for j in _ps_jobs(dvm) if j["nspace"] == ns2]
             == [{"a": 1, "c": 1}], what="job 2 laid out on a and c")
    states = ps(dvm)
    assert states[ns2] == "queued" and states[ns4] == "queued", states
    go.touch()
    assert t.first("reply", 1)["exit"] == 0
    assert t.first("started", 2)["nodes"] == ["a", "c"]
    assert t.first("reply", 2)["exit"] == 0
    assert t.first("reply", 4)["exit"] == 0
    assert t.index("started", 2) < t.index("started", 4)  # FIFO on a kept
    assert records(dvm)["queued_jobs"] == 0


def test_a_job_waiting_for_a_lost_node_starts_at_once_on_the_nodes_left(make_dvm, tmp_path):
    """What a queued job waited for was on the node that is lost: laid out
    again on the nodes left, it fits, and starts there at once."""
    dvm = make_dvm("a:1,b:1,c:1")
    t = Inbox(tool(dvm))
    go = tmp_path / "go"
    t.peer.send(run_msg(1, hold(go)) | {"apps": [{"argv": hold(go), "n": 1,
                                                  "hosts": [["b", 1]]}]})
    t.first("started", 1)
    t.peer.send(run_msg(2, ["true"], n=2))  # a and b; b is busy
    t.first("queued", 2)
    os.kill(dvm.daemon_pids["b"], signal.SIGKILL)
    assert t.first("reply", 1)["exit"] == 255  # it ran there
    assert t.first("started", 2)["nodes"] == ["a", "c"]
    assert t.first("reply", 2)["exit"] == 0
    go.touch()


def _ps_jobs(dvm) -> list[dict]:
    return json.loads(dvm.cmd("ps", "--json", check=True).stdout)["jobs"]
