"""PMI-1 on a node: the I/O shell around :class:`pydvm.pmi1.Pmi1Job`.

MPICH, Intel MPI, MVAPICH and the other MPIs of the MPICH family find their
launcher through PMI-1 (:mod:`pydvm.pmi1`).  For each process of a PMI-1
job (:func:`~pydvm.runtime.node.launch.start_share` decides which jobs are)
the node makes a connected socket pair: one end is the process's
``PMI_FD`` (kept across its exec), the other is read here on the node's
loop.  Each request goes to the job's :class:`~pydvm.pmi1.Pmi1Job` on this
node, whose effects are carried out here:

* a barrier becomes the master's ``fence`` over the whole job
  (:mod:`pydvm.runtime.master.collectives`), its data every node's puts -- or,
  for a job that runs on this node alone, completes here;
* ``abort`` is the master's ``abort`` (the job ends with that status);
* ``publish_name`` / ``lookup_name`` / ``unpublish_name`` are the data
  store's publish / lookup / unpublish, served for the process as any of
  its requests is (:meth:`NodeServer.serve_data
  <pydvm.runtime.node.server.NodeServer.serve_data>`): the same ranges,
  lifetimes and permissions as a PMIx client's ``MPI_Publish_name``;
* ``spawn`` is the master's ``spawn`` of a child job, itself PMI-1, whose
  processes find the parent's ``preput`` pairs in their key-value space
  and ``PMI_SPAWNED=1`` in their environment.

A process of a job offered PMIx whose program could not be told
(:func:`pydvm.pmi1.detect.job_interface` None) gets a *watch* socket as
``PMI_FD`` too, without ``PMI_RANK``/``PMI_SIZE``: a PMI-1 client that
speaks on it would otherwise have run as a singleton, so its ``init`` ends
the job, saying which option runs it right (:meth:`Pmi1Host._watched`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
from typing import TYPE_CHECKING, Any

from ... import _trace
from ...errors import Status
from ...pmi1 import Pmi1Job, process_mapping
from ...pmi1 import job as J
from ...pmi1.wire import ProtocolError, Reader, encode
from ...pmix import sockdiag
from ...store import Caller
from ...wire import Message
from ..shared.peers import PeerSession, SessionChannel, process_caller

if TYPE_CHECKING:
    from .launch import LocalJob
    from .server import NodeServer

log = logging.getLogger("pydvm.pmi1")

#: What a rank's ``PMI_FD`` is when the job was not offered PMI-1 (see the
#: module docstring): the advice its ``init`` ends the job with.
WRONG_INTERFACE = ("process {ns}:{rank} speaks PMI-1 (MPICH, Intel MPI, MVAPICH) but its "
                   "job was offered PMIx: run it with --mpi pmi1")


#: Connections to a node's PMI-1 port that have not yet claimed their
#: PMI_ID, at most (one more is closed at once).
MAX_STRANGERS = 1024


class _Answers(SessionChannel):
    """The channel-like end of a :class:`Pmi1Session`."""

    def close(self, reason: str = "closed", *, error: bool = False) -> None:
        self.closed = True


class Pmi1Session(PeerSession):
    """One PMI-1 process as the node's routing code sees a client: its
    name-service requests are the store's requests, made as its caller."""

    kind = "pmi1"

    def __init__(self, caller: Caller, max_outstanding: int | None) -> None:
        super().__init__(_Answers(f"pmi1 {caller.nspace}:{caller.rank}"), max_outstanding)
        self.caller = caller
        self.pending: dict[int, Any] = {}
        self._next = 0

    @property
    def proc_key(self) -> tuple[str, int]:
        return (self.caller.nspace, self.caller.rank)

    def new_id(self, done) -> int:
        self._next += 1
        self.pending[self._next] = done
        return self._next

    def deliver(self, msg: Message) -> None:
        rid = msg.get("id")
        done = self.pending.pop(rid, None) if isinstance(rid, int) else None
        if done is not None:
            done(msg)


class _Conn:
    """One process's PMI-1 connection: the node's end of its socket pair,
    read on the loop (``add_reader``); replies are small and written at
    once, what the socket does not take at once is written when it can."""

    def __init__(self, host: "Pmi1Host", nspace: str, rank: int, watch: bool,
                 sock: socket.socket) -> None:
        self.host = host
        self.nspace = nspace
        self.rank = rank
        self.watch = watch
        self.reader = Reader()
        self.sock: socket.socket | None = sock
        self._out = bytearray()
        self._loop = asyncio.get_running_loop()
        sock.setblocking(False)
        self._loop.add_reader(sock.fileno(), self._readable)

    def _readable(self) -> None:
        if self.sock is None:
            return
        try:
            data = self.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            data = b""
            log.debug("pmi1 %s:%d: %s", self.nspace, self.rank, exc)
        if not data:  # the process (and every child holding its socket) is gone
            self.close()
            return
        try:
            cmds = self.reader.feed(data)
        except ProtocolError as exc:
            self.host.refuse(self, str(exc))
            return
        for cmd in cmds:
            if self.sock is None:
                return
            if not self.nspace:  # on the node's port: who is it?
                self.host.claim(self, cmd)
            elif self.watch:
                self.host.watched(self, cmd)
            else:
                self.host.request(self, cmd)

    def write(self, data: bytes) -> None:
        if self.sock is None:
            return
        if not self._out:
            try:
                n = self.sock.send(data)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError:
                self.close()
                return
            if n == len(data):
                return
            data = data[n:]
            self._loop.add_writer(self.sock.fileno(), self._writable)
        self._out += data

    def _writable(self) -> None:
        if self.sock is None:
            return
        try:
            n = self.sock.send(self._out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.close()
            return
        del self._out[:n]
        if not self._out:
            self._loop.remove_writer(self.sock.fileno())

    def close(self) -> None:
        self.host._strangers.discard(self)
        sock, self.sock = self.sock, None
        if sock is not None:
            self._loop.remove_reader(sock.fileno())
            if self._out:
                self._loop.remove_writer(sock.fileno())
            sock.close()


def write_topology(path: str) -> bool:
    """Write this machine's hardware topology to ``path`` as hwloc XML, with
    the system's libhwloc (the one libpmix uses); False when it cannot."""
    import ctypes
    import ctypes.util
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("hwloc") or "libhwloc.so.15")
        init, load = lib.hwloc_topology_init, lib.hwloc_topology_load
        export, destroy = lib.hwloc_topology_export_xml, lib.hwloc_topology_destroy
    except (OSError, AttributeError):
        return False
    init.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    load.argtypes = [ctypes.c_void_p]
    export.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_ulong]
    destroy.argtypes = [ctypes.c_void_p]
    topo = ctypes.c_void_p()
    if init(ctypes.byref(topo)) != 0:
        return False
    try:
        return load(topo) == 0 and export(topo, os.fsencode(path), 0) == 0
    finally:
        destroy(topo)


class Pmi1Host:
    """A node's PMI-1 server (see the module docstring): its jobs, one
    :class:`~pydvm.pmi1.Pmi1Job` each, and each process's connection."""

    def __init__(self, node: "NodeServer") -> None:
        self.node = node
        self.jobs: dict[str, Pmi1Job] = {}
        self.conns: dict[tuple[str, int], _Conn] = {}
        self.sessions: dict[tuple[str, int], Pmi1Session] = {}
        #: namespaces whose processes got only a watch socket
        self.watched_jobs: set[str] = set()
        #: namespaces of jobs that run on this node alone (their barriers
        #: complete here, without the master)
        self.alone: set[str] = set()
        #: the PMI_PORT form (pydvm_pmi1_wire port): the node's listening
        #: socket, each PMI_ID not yet claimed, connections not yet claimed
        self._listener: socket.socket | None = None
        self._ids: dict[int, tuple[str, int]] = {}
        self._id_of: dict[tuple[str, int], int] = {}
        self._strangers: set[_Conn] = set()
        #: the machine's topology as hwloc XML, for PMI_hwloc_xmlfile (made
        #: at the first PMI-1 job; "" when it cannot be)
        self._topology: str | None = None

    def topology(self) -> str:
        """The file MPICH reads the hardware topology from instead of
        discovering it in every rank (``PMI_hwloc_xmlfile``, as MPICH's
        own launcher offers it): written once, ~7 ms, readable by every
        user's processes, removed with the node."""
        if self._topology is None:
            import tempfile
            fd, path = tempfile.mkstemp(prefix=f"pydvm-hwloc-{self.node.name}-", suffix=".xml")
            os.close(fd)
            os.chmod(path, 0o644)
            self.node.guardian.remove_on_exit(path)
            self._topology = path if write_topology(path) else ""
            if not self._topology:
                os.unlink(path)
        return self._topology

    # -- launching -----------------------------------------------------------

    def prepare(self, job: "LocalJob", msg: Message, procs: list[dict], watch: bool
                ) -> list[tuple[dict[str, str], socket.socket]]:
        """Per process of ``procs`` (this node's share of ``msg``'s job): its
        PMI-1 environment and the socket it gets as ``PMI_FD``.  ``watch``:
        the job was offered PMIx, these are watch sockets (module docstring)."""
        layout = msg.get("pmix") or {}
        ns = job.nspace
        size = int(msg.get("job_size") or len(procs))
        nodes = layout.get("nodes") or {}
        if not watch and ns not in self.jobs:
            if set(nodes) == {self.node.name}:
                self.alone.add(ns)
            order = list(nodes)  # in rank order of first appearance
            where = {r: order.index(n) for n, ranks in nodes.items() for r in ranks}
            mapping = process_mapping([where[r] for r in range(size)]) \
                if len(where) == size else None
            if mapping is not None and len(mapping) > J.VALLEN_MAX:
                mapping = None  # MPICH then exchanges host names itself
            preput = msg.get("preput") if isinstance(msg.get("preput"), dict) else {}
            kvs = {str(k): str(v) for k, v in preput.items()}
            if self.topology():
                kvs.setdefault(J.TOPOLOGY_KEY, self.topology())
            self.jobs[ns] = Pmi1Job(ns, size, {}, int(layout.get("univ_size") or size),
                                    mapping, kvs)
        if watch:
            self.watched_jobs.add(ns)
        mine = sorted(p["rank"] for p in procs)
        by_port = not watch and self.node.values["pydvm_pmi1_wire"] == "port"
        out: list = []
        for p in procs:
            rank = p["rank"]
            theirs: socket.socket | None = None
            if by_port:
                env = {"PMI_PORT": self._listen(), "PMI_ID": str(self._new_id(ns, rank))}
            else:
                ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                theirs.set_inheritable(False)  # kept for the child alone (pass_fds)
                env = {"PMI_FD": str(theirs.fileno())}
                self._attach(ns, rank, ours, watch)
            if not watch:
                self.jobs[ns].ranks[rank] = int(p.get("app_idx", 0))
                env.update({
                    "PMI_RANK": str(rank), "PMI_SIZE": str(size),
                    "MPI_LOCALNRANKS": str(len(mine)), "MPI_LOCALRANKID": str(mine.index(rank)),
                    "PMI_HOSTNAME": self.node.name,
                })
                if msg.get("spawned"):
                    env["PMI_SPAWNED"] = "1"
            out.append((env, theirs))
        return out

    # -- the PMI_PORT + PMI_ID form ---------------------------------------------

    def _listen(self) -> str:
        """``host:port`` of the node's PMI-1 port (opened on first use, on
        loopback: a job's processes run on their node's machine)."""
        if self._listener is None:
            ls = socket.create_server(("127.0.0.1", 0))
            ls.setblocking(False)
            asyncio.get_running_loop().add_reader(ls.fileno(), self._accept)
            self._listener = ls
        host, port = self._listener.getsockname()[:2]
        return f"{host}:{port}"

    def _new_id(self, ns: str, rank: int) -> int:
        """An unguessable ``PMI_ID`` for ``ns:rank``, good for one connection."""
        while True:
            pmiid = secrets.randbelow(2 ** 31 - 2) + 1
            if pmiid not in self._ids:
                self._ids[pmiid] = (ns, rank)
                self._id_of[(ns, rank)] = pmiid
                return pmiid

    def _accept(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            log.warning("%s: PMI-1 port: accept failed: %s", self.node.name, exc)
            return
        if len(self._strangers) >= MAX_STRANGERS:
            log.warning("%s: PMI-1 port: %d connections have not said who they are; "
                        "closing a new one", self.node.name, len(self._strangers))
            sock.close()
            return
        self._strangers.add(_Conn(self, "", -1, False, sock))

    def claim(self, conn: _Conn, cmd) -> None:
        """The first request on the port, ``initack pmiid=N``: which process
        this connection is -- the id it was given, once, by a process of the
        job's user (the kernel's owner of the connecting socket)."""
        self._strangers.discard(conn)
        if cmd.name != "initack":
            self.refuse(conn, f"first request on the PMI-1 port is {cmd.name!r}, not initack")
            return
        try:
            entry = self._ids.get(cmd.int("pmiid"))
        except ProtocolError as exc:
            self.refuse(conn, str(exc))
            return
        pj = self.jobs.get(entry[0]) if entry else None
        if entry is None or pj is None:
            self.refuse(conn, f"unknown PMI_ID {cmd.get('pmiid')}")
            return
        ns, rank = entry
        job = self.node.jobs.get(ns)
        want = job.uid if job is not None and job.uid is not None else os.getuid()
        try:
            uid = sockdiag.owner(conn.sock.getpeername()[:2], conn.sock.getsockname()[:2])
        except OSError:
            uid = None
        if uid is not None and uid not in (want, 0):
            self.refuse(conn, f"uid {uid} claimed PMI_ID of {ns}:{rank} (uid {want})")
            return
        del self._ids[cmd.int("pmiid")]
        self._id_of.pop((ns, rank), None)
        conn.nspace, conn.rank = ns, rank
        self.conns[(ns, rank)] = conn
        conn.write(pj.initack(rank))

    def _attach(self, ns: str, rank: int, sock: socket.socket, watch: bool) -> None:
        self.conns[(ns, rank)] = _Conn(self, ns, rank, watch, sock)

    def _disconnect(self, ns: str, rank: int) -> None:
        """``ns:rank``'s connection closed, its PMI_ID (if unclaimed) void."""
        pmiid = self._id_of.pop((ns, rank), None)
        if pmiid is not None:
            self._ids.pop(pmiid, None)
        conn = self.conns.pop((ns, rank), None)
        if conn is not None:
            conn.close()

    def forget(self, ns: str, rank: int) -> None:
        """A process was not started after all: drop its connection (or PMI_ID)."""
        self._disconnect(ns, rank)
        pj = self.jobs.get(ns)
        if pj is not None:
            pj.ranks.pop(rank, None)

    # -- requests --------------------------------------------------------------

    def request(self, conn: _Conn, cmd) -> None:
        if _trace.PATH:
            _trace.mark(f"pmi1.{cmd.name}.{conn.rank}", conn.nspace)
        pj = self.jobs.get(conn.nspace)
        if pj is None:
            self.refuse(conn, "its job has ended")
            return
        self._apply(pj, pj.handle(conn.rank, cmd))

    def refuse(self, conn: _Conn, why: str) -> None:
        log.warning("%s: PMI-1 connection of %s:%d closed: %s", self.node.name,
                    conn.nspace, conn.rank, why)
        conn.close()

    def watched(self, conn: _Conn, cmd) -> None:
        """A process of a job offered PMIx spoke PMI-1 on its watch socket."""
        why = WRONG_INTERFACE.format(ns=conn.nspace, rank=conn.rank)
        if cmd.name == "init":
            conn.write(encode("response_to_init", rc=-1, pmi_version=1, pmi_subversion=1,
                              msg="this_job_was_offered_PMIx:_run_it_with_--mpi_pmi1"))
        conn.close()
        if conn.nspace in self.watched_jobs:
            self.watched_jobs.discard(conn.nspace)  # said once per job
            log.info("%s: %s", self.node.name, why)
            self.node.uplink.request({"t": "abort", "nspace": conn.nspace, "rank": conn.rank,
                                      "status": 1, "why": why}, lambda r: None)

    def _apply(self, pj: Pmi1Job, effects: list) -> None:
        for e in effects:
            cls = e.__class__
            if cls is J.Send:
                conn = self.conns.get((pj.kvsname, e.rank))
                if conn is not None:
                    conn.write(e.data)
            elif cls is J.Fence:
                self._fence(pj, e)
            elif cls is J.Data:
                self._data(pj, e)
            elif cls is J.Abort:
                self._abort(pj, e)
            elif cls is J.Spawn:
                self._spawn(pj, e)
            elif cls is J.Refuse:
                conn = self.conns.get((pj.kvsname, e.rank))
                if conn is not None:
                    self.refuse(conn, e.why)
            elif cls is J.Note:
                log.warning("%s: %s:%d: %s", self.node.name, pj.kvsname, e.rank, e.why)

    def _fence(self, pj: Pmi1Job, e: J.Fence) -> None:
        if pj.kvsname in self.alone:  # every process of the job is here, and in
            def done() -> None:
                if self.jobs.get(pj.kvsname) is pj and pj.fencing:
                    self._apply(pj, pj.fence_done(True, e.data))
            asyncio.get_running_loop().call_soon(done)
            return

        def answered(r: Message) -> None:
            if _trace.PATH:
                _trace.mark("pmi1.fence_done", pj.kvsname)
            if self.jobs.get(pj.kvsname) is not pj:
                return
            ok = r.get("status") == Status.SUCCESS
            self._apply(pj, pj.fence_done(ok, r.get("data") or b"", r.get("msg") or ""))
        from ...pmix.constants import RANK_WILDCARD
        self.node.uplink.request({"t": "fence", "procs": [[pj.kvsname, RANK_WILDCARD]],
                                  "data": e.data, "collect": True}, answered)

    def _abort(self, pj: Pmi1Job, e: J.Abort) -> None:
        msg = {"t": "abort", "nspace": pj.kvsname, "rank": e.rank, "status": e.status,
               "msg": e.message, "api": "PMI_Abort"}
        self.node.uplink.request(msg, lambda r: None)

    def _session(self, pj: Pmi1Job, rank: int) -> Pmi1Session | None:
        key = (pj.kvsname, rank)
        s = self.sessions.get(key)
        if s is None:
            job = self.node.jobs.get(pj.kvsname)
            lp = job.procs.get(rank) if job is not None else None
            if lp is None or lp.ended:
                return None
            uid = job.uid if job.uid is not None else os.getuid()
            gid = job.gid if job.gid is not None else os.getgid()
            caller = process_caller(pj.kvsname, rank, uid, gid, self.node.name, lp.app_idx,
                                    job.session_id)
            s = self.sessions[key] = Pmi1Session(caller, self.node.values["pydvm_max_outstanding"])
            lp.sessions.add(s)
        return s

    def _data(self, pj: Pmi1Job, e: J.Data) -> None:
        s = self._session(pj, e.rank)
        if s is None:
            return

        def done(r: Message) -> None:
            status = r.get("status", Status.ERR_UNREACH)
            port = ""
            if e.kind == "lookup" and status in (Status.SUCCESS, Status.ERR_PARTIAL_SUCCESS):
                found = r.get("found") or []
                port = str(found[0][1]) if found else ""
                status = Status.SUCCESS if found else Status.ERR_NOT_FOUND
            why = r.get("msg") or (f"{e.service}_not_found"
                                   if status == Status.ERR_NOT_FOUND else "")
            if self.jobs.get(pj.kvsname) is pj:
                self._apply(pj, pj.data_done(e, int(status), port, why))

        if e.kind == "publish":
            msg: Message = {"t": "publish", "pairs": {e.service: e.port}, "replace": False}
        elif e.kind == "lookup":
            msg = {"t": "lookup", "keys": [e.service]}  # at once, never parked
        else:
            msg = {"t": "unpublish", "keys": [e.service]}
        msg["id"] = s.new_id(done)
        self.node.serve_data(s, msg)

    def _spawn(self, pj: Pmi1Job, e: J.Spawn) -> None:
        apps = []
        for a in e.apps:
            info = a.get("info") or {}
            app = {"argv": a["argv"], "maxprocs": a["n"], "env": []}
            if info.get("wdir"):
                app["cwd"] = info["wdir"]
            apps.append(app)

        def answered(r: Message) -> None:
            if self.jobs.get(pj.kvsname) is pj:
                ok = r.get("status") == Status.SUCCESS
                self._apply(pj, pj.spawn_done(e, ok, r.get("msg") or ""))
        self.node.uplink.request({"t": "spawn", "parent": [pj.kvsname, e.rank], "apps": apps,
                                  "mpi": "pmi1", "preput": e.preput}, answered)

    # -- ends ----------------------------------------------------------------------

    def client_state(self, ns: str, rank: int) -> str | None:
        pj = self.jobs.get(ns)
        return pj.client_state(rank) if pj is not None else None

    def reaped(self, ns: str, rank: int) -> None:
        """``ns:rank`` has ended: its connection, session and unclaimed PMI_ID go."""
        self._disconnect(ns, rank)
        s = self.sessions.pop((ns, rank), None)
        if s is not None:
            s.channel.close(f"process {ns}:{rank} ended")
            self.node.drop_session(s, ns, rank)
        pj = self.jobs.get(ns)
        if pj is not None:
            self._apply(pj, pj.rank_gone(rank))

    def job_ended(self, ns: str) -> None:
        """The job has ended everywhere (its NSPACE purge)."""
        self.jobs.pop(ns, None)
        self.watched_jobs.discard(ns)
        self.alone.discard(ns)
        for key in [k for k in self.conns if k[0] == ns]:
            self.conns.pop(key).close()
        for key in [k for k in self.sessions if k[0] == ns]:
            del self.sessions[key]
        for key in [k for k in self._id_of if k[0] == ns]:
            self._ids.pop(self._id_of.pop(key), None)

    def stop(self) -> None:
        if self._listener is not None:
            asyncio.get_running_loop().remove_reader(self._listener.fileno())
            self._listener.close()
            self._listener = None
        for conn in list(self._strangers):
            conn.close()
        self._strangers.clear()
        if self._topology:
            try:
                os.unlink(self._topology)
            except OSError:
                pass
        for conn in self.conns.values():
            conn.close()
        self.conns.clear()
        self.jobs.clear()
