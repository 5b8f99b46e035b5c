"""Unit tests of the per-user PMIx server's relay (runtime/pmixhost/users.py):
the codec that carries upcalls and answers between an agent and its node,
and what the node does with what an agent sends (no libpmix, no processes;
tests/multiuser/test_pmix_users.py runs the real thing with real uids)."""

from __future__ import annotations

import gc
from types import SimpleNamespace

import pytest
from hypothesis import given, strategies as st

from pydvm.errors import Status
from pydvm.pmix import DataArray, Proc, Value
from pydvm.pmix import constants as C
from pydvm.pmix import requests as R
from pydvm.runtime.pmixhost.codec import decode, decode_request, encode, encode_request
from pydvm.runtime.pmixhost.remote import RemoteReply, UserServer
from pydvm.runtime.pmixhost.users import UserServers

P = Proc("ns-a", 3)
INFO = DataArray(C.INFO, (("k1", Value("x", C.STRING)), ("k2", Value(7, C.UINT32))))

REQUESTS = [
    R.ClientConnected(P, {"pmix.x": Value(True, C.BOOL)}),
    R.ClientFinalized(P),
    R.Abort(P, 3, "bye", [Proc("ns-a", 0), Proc("ns-a", C.RANK_WILDCARD)]),
    R.Fence([P], b"\x00\xffblob", True, 10, {}),
    R.DirectModex(P, {}),
    R.Publish(P, {"k": Value(b"\x01", C.BYTE_OBJECT), "u": Value(200, C.UINT8),
                  "d": Value(INFO, C.DATA_ARRAY)}, C.RANGE_SESSION, C.PERSIST_APP,
              (1001, 1002), None, {"pmix.timeout": Value(5, C.INT)}),
    R.Lookup(P, ["a", "b"], None, 1, 30, {}),
    R.Unpublish(P, None, C.RANGE_LOCAL, {}),
    R.Spawn(P, {}, [R.App("./a.out", ["./a.out", "-v"], ["X=1"], None, 2,
                          {"pmix.wdir": Value("/tmp", C.STRING)})]),
    R.Connect([P, Proc("ns-b", 0)], {}),
    R.Disconnect([P], {}),
    R.RegisterEvents([1, -2], {}),
    R.DeregisterEvents([]),
    R.NotifyEvent(-57, P, C.RANGE_SESSION, [("ev", Value(Proc("ns-a", 1), C.PROC))]),
    R.Group("construct", "g1", [P], {}),
]


@pytest.mark.parametrize("req", REQUESTS, ids=lambda r: r.kind)
def test_every_upcall_crosses_to_the_node_and_back_unchanged(req):
    import msgpack
    back = decode_request(msgpack.unpackb(msgpack.packb(encode_request(req)), raw=False))
    assert type(back) is type(req)
    for f in req.__dataclass_fields__:
        if f != "reply":
            # App is compared by identity (eq=False): its repr shows every field
            assert repr(getattr(back, f)) == repr(getattr(req, f)), f


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1),
                     st.floats(allow_nan=False), st.text(), st.binary())
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(st.text(max_size=5), inner, max_size=4),
        st.builds(Value, inner, st.integers(0, 60)),
        st.builds(Proc, st.text(max_size=8), st.integers(-3, 10**6)),
        st.builds(DataArray, st.integers(0, 60), st.lists(inner, max_size=3).map(tuple))),
    max_leaves=12)


@given(_values)
def test_decode_inverts_encode(x):
    import msgpack
    assert decode(msgpack.unpackb(msgpack.packb(encode(x)), raw=False)) == x


@pytest.mark.parametrize("bad", [{"X": 1}, {"V": [1, 2], "P": [1, 2]},
                                 {"C": ["Popen", {}]}, {"C": ["Publish", {"nope": 1}]}])
def test_what_the_codec_never_makes_is_refused(bad):
    with pytest.raises((ValueError, TypeError)):
        decode(bad)


def test_a_value_that_cannot_cross_is_a_type_error():
    with pytest.raises(TypeError):
        encode(object())
    with pytest.raises(ValueError):
        decode_request({"T": [1, 2]})  # data, not an upcall


class FakeChannel:
    def __init__(self):
        self.sent = []
        self.closed = False
        self.why = None

    def send(self, msg):
        self.sent.append(msg)

    def close(self, reason="closed", *, error=False):
        self.closed, self.why = True, reason


def _agent(handler, trusted=lambda a, r: None):
    a = UserServer(1001, 1001, handler, trusted, lambda a, why: None)
    a.channel = FakeChannel()
    return a


def _up(req, rid=7):
    return {"t": "up", "id": rid, "req": encode_request(req)}


def test_an_upcall_is_served_by_the_nodes_handler_and_its_answer_relayed():
    seen = []

    def handler(req):
        seen.append(req)
        req.reply(Status.SUCCESS, [("k", Value("v", C.STRING), P)])
    a = _agent(handler)
    a._on_message(a.channel, _up(R.Lookup(P, ["k"], None, None, None, {})))
    assert seen and seen[0].origin is a and seen[0].proc == P
    (out,) = a.channel.sent
    assert out["t"] == "reply" and out["id"] == 7
    assert decode(out["args"]) == [Status.SUCCESS, [("k", Value("v", C.STRING), P)]]
    assert seen[0].reply(Status.SUCCESS) is False  # answered once only
    assert len(a.channel.sent) == 1


def test_an_upcall_the_agents_user_may_not_make_is_refused_no_permissions():
    a = _agent(lambda req: pytest.fail("must not be served"),
               trusted=lambda a, r: "from ns-b:0, not a process of this user's jobs")
    a._on_message(a.channel, _up(R.Publish(Proc("ns-b", 0), {}, None, None, None, None, {})))
    (out,) = a.channel.sent
    assert out["fail"] == Status.ERR_NO_PERMISSIONS
    assert a.stats["refused"] == 1 and not a.channel.closed


def test_a_malformed_upcall_is_refused_bad_param_and_the_agent_kept():
    a = _agent(lambda req: pytest.fail("must not be served"))
    a._on_message(a.channel, {"t": "up", "id": 3, "req": {"C": ["Publish", {"x": 1}]}})
    assert a.channel.sent[-1]["fail"] == Status.ERR_BAD_PARAM and not a.channel.closed
    a._on_message(a.channel, {"t": "reply", "id": 99})  # a late answer: ignored
    assert not a.channel.closed and len(a.channel.sent) == 1
    a._on_message(a.channel, {"t": "launch"})  # not the protocol: the agent is cut off
    assert a.channel.closed


def test_a_handler_that_raises_answers_error_and_a_dropped_reply_answers_error():
    def boom(req):
        raise RuntimeError("boom")
    a = _agent(boom)
    a._on_message(a.channel, _up(R.Fence([P], b"", False, None, {})))
    assert a.channel.sent[-1]["fail"] == C.ERROR and a.stats["handler_errors"] == 1

    a = _agent(lambda req: None)  # never answers, keeps nothing
    a._on_message(a.channel, _up(R.Connect([P], {})))
    gc.collect()
    assert a.channel.sent[-1]["fail"] == C.ERROR


def test_a_notification_gets_no_answer():
    got = []
    a = _agent(lambda req: got.append(req))
    a._on_message(a.channel, {"t": "up", "req": encode_request(
        R.NotifyEvent(1, P, C.RANGE_SESSION, []))})
    assert got and got[0].reply.notification
    assert got[0].reply(Status.SUCCESS) is False and a.channel.sent == []


def _servers(n: int) -> list[SimpleNamespace]:
    """Users' agents as UserServers.may reads them."""
    return [SimpleNamespace(tools=False) for _ in range(n)]


def test_the_node_believes_an_agent_only_about_its_own_users_processes():
    mine, theirs = _servers(2)
    host = SimpleNamespace(host=SimpleNamespace(local_nspaces={"ns-a": mine, "ns-b": theirs}))
    may = UserServers.may
    assert may(host, mine, R.Publish(Proc("ns-a", 0), {}, None, None, None, None, {})) is None
    assert "not a process" in may(host, mine, R.Publish(Proc("ns-b", 0), {}, None, None, None,
                                                         None, {}))
    assert "not a process" in may(host, mine, R.Lookup(Proc("ns-x", 0), [], None, None, None,
                                                        {}))
    assert "not a process" in may(host, mine, R.NotifyEvent(1, Proc("ns-b", 0), 0, []))
    # a collective may name processes elsewhere, not another user's here
    assert may(host, mine, R.Fence([Proc("ns-a", 0), Proc("ns-remote", 1)], b"", False, None,
                                   {})) is None
    assert "another user's job" in may(host, mine, R.Connect([Proc("ns-a", 0),
                                                              Proc("ns-b", 0)], {}))


def test_a_direct_modex_names_the_process_whose_data_is_wanted_not_the_asker():
    """libpmix's direct_modex upcall carries the process whose data a local
    client wants (on another node, or of a peer job), never the asker: an
    agent may ask for a remote process's data or its own user's, not for
    another user's process here."""
    mine, theirs = _servers(2)
    host = SimpleNamespace(host=SimpleNamespace(local_nspaces={"ns-a": mine, "ns-b": theirs}))
    may = UserServers.may
    assert may(host, mine, R.DirectModex(Proc("ns-remote", 3), {})) is None
    assert may(host, mine, R.DirectModex(Proc("ns-a", 1), {})) is None
    assert "another user's job" in may(host, mine, R.DirectModex(Proc("ns-b", 0), {}))


def test_the_tool_server_speaks_for_its_tools_and_known_processes_only():
    """The tool server process runs as the node does: it may speak for a tool
    it let in (or one gone lately), a process the node knows (a "client
    tool"), and libpmix's nameless client tool -- never for a namespace the
    node does not know, nor for another tool server's tools."""
    tools_srv, other = SimpleNamespace(tools=True), SimpleNamespace(tools=True)
    known = {"dvm-tool.1": tools_srv, "dvm-tool.2": other}
    host = SimpleNamespace(host=SimpleNamespace(
        local_nspaces={"ns-a": object()}, sessions={("ns-a", 0): object()},
        tools=SimpleNamespace(served_by=lambda ns: known.get(ns, False))))
    may = UserServers.may
    assert may(host, tools_srv, R.Publish(Proc("dvm-tool.1", 0), {}, None, None, None, None,
                                          {})) is None
    assert may(host, tools_srv, R.NotifyEvent(1, Proc("", 0), 0, [])) is None
    assert may(host, tools_srv, R.Lookup(Proc("ns-a", 0), [], None, None, None, {})) is None
    assert "not a tool" in may(host, tools_srv, R.Lookup(Proc("dvm-tool.2", 0), [], None,
                                                         None, None, {}))
    assert "not a tool" in may(host, tools_srv, R.NotifyEvent(1, Proc("ns-x", 0), 0, []))


def test_a_tool_connection_crosses_from_the_tool_server_and_nothing_else_does():
    import msgpack
    from pydvm.pmix.tools import ToolConnected
    from pydvm.runtime.pmixhost.codec import decode_tool, encode_tool
    req = ToolConnected(1000, "", 1000, 1000, 4242, "pps", 7, {"pmix.nspace": Value("x", C.STRING)},
                        9, False)
    back = decode_tool(msgpack.unpackb(msgpack.packb(encode_tool(req))))
    assert (back.uid, back.claimed_uid, back.claimed_gid, back.pid, back.cmd, back.keeps_id) \
        == (1000, 1000, 1000, 4242, "pps", False)
    assert back.info["pmix.nspace"].value == "x"
    assert back.fd is None and back.sd is None   # descriptors stay in the tool server
    good = encode_tool(req)
    for bad in (None, [], {**good, "extra": 1}, {**good, "uid": "0"}, {**good, "uid": True},
                {**good, "keeps_id": 1}, {**good, "info": [1]}, {k: v for k, v in good.items()
                                                                if k != "why"}):
        with pytest.raises((ValueError, TypeError)):
            decode_tool(bad)


def test_a_remote_reply_after_the_agent_is_gone_is_dropped_quietly():
    a = _agent(lambda req: None)
    a.channel.closed = True
    r = RemoteReply(a, 5, "fence")
    assert r(Status.SUCCESS, b"x") is True and a.channel.sent == []


# -- publish, lookup, unpublish relayed as the store's requests ("data") ------

class _Host:
    """Stands for PmixHost's serve_relayed: records what it is asked, answers
    ``now`` (a Reply) at once, or None (then the answer comes later)."""

    def __init__(self, now=None):
        self.asked = []
        self.now = now

    def __call__(self, req):
        pytest.fail("a data request must not reach the upcall handler")

    def serve_relayed(self, nspace, rank, msg, waiting):
        self.asked.append((nspace, rank, msg, waiting))
        return self.now


def _data(m, rid=9, p=("ns-a", 3)):
    return {"t": "data", "id": rid, "p": list(p), "m": m}


def test_a_relayed_data_request_is_served_as_its_process_and_answered_with_the_store_reply():
    from pydvm.store import Reply
    from pydvm.store.results import FoundKey as Found
    host = _Host(now=Reply(Status.SUCCESS, found=(Found("k", 7, ("ns-a", 0)),)))
    a = _agent(host)
    a._on_message(a.channel, _data({"t": "lookup", "keys": ["k"], "wait": None,
                                    "node_only": True, "replace": True, "uid": 0}))
    ((ns, rank, msg, _),) = host.asked
    assert (ns, rank) == ("ns-a", 3)
    assert msg == {"t": "lookup", "keys": ["k"], "wait": None}  # nothing a PMIx request lacks
    (out,) = a.channel.sent
    assert out["t"] == "reply" and out["id"] == 9 and out["status"] == Status.SUCCESS
    assert out["found"] == [["k", 7, "ns-a", 0]]
    assert a.stats["answered_now"] == 1 and a.stats["requests"] == 1


def test_a_relayed_lookup_that_waits_is_answered_once_when_the_store_answers_it():
    host = _Host(now=None)
    a = _agent(host)
    a._on_message(a.channel, _data({"t": "lookup", "keys": ["k"], "wait": 1}, rid=11))
    assert a.channel.sent == [] and a.stats["answered_now"] == 0
    waiting = host.asked[0][3]
    assert waiting.kind == "lookup"
    waiting.relay({"t": "reply", "id": 1, "status": 0, "found": [["k", "v", "ns-a", 1]]})
    waiting.relay({"t": "reply", "id": 1, "status": 0})  # answered once only
    assert waiting.reply.fail(Status.ERR_UNREACH) is False
    (out,) = a.channel.sent
    assert out == {"t": "reply", "id": 11, "status": 0, "found": [["k", "v", "ns-a", 1]]}


def test_a_relayed_data_request_the_agents_user_may_not_make_is_refused_unserved():
    host = _Host()
    a = _agent(host, trusted=lambda a, r: f"from {r.proc}, not a process of this user's jobs")
    a._on_message(a.channel, _data({"t": "publish", "pairs": {"k": 1}}, p=("ns-b", 0)))
    assert host.asked == []
    (out,) = a.channel.sent
    assert out["id"] == 9 and out["fail"] == Status.ERR_NO_PERMISSIONS
    assert a.stats["refused"] == 1 and not a.channel.closed


@pytest.mark.parametrize("msg", [
    _data({"t": "update", "key": "k"}),                # not a PMIx data request
    _data({"t": "lookup", "keys": ["k"]}, rid="7"),    # ids are ints
    _data({"t": "lookup", "keys": ["k"]}, rid=True),
    _data({"t": "lookup", "keys": ["k"]}, p=("ns-a",)),
    _data({"t": "lookup", "keys": ["k"]}, p=("ns-a", "3")),
    _data(["lookup"]),
])
def test_a_malformed_relayed_data_request_is_refused_bad_param_and_the_agent_kept(msg):
    host = _Host()
    a = _agent(host)
    a._on_message(a.channel, msg)
    assert host.asked == [] and a.stats["refused"] == 1 and not a.channel.closed
    if isinstance(msg["id"], int) and not isinstance(msg["id"], bool):
        assert a.channel.sent[-1]["fail"] == Status.ERR_BAD_PARAM


def test_an_agents_log_record_is_logged_by_the_node_on_one_line_at_a_bounded_level(caplog):
    import logging
    a = _agent(lambda req: None)
    with caplog.at_level(logging.DEBUG, logger="pydvm.pmix"):
        a._on_message(a.channel, {"t": "log", "level": 50, "msg": "boom\nnode n1: forged"})
        a._on_message(a.channel, {"t": "log", "level": 1, "msg": "quiet"})
        a._on_message(a.channel, {"t": "log", "level": 30, "msg": ["not", "text"]})
    recs = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert [lv for lv, _ in recs] == [logging.WARNING, logging.INFO]
    assert recs[0][1].endswith(": boom\\nnode n1: forged") and "\n" not in recs[0][1]
    assert not a.channel.closed


# -- the watchdog's probe ------------------------------------------------------

class _Answers:
    """A channel whose call answers ``reply`` (and records what it was asked)."""

    closed = False

    def __init__(self, reply):
        self.reply, self.asked = reply, []

    async def call(self, msg, timeout):
        self.asked.append((msg, timeout))
        return self.reply


@pytest.mark.parametrize("reply, why", [
    ({"status": Status.SUCCESS}, None),
    ({"status": C.ERR_NOT_SUPPORTED, "msg": "unknown command 'probe'"}, None),
    ({"status": Status.ERR_TIMEOUT, "msg": "PMIX_ERR_TIMEOUT: libpmix did not complete"},
     "hung: its libpmix did not complete a call in 4 s"),
    ({"status": Status.ERR_TIMEOUT, "msg": "no reply from PMIx agent of uid 1001 in 6.0s"},
     "hung: its process did not answer the node in 6 s"),
])
def test_a_probe_tells_a_hang_inside_libpmix_from_a_stuck_process_and_from_an_answer(
        reply, why):
    import asyncio
    a = _agent(lambda req: None)
    a.channel = _Answers(reply)
    assert asyncio.run(a.probe(4.0)) == why
    assert a.channel.asked == [({"t": "probe", "timeout": 4.0}, 6.0)]


def test_processes_whose_server_process_cannot_start_get_the_nodes_own_server_or_a_reason():
    """With ``pydvm_pmix_isolate`` the node process hosts no libpmix server:
    when a server process cannot start, the node starts its own for them
    (``PmixHost.fallback_server``); if that cannot start either, the job is
    refused with the reason.  Without isolation the node's own serves them."""
    asked = []
    own = object()
    host = SimpleNamespace(server=object(), isolated=True,
                           fallback_server=lambda why: asked.append(why) or None)
    users = UserServers(host)
    with pytest.raises(RuntimeError, match="no PMIx server for these processes: no setpriv"):
        users._fallback("no setpriv")
    assert asked == ["no setpriv"]
    host.fallback_server = lambda why: own
    assert users._fallback("no setpriv") is own
    host.isolated = False
    assert users._fallback("no setpriv") is host.server
    host.server = None   # the node stopped
    assert users._fallback("no setpriv") is None


def test_only_the_tool_server_may_pass_on_a_tools_connection_and_its_end():
    from pydvm.pmix.tools import ToolConnected
    from pydvm.runtime.pmixhost.codec import encode_tool
    seen, gone = [], []

    def handler(req):
        seen.append(req)
    handler.tools = SimpleNamespace(disconnected=lambda ns, srv: gone.append((ns, srv)))
    tool = encode_tool(ToolConnected(1000, "", 1000, 1000, 7, "pps", None, {}, None, False))

    users_agent = _agent(handler)
    users_agent._on_message(users_agent.channel, {"t": "tool", "id": 1, "req": tool})
    assert seen == [] and users_agent.channel.why == "protocol error"

    srv = UserServer(0, 0, handler, lambda a, r: None, lambda a, why: None, tools=True)
    srv.channel = FakeChannel()
    srv._on_message(srv.channel, {"t": "tool", "id": 2, "req": {**tool, "uid": "root"}})
    assert seen == [] and srv.channel.sent[-1]["fail"] == Status.ERR_BAD_PARAM
    srv._on_message(srv.channel, {"t": "tool", "id": 3, "req": tool})
    (req,) = seen
    assert req.kind == "tool_connected" and req.origin is srv and req.uid == 1000
    req.reply.abandon()   # a refusal: the tool server cuts the connection
    last = srv.channel.sent[-1]
    assert (last["id"], last["fail"]) == (3, Status.ERR_NO_PERMISSIONS)
    srv._on_message(srv.channel, {"t": "tool_gone", "ns": "dvm-tool.1"})
    assert gone == [("dvm-tool.1", srv)] and not srv.channel.closed


def test_registrations_wait_at_the_node_not_inside_the_server_process():
    """6,000 one-rank jobs submitted at once to an isolated DVM all failed
    (PMIX_ERR_TIMEOUT from register_client): the node sent every
    registration to the server process at once, whose libpmix calls then
    queued for longer than their 5 s.  The node keeps at most
    REGISTRATIONS_IN_FLIGHT requests out; the rest wait their turn here,
    with their timeout starting when they are sent."""
    import asyncio
    from pydvm.pmix import Proc
    from pydvm.runtime.pmixhost.remote import REGISTRATIONS_IN_FLIGHT

    class Slow:
        closed = False

        def __init__(self):
            self.now = self.most = 0

        async def call(self, msg, timeout):
            self.now += 1
            self.most = max(self.most, self.now)
            await asyncio.sleep(0.001)
            self.now -= 1
            return {"status": Status.SUCCESS, "env": {}}

    async def main():
        a = _agent(lambda req: None)
        a.channel = Slow()
        await asyncio.gather(*[a.register_client(Proc(f"ns{i}", 0), 0, 0) for i in range(500)],
                             *[a.register_nspace(f"ns{i}", 1) for i in range(500)])
        return a.channel.most
    assert 1 < asyncio.run(main()) <= REGISTRATIONS_IN_FLIGHT < 500
