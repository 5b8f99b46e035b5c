"""Job events (issue 32): ``subscribe``, ``unsubscribe``, ``pydvm events``, bounded subscribers."""

from __future__ import annotations

import json
import os
import socket
import sys

import pytest

from dvmkit import finish, wait_for
from rawpeers import Peer, master_uri, tool
from test_queue import Inbox, hold, records, run_msg

from pydvm.protocol import mac

pytestmark = pytest.mark.e2e

NOT_FOUND = -46


def events_of(inbox: Inbox, ref, ns: str) -> list[dict]:
    """The events of ``ns`` on subscription ``ref``, read until its ``ended``."""
    inbox.until(lambda m: m.get("t") == "job_event" and m.get("ref") == ref
                and m.get("nspace") == ns and m.get("kind") == "ended", f"{ns} ended")
    return [m for m in inbox.seen if m.get("t") == "job_event" and m.get("ref") == ref
            and m.get("nspace") == ns]


def test_a_jobs_events_come_in_order_with_their_details(make_dvm, tmp_path):
    """queued, started (size, nodes), one proc_exit per rank, ended -- in
    that order, for a whole-DVM subscription and for one naming the job."""
    dvm = make_dvm("a:2,b:1")
    sub = Inbox(tool(dvm))
    assert sub.peer.call({"t": "subscribe", "id": 50})["status"] == 0
    t = Inbox(tool(dvm))
    go = tmp_path / "go"
    t.peer.send(run_msg(1, hold(go), n=3))
    first = t.first("started", 1)["nspace"]
    code = ("import os, sys, time\n"
            "while not os.path.exists(sys.argv[1]): time.sleep(0.02)\n"
            "sys.exit(3 if os.environ['PYDVM_RANK'] == '1' else 0)")
    t.peer.send(run_msg(2, [sys.executable, "-c", code, str(go)], n=2))
    ns = t.first("queued", 2)["nspace"]
    assert sub.call({"t": "subscribe", "id": 51, "nspace": ns})["status"] == 0
    go.touch()
    assert t.first("reply", 2)["exit"] == 3
    for ref in (50, 51):
        evs = events_of(sub, ref, ns)
        kinds = [e["kind"] for e in evs]
        if ref == 50:
            assert kinds[0] == "queued" and evs[0]["position"] == 1, evs
            kinds, evs = kinds[1:], evs[1:]
        assert kinds == ["started", "proc_exit", "proc_exit", "ended"], kinds
        assert evs[0]["size"] == 2 and evs[0]["nodes"] == {"a": [0, 1]}
        exits = {e["rank"]: (e["node"], e["status"], e["signal"]) for e in evs[1:3]}
        assert exits == {0: ("a", 0, 0), 1: ("a", 3, 0)}
        end = evs[-1]
        assert (end["exit"], end["failed"], end["killed"], end["reason"]) == (3, 1, 0, "")
        assert all(isinstance(e["time"], float) and e["session"] == 0 for e in evs)
        assert [e["time"] for e in evs] == sorted(e["time"] for e in evs)
    assert [e["kind"] for e in events_of(sub, 50, first)][-1] == "ended"
    # The job's own subscription ended with it; the whole-DVM one stays.
    wait_for(lambda: records(dvm)["event_subscriptions"] == 1, what="51 gone with its job")
    assert sub.call({"t": "unsubscribe", "id": 52, "ref": 50})["status"] == 0
    assert records(dvm)["event_subscriptions"] == 0
    r = sub.call({"t": "subscribe", "id": 53, "nspace": "pydvm-nobody@9"})
    assert r["status"] == NOT_FOUND and "no running or queued job" in r["msg"]


def test_a_job_killed_while_queued_ends_without_starting(make_dvm, tmp_path):
    dvm = make_dvm("a:1")
    t = Inbox(tool(dvm))
    go = tmp_path / "go"
    t.peer.send(run_msg(1, hold(go)))
    t.first("started", 1)
    t.peer.send(run_msg(2, hold(go)))
    ns = t.first("queued", 2)["nspace"]
    sub = Inbox(tool(dvm))
    assert sub.peer.call({"t": "subscribe", "id": 9, "nspace": ns})["status"] == 0
    assert dvm.cmd("kill", ns).returncode == 0
    (end,) = events_of(sub, 9, ns)
    assert end["kind"] == "ended" and end["exit"] != 0 and end["killed"] == 0
    assert end["reason"].startswith("killed while queued by 'pydvm kill'")
    go.touch()
    assert t.first("reply", 1)["exit"] == 0


def test_pydvm_events_prints_a_jobs_events_and_ends_with_it(dvm, tmp_path):
    go = tmp_path / "go"
    bg = dvm.run_bg("-n", "2", *hold(go))
    ns = wait_for(lambda: next((j["nspace"] for j in json.loads(
        dvm.cmd("ps", "--json", check=True).stdout)["jobs"]), None), what="the job listed")
    env = dict(dvm.env, PYDVM_URI=dvm.uri)
    import subprocess

    from dvmkit import PYDVM

    ev = subprocess.Popen(PYDVM + ["events", "--job", ns], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    ev_json = subprocess.Popen(PYDVM + ["events", "--job", ns, "--json"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               stdin=subprocess.DEVNULL)
    wait_for(lambda: records(dvm)["event_subscriptions"] == 2, what="both subscribed")
    go.touch()
    assert finish(bg, 30) == 0
    assert finish(ev, 30) == 0, ev.stderr.read()
    assert finish(ev_json, 30) == 0, ev_json.stderr.read()
    lines = ev.stdout.read().splitlines()
    assert [ln.split()[1:3] for ln in lines] == [[ns, "proc_exit"]] * 2 + [[ns, "ended"]], lines
    assert lines[-1].endswith(" ended exit=0 failed=0 killed=0"), lines
    evs = [json.loads(ln) for ln in ev_json.stdout.read().splitlines()]
    assert [e["kind"] for e in evs] == ["proc_exit", "proc_exit", "ended"]
    assert sorted(e["rank"] for e in evs[:2]) == [0, 1]
    bad = dvm.cmd("events", "--job", "pydvm-nobody@1")
    assert bad.returncode == 1 and "no running or queued job" in bad.stderr


def test_a_subscriber_that_never_reads_is_dropped(make_dvm, tmp_path):
    """A tool that subscribes and stops reading: past pydvm_event_backlog
    its subscription is dropped (logged), its connection left alone, and
    the master holds nothing more for it."""
    dvm = make_dvm("a:4", pydvm_event_backlog="1k")
    uri = master_uri(dvm)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # Small buffers on our side, and small segments, so that the master's
    # kernel cannot take much either (loopback's 64 KiB segments would let
    # its send buffer grow to megabytes): what we leave unread piles up in
    # the master's own buffer, which is what the cap is about.
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
    s.connect((uri.host, uri.port))
    lazy = Peer(s, "lazy")
    challenge = lazy.recv()
    assert lazy.call({"t": "auth", "role": "tool",
                      "mac": mac(dvm.secret(), challenge["nonce"], "tool")})["status"] == 0
    assert lazy.call({"t": "subscribe", "id": 1})["status"] == 0
    assert records(dvm)["event_subscriptions"] == 1
    t = Inbox(tool(dvm))
    # How much the kernels take before the master's own buffer grows
    # depends on the machine (send-buffer autotuning), so jobs are
    # submitted in batches until the drop, up to far more events than any
    # kernel holds for a reader that advertises 4 KiB.
    batches = 0
    while records(dvm)["event_subscriptions"] and batches < 40:
        first = 100 + 100 * batches
        specs = [{"id": first + i, "apps": [{"argv": ["true"], "n": 1}],
                  "env": dict(os.environ), "cwd": "/", "queue": True, "output": "discard"}
                 for i in range(100)]
        t.peer.send({"t": "run_many", "id": first - 1, "jobs": specs})
        assert t.first("reply", first - 1)["status"] == 0
        for i in range(100):
            assert t.first("reply", first + i)["exit"] == 0
        batches += 1
    assert records(dvm)["event_subscriptions"] == 0, f"not dropped after {batches * 100} jobs"
    log = dvm.log("master")
    assert "job-event subscription(s) dropped: the connection has" in log, log[-2000:]
    # The connection itself is still served.
    lazy.sock.settimeout(5)
    seen = []
    while not any(m.get("kind") == "dropped" for m in seen):
        seen.append(lazy.recv())
    assert lazy.call({"t": "ping"})["status"] == 0
    lazy.close()

