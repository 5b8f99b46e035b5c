"""The master's components through their interfaces, without processes or sockets.

A real :class:`~pydvm.runtime.master.server.Master` is built (its constructor
opens nothing) and its nodes are marked up with stand-in links
(``masterkit.py``): every message goes through the master's dispatch tables
to the component that owns it, and every fan-out through the listeners the
master wires.  What these tests pin down:

* every message type is handled by a method of one component, and
  master/DESIGN.md's message table says the same;
* one predicate answers "may anyone act for ns:rank (on node N)", in the
  same words wherever it is asked, and one builder makes a process's
  identity;
* a lost node, an ended process, an ended job fan out to every component
  that holds something of it -- and once a job is over the master holds
  nothing more than before it ran;
* job streams (output credit, stdin window), PMIx spawn (a child reports to
  its parent's ``pydvm run``, which waits for it), the tool gates, the
  direct gate (a credential admitted while its process runs, refused in the
  predicate's words after, its connection closed at the process's end).
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import pytest
from masterkit import exited, master_with, run_job, settle, tool

from pydvm.enums import Persistence, Range
from pydvm.errors import Status
from pydvm.runtime.master import server as master_mod
from pydvm.runtime.master import toolreqs
from pydvm.runtime.master.collectives import PMIX_REQUESTS
from pydvm.runtime.master.core import DEFAULT_SESSION, LOST_STATUS
from pydvm.runtime.shared.dataops import DATA_OPS
from pydvm.runtime.node.jobio import STDIN_WINDOW
from pydvm.runtime.shared.peers import ClaimRefused, process_caller

DESIGN = Path(master_mod.__file__).parent / "DESIGN.md"
TABLES = {"daemon": master_mod.DAEMON_MESSAGES, "tool": master_mod.TOOL_MESSAGES,
          "direct": master_mod.DIRECT_MESSAGES}


def two_ranks() -> list[dict]:
    """rank 0 on a, rank 1 on b."""
    return [{"argv": ["prog"], "n": 2, "hosts": [["a", 1], ["b", 1]]}]


def replies(session) -> list[dict]:
    return [m for m in session.channel.sent if m.get("t") == "reply"]


def idle_records(m) -> dict[str, int]:
    """What the master holds, less what every master holds at rest."""
    out = dict(m.record_counts())
    for k in ("sessions", "connections", "tasks"):
        out.pop(k)
    return {k: v for k, v in out.items() if v}


# ----------------------------------------------------------------------
# dispatch
# ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(TABLES))
def test_every_message_type_is_handled_by_a_method_of_the_component_owning_it(kind):
    async def scenario():
        m, _ = master_with("a")
        for t, (component, method) in TABLES[kind].items():
            owner = m if component == "master" else getattr(m, component)
            assert callable(getattr(owner, method, None)), (kind, t, component, method)
    asyncio.run(scenario())


def test_daemons_tools_and_direct_clients_each_reach_every_request_of_theirs():
    assert set(DATA_OPS) | set(PMIX_REQUESTS) | {"ready", "exited", "pmix_lost", "output", "stdin_ack",
                                                  "cancel", "node_holds", "ping"} \
        == set(master_mod.DAEMON_MESSAGES)
    assert set(DATA_OPS) | {"cancel", "ping"} == set(master_mod.DIRECT_MESSAGES)
    assert set(DATA_OPS) <= set(master_mod.TOOL_MESSAGES)


def test_the_design_notes_list_the_same_message_to_handler_map_as_the_code():
    """DESIGN.md's "Message -> handler" rows for the master: ``| kind → master |
    `msg` `msg` | `component.method` |``."""
    text = DESIGN.read_text()
    section = text.split("## Message → handler", 1)[1].split("\n## ", 1)[0]
    documented: dict[str, dict[str, tuple[str, str]]] = {k: {} for k in TABLES}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].endswith("→ master"):
            continue
        kind = cells[0].split()[0]
        handler = re.fullmatch(r"`(\w+)\.(\w+)`", cells[2])
        assert kind in TABLES and handler, line
        for t in re.findall(r"`(\w+)`", cells[1]):
            assert t not in documented[kind], f"{t} listed twice for {kind}"
            documented[kind][t] = (handler[1], handler[2])
    assert documented == TABLES


def test_an_unknown_message_from_a_daemon_is_refused_and_the_daemon_kept():
    async def scenario():
        m, d = master_with("a")
        m._on_daemon(d["a"].channel, {"t": "bogus", "id": 7})
        assert replies(d["a"])[-1]["status"] == Status.ERR_BAD_PARAM
        assert not d["a"].channel.closed
        m._on_daemon(d["a"].channel, {"t": "ping"})  # a heartbeat: a notice
        assert len(replies(d["a"])) == 1
    asyncio.run(scenario())


# ----------------------------------------------------------------------
# one predicate, one identity
# ----------------------------------------------------------------------


def test_one_predicate_says_whether_anyone_may_act_for_a_process():
    async def scenario():
        m, d = master_with("a", "b")
        ns = await run_job(m, tool(1000), two_ranks())
        p = m.processes
        assert p.refusal(ns, 0, "a") == "" and p.refusal(ns, 1) == ""
        assert p.refusal(ns, 0, "b") == f"process {ns}:0 is not a running process of node b"
        assert p.refusal("ghost", 0, "a") == "process ghost:0 is not a running process of node a"
        assert p.refusal(ns, 9) == f"process {ns}:9 is not a running process"
        assert p.refusal(ns, 0, "a", app=0, session=DEFAULT_SESSION) == ""
        assert p.refusal(ns, 0, "a", app=1, session=0) == \
            f"process {ns}:0 is not of application 1 in session 0"
        assert p.refusal(ns, 0, "a", uid=1000) == ""
        assert p.refusal(ns, 0, "a", uid=4242) == f"process {ns}:0 is not a process of uid 4242"
        exited(m, d["a"], ns, 0)
        assert p.refusal(ns, 0, "a") == f"process {ns}:0 has ended"
        with pytest.raises(ClaimRefused, match="has ended") as err:
            p.running_caller(ns, 0, 1000, 1000, "a")
        assert err.value.status == Status.ERR_NO_PERMISSIONS
    asyncio.run(scenario())


def test_every_asker_refuses_an_ended_process_in_the_same_words():
    """A daemon's data request, an abort and an event for a process that has
    ended: each NO_PERMISSIONS, each with the predicate's text."""
    async def scenario():
        m, d = master_with("a", "b")
        ns = await run_job(m, tool(), two_ranks())
        exited(m, d["a"], ns, 0)
        why = m.processes.refusal(ns, 0, "a")
        a = d["a"].channel
        m._on_daemon(a, {"t": "publish", "id": 1, "caller": [ns, 0, 1000, 1000],
                         "pairs": {"k": 1}})
        m._on_daemon(a, {"t": "abort", "id": 2, "nspace": ns, "rank": 0, "status": 3})
        m._on_daemon(a, {"t": "notify", "id": 3, "source": [ns, 0], "code": -1, "range": 1})
        await settle()
        got = {r["id"]: (r["status"], r["msg"]) for r in replies(d["a"])}
        assert got == {i: (Status.ERR_NO_PERMISSIONS, why) for i in (1, 2, 3)}, got
        # ... and a process of another node, likewise
        m._on_daemon(a, {"t": "abort", "id": 4, "nspace": ns, "rank": 1, "status": 3})
        assert replies(d["a"])[-1]["msg"] == m.processes.refusal(ns, 1, "a")
        assert m.jobs[ns].first_failure is None  # neither abort was taken
    asyncio.run(scenario())


def test_a_process_identity_has_no_session_in_the_default_session():
    assert process_caller("ns", 1, 5, 6, "a", 0, DEFAULT_SESSION).session_id is None
    assert process_caller("ns", 1, 5, 6, "a", 0, 3).session_id == 3
    assert process_caller("ns", 1, 5, 6).app_idx is None


def test_a_daemon_request_is_served_as_its_process_and_the_vouching_is_forgotten_at_its_end():
    async def scenario():
        m, d = master_with("a", "b")
        ns = await run_job(m, tool(), two_ranks())
        b = d["b"].channel
        m._on_daemon(b, {"t": "publish", "id": 1, "caller": [ns, 1, 1000, 1000],
                         "pairs": {"k": 1}, "persist": int(Persistence.PROC)})
        assert replies(d["b"])[-1]["status"] == Status.SUCCESS
        assert m.record_counts()["caller_cache"] == 1
        assert m.store.stats().items == 1
        exited(m, d["b"], ns, 1)  # its PROC item goes, and so does the cached caller
        assert m.record_counts()["caller_cache"] == 0
        assert m.store.stats().items == 0
    asyncio.run(scenario())


# ----------------------------------------------------------------------
# fan-out
# ----------------------------------------------------------------------


def test_a_lost_node_fails_its_collectives_and_ends_its_processes():
    async def scenario():
        m, d = master_with("a", "b")
        t = tool()
        ns = await run_job(m, t, two_ranks())
        wild = [[ns, 0xFFFFFFFE]]
        m._on_daemon(d["a"].channel, {"t": "fence", "id": 5, "procs": wild, "data": b"x"})
        assert m.record_counts()["collectives"] == 1
        m._on_peer_closed(d["b"].channel, "link broke")
        await settle()
        assert replies(d["a"])[-1] == {"t": "reply", "id": 5, "status": Status.ERR_UNREACH,
                                       "msg": "node b was lost"}
        assert m.nodes.records["b"].state == "lost"
        assert m.jobs[ns].procs[1].exit_status == LOST_STATUS
        assert d["a"].channel.of_type("kill") == [{"t": "kill", "nspace": ns}]
        assert m.record_counts()["collectives"] == 0
    asyncio.run(scenario())


def test_a_node_closing_while_the_dvm_stops_is_stopped_not_lost():
    async def scenario():
        m, d = master_with("a", "b")
        ns = await run_job(m, tool(), two_ranks())
        m.nodes.begin_stop()
        m._on_peer_closed(d["b"].channel, "shut down")
        assert m.nodes.records["b"].state == "stopped"
        assert m.jobs[ns].procs[1].exit_status is None and not m.jobs[ns].error
    asyncio.run(scenario())


def test_a_job_ends_only_once_every_node_purged_it_and_leaves_nothing_behind():
    async def scenario():
        m, d = master_with("a", "b")
        before = idle_records(m)
        t = tool()
        ns = await run_job(m, t, two_ranks())
        m._on_daemon(d["a"].channel, {"t": "publish", "id": 1, "caller": [ns, 0, 1000, 1000],
                                      "pairs": {"n": 1}, "persist": int(Persistence.NSPACE)})
        gate = asyncio.get_running_loop().create_future()

        async def held_purge(msg):
            await gate
            return {"t": "reply", "status": 0}
        calls = []
        d["b"].channel.call = lambda msg, timeout=None: (calls.append(msg), held_purge(msg))[1]
        exited(m, d["a"], ns, 0)
        exited(m, d["b"], ns, 1, status=3)
        await settle()
        assert m.store.stats().items == 0  # the master store's NSPACE purge: at once
        assert [c["t"] for c in calls] == ["purge"] and calls[0]["nspace"] == ns
        assert not replies(t)  # b has not acknowledged: the job is not over
        gate.set_result(None)
        await settle()
        final = replies(t)[-1]
        assert final["status"] == Status.SUCCESS and final["exit"] == 3, final
        assert final["failures"] == [[1, 0, "b", 3, 0, False]]
        assert ns not in m.jobs
        assert idle_records(m) == before, m.record_counts()
    asyncio.run(scenario())


def test_a_tool_going_away_kills_its_jobs():
    async def scenario():
        m, d = master_with("a", "b")
        t = tool()
        ns = await run_job(m, t, two_ranks())
        m._on_peer_closed(t.channel, "tool closed")
        assert m.jobs[ns].kill_reason == "its pydvm run went away"
        assert d["a"].channel.of_type("kill") and d["b"].channel.of_type("kill")
    asyncio.run(scenario())


# ----------------------------------------------------------------------
# streams
# ----------------------------------------------------------------------


def test_output_goes_to_the_jobs_tool_and_is_credited_in_batches():
    async def scenario():
        m, d = master_with("a", "b", pydvm_output_window=4096)
        t = tool()
        ns = await run_job(m, t, two_ranks())
        msg = {"t": "output", "nspace": ns, "rank": 0, "fd": 1, "data": b"x" * 300}
        m._on_daemon(d["a"].channel, dict(msg))
        assert t.channel.of_type("output")[-1]["data"] == b"x" * 300
        assert not d["a"].channel.of_type("output_ack")  # 556 units < window / 4
        m._on_daemon(d["a"].channel, dict(msg))
        assert d["a"].channel.of_type("output_ack") == [
            {"t": "output_ack", "nspace": ns, "bytes": 2 * (300 + 256)}]
    asyncio.run(scenario())


def test_a_tool_that_jobs_output_goes_to_gets_a_capped_send_buffer_and_no_other():
    """The kernel's send buffer towards a tool that gets a job's output is
    capped when the job starts (what is in flight then is about the output
    windows); a tool whose jobs' output is discarded keeps TCP's own."""
    async def scenario():
        m, _ = master_with("a", "b")
        t, quiet = tool(), tool(seq=2)
        await run_job(m, t, two_ranks())
        await run_job(m, quiet, two_ranks(), output="discard")
        assert t.channel.send_cap == toolreqs.OUTPUT_SEND_BUFFER
        assert quiet.channel.send_cap is None
    asyncio.run(scenario())


def test_stdin_reaches_rank_0_within_its_window_and_its_node_alone_acknowledges_it():
    async def scenario():
        m, d = master_with("a", "b")
        t = tool()
        ns = await run_job(m, t, two_ranks(), stdin=True)
        m._on_tool(t.channel, {"t": "stdin", "nspace": ns, "data": b"abc"})
        assert d["a"].channel.of_type("stdin") == [{"t": "stdin", "nspace": ns,
                                                     "data": b"abc", "eof": False}]
        assert m.record_counts()["stdin_streams"] == 1
        m._on_tool(t.channel, {"t": "stdin", "nspace": ns, "data": b"y" * STDIN_WINDOW})
        assert t.channel.of_type("stdin_ack")[-1]["closed"] is True  # beyond the window
        m._on_daemon(d["b"].channel, {"t": "stdin_ack", "nspace": ns, "bytes": 3})
        assert len(t.channel.of_type("stdin_ack")) == 1  # b does not run rank 0
        m._on_daemon(d["a"].channel, {"t": "stdin_ack", "nspace": ns, "bytes": 3})
        assert t.channel.of_type("stdin_ack")[-1] == {"t": "stdin_ack", "nspace": ns,
                                                      "bytes": 3, "closed": False}
        other = tool(seq=2)
        m._on_tool(other.channel, {"t": "stdin", "nspace": ns, "data": b"z"})
        assert other.channel.of_type("stdin_ack")[-1]["closed"] is True  # not its job
        exited(m, d["a"], ns, 0)
        exited(m, d["b"], ns, 1)
        await settle()
        assert m.record_counts()["stdin_streams"] == 0
    asyncio.run(scenario())


def test_stdin_all_goes_to_every_node_and_the_tool_hears_what_every_node_took():
    async def scenario():
        m, d = master_with("a", "b")
        t = tool()
        ns = await run_job(m, t, two_ranks(), stdin=True, stdin_rank="all")
        launched = [x for n in "ab" for x in d[n].channel.calls if x.get("t") == "launch"]
        assert [p.get("stdin") for x in launched for p in x["procs"]] == [True, True]
        m._on_tool(t.channel, {"t": "stdin", "nspace": ns, "data": b"abc"})
        for n in "ab":
            assert d[n].channel.of_type("stdin") == [{"t": "stdin", "nspace": ns,
                                                       "data": b"abc", "eof": False}]

        def acks() -> list[tuple[int, bool]]:
            return [(a["bytes"], a["closed"]) for a in t.channel.of_type("stdin_ack")]
        m._on_daemon(d["a"].channel, {"t": "stdin_ack", "nspace": ns, "bytes": 3})
        assert acks() == []  # b's rank has none of it yet
        m._on_daemon(d["b"].channel, {"t": "stdin_ack", "nspace": ns, "bytes": 2})
        assert acks() == [(2, False)]
        m._on_daemon(d["b"].channel, {"t": "stdin_ack", "nspace": ns, "bytes": 1,
                                      "closed": True})  # b's rank reads no more
        assert acks() == [(2, False), (1, False)]  # a still reads
        m._on_tool(t.channel, {"t": "stdin", "nspace": ns, "data": b"de"})
        assert len(d["b"].channel.of_type("stdin")) == 1  # only a gets it
        m._on_daemon(d["a"].channel, {"t": "stdin_ack", "nspace": ns, "bytes": 2})
        m._on_daemon(d["a"].channel, {"t": "stdin_ack", "nspace": ns, "bytes": 0,
                                      "closed": True})
        assert acks()[-2:] == [(2, False), (0, True)]
        exited(m, d["a"], ns, 0)
        exited(m, d["b"], ns, 1)
        await settle()
        assert m.record_counts()["stdin_streams"] == 0
    asyncio.run(scenario())


# ----------------------------------------------------------------------
# PMIx spawn, tool gates
# ----------------------------------------------------------------------


def test_a_spawned_job_reports_to_its_parents_run_which_waits_for_it():
    async def scenario():
        m, d = master_with("a", "b")
        t = tool()
        ns = await run_job(m, t, two_ranks(), env={"E": "1"}, cwd="/tmp")
        m._on_daemon(d["a"].channel, {"t": "spawn", "id": 9, "parent": [ns, 0],
                                      "apps": [{"cmd": "child", "maxprocs": 1}]})
        await settle()
        answer = replies(d["a"])[-1]
        assert answer["status"] == Status.SUCCESS, answer
        child = answer["nspace"]
        launch = [c for ch in (d["a"].channel, d["b"].channel) for c in ch.calls
                  if c["t"] == "launch" and c["nspace"] == child][0]
        assert launch["pmix"]["parent"] == [ns, 0]
        assert launch["procs"][0]["env"] == {"E": "1"} and launch["procs"][0]["cwd"] == "/tmp"
        assert m.processes.tool_of(child) is t
        exited(m, d["a"], ns, 0)
        exited(m, d["b"], ns, 1)
        await settle()
        assert ns not in m.jobs and not replies(t)  # the child still runs
        node = m.jobs[child].procs[0].node
        exited(m, d[node], child, 0)
        await settle()
        assert replies(t)[-1]["nspace"] == ns
        assert m.record_counts()["spawn_parents"] == 0
        assert m.record_counts()["job_tools"] == 0
    asyncio.run(scenario())


def test_a_stopping_dvm_refuses_new_work_and_only_its_owner_may_stop_it():
    async def scenario():
        m, d = master_with("a")
        stranger = tool(4242, owner=False, seq=2)
        m._on_tool(stranger.channel, {"t": "stop", "id": 1})
        assert replies(stranger)[-1]["status"] == Status.ERR_NO_PERMISSIONS
        m._stopping = True
        t = tool()
        m._on_tool(t.channel, {"t": "run", "id": 2, "apps": two_ranks()})
        m._on_tool(t.channel, {"t": "ping", "id": 3})
        assert [(r["id"], r["status"]) for r in replies(t)] == [
            (2, Status.ERR_UNREACH), (3, Status.SUCCESS)]
    asyncio.run(scenario())


# ----------------------------------------------------------------------
# the direct gate
# ----------------------------------------------------------------------


def test_a_direct_client_is_admitted_while_its_process_runs_and_closed_when_it_ends():
    """A credential its daemon minted: accepted for a running process of
    that node (app, session); refused in the predicate's words once it has
    ended; the accepted connection is closed at the end, and its master-store
    requests are served as the vouched-for process meanwhile."""
    from masterkit import StandIn

    from pydvm.runtime.shared import credential as C

    async def scenario():
        m, d = master_with("a", "b")
        ns = await run_job(m, tool(os.getuid()), two_ranks())
        voucher = C.Voucher(m.secret, m.dvmid, "b", "tcp://127.0.0.1:1/x")
        cred = C.Credential.parse(voucher.environment(ns, 1, os.getuid(), os.getgid(), 0,
                                                      DEFAULT_SESSION)[C.ENV])

        def handshake():
            ch = StandIn("direct peer")
            ch.nonce, ch.creds, ch.unix, ch.auth_timer = os.urandom(32), None, "", None
            ch.offer, ch.seal_hello = None, None  # a clear link (seal.py)
            m._on_unauthenticated(ch, {"t": "auth", "id": 1, **cred.answer(ch.nonce, ns, 1)})
            return ch

        ok = handshake()
        assert ok.sent[-1]["status"] == Status.SUCCESS and not ok.closed, ok.sent
        assert m.direct.stats()["open"] == 1
        m._on_direct(ok, {"t": "publish", "id": 2, "pairs": {"d": 1}})
        assert ok.sent[-1]["status"] == Status.SUCCESS
        m._on_direct(ok, {"t": "lookup", "id": 3, "keys": ["d"], "range": int(Range.LOCAL)})
        assert ok.sent[-1]["status"] == Status.ERR_BAD_PARAM
        exited(m, d["b"], ns, 1)
        assert ok.closed and ok.close_reason == f"process {ns}:1 ended"
        late = handshake()
        assert late.sent[-1] == {"t": "reply", "id": 1, "status": Status.ERR_NO_PERMISSIONS,
                                 "msg": m.processes.refusal(ns, 1, "b")}
        assert late.closed and m.direct.stats()["refused"] == 1
    asyncio.run(scenario())
