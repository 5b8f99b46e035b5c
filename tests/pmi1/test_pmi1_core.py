"""The pure PMI-1 core: the wire (pydvm.pmi1.wire) and a node's share of a
job (pydvm.pmi1.job), requests in, effects out -- no sockets."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pydvm.pmi1 import Pmi1Job, ProtocolError, Reader, encode, process_mapping
from pydvm.pmi1 import job as J
from pydvm.pmi1.wire import MAX_LINE, parse_line


def cmd(line: str):
    return parse_line(line)


def sent(effects, rank=None) -> list[str]:
    return [e.data.decode() for e in effects
            if isinstance(e, J.Send) and (rank is None or e.rank == rank)]


def fields(line: str) -> dict[str, str]:
    return dict(parse_line(line.strip()).pairs) | {"cmd": parse_line(line.strip()).name}


# -- wire ---------------------------------------------------------------------

def test_a_line_is_its_command_and_fields_in_order():
    c = cmd("cmd=put kvsname=kvs_1 key=bc-0 value=tcp://1.2.3.4:5$x=y")
    assert c.name == "put"
    assert c.pairs == [("kvsname", "kvs_1"), ("key", "bc-0"), ("value", "tcp://1.2.3.4:5$x=y")]


def test_escaped_spaces_and_backslashes_round_trip():
    line = encode("get_result", rc=0, value="a b\\c").decode()
    assert line == "cmd=get_result rc=0 value=a\\ b\\\\c\n"
    assert cmd(line.strip()).get("value") == "a b\\c"


def test_a_spawn_block_is_one_command_with_values_to_the_end_of_the_line():
    r = Reader()
    got = r.feed(b"mcmd=spawn\nnprocs=2\nexecname=./child\nargcnt=1\narg1=hello world\n"
                 b"preput_num=0\ninfo_num=0\nendcmd\n")
    assert len(got) == 1 and got[0].multi and got[0].name == "spawn"
    assert got[0].get("arg1") == "hello world"


@given(st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=30))
@settings(max_examples=60, deadline=None)
def test_commands_come_out_the_same_however_the_bytes_are_cut(cuts):
    data = (b"cmd=init pmi_version=1 pmi_subversion=1\ncmd=get_maxes\n"
            b"mcmd=spawn\nnprocs=1\nexecname=x\nendcmd\ncmd=barrier_in\n")
    r = Reader()
    got, i = [], 0
    for c in cuts * 20:
        if i >= len(data):
            break
        got += r.feed(data[i:i + c])
        i += c
    got += r.feed(data[i:])
    assert [c.name for c in got] == ["init", "get_maxes", "spawn", "barrier_in"]


@pytest.mark.parametrize("bad", [b"hello\n", b"cmd=\n", b"cmd=put ke$y=1\n"])
def test_what_is_not_pmi1_is_a_protocol_error(bad):
    with pytest.raises(ProtocolError):
        Reader().feed(bad)


def test_a_line_without_end_is_bounded():
    r = Reader()
    with pytest.raises(ProtocolError):
        for _ in range(MAX_LINE // 1000 + 2):
            r.feed(b"x" * 1000)


# -- the process mapping ------------------------------------------------------------

@pytest.mark.parametrize("nodes,want", [
    ([0, 0, 1, 1], "(vector,(0,2,2))"),
    ([0, 1, 0, 1], "(vector,(0,2,1),(0,2,1))"),
    ([0, 0, 0], "(vector,(0,1,3))"),
    ([0, 0, 1, 2, 2], "(vector,(0,1,2),(1,1,1),(2,1,2))"),
])
def test_process_mapping_is_mpichs_vector(nodes, want):
    assert process_mapping(nodes) == want


# -- a node's share of a job ---------------------------------------------------------

def share(ranks=(0, 1), size=4, **kw) -> Pmi1Job:
    return Pmi1Job("kvs@1", size, {r: 0 for r in ranks}, universe=size, **kw)


def init(j: Pmi1Job, rank: int) -> None:
    out = sent(j.handle(rank, cmd("cmd=init pmi_version=1 pmi_subversion=1")))
    assert fields(out[0])["rc"] == "0"


def test_init_maxes_appnum_kvsname_universe_as_mpich_expects():
    j = Pmi1Job("kvs@1", 4, {2: 1}, universe=8)
    init(j, 2)
    assert fields(sent(j.handle(2, cmd("cmd=get_maxes")))[0]) == {
        "cmd": "maxes", "kvsname_max": "256", "keylen_max": "64", "vallen_max": "1024",
        "rc": "0"}
    assert fields(sent(j.handle(2, cmd("cmd=get_appnum")))[0])["appnum"] == "1"
    assert fields(sent(j.handle(2, cmd("cmd=get_my_kvsname")))[0])["kvsname"] == "kvs@1"
    assert fields(sent(j.handle(2, cmd("cmd=get_universe_size")))[0])["size"] == "8"
    j.check()


def test_a_pmi2_client_is_told_no_at_init():
    j = share()
    effects = j.handle(0, cmd("cmd=init pmi_version=2 pmi_subversion=0"))
    assert fields(sent(effects)[0])["rc"] != "0"
    assert any(isinstance(e, J.Note) for e in effects)


def test_a_missing_key_is_answered_at_once_never_parked():
    j = share()
    init(j, 0)
    out = fields(sent(j.handle(0, cmd("cmd=get kvsname=kvs@1 key=PMI_hwloc_xmlfile")))[0])
    assert out["cmd"] == "get_result" and out["rc"] == "-1"


def test_puts_reach_every_node_at_the_barrier_and_only_then_out():
    a, b = share((0, 1)), share((2, 3))
    for j, ranks in ((a, (0, 1)), (b, (2, 3))):
        for r in ranks:
            init(j, r)
            j.handle(r, cmd(f"cmd=put kvsname=kvs@1 key=bc-{r} value=addr{r}"))
    assert a.handle(0, cmd("cmd=barrier_in")) == []  # rank 1 of this node not in yet
    fa = a.handle(1, cmd("cmd=barrier_in"))
    assert len(fa) == 1 and isinstance(fa[0], J.Fence)
    assert a.puts == {}
    a.check()
    fb = b.handle(2, cmd("cmd=barrier_in")) + b.handle(3, cmd("cmd=barrier_in"))
    data = fa[0].data + fb[0].data  # what the master answers every node with
    out = a.fence_done(True, data)
    assert sorted(e.rank for e in out) == [0, 1]
    assert all(fields(x)["rc"] == "0" for x in sent(out))
    got = fields(sent(a.handle(0, cmd("cmd=get kvsname=kvs@1 key=bc-3")))[0])
    assert got["value"] == "addr3"
    a.check()


def test_a_failed_fence_lets_every_waiter_out_with_an_error():
    a = share((0,), size=2)
    init(a, 0)
    a.handle(0, cmd("cmd=barrier_in"))
    out = a.fence_done(False, why="node b was lost")
    assert fields(sent(out)[0])["rc"] == "-1"
    assert "node_b_was_lost" in sent(out)[0]
    assert not a.fencing and not a.entered


def test_a_rank_that_ends_before_the_barrier_releases_its_peers_with_an_error():
    a = share((0, 1))
    init(a, 0)
    init(a, 1)
    a.handle(0, cmd("cmd=barrier_in"))
    out = a.rank_gone(1)
    assert [e.rank for e in out] == [0] and fields(sent(out)[0])["rc"] == "-1"
    a.check()


def test_abort_names_its_status_and_message():
    a = share()
    init(a, 1)
    [e] = a.handle(1, cmd("cmd=abort exitcode=7 message=bad\\ input"))
    assert e == J.Abort(1, 7, "bad input")


def test_name_service_requests_become_data_effects_and_their_answers_replies():
    a = share()
    init(a, 0)
    [pub] = a.handle(0, cmd("cmd=publish_name service=svc port=tag#0$"))
    assert pub == J.Data(0, "publish", "svc", "tag#0$")
    assert fields(sent(a.data_done(pub, 0))[0]) == {"cmd": "publish_result", "info": "ok",
                                                   "rc": "0", "msg": "success"}
    [look] = a.handle(0, cmd("cmd=lookup_name service=svc"))
    assert fields(sent(a.data_done(look, 0, "tag#0$"))[0])["port"] == "tag#0$"
    bad = fields(sent(a.data_done(look, -46, why="svc not found"))[0])
    assert bad["rc"] == "-1" and bad["msg"] == "svc_not_found"


def test_a_multi_application_spawn_is_answered_once_after_its_last_block():
    a = share()
    init(a, 0)
    r = Reader()
    [b1, b2] = r.feed(
        b"mcmd=spawn\nnprocs=2\nexecname=./w\ntotspawns=2\nspawnssofar=1\nargcnt=0\n"
        b"preput_num=1\npreput_key_0=PARENT_ROOT_PORT_NAME\npreput_val_0=tag#1$\n"
        b"info_num=1\ninfo_key_0=wdir\ninfo_val_0=/tmp\nendcmd\n"
        b"mcmd=spawn\nnprocs=1\nexecname=./v\ntotspawns=2\nspawnssofar=2\nargcnt=1\n"
        b"arg1=-x\npreput_num=1\npreput_key_0=PARENT_ROOT_PORT_NAME\npreput_val_0=tag#1$\n"
        b"info_num=0\nendcmd\n")
    assert a.handle(0, b1) == []
    [sp] = a.handle(0, b2)
    assert sp.apps == ({"argv": ["./w"], "n": 2, "info": {"wdir": "/tmp"}},
                       {"argv": ["./v", "-x"], "n": 1, "info": {}})
    assert sp.preput == {"PARENT_ROOT_PORT_NAME": "tag#1$"}
    out = fields(sent(a.spawn_done(sp, True))[0])
    assert out["rc"] == "0" and out["errcodes"] == "0,0,0"


def test_a_spawned_job_finds_its_preput_pairs():
    j = share(preput={"PARENT_ROOT_PORT_NAME": "tag#9$"})
    init(j, 0)
    got = fields(sent(j.handle(0, cmd("cmd=get kvsname=kvs@1 key=PARENT_ROOT_PORT_NAME")))[0])
    assert got["value"] == "tag#9$"


def test_the_process_mapping_is_served_and_cannot_be_overwritten():
    j = share(mapping="(vector,(0,2,2))")
    init(j, 0)
    got = fields(sent(j.handle(0, cmd("cmd=get kvsname=kvs@1 key=PMI_process_mapping")))[0])
    assert got["value"] == "(vector,(0,2,2))"
    put = fields(sent(j.handle(0, cmd("cmd=put kvsname=kvs@1 key=PMI_process_mapping "
                                      "value=x")))[0])
    assert put["rc"] == "-1"


def test_an_unknown_command_is_answered_not_ignored():
    j = share()
    init(j, 0)
    effects = j.handle(0, cmd("cmd=frobnicate x=1"))
    assert fields(sent(effects)[0])["rc"] == "-1"


def test_a_rank_that_is_not_here_is_refused():
    j = share((0,))
    [e] = j.handle(5, cmd("cmd=init pmi_version=1 pmi_subversion=1"))
    assert isinstance(e, J.Refuse)


def test_fence_data_is_each_nodes_puts_as_msgpack():
    j = share((0,), size=1)
    init(j, 0)
    j.handle(0, cmd("cmd=put kvsname=kvs@1 key=k value=v"))
    [f] = j.handle(0, cmd("cmd=barrier_in"))
    assert msgpack.unpackb(f.data) == {"k": "v"}


def test_initack_tells_rank_and_size():
    j = share((3,), size=4)
    lines = j.initack(3).decode().splitlines()
    assert lines == ["cmd=initack rc=0", "cmd=set size=4", "cmd=set rank=3", "cmd=set debug=0"]
