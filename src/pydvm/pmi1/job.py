"""A node's share of one PMI-1 job: the pure core of the PMI-1 server.

Every process of a PMI-1 job on a node talks to :class:`Pmi1Job` through
its own connection; :meth:`Pmi1Job.handle` takes one request of one rank
and returns what to do -- replies to send, a fence to contribute, an abort,
a name-service or spawn request -- as plain effect objects the node's I/O
shell carries out (:mod:`pydvm.runtime.node.pmi1host`).  The answers to those
requests come back through :meth:`fence_done`, :meth:`data_done` and
:meth:`spawn_done`.

The key-value space
-------------------
What the job's processes ``put`` is visible, after the next barrier, to
every process of the job on every node -- PMI-1's only promise.  A node
keeps the puts of its own processes since the last barrier (``puts``);
when every local process of the job has entered a barrier, the node sends
them to the master as its contribution to a fence over the whole job
(:class:`~pydvm.runtime.master.collectives.Collectives`: the same collective a
PMIx fence is); the master answers every node with all the contributions,
which each node adds to its ``kvs``, and only then is each waiting process
let out of the barrier.  A ``get`` is answered at once: the value, or
``rc=-1`` when nobody has put the key (a client asks for optional keys and
falls back when they are missing -- it must never be left waiting).

Invariants (checked by :meth:`check`):

* ``entered`` holds only local ranks that are connected and not finalized;
* a fence is out (``fencing``) only when every local rank entered (or
  has ended since);
* ``puts`` is empty while a fence is out (what was put went with it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgpack

from .wire import (KEYLEN_MAX, KVSNAME_MAX, VALLEN_MAX, Command, ProtocolError, encode)

#: The PMI-1 version this server speaks (1.1, as MPICH's launcher does).
VERSION, SUBVERSION = 1, 1

#: Keys the server answers itself (MPICH reads them after init).
MAPPING_KEY = "PMI_process_mapping"
#: Where a file of the node's hardware topology (hwloc XML) is: MPICH 5
#: reads it instead of discovering the topology in every rank.
TOPOLOGY_KEY = "PMI_hwloc_xmlfile"


# ----------------------------------------------------------------------
# effects: what the I/O shell does for the core
# ----------------------------------------------------------------------

@dataclass(frozen=True)
class Send:
    """Write ``data`` (reply lines) to ``rank``'s connection."""
    rank: int
    data: bytes


@dataclass(frozen=True)
class Fence:
    """Every local rank is in the barrier: contribute ``data`` (this node's
    puts, encoded) to a fence over the whole job; answer with :meth:`Pmi1Job.fence_done`."""
    data: bytes


@dataclass(frozen=True)
class Abort:
    """``rank`` called ``PMI_Abort``: end the job with ``status``."""
    rank: int
    status: int
    message: str


@dataclass(frozen=True)
class Data:
    """A name-service request of ``rank``: ``kind`` publish, lookup or
    unpublish of ``service`` (``port`` for a publish); answer with
    :meth:`Pmi1Job.data_done`."""
    rank: int
    kind: str
    service: str
    port: str = ""


@dataclass(frozen=True)
class Spawn:
    """``rank`` asks for a child job: ``apps`` (each ``argv``, ``n``,
    ``info``), ``preput`` the pairs the children find in their key-value
    space; answer with :meth:`Pmi1Job.spawn_done`."""
    rank: int
    apps: tuple
    preput: dict


@dataclass(frozen=True)
class Refuse:
    """``rank`` sent what is not PMI-1 (or not allowed now): close its
    connection, logging ``why``."""
    rank: int
    why: str


@dataclass(frozen=True)
class Note:
    """Something the node's log should say once (``why``), the rank served on."""
    rank: int
    why: str


# ----------------------------------------------------------------------
# the process mapping
# ----------------------------------------------------------------------

def process_mapping(node_of_rank: list[int]) -> str:
    """MPICH's ``PMI_process_mapping`` for ranks 0.. on nodes ``node_of_rank``
    (each node an index, 0 for the first): ``(vector,(start,nodes,ranks),...)``,
    each block ``ranks`` consecutive ranks on each of ``nodes`` nodes from
    ``start`` on, e.g. ``(vector,(0,2,2))`` for ranks 0,1 on node 0 and
    2,3 on node 1."""
    runs: list[list[int]] = []  # [node, count]
    for n in node_of_rank:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    blocks: list[list[int]] = []  # [start, nodes, ranks per node]
    for n, c in runs:
        if blocks and blocks[-1][2] == c and blocks[-1][0] + blocks[-1][1] == n:
            blocks[-1][1] += 1
        else:
            blocks.append([n, 1, c])
    return "(vector," + ",".join(f"({s},{k},{c})" for s, k, c in blocks) + ")"


# ----------------------------------------------------------------------
# the job
# ----------------------------------------------------------------------

@dataclass
class Pmi1Job:
    """A node's share of one PMI-1 job (see the module docstring).

    ``ranks``: the job's ranks on this node, each with its application
    number (``appnum``); ``size``: the job's; ``universe``: what
    ``get_universe_size`` answers; ``mapping``: ``PMI_process_mapping``
    (None: not offered); ``preput``: pairs in the key-value space from the
    start (a spawned job's, from its parent)."""

    kvsname: str
    size: int
    ranks: dict[int, int]
    universe: int
    mapping: str | None = None
    preput: dict[str, str] = field(default_factory=dict)
    #: the whole job's key-value space as this node knows it (after the last barrier).
    kvs: dict[str, str] = field(default_factory=dict)
    #: this node's processes' puts since the last barrier.
    puts: dict[str, str] = field(default_factory=dict)
    #: local ranks in the current barrier.
    entered: set[int] = field(default_factory=set)
    #: this node's contribution is at the master.
    fencing: bool = False
    #: per local rank: "connected" (sent init), "finalized" (sent finalize).
    state: dict[int, str] = field(default_factory=dict)
    #: local ranks that have ended.
    gone: set[int] = field(default_factory=set)
    #: a rank's spawn blocks so far (PMI-1 sends one block per application).
    spawning: dict[int, list[Command]] = field(default_factory=dict)
    #: barriers completed (for the log and the tests).
    barriers: int = 0

    def __post_init__(self) -> None:
        self.kvs.update(self.preput)

    # -- requests ---------------------------------------------------------

    def handle(self, rank: int, cmd: Command) -> list:
        """The effects of ``rank``'s request ``cmd``."""
        if rank not in self.ranks or rank in self.gone:
            return [Refuse(rank, f"rank {rank} is not a live process of {self.kvsname} here")]
        try:
            fn = getattr(self, "_do_" + cmd.name, None) if cmd.name.isidentifier() else None
            if fn is None:
                return [Send(rank, encode(cmd.name + "_result", rc=-1,
                                          msg=f"unknown_command_{cmd.name}")),
                        Note(rank, f"unknown PMI-1 command {cmd.name!r} answered rc=-1")]
            return fn(rank, cmd)
        except ProtocolError as exc:
            return [Refuse(rank, str(exc))]

    def _do_init(self, rank: int, cmd: Command) -> list:
        version = cmd.int("pmi_version")
        if version != VERSION:
            return [Send(rank, encode("response_to_init", rc=-1, pmi_version=VERSION,
                                      pmi_subversion=SUBVERSION,
                                      msg=f"PMI-{version}_not_served:_this_is_PMI-1")),
                    Note(rank, f"a process asked for PMI-{version}; only PMI-1 is served")]
        self.state[rank] = "connected"
        return [Send(rank, encode("response_to_init", pmi_version=VERSION,
                                  pmi_subversion=SUBVERSION, rc=0))]

    def initack(self, rank: int) -> bytes:
        """The reply to ``cmd=initack`` (the ``PMI_PORT`` + ``PMI_ID`` form):
        the process learns its rank and size from it."""
        return (encode("initack", rc=0) + encode("set", size=self.size)
                + encode("set", rank=rank) + encode("set", debug=0))

    def _do_get_maxes(self, rank: int, cmd: Command) -> list:
        return [Send(rank, encode("maxes", kvsname_max=KVSNAME_MAX, keylen_max=KEYLEN_MAX,
                                  vallen_max=VALLEN_MAX, rc=0))]

    def _do_get_appnum(self, rank: int, cmd: Command) -> list:
        return [Send(rank, encode("appnum", appnum=self.ranks[rank], rc=0))]

    def _do_get_universe_size(self, rank: int, cmd: Command) -> list:
        return [Send(rank, encode("universe_size", size=self.universe, rc=0))]

    def _do_get_my_kvsname(self, rank: int, cmd: Command) -> list:
        return [Send(rank, encode("my_kvsname", kvsname=self.kvsname, rc=0))]

    def _do_put(self, rank: int, cmd: Command) -> list:
        key, value = cmd.get("key"), cmd.get("value", "")
        kvs = cmd.get("kvsname")
        if not key:
            raise ProtocolError("put without a key")
        if kvs not in (None, self.kvsname):
            why = f"not_your_kvs_{kvs}"
        elif len(key) > KEYLEN_MAX or len(value) > VALLEN_MAX:
            why = "key_or_value_too_long"
        elif key == MAPPING_KEY:
            why = "reserved_key"
        else:
            self.puts[key] = value
            return [Send(rank, encode("put_result", rc=0, msg="success"))]
        return [Send(rank, encode("put_result", rc=-1, msg=why))]

    def _do_get(self, rank: int, cmd: Command) -> list:
        key = cmd.get("key")
        if not key:
            raise ProtocolError("get without a key")
        kvs = cmd.get("kvsname")
        value = None
        if kvs in (None, self.kvsname):
            if key == MAPPING_KEY:
                value = self.mapping
            else:
                value = self.kvs.get(key)
                if value is None:
                    value = self.puts.get(key)  # put here, before the barrier
        if value is None:
            return [Send(rank, encode("get_result", rc=-1, msg=f"key_{key}_not_found"))]
        return [Send(rank, encode("get_result", rc=0, msg="success", value=value))]

    def _do_barrier_in(self, rank: int, cmd: Command) -> list:
        if rank in self.entered:
            raise ProtocolError("barrier_in twice")
        if self.state.get(rank) != "connected":
            return [Send(rank, encode("barrier_out", rc=-1, msg="not_initialized"))]
        self.entered.add(rank)
        return self._maybe_fence()

    def _maybe_fence(self) -> list:
        if self.fencing or self.entered != set(self.ranks):
            return []
        self.fencing = True
        data = msgpack.packb(self.puts)
        self.puts = {}
        return [Fence(data)]

    def _do_finalize(self, rank: int, cmd: Command) -> list:
        self.state[rank] = "finalized"
        return [Send(rank, encode("finalize_ack", rc=0))]

    def _do_abort(self, rank: int, cmd: Command) -> list:
        try:
            status = int(cmd.get("exitcode") or 1)
        except ValueError:
            status = 1
        return [Abort(rank, status, cmd.get("message") or "")]

    def _do_publish_name(self, rank: int, cmd: Command) -> list:
        service, port = cmd.get("service"), cmd.get("port")
        if not service or port is None:
            return [Send(rank, encode("publish_result", rc=-1, msg="need_service_and_port"))]
        return [Data(rank, "publish", service, port)]

    def _do_unpublish_name(self, rank: int, cmd: Command) -> list:
        service = cmd.get("service")
        if not service:
            return [Send(rank, encode("unpublish_result", rc=-1, msg="need_service"))]
        return [Data(rank, "unpublish", service)]

    def _do_lookup_name(self, rank: int, cmd: Command) -> list:
        service = cmd.get("service")
        if not service:
            return [Send(rank, encode("lookup_result", rc=-1, msg="need_service"))]
        return [Data(rank, "lookup", service)]

    def _do_spawn(self, rank: int, cmd: Command) -> list:
        blocks = self.spawning.setdefault(rank, [])
        blocks.append(cmd)
        total = cmd.int("totspawns", 1)
        sofar = cmd.int("spawnssofar", len(blocks))
        if sofar < total:
            return []  # PMI-1 answers a multi-application spawn once, after its last block
        del self.spawning[rank]
        apps = []
        preput: dict[str, str] = {}
        for b in blocks:
            exe = b.get("execname")
            if not exe:
                raise ProtocolError("spawn without execname")
            argc = b.int("argcnt", 0)
            argv = [exe] + [b.get(f"arg{i}", "") for i in range(1, argc + 1)]
            n = b.int("nprocs", 1)
            infos = b.int("info_num", b.int("infonum", 0))
            info = {}
            for i in range(infos):
                k = b.get(f"info_key_{i}") or b.get(f"infokey{i}")
                v = b.get(f"info_val_{i}") or b.get(f"infoval{i}")
                if k:
                    info[k] = v or ""
            for i in range(b.int("preput_num", 0)):
                k = b.get(f"preput_key_{i}")
                if k:
                    preput[k] = b.get(f"preput_val_{i}", "")
            apps.append({"argv": argv, "n": max(1, n), "info": info})
        return [Spawn(rank, tuple(apps), preput)]

    # -- answers from elsewhere --------------------------------------------

    def fence_done(self, ok: bool, data: bytes = b"", why: str = "") -> list:
        """The master's answer to this node's :class:`Fence`: every node's
        contribution (``data``, concatenated), or a failure (a node lost, a
        process ended): every waiting rank is let out, with ``rc=-1`` on failure."""
        self.fencing = False
        waiting, self.entered = sorted(self.entered), set()
        if ok:
            unpacker = msgpack.Unpacker(raw=False)
            unpacker.feed(data)
            for part in unpacker:
                if isinstance(part, dict):
                    self.kvs.update({str(k): str(v) for k, v in part.items()})
            self.barriers += 1
            line = encode("barrier_out", rc=0)
        else:
            line = encode("barrier_out", rc=-1, msg=_word(why or "barrier_failed"))
        return [Send(r, line) for r in waiting if r not in self.gone]

    def data_done(self, req: Data, status: int, port: str = "", why: str = "") -> list:
        """The store's answer to a :class:`Data` request."""
        if req.rank in self.gone:
            return []
        name = {"publish": "publish_result", "unpublish": "unpublish_result",
                "lookup": "lookup_result"}[req.kind]
        if status == 0:
            # info=ok: what MPICH 4.0's client checks (newer ones read rc)
            extra = {"port": port} if req.kind == "lookup" else {}
            return [Send(req.rank, encode(name, info="ok", rc=0, msg="success", **extra))]
        return [Send(req.rank, encode(name, rc=-1, msg=_word(why or f"status_{status}")))]

    def spawn_done(self, req: Spawn, ok: bool, why: str = "") -> list:
        if req.rank in self.gone:
            return []
        if ok:
            n = sum(a["n"] for a in req.apps)
            return [Send(req.rank, encode("spawn_result", rc=0,
                                          errcodes=",".join(["0"] * n)))]
        return [Send(req.rank, encode("spawn_result", rc=-1, msg=_word(why or "spawn_failed")))]

    def rank_gone(self, rank: int) -> list:
        """``rank`` has ended.  A barrier it never entered can no longer
        complete here: the ranks waiting in it are let out with ``rc=-1``."""
        if rank not in self.ranks or rank in self.gone:
            return []
        self.gone.add(rank)
        self.entered.discard(rank)
        self.spawning.pop(rank, None)
        if self.entered and not self.fencing:
            waiting, self.entered = sorted(self.entered), set()
            line = encode("barrier_out", rc=-1, msg=f"rank_{rank}_ended")
            return [Send(r, line) for r in waiting]
        return []

    def client_state(self, rank: int) -> str | None:
        """What ``rank`` did with PMI: None, "connected" or "finalized"."""
        return self.state.get(rank)

    def check(self) -> None:
        """Assert the invariants of the module docstring."""
        live = {r for r, s in self.state.items() if s == "connected"}
        assert self.entered <= live - self.gone, (self.entered, live, self.gone)
        assert not self.fencing or self.entered | self.gone == set(self.ranks), \
            (self.fencing, self.entered)
        assert not (self.fencing and self.puts), "puts kept while a fence is out"


def _word(text: str) -> str:
    """A message as one wire token (spaces would end it for older clients)."""
    return "_".join(str(text).split()) or "error"
