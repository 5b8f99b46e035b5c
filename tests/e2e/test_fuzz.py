"""Fuzzing a real DVM's two input sockets with hypothesis.

Four kinds of connection are fuzzed, each for ``PYDVM_FUZZ_EXAMPLES``
examples (default 400), all against one DVM (daemons a, b, c) started for
this module:

* ``daemon-before-hello``: a fresh connection to the client socket of the
  daemon of node a, then the fuzz input;
* ``daemon-after-hello``: the same after a valid ``hello`` naming the
  running process of a held job (so data requests act as that process);
* ``master-before-handshake``: a fresh TCP connection to the master, its
  challenge read, then the fuzz input;
* ``master-after-handshake``: the same after a valid tool handshake (HMAC
  of the DVM's secret).

An input is bytes: random bytes, well-framed random messages (a random
``"t"`` among the real message types with random field values, or random
msgpack maps and values), or such frames mutated (bit flips, truncation,
changed length headers, splicing, insertions, deletions), or a mix.
Nothing sent to the master ever decodes to ``stop``, ``shutdown``,
``session_end``, ``kill_job`` or ``run`` (checked on the bytes with the
same decoder the master uses).

For every input a fresh connection is opened, the input sent, the answers
read with a short timeout, and the connection closed.  What the DVM must do
is predicted from the input alone, decoded locally with the DVM's own
:class:`~pydvm.wire.FrameDecoder` (see :class:`Prediction`):

* every decoded request is answered with its id (``None`` for a data
  request without an integer id), exactly once, or the connection is closed
  -- after hello / after the handshake a connection is closed only for a
  frame error, with an ``error`` frame first; a valid-looking lookup that
  waits may stay unanswered (it is parked) but is answered at most once;
* a refused first message (no hello, a hello for no process, any message
  before a valid handshake) is answered and the connection closed;
* a connection left inside a frame waits for more and is closed at EOF;
* before hello / the handshake a frame is read alone and may be at most
  ``HANDSHAKE_FRAME`` bytes: a longer one is a frame error.

At the end the DVM processes are alive, no log in the log directory holds a
traceback, the stores hold no item but those whose publish was answered
SUCCESS, no lookup is left parked, and an ordinary job still publishes and
looks up.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field

import msgpack
import pytest
from hypothesis import HealthCheck, Phase, example, given, reject, seed, settings
from hypothesis import strategies as st

from dvmkit import pid_alive, start_dvm, wait_for
from rawpeers import CRASH_PATTERNS, HeldJob, Peer, master_uri
from pydvm.enums import Range
from pydvm.runtime.shared import dataops
from pydvm.runtime.shared.auth import mac
from pydvm.wire import HANDSHAKE_FRAME, HEADER, MAX_FRAME, FrameDecoder, FrameError, pack

pytestmark = pytest.mark.e2e

#: Examples per connection kind (hypothesis ``max_examples``).
EXAMPLES = int(os.environ.get("PYDVM_FUZZ_EXAMPLES", "400"))
#: A fixed seed explores other inputs; without one every run is the same.
SEED = os.environ.get("PYDVM_FUZZ_SEED")
#: Bound on each wait for an answer or a close.
READ_TIMEOUT = 3.0
BAD_PARAM = -27
NO_PERMISSIONS = -23
#: The only keys the fuzzer publishes, looks up or unpublishes (as str).
KEYS = ["fz0", "fz1", "fz2", "fz3"]
#: Never sent to the master: they stop the DVM or end/kill/launch jobs.
MASTER_FORBIDDEN = frozenset({"stop", "shutdown", "session_end", "kill_job", "run"})
#: Every message type of the protocol (both directions), plus a few unknown ones.
TYPES = ["publish", "lookup", "unpublish", "update", "keys", "hello"] + sorted({  # client first
    "auth", "ready", "cancel", "output", "exited",                  # daemon -> master
    "launch", "kill", "purge", "stats", "shutdown", "ping",         # master -> daemon
    "run", "kill_job", "ps", "stop", "session_new", "session_end", "store", "info",  # tools
    "challenge", "reply", "error", "started",                       # answers
    "bogus", "", "PUBLISH",
} - {"publish", "lookup", "unpublish", "update", "keys", "hello"})
MASTER_TYPES = [t for t in TYPES if t not in MASTER_FORBIDDEN]
#: Tool requests that may succeed; any other non-data type is refused.
_TOOL_OK = frozenset({"session_new", "store", "info", "purge", "ping", "ps"})
KINDS = ("daemon-before-hello", "daemon-after-hello", "master-before-handshake",
         "master-after-handshake")

#: Inputs sent, by kind (filled as the tests run; reported at the end).
SENT: Counter = Counter()
#: What became of them, by kind: how many were refused, closed for a frame
#: error, left inside a frame, and how many replies (SUCCESS or not) came back.
OUTCOMES: dict[str, Counter] = {}


# ---------------------------------------------------------------------------
# strategies
# ---------------------------------------------------------------------------

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 10), st.integers(-2**63, 2**64 - 1),
    st.floats(), st.text(max_size=10), st.binary(max_size=10), st.sampled_from(KEYS),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=6), st.sampled_from(KEYS),
                                  st.integers(-5, 5)), inner, max_size=4)),
    max_leaves=10,
)
small_ints = st.integers(0, 8)
key_lists = st.lists(st.sampled_from(KEYS), max_size=4)


def mostly(valid: st.SearchStrategy) -> st.SearchStrategy:
    """``valid`` seven times in eight, else any random value."""
    return st.one_of(*[valid] * 7, values)


def field_strategies(nspaces: list[str], ranks: list[int]) -> dict[str, st.SearchStrategy]:
    """Strategies for the fields of real messages, each sometimes a random value."""
    nspace = mostly(st.sampled_from(nspaces) | st.text(max_size=12))
    rank = mostly(st.sampled_from(ranks) | st.integers(-2, 4))
    ids = st.lists(st.integers(-1, 2**32), max_size=3)
    return {
        # data requests
        "pairs": mostly(st.dictionaries(st.one_of(*[st.sampled_from(KEYS)] * 3, st.integers(-2, 2),
                                                  st.binary(max_size=3), st.text(max_size=3)),
                                        mostly(st.one_of(st.text(max_size=8), st.binary(max_size=8),
                                                         st.integers(-2**63, 2**63 - 1),
                                                         st.floats(), st.booleans())),
                                        min_size=1, max_size=3)),
        "keys": mostly(key_lists | st.none()),
        "key": mostly(st.sampled_from(KEYS)),
        "op": mostly(st.sampled_from(["add", "add", "cas", "append"])),
        "value": mostly(st.one_of(st.integers(-3, 3), st.sampled_from([b"", b"1", "1", b"x"]),
                                  st.binary(max_size=4))),
        "expected": mostly(st.none() | st.sampled_from([b"", b"1", "1", 0, 1])),
        "prefix": mostly(st.sampled_from(["", "fz", "fz1", "zz"])),
        "limit": mostly(st.none() | st.integers(0, 3)),
        "range": mostly(st.sampled_from([2, 2, 3, 4, 4, 5, 0, 1, 6, 7, 8])),
        "persist": mostly(st.sampled_from([0, 1, 2, 3, 4, 5, 255, None, 77])),
        "uids": mostly(ids),
        "gids": mostly(ids),
        "replace": mostly(st.booleans()),
        "wait": mostly(st.none() | st.integers(0, 3)),
        "timeout": mostly(st.none() | st.floats(0, 0.05)),
        # requestor claims (honoured from tools, stripped by daemons)
        "requestor": mostly(st.tuples(nspace, rank).map(list)),
        "req_uid": mostly(st.integers(0, 70000)),
        "req_gid": mostly(st.integers(0, 70000) | st.none()),
        "req_app": mostly(small_ints),
        "caller": mostly(st.tuples(nspace, rank, st.integers(0, 5), st.integers(0, 5)).map(list)),
        # hello / auth
        "nspace": nspace,
        "rank": rank,
        "role": mostly(st.sampled_from(["tool", "daemon", "admin"])),
        "mac": mostly(st.binary(min_size=32, max_size=32)),
        "node": mostly(st.sampled_from(["a", "b", "c", "zz"])),
        "pid": mostly(st.integers(0, 2**31)),
        # tool and runtime messages
        "hosts": mostly(st.lists(st.tuples(mostly(st.sampled_from(["a", "b", "c", "zz"])),
                                           mostly(st.integers(-1, 4))).map(list), max_size=3)),
        "session": mostly(small_ints),
        "session_id": mostly(small_ints),
        "horizon": mostly(st.sampled_from([0, 1, 2, 3, 4, 5, 255])),
        "app_idx": mostly(small_ints),
        "ref": mostly(st.integers(0, 2000)),
        "uid": mostly(st.integers(0, 70000)),
        "status": mostly(st.integers(-50, 300)),
        "fd": mostly(st.sampled_from([1, 2])),
        "data": mostly(st.binary(max_size=20)),
        "procs": mostly(st.lists(values, max_size=2)),
        "found": values,
        "msg": values,
        "nonce": mostly(st.binary(max_size=32)),
    }


#: The fields each message type reads (others are added at random).
TYPE_FIELDS = {
    "publish": ["pairs", "range", "persist", "uids", "gids", "replace",
                "requestor", "req_uid", "req_gid", "req_app", "caller"],
    "lookup": ["keys", "range", "wait", "timeout", "requestor", "req_uid", "req_gid", "caller"],
    "unpublish": ["keys", "requestor", "req_uid", "caller"],
    "update": ["key", "op", "value", "expected", "range", "persist", "uids", "gids",
               "requestor", "req_uid", "req_gid", "caller"],
    "keys": ["prefix", "range", "limit", "requestor", "req_uid", "caller"],
    "hello": ["nspace", "rank"],
    "auth": ["role", "mac", "node", "pid"],
    "session_new": ["hosts"],
    "purge": ["horizon", "nspace", "rank", "app_idx", "session_id"],
    "cancel": ["ref"],
    "store": ["uid"],
    "stats": ["uid"],
    "exited": ["nspace", "rank", "status"],
    "output": ["nspace", "rank", "fd", "data"],
    "launch": ["nspace", "session_id", "procs"],
    "kill": ["nspace"],
    "reply": ["status", "msg", "found"],
    "error": ["status", "msg"],
    "challenge": ["nonce"],
}


#: Fields a message is little without: present seven times in eight (others half the time).
ESSENTIAL = frozenset({"pairs", "keys", "nspace", "rank", "role", "mac", "horizon", "key", "op",
                       "value"})


def messages(types: list[str], common: list[str],
             fields: dict[str, st.SearchStrategy]) -> st.SearchStrategy:
    """A message of a random real type with (mostly) its own fields, randomly valued;
    the ``common`` types three times in four."""
    names = sorted(fields)
    weighted = st.one_of(*[st.sampled_from(common)] * 3, st.sampled_from(types))

    @st.composite
    def typed(draw) -> dict:
        t = draw(weighted)
        msg: dict = {"t": t}
        if draw(st.integers(0, 9)) < 8:
            msg["id"] = draw(st.one_of(*[st.integers(0, 6)] * 4, st.integers(-2**63, 2**64 - 1),
                                       values))
        for name in TYPE_FIELDS.get(t, []):
            if draw(st.integers(0, 7)) < (7 if name in ESSENTIAL else 4):
                msg[name] = draw(fields[name])
        for name in draw(st.lists(st.sampled_from(names), max_size=2)):
            msg.setdefault(name, draw(fields[name]))
        if draw(st.integers(0, 9)) == 0:
            msg.setdefault(draw(st.text(max_size=4)), draw(values))
        return msg

    any_map = st.dictionaries(st.sampled_from(["t", "id", "keys", "pairs"]) | st.text(max_size=4)
                              | st.integers(-2, 2), values, max_size=4)
    return st.one_of(typed(), typed(), typed(), typed(), typed(), any_map)


def framed(msgs: st.SearchStrategy) -> st.SearchStrategy:
    """One to three well-framed messages (and, rarely, a framed non-map value)."""
    body = st.one_of(msgs, msgs, msgs, msgs, msgs, values).map(lambda m: msgpack.packb(m, use_bin_type=True))
    return st.lists(body, min_size=1, max_size=3).map(
        lambda bodies: b"".join(HEADER.pack(len(b)) + b for b in bodies))


@st.composite
def mutated(draw, base: st.SearchStrategy) -> bytes:
    """A valid input with one to three mutations."""
    data = bytearray(draw(base))
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["flip", "flip", "truncate", "length", "overwrite",
                                   "splice", "insert", "delete", "repeat"]))
        n = len(data)
        if op == "flip" and n:
            i = draw(st.integers(0, n - 1))
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "truncate":
            data = data[:draw(st.integers(0, n))]
        elif op == "length" and n >= 4:
            (cur,) = HEADER.unpack_from(data, 0)
            new = draw(st.one_of(
                st.integers(-8, 8).map(lambda d: min(max(cur + d, 0), 2**32 - 1)),
                st.sampled_from([0, 1, 4, MAX_FRAME, MAX_FRAME + 1, 2**31, 2**32 - 1]),
                st.integers(0, 2**32 - 1)))
            data[0:4] = HEADER.pack(new)
        elif op == "overwrite" and n >= 4:
            i = draw(st.integers(0, n - 4))
            data[i:i + 4] = HEADER.pack(draw(st.integers(0, 2**32 - 1)))
        elif op == "splice":
            other = draw(base)
            data = data[:draw(st.integers(0, n))] + other[draw(st.integers(0, len(other))):]
        elif op == "insert":
            i = draw(st.integers(0, n))
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and n:
            i = draw(st.integers(0, n - 1))
            del data[i:i + draw(st.integers(1, 8))]
        elif op == "repeat" and n:
            i = draw(st.integers(0, n - 1))
            data[i:i] = data[i:i + draw(st.integers(1, 16))]
    return bytes(data)


def inputs(msgs: st.SearchStrategy, greeting: bytes = b"") -> st.SearchStrategy:
    """Random bytes, frames, mutated frames, mixes; after ``greeting`` (a valid
    first message) in a fifth of the examples if one is given."""
    frames = framed(msgs)
    piece = st.one_of(frames, mutated(frames), st.binary(max_size=24))
    kinds = [
        frames,
        frames,
        mutated(frames),
        mutated(frames),
        st.lists(piece, min_size=2, max_size=3).map(b"".join),
        st.binary(max_size=256),
    ]
    if greeting:
        greet = st.one_of(st.just(greeting), st.just(greeting), mutated(st.just(greeting)))
        after = st.one_of(frames, frames, mutated(frames))
        kinds += [st.tuples(greet, after).map(b"".join)] * 2
    return st.one_of(*kinds)


#: Hand-picked inputs tried first on every kind.
EXPLICIT = [
    b"",
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    HEADER.pack(MAX_FRAME + 1),
    HEADER.pack(2**32 - 1) + b"\x80",
    HEADER.pack(0),
    HEADER.pack(100) + b"\x81",
    b"\x00\x00\x00\x01\xc1",
    pack({"t": "lookup", "id": 1, "keys": ["fz0"], "wait": 0, "timeout": float("inf")}),
    pack({"t": "lookup", "id": 1, "keys": ["fz0"], "wait": 0, "timeout": 1e300}),
    pack({"t": "lookup", "id": 2, "keys": ["fz0"], "wait": 0, "timeout": 2**63}),
    pack({"t": "lookup", "id": 3, "keys": ["fz0"], "wait": 2**64 - 1}),
    pack({"t": "publish", "id": 4, "pairs": {"fz0": 2**64 - 1}}),
    pack({"t": "publish", "id": 5, "pairs": {"fz1": {"a": [1, {"b": None}]}}, "range": 2}),
    pack({"t": "publish", "id": 6, "pairs": {"fz2": 1}, "uids": [2**32 - 1], "gids": [0]}),
    pack({"t": "unpublish", "id": 7, "keys": None}),
    pack({"t": "update", "id": 14, "key": "fz0", "op": "add", "value": 2**64 - 1}),
    pack({"t": "update", "id": 15, "key": "fz0", "op": "add", "value": 1}),
    pack({"t": "update", "id": 16, "key": "fz1", "op": "cas", "value": b"x", "expected": b""}),
    pack({"t": "keys", "id": 17, "prefix": "fz", "limit": 2**63}),
    pack({"t": "purge", "id": 8, "horizon": 5, "nspace": "x", "rank": 2**64 - 1}),
    pack({"t": "session_new", "id": 9, "hosts": [["a", -1]]}),
    pack({"t": "session_new", "id": 10, "hosts": {"a": 1}}),
    pack({"t": "store", "id": 11, "uid": 2**64 - 1}),
    pack({"t": "cancel", "ref": 2**64 - 1}),
    pack({"t": "reply", "id": 1000, "status": 0}),
    pack({"t": "hello", "id": [1, 2], "nspace": None}),
    pack({"t": "publish", "id": 12, "pairs": {"fz3": "v"}}) * 3,
    HEADER.pack(2000) + b"\x91" * 2000,                # deeply nested arrays
    HEADER.pack(2000) + b"\x81\xa1t" * 666 + b"\xc0\xc0",  # deeply nested maps
    # A request the daemon forwards to the master, then a frame error that closes
    # the connection before the master's answer is back.
    pack({"t": "lookup", "id": 13, "keys": ["fz0"]}) + b"\x00\x00\x00\x01\xc1",
    HEADER.pack(3) + b"\xc7\x01\x05",                   # truncated ext inside a frame
    HEADER.pack(15) + b"\xd6\xff\x00\x00\x00\x00\xd7\xff" + b"\xff" * 7,  # timestamps
]


# ---------------------------------------------------------------------------
# the DVM under fuzz
# ---------------------------------------------------------------------------


class FuzzPeer(Peer):
    """A raw connection that can also poll without failing on silence."""

    def poll(self, deadline: float) -> bool:
        """Read once into the queue; False if nothing came before the deadline."""
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        self.sock.settimeout(left)
        try:
            data = self.sock.recv(1 << 16)
        except socket.timeout:
            return False
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if not data:
            self.eof = True
            return True
        # A frame error here means the DVM sent something undecodable: let it fail.
        self._queue.extend(self._dec.feed(data))
        return True


@dataclass
class Fuzzed:
    dvm: object
    held: HeldJob
    secret: bytes
    host: str
    port: int
    #: store name -> keys of publishes answered SUCCESS, and how many there were.
    published: dict[str, set] = field(default_factory=lambda: {"master": set(), "a": set()})
    successes: Counter = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)

    def connect(self, kind: str) -> FuzzPeer:
        if kind.startswith("daemon"):
            p = FuzzPeer.unix(self.held.server)
            if kind == "daemon-after-hello":
                r = p.call(self.held.hello())
                assert r["status"] == 0, r
            return p
        p = FuzzPeer.tcp(self.host, self.port)
        challenge = p.recv()
        assert challenge.get("t") == "challenge", challenge
        if kind == "master-after-handshake":
            r = p.call({"t": "auth", "role": "tool",
                        "mac": mac(self.secret, challenge["nonce"], "tool")})
            assert r["status"] == 0, r
        return p


HOLD = ('echo READY "$PYDVM_SERVER" "$PYDVM_NSPACE" "$PYDVM_RANK" "$PYDVM_NODE"; '
        # no bound of its own: under load a count of sleeps ran out before the tests
        # did; the fixture's go file or the DVM's stop ends it
        'while [ ! -e "$1" ]; do sleep 0.05; done')


@pytest.fixture(scope="module")
def fz(tmp_path_factory):
    """One DVM (a, b, c) for the whole module, with a job process running on a."""
    tmp = tmp_path_factory.mktemp("fuzz")
    dvm = start_dvm(tmp)
    go = tmp / "go"
    held = None
    try:
        proc = dvm.run_bg("--host", "a", "-n", "1", "sh", "-c", HOLD, "sh", str(go))
        held = HeldJob(proc, go)
        _, held.server, held.nspace, rank, held.node = held.line("READY").split()
        held.rank = int(rank)
        assert held.node == "a"
        uri = master_uri(dvm)
        yield Fuzzed(dvm, held, dvm.secret(), uri.host, uri.port)
    finally:
        go.touch()
        if held is not None:
            try:
                held.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                held.kill()
        dvm.stop()


# ---------------------------------------------------------------------------
# what the DVM must do with an input
# ---------------------------------------------------------------------------


def idkey(v) -> bytes:
    """Ids compared as their encoding (so that NaN and nested ids compare)."""
    return msgpack.packb(v, use_bin_type=True)


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass
class Prediction:
    """What the DVM must answer to ``data`` on a connection of ``kind``."""

    msgs: list                      # the messages the DVM decodes and acts on
    required: Counter = field(default_factory=Counter)   # id -> replies due
    optional: Counter = field(default_factory=Counter)   # id -> replies allowed besides
    #: id -> what the replies to the requests with that id must be: "ok" (a valid
    #: hello), "fail" (a refusal) or "any"; checked where all agree.
    outcome: dict = field(default_factory=dict)
    publishes: list = field(default_factory=list)        # (id, store, keys)
    refused: bool = False     # the DVM closes after refusing a first message
    frame_error: bool = False  # the DVM closes after an error frame
    pending: int = 0          # bytes of an incomplete frame the DVM waits on
    types: set = field(default_factory=set)

    @property
    def must_close(self) -> bool:
        return self.refused or self.frame_error

    @classmethod
    def of(cls, kind: str, data: bytes, held: HeldJob) -> "Prediction":
        msgs, bad, dec = _decode_as_dvm(kind, data, held)
        p = cls(msgs, pending=0 if bad else dec.pending_bytes)
        p.types = {m["t"] for m in msgs}
        state = {"daemon-before-hello": "hello", "daemon-after-hello": "client",
                 "master-before-handshake": "auth", "master-after-handshake": "tool"}[kind]
        for m in msgs:
            t, rid = m["t"], m.get("id")
            answer_type = t in ("reply", "error")  # answers are never answered (wire.refuse)
            if state == "hello":
                if answer_type:
                    p.refused = True  # closed, unanswered
                    break
                p.required[idkey(rid)] += 1
                ok = (t == "hello" and m.get("nspace") == held.nspace
                      and isinstance(m.get("nspace"), str)
                      and is_int(m.get("rank")) and m.get("rank") == held.rank)
                if ok:
                    p.expect(rid, "ok")
                    state = "client"
                    continue
                p.expect(rid, "fail")
                p.refused = True
                break
            if state == "auth":  # nobody here knows the nonce's MAC
                p.required[idkey(rid)] += 1
                p.expect(rid, "fail")
                p.refused = True
                break
            if t in dataops.DATA_OPS:
                if not is_int(rid):
                    p.required[idkey(None)] += 1
                    p.expect(None, "fail")
                    continue
                p.expect(rid, "any")
                w = m.get("wait")
                if t == "lookup" and is_int(w) and w >= 0:
                    p.optional[idkey(rid)] += 1  # may be parked: answered at most once
                else:
                    p.required[idkey(rid)] += 1
                if t in ("publish", "update"):  # both may store a new item
                    store = "master"
                    if state == "client" and dataops.request_range(m) == Range.LOCAL:
                        store = held.node
                    pairs = m.get("pairs") if t == "publish" else [m.get("key")]
                    keys = [k for k in pairs if isinstance(k, str)] \
                        if isinstance(pairs, (dict, list)) else []
                    p.publishes.append((idkey(rid), store, keys))
            elif state in ("tool", "client") and t == "cancel":
                continue  # a notice (like a daemon's), never answered
            elif answer_type:
                continue  # a stray reply or error frame: dropped, never answered
            else:
                p.required[idkey(rid)] += 1
                p.expect(rid, "any" if state == "tool" and t in _TOOL_OK else "fail")
        else:
            p.frame_error = bad
        return p

    def expect(self, rid, outcome: str) -> None:
        self.outcome.setdefault(idkey(rid), set()).add(outcome)


def _valid_hello(m: dict, held: HeldJob) -> bool:
    return (m["t"] == "hello" and isinstance(m.get("nspace"), str)
            and m.get("nspace") == held.nspace and is_int(m.get("rank"))
            and m.get("rank") == held.rank)


def _decode_as_dvm(kind: str, data: bytes, held: HeldJob):
    """The messages the DVM reads of ``data``, whether it met a frame error,
    and the decoder: before the handshake a frame may be at most
    HANDSHAKE_FRAME bytes and is read alone; only a valid hello lets the
    daemon read on (a refused first message closes the connection)."""
    gated = kind in ("daemon-before-hello", "master-before-handshake")
    dec = FrameDecoder(handshake=HANDSHAKE_FRAME if gated else None)
    msgs: list = []
    chunk = data
    while True:
        try:
            got = dec.feed(chunk)
        except FrameError as exc:
            return msgs + exc.messages, True, dec
        msgs += got
        if dec.handshake is None or not got:
            return msgs, False, dec
        if kind != "daemon-before-hello" or not _valid_hello(got[0], held):
            return msgs, False, dec  # refused: nothing after it is read
        dec.handshake = None
        chunk = b""


def describe(kind: str, data: bytes, p: Prediction, got: list, why: str) -> str:
    shown = data if len(data) <= 300 else data[:300] + b"..."
    return (f"{kind}: {why}\n  input ({len(data)} bytes): {shown!r}\n"
            f"  decoded: {p.msgs!r}\n  frame error: {p.frame_error}, refused: {p.refused}, "
            f"pending: {p.pending}\n  received: {got!r}")


def exercise(fz: Fuzzed, kind: str, data: bytes) -> None:
    """Send ``data`` on a fresh connection of ``kind`` and check the answers."""
    p = Prediction.of(kind, data, fz.held)
    if kind.startswith("master") and p.types & MASTER_FORBIDDEN:
        reject()
    peer = fz.connect(kind)
    SENT[kind] += 1
    try:
        _exercise(fz, kind, data, p, peer)
    except AssertionError as exc:
        fz.violations.append(str(exc))
        raise
    finally:
        peer.close()


def _exercise(fz: Fuzzed, kind: str, data: bytes, p: Prediction, peer: FuzzPeer) -> None:
    def fail(why: str) -> None:
        raise AssertionError(describe(kind, data, p, peer._queue, why))

    def answered() -> Counter:
        return Counter(idkey(m.get("id")) for m in peer._queue if m.get("t") == "reply")

    def due() -> bool:
        got = answered()
        return any(got[k] < n for k, n in p.required.items())

    try:
        peer.sock.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        peer.eof = True
    deadline = time.monotonic() + READ_TIMEOUT
    # Until the due answers are in -- or, if the DVM must close, until it does.
    while not peer.eof and (p.must_close or due()):
        if not peer.poll(deadline):
            fail("neither the due answers nor a close within "
                 f"{READ_TIMEOUT}s" if not p.must_close else
                 f"not closed within {READ_TIMEOUT}s")
    closed_by_dvm = peer.eof
    if closed_by_dvm and not p.must_close:
        fail("the DVM closed a connection it had no reason to close")
    if not peer.eof:
        peer.half_close()
        deadline = time.monotonic() + READ_TIMEOUT
        while not peer.eof:
            if not peer.poll(deadline):
                fail(f"still open {READ_TIMEOUT}s after our end of stream")
    got = answered()
    frames = [m for m in peer._queue if m.get("t") != "ping"]
    seen = OUTCOMES.setdefault(kind, Counter())
    seen["refused"] += p.refused
    seen["frame error"] += p.frame_error
    seen["inside a frame"] += bool(p.pending)
    seen["requests"] += len(p.msgs)
    seen["replies ok"] += sum(1 for m in frames if m.get("t") == "reply" and m.get("status") == 0)
    seen["replies refusing"] += sum(1 for m in frames
                                    if m.get("t") == "reply" and m.get("status") != 0)
    seen["unanswered (parked)"] += sum(max(0, n - got[k]) for k, n in p.optional.items()
                                       if not p.required[k])
    for m in frames:
        if m.get("t") == "reply":
            if not is_int(m.get("status")) or not isinstance(m.get("msg"), str):
                fail(f"malformed reply {m!r}")
        elif m.get("t") == "error":
            if m.get("status") != BAD_PARAM or not m.get("msg"):
                fail(f"malformed error frame {m!r}")
        else:
            fail(f"unexpected {m.get('t')!r} frame")
    errors = [m for m in frames if m.get("t") == "error"]
    if p.frame_error and not errors:
        fail("a frame error closed the connection without an error frame")
    if errors and not p.frame_error:
        fail("an error frame for an input the DVM's decoder reads without error")
    if not p.frame_error:  # every request answered (relaxed only when a frame error closes)
        for k, n in p.required.items():
            if got[k] < n:
                fail(f"request id {msgpack.unpackb(k)!r} answered {got[k]} time(s), "
                     f"expected {n}")
    for k, n in got.items():
        if n > p.required[k] + p.optional[k]:
            fail(f"id {msgpack.unpackb(k)!r} answered {n} time(s), at most "
                 f"{p.required[k] + p.optional[k]} expected")
    for m in frames:
        if m.get("t") != "reply":
            continue
        k = idkey(m.get("id"))
        if p.outcome.get(k) == {"ok"} and m["status"] != 0:
            fail(f"a valid hello was refused: {m!r}")
        if p.outcome.get(k) == {"fail"} and m["status"] == 0:
            fail(f"a request that must be refused succeeded: {m!r}")
        if m["status"] == 0:
            for pid, store, keys in p.publishes:
                if pid == k:
                    fz.published.setdefault(store, set()).update(keys)
                    fz.successes[store] += 1


def run_fuzz(fz: Fuzzed, kind: str, record_property) -> None:
    fields = field_strategies([fz.held.nspace, "pydvm-x@1"], [fz.held.rank])
    if kind.startswith("master"):
        msgs = messages(MASTER_TYPES, ["publish", "lookup", "unpublish", "update", "info",
                                       "store", "session_new", "purge", "auth"], fields)
    else:
        msgs = messages(TYPES, ["publish", "lookup", "unpublish", "update", "keys", "hello"],
                        fields)
    before = SENT[kind]

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=SEED is None,
              suppress_health_check=list(HealthCheck),
              phases=[Phase.explicit, Phase.generate, Phase.shrink])
    @given(data=inputs(msgs, pack(fz.held.hello()) if kind == "daemon-before-hello" else b""))
    def prop(data: bytes) -> None:
        exercise(fz, kind, data)

    for data in EXPLICIT + [pack(fz.held.hello()) + pack({"t": "lookup", "id": 1, "keys": KEYS})]:
        prop = example(data=data)(prop)
    if SEED is not None:
        prop = seed(int(SEED))(prop)
    t0 = time.monotonic()
    try:
        prop()
    finally:
        sent = SENT[kind] - before
        print(f"\nfuzz {kind}: {sent} inputs sent in {time.monotonic() - t0:.1f}s; "
              f"{dict(OUTCOMES.get(kind, {}))}")
        record_property(f"fuzz_inputs_{kind}", sent)
    assert_alive_and_clean(fz.dvm, f"after fuzzing {kind} with {sent} inputs")
    assert sent >= EXAMPLES, f"{kind}: only {sent} fuzz inputs sent"


#: Log lines no outside input may cause: a crash, a lost link, or the master and
#: a daemon not understanding each other (nobody else talks on their link).
BAD_LOG = re.compile(r"Traceback|" + CRASH_PATTERNS
                     + r"|master sent unknown message type|daemon \S+: unknown message type")
#: Seconds the logs must stay still once the input has stopped.
QUIET = 1.0


def assert_alive_and_clean(dvm, when: str) -> None:
    """DVM processes alive, no bad log line, and no log still growing (a runaway loop)."""
    problems = []
    for name, pid in dvm.daemon_pids.items():
        if not pid_alive(pid):
            problems.append(f"daemon {name} (pid {pid}) died")
    if not pid_alive(dvm.pid):
        problems.append(f"the master (pid {dvm.pid}) died")
    logs = sorted(dvm.log_dir.glob("*.log"))
    sizes = {path: path.stat().st_size for path in logs}
    for path in logs:
        text = path.read_text(errors="replace")
        bad = [ln for ln in text.splitlines() if BAD_LOG.search(ln)]
        if bad:
            shown = "\n    ".join(bad[:4])
            problems.append(f"{path.name} has {len(bad)} bad line(s), first:\n    {shown}")
            i = text.find("Traceback")
            if i >= 0:
                problems.append(f"{path.name} first traceback:\n{text[max(0, i - 300):i + 2500]}")
    time.sleep(QUIET)
    for path in logs:
        with open(path, "rb") as f:
            f.seek(sizes[path])
            new = f.read().decode(errors="replace").splitlines()
        if len(new) > 3:
            shown = "\n    ".join(new[:3])
            problems.append(f"{path.name} still grows once the input stopped: {len(new)} lines "
                            f"in {QUIET}s, e.g.\n    {shown}")
    if problems:
        raise AssertionError(f"{when}:\n" + "\n".join(problems))


# ---------------------------------------------------------------------------
# the tests
# ---------------------------------------------------------------------------


def test_fuzz_daemon_socket_before_hello_answers_or_closes(fz, record_property):
    """Fuzz input as a client's first bytes is answered and/or closed; the daemon survives."""
    run_fuzz(fz, "daemon-before-hello", record_property)


def test_fuzz_daemon_socket_after_hello_answers_every_request(fz, record_property):
    """After a valid hello every fuzzed request is answered with its id, or a frame error closes."""
    run_fuzz(fz, "daemon-after-hello", record_property)


def test_fuzz_master_port_before_handshake_refuses_and_closes(fz, record_property):
    """Fuzz input before the handshake is refused and closed; the master survives."""
    run_fuzz(fz, "master-before-handshake", record_property)


def test_fuzz_master_port_after_tool_handshake_answers_every_request(fz, record_property):
    """After a tool handshake every fuzzed request is answered with its id, or a frame error closes."""
    run_fuzz(fz, "master-after-handshake", record_property)


def test_fuzz_leaves_processes_logs_and_stores_clean(fz, record_property):
    """After all the fuzzing: DVM alive, no traceback logged, stores hold only successful publishes."""
    total = sum(SENT.values())
    print(f"\nfuzz inputs sent: {dict(SENT)} (total {total})")
    record_property("fuzz_inputs_total", total)
    assert_alive_and_clean(fz.dvm, f"after {total} fuzz inputs {dict(SENT)}")
    dvm = fz.dvm
    stores = dvm.store()
    assert set(stores) == {"master", "a", "b", "c"}, stores
    for s in stores.values():
        assert "error" not in s, f"a store did not answer: {s}"
    # Abandoned waiting lookups are cancelled with their connections.
    wait_for(lambda: all(s.get("parked") == 0 for s in dvm.store().values()), timeout=10,
             what="no lookup left parked by the fuzzer")
    stores = dvm.store()
    for name, s in stores.items():
        allowed = fz.published.get(name, set())
        stray = set(s["keys"]) - allowed
        assert not stray, (f"{name} store holds keys no successful publish put there: {stray} "
                           f"(successful publishes: {fz.successes[name]}, keys {allowed})")
        assert s["items"] <= fz.successes[name], (
            f"{name} store holds {s['items']} items, but only {fz.successes[name]} publishes "
            f"there were answered SUCCESS ({s})")
    assert stores["b"]["items"] == stores["c"]["items"] == 0, stores
    if set(SENT) == set(KINDS):
        assert total >= len(KINDS) * EXAMPLES, f"only {total} fuzz inputs sent"


def test_normal_job_publishes_and_looks_up_after_fuzz(fz):
    """After the fuzzing an ordinary job publishes and looks up, on the fuzzed node and across nodes."""
    dvm = fz.dvm
    p = dvm.run("--host", "a", "-n", "1", "sh", "-c",
                "pydvm publish after-fuzz=fine && pydvm lookup after-fuzz", timeout=30)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "FOUND after-fuzz fine from " in p.stdout, p.stdout
    j = dvm.run("-n", "3", "sh", "-c",
                'pydvm publish "af$PYDVM_RANK=on-$PYDVM_NODE" && pydvm lookup --wait af0 af1 af2',
                timeout=30)
    assert j.returncode == 0, j.stdout + j.stderr
    assert len([ln for ln in j.stdout.splitlines() if ln.startswith("FOUND af")]) == 9, j.stdout
    # The fuzzed connection kinds still work as before.
    for kind in KINDS:
        peer = fz.connect(kind)
        peer.close()
    assert_alive_and_clean(dvm, "after the final jobs")
