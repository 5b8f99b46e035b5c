"""C PMIx clients against PmixServer through the dict-backed test host."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from pydvm.pmix import constants as C

from .conftest import HARNESS


def client(exe, rank, *ops, **kw):
    return {"rank": rank, "argv": [exe, *ops], **kw}


def found(res, rank):
    """FOUND lines of a rank -> {key: (type, value, proc)}."""
    out = {}
    for line in res.lines(rank, "FOUND "):
        m = re.match(r"FOUND key=(\S+) proc=(\S+) type=(\d+) value=(.*)$", line)
        out[m.group(1)] = (int(m.group(3)), m.group(4), m.group(2))
    return out


def statuses(res, rank, prefix):
    return [int(re.search(r"status=(-?\d+)", l).group(1)) for l in res.lines(rank, prefix)]


def test_init_finalize(harness, pmix_ops):
    res = harness({"clients": [client(pmix_ops, 0)]}).ok()
    assert res.lines(0, "INIT")[0].startswith("INIT status=0 nspace=pydvm-test@1 rank=0")
    assert res.lines(0, "FINALIZE") == ["FINALIZE status=0"]
    assert [r["kind"] for r in res.requests] == ["client_connected", "client_finalized"]
    assert res.requests[1]["proc"] == "pydvm-test@1:0"
    assert res.report["pending_replies"] == 0
    # the private tmpdir (and libpmix's dstor files in it) went with finalize
    assert not os.path.exists(res.report["tmpdir"])


def test_clients_are_given_the_topology_the_server_discovered(harness, pmix_ops):
    """PMIX_SERVER_SHARE_TOPOLOGY: libpmix hands every client the machine's
    topology with its job data, as an hwloc shared-memory image (in the
    server's private directory, readable by any client that can reach it)
    and as XML -- so that MPI_Init need not discover it."""
    wild = str(2**32 - 2)  # PMIX_RANK_WILDCARD
    res = harness({"clients": [client(pmix_ops, 0, f"get:{wild}:pmix.hwlocfile",
                                      f"get:{wild}:pmix.hwlocxml2")]}).ok()
    image = res.report["topology_image"]
    assert res.lines(0, "GET")[0] == f"GET status=0 type=3 value={image}"
    assert res.lines(0, "GET")[1].startswith("GET status=0 type=3 value=<?xml")
    assert res.report["topology_image_mode"] == 0o644


def test_publish_lookup_unpublish_round_trip(harness, pmix_ops):
    res = harness({"clients": [
        client(pmix_ops, 0, "pub:alpha:string:one", "pub:beta:string:two",
               "look:alpha,beta", "unpub:alpha", "look:alpha", "look:beta", "unpub:*",
               "look:beta"),
    ]}).ok()
    assert statuses(res, 0, "PUBLISH") == [0, 0]
    assert statuses(res, 0, "LOOKUP") == [0, C.ERR_NOT_FOUND, 0, C.ERR_NOT_FOUND]
    assert statuses(res, 0, "UNPUBLISH") == [0, 0]
    f = found(res, 0)
    assert f["alpha"] == (C.STRING, "one", "pydvm-test@1:0")
    unp = res.kinds("unpublish")
    assert unp[0]["keys"] == ["alpha"] and unp[1]["keys"] is None
    pub = res.kinds("publish")[0]
    # no directives given: range and persistence are "not given", the euid claim is gone
    assert pub["range"] is None and pub["persistence"] is None and pub["directives"] == {}


TYPED = [  # (client type, value sent, PMIx type, value printed back)
    ("uint8", "200", C.UINT8, "200"),
    ("int8", "-100", C.INT8, "-100"),
    ("int16", "-30000", C.INT16, "-30000"),
    ("uint16", "65000", C.UINT16, "65000"),
    ("int32", "-2000000000", C.INT32, "-2000000000"),
    ("uint32", "4000000000", C.UINT32, "4000000000"),
    ("int64", "-9000000000000000000", C.INT64, "-9000000000000000000"),
    ("uint64", "18000000000000000000", C.UINT64, "18000000000000000000"),
    ("size", "123456789012", C.SIZE, "123456789012"),
    ("pid", "4242", C.PID, "4242"),
    ("int", "-7", C.INT, "-7"),
    ("uint", "7", C.UINT, "7"),
    ("float", "1.5", C.FLOAT, "1.5"),
    # libpmix 4.2 packs float/double as "%f" text: 6 decimals survive the wire
    ("double", "-1234.125", C.DOUBLE, "-1234.125"),
    ("bool", "1", C.BOOL, "1"),
    ("bytes", "00ff10", C.BYTE_OBJECT, "00ff10"),
    ("string", "héllo wörld", C.STRING, "héllo wörld"),
    ("status", "-46", C.STATUS, "-46"),
    ("rank", "3", C.PROC_RANK, "3"),
]


def test_typed_values_round_trip(harness, pmix_ops):
    ops = [f"pub:k_{t}:{t}:{v}" for t, v, _, _ in TYPED]
    ops.append("look:" + ",".join(f"k_{t}" for t, *_ in TYPED))
    res = harness({"clients": [client(pmix_ops, 0, *ops)]}).ok()
    assert statuses(res, 0, "PUBLISH") == [0] * len(TYPED)
    assert statuses(res, 0, "LOOKUP") == [0]
    f = found(res, 0)
    seen = {k: p for r in res.kinds("publish") for k, p in r["pairs"].items()}
    for t, sent, ptype, back in TYPED:
        assert f[f"k_{t}"][:2] == (ptype, back), t
        assert seen[f"k_{t}"][1] == ptype, t          # the host saw the PMIx type
    assert seen["k_bytes"][0] == "00ff10"
    assert seen["k_uint64"][0] == 18000000000000000000
    assert seen["k_bool"][0] is True


def test_unsupported_type_refused_and_nothing_stored(harness, pmix_ops):
    res = harness({"clients": [client(pmix_ops, 0, "pub:when:time:12345", "look:when")]}).ok()
    assert statuses(res, 0, "PUBLISH") == [C.ERR_NOT_SUPPORTED]
    assert statuses(res, 0, "LOOKUP") == [C.ERR_NOT_FOUND]
    assert res.kinds("publish") == []                  # never reached the host
    assert res.report["stats"]["refused"] == 1


def test_oversized_value_refused(harness, pmix_ops):
    res = harness({"max_value_size": 16, "clients": [
        client(pmix_ops, 0, "pub:big:string:" + "x" * 17, "pub:ok:string:" + "x" * 16,
               "look:big")]}).ok()
    assert statuses(res, 0, "PUBLISH") == [C.ERR_BAD_PARAM, 0]
    assert statuses(res, 0, "LOOKUP") == [C.ERR_NOT_FOUND]
    assert [list(r["pairs"]) for r in res.kinds("publish")] == [["ok"]]


def test_long_keys_refused(harness, pmix_ops):
    res = harness({"clients": [
        client(pmix_ops, 0, "unpublong:600", "lookuplong:600", "unpublong:511")]}).ok()
    assert statuses(res, 0, "UNPUBLISH") == [C.ERR_BAD_PARAM, 0]
    assert statuses(res, 0, "LOOKUP") == [C.ERR_BAD_PARAM]
    assert len(res.kinds("unpublish")) == 1 and res.kinds("lookup") == []


def test_partial_success_and_not_found(harness, pmix_ops):
    res = harness({"clients": [
        client(pmix_ops, 0, "pub:here:string:x", "look:here,absent", "look:absent",
               "pub:here:string:again")]}).ok()
    # libpmix 4.2 forwards data only with SUCCESS: PARTIAL_SUCCESS arrives alone
    assert statuses(res, 0, "LOOKUP") == [C.ERR_PARTIAL_SUCCESS, C.ERR_NOT_FOUND]
    assert statuses(res, 0, "PUBLISH") == [0, C.ERR_DUPLICATE_KEY]


def test_waiting_lookup_answered_by_later_publish(harness, pmix_ops):
    res = harness({"clients": [
        client(pmix_ops, 0, "lookd:wait=bool/1,timeout=int/10:late,later"),
        client(pmix_ops, 1, "sleep:200", "pub:late:string:v1", "sleep:100",
               "pub:later:int32:5"),
    ]}).ok()
    assert statuses(res, 0, "LOOKUP") == [0]
    f = found(res, 0)
    assert f["late"] == (C.STRING, "v1", "pydvm-test@1:1")
    assert f["later"] == (C.INT32, "5", "pydvm-test@1:1")
    lk = res.kinds("lookup")[0]
    assert lk["wait"] == 0 and lk["timeout"] == 10


def test_wait_count(harness, pmix_ops):
    res = harness({"clients": [
        client(pmix_ops, 0, "lookd:wait=int/1,timeout=int/10:a"),
        client(pmix_ops, 1, "sleep:150", "pub:a:string:x"),
    ]}).ok()
    assert statuses(res, 0, "LOOKUP") == [0]
    assert res.kinds("lookup")[0]["wait"] == 1


def test_lookup_times_out(harness, pmix_ops):
    t0 = time.monotonic()
    res = harness({"clients": [client(pmix_ops, 0, "lookd:wait=bool/1,timeout=int/1:never")]})
    res.ok()
    assert statuses(res, 0, "LOOKUP") == [C.ERR_TIMEOUT]
    assert time.monotonic() - t0 >= 1.0
    assert res.report["parked"] == 0


@pytest.mark.parametrize("rtype", ["range", "int", "uint32", "uint8"])
def test_range_encodings(harness, pmix_ops, rtype):
    res = harness({"clients": [
        client(pmix_ops, 0, f"pubd:range={rtype}/3:k:string:v",
               f"lookd:range={rtype}/2:k", f"unpub:k")]}).ok()
    assert statuses(res, 0, "PUBLISH") == [0]
    assert res.kinds("publish")[0]["range"] == 3
    assert res.kinds("lookup")[0]["range"] == 2


@pytest.mark.parametrize("ptype", ["persist", "int", "uint8", "int64"])
def test_persistence_encodings(harness, pmix_ops, ptype):
    res = harness({"clients": [
        client(pmix_ops, 0, f"pubd:persist={ptype}/1:a:string:v",
               f"pubd:persist={ptype}/5:b:string:v", f"pubd:persist={ptype}/255:c:string:v",
               "look:a", "look:a")]}).ok()
    assert statuses(res, 0, "PUBLISH") == [0, 0, 0]
    assert [r["persistence"] for r in res.kinds("publish")] == [1, 5, 255]
    # FIRST_READ (1) honoured by the test host: gone after the first read
    assert statuses(res, 0, "LOOKUP") == [0, C.ERR_NOT_FOUND]


def test_bad_directives_refused(harness, pmix_ops):
    res = harness({"clients": [
        client(pmix_ops, 0, "pubd:range=int/9:a:string:v", "pubd:persist=string/x:b:string:v",
               "pubd:persist=int/6:c:string:v", "lookd:wait=int/-1:a",
               "lookd:timeout=double/1.5:a")]}).ok()
    assert statuses(res, 0, "PUBLISH") == [C.ERR_BAD_PARAM] * 3
    assert statuses(res, 0, "LOOKUP") == [C.ERR_BAD_PARAM] * 2
    assert res.kinds("publish") == [] and res.kinds("lookup") == []


@pytest.mark.parametrize("mode,status", [("sync", C.ERROR), ("async", C.ERROR),
                                         ("drop", C.ERROR),
                                         ("status", C.ERR_NO_PERMISSIONS)])
def test_handler_failure_answers_error(harness, pmix_ops, mode, status):
    res = harness({"fail": {"kind": "publish", "mode": mode, "status": C.ERR_NO_PERMISSIONS},
                   "clients": [client(pmix_ops, 0, "pub:k:string:v", "look:k")]}).ok()
    assert statuses(res, 0, "PUBLISH") == [status]
    assert statuses(res, 0, "LOOKUP") == [C.ERR_NOT_FOUND]
    assert res.report["pending_replies"] == 0


def test_fence_with_data_collection(harness, pmix_ops):
    ops = lambda me, peer: ["put:blob:from-%d" % me, "commit", "fence:1", f"get:{peer}:blob"]
    res = harness({"clients": [client(pmix_ops, 0, *ops(0, 1)), client(pmix_ops, 1, *ops(1, 0))]},
                  env={"PMIX_MCA_pmix_server_fence_localonly_opt": "0"}).ok()
    assert statuses(res, 0, "FENCE") == [0] and statuses(res, 1, "FENCE") == [0]
    assert res.lines(0, "GET") == ["GET status=0 type=3 value=from-1"]
    assert res.lines(1, "GET") == ["GET status=0 type=3 value=from-0"]
    fences = res.kinds("fence")
    assert len(fences) == 1 and fences[0]["collect"] is True and fences[0]["ndata"] > 0
    assert fences[0]["procs"] == ["pydvm-test@1:*"]


def test_direct_modex_request_reaches_host(harness, pmix_ops):
    # rank 1 is declared on another node: a Get of its data goes to the host
    # as a DirectModex; the test host answers NOT_FOUND, which reaches the client
    res = harness({"nodes": {"node0": [0], "node1": [1]},
                   "clients": [client(pmix_ops, 0, "get:1:blob")]}).ok()
    dm = res.kinds("direct_modex")
    assert dm and dm[0]["proc"] == "pydvm-test@1:1"
    assert statuses(res, 0, "GET") == [C.ERR_NOT_FOUND]


def test_connect_disconnect_collectives(harness, pmix_ops):
    # rank 2 is declared on another node, so the operation is not node-local
    # (libpmix completes all-local connects itself, without the host)
    res = harness({"nodes": {"node0": [0, 1], "node1": [2]},
                   "clients": [client(pmix_ops, r, "connect", "disconnect") for r in (0, 1)]})
    res.ok()
    for r in (0, 1):
        assert statuses(res, r, "CONNECT") == [0] and statuses(res, r, "DISCONNECT") == [0]
    # libpmix collects the local participants: one upcall each for the node
    (cn,), (dc,) = res.kinds("connect"), res.kinds("disconnect")
    assert cn["procs"] == ["pydvm-test@1:*"] and dc["procs"] == ["pydvm-test@1:*"]


def test_spawn_request_and_reply(harness, pmix_ops):
    res = harness({"clients": [client(pmix_ops, 0, "spawn:/bin/true:3")]}).ok()
    assert res.lines(0, "SPAWN") == ["SPAWN status=0 nspace=pydvm-spawned@1"]
    (sp,) = res.kinds("spawn")
    assert sp["proc"] == "pydvm-test@1:0"
    app = sp["apps"][0]
    assert (app["cmd"], app["argv"], app["maxprocs"], app["cwd"]) == \
        ("/bin/true", ["/bin/true", "x"], 3, "/")
    assert "X=1" in app["env"]


def test_abort_upcall(harness, pmix_ops):
    res = harness({"clients": [client(pmix_ops, 0, "abort:3", "nofin")]}).ok()
    ab = res.kinds("abort")
    assert ab and ab[0]["status"] == 3 and ab[0]["message"] == "test abort"
    assert statuses(res, 0, "ABORT") == [0]


def test_client_dying_without_finalize_sends_nothing(harness, pmix_ops):
    res = harness({"clients": [client(pmix_ops, 0, "pub:k:string:v", "nofin")]}).ok()
    assert res.kinds("client_finalized") == []          # the host must notice the exit


def test_killed_server_leaves_dstor_and_cleanup_removes_it(tmp_path, pmix_ops):
    import json
    from pydvm.pmix import cleanup_stale
    spec = {"tmpdir": str(tmp_path / "srv"),
            "clients": [client(pmix_ops, 0, "sleep:5000")]}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    p = subprocess.Popen([sys.executable, str(HARNESS), str(tmp_path / "spec.json")],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    srv = tmp_path / "srv"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not list(srv.glob("pydvm-pmix.*/pmix_dstor_*")):
        time.sleep(0.05)
    time.sleep(0.2)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    left = list(srv.glob("pydvm-pmix.*/pmix_dstor_*"))
    assert left, "expected libpmix's dstor directories to survive a SIGKILL"
    removed = cleanup_stale(srv)
    assert removed and not list(srv.glob("pydvm-pmix.*"))


def test_answers_given_inside_the_upcall_are_those_of_the_loop(harness, pmix_ops):
    """A host's ``answer_now`` answers on libpmix's thread: a publish's or
    unpublish's status returned from the upcall (errors included), a lookup's
    data through libpmix's callback called before the upcall returns.  What
    the client sees is exactly what the loop path gives it."""
    ops = ["pub:alpha:string:one", "pub:alpha:string:again", "pub:beta:uint8:7",
           "look:alpha,beta", "look:alpha,missing", "look:missing", "unpub:alpha",
           "look:alpha", "unpub:*", "look:beta"]
    runs = {}
    for now in (False, True):
        res = harness({"answer_now": now, "clients": [client(pmix_ops, 0, *ops)]}).ok()
        runs[now] = res
        assert statuses(res, 0, "PUBLISH") == [0, C.ERR_DUPLICATE_KEY, 0]
        assert statuses(res, 0, "LOOKUP") == [0, C.ERR_PARTIAL_SUCCESS, C.ERR_NOT_FOUND,
                                              C.ERR_NOT_FOUND, C.ERR_NOT_FOUND]
        assert statuses(res, 0, "UNPUBLISH") == [0, 0]
        assert res.report["pending_replies"] == 0
    assert found(runs[True], 0) == found(runs[False], 0)
    assert found(runs[True], 0)["beta"] == (C.UINT8, "7", "pydvm-test@1:0")
    assert runs[False].report["now"] == [] and runs[False].report["stats"]["answered_now"] == 0
    now = runs[True].report["now"]
    assert now == ["publish"] * 3 + ["lookup"] * 3 + ["unpublish", "lookup", "unpublish",
                                                       "lookup"]
    assert runs[True].report["stats"]["answered_now"] == len(now)


def test_a_waiting_lookup_goes_to_the_loop_when_answers_are_given_in_the_upcall(
        harness, pmix_ops):
    """With ``answer_now``, a lookup that must wait is still parked on the loop
    and answered there by a later publish (handed to the loop while a lookup
    waits); its timeout still ends it."""
    res = harness({"answer_now": True, "clients": [
        client(pmix_ops, 0, "lookd:wait=bool/1,timeout=int/30:late",
               "lookd:wait=bool/1,timeout=int/1:never"),
        client(pmix_ops, 1, "sleep:300", "pub:late:string:x"),
    ]}).ok()
    assert statuses(res, 0, "LOOKUP") == [0, C.ERR_TIMEOUT]
    assert found(res, 0)["late"][:2] == (C.STRING, "x")
    assert "lookup" not in res.report["now"]
