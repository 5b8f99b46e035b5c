"""A node's PMIx server: real PMIx and MPI programs served by the node's store and router.

:class:`PmixHost` belongs to a :class:`~pydvm.runtime.node.server.NodeServer`
(the one component that serves a node's clients, in a daemon or in the
master for the head node).  It hosts the process's one libpmix server
(:mod:`pydvm.pmix`) -- or, with ``pydvm_pmix_isolate``, none: then every
job's server is a process of its own (:mod:`pydvm.runtime.pmixhost.users`) whose
upcalls arrive here relayed, and :class:`NoServerHere` stands for the
node's --, registers every job the node launches and every local process of
it, and turns each upcall into what pydvm already does:

=========================  ==================================================
upcall                     served by
=========================  ==================================================
publish, lookup,           :meth:`NodeServer.serve_now` on libpmix's thread
unpublish                  when a store here can answer at once, else
                           :meth:`NodeServer.serve_data` -- the very path of a
                           native client's request (node store for LOCAL, the
                           router for every other range) -- as the process's
                           :class:`PmixSession` (below)
fence, direct modex,       the master (:mod:`pydvm.runtime.master.collectives`) over
connect, disconnect,       the node's uplink; the master asks the node hosting
spawn, abort               a rank for its modex data (``dmodex`` below)
job control, allocate      :mod:`pydvm.runtime.pmixhost.jobctl` (job control
                           through the master; allocations refused here)
client finalized,          answered here
client connected
=========================  ==================================================

Two paths for publish, lookup and unpublish
-------------------------------------------
**At once, on libpmix's thread** (:meth:`PmixHost.answer_now`, offered each
of these requests first by the binding): when a store of this process can
answer without waiting or the network -- on the head node the master store
(every range but LOCAL) and the node store (LOCAL); on a daemon with
direct data off its node store (LOCAL; with it on, that store keeps the
master told which uids it holds, in order, from the loop) -- the
request is served inside the upcall by :meth:`NodeServer.serve_now
<pydvm.runtime.node.server.NodeServer.serve_now>` under the process's store guard
(:mod:`pydvm.runtime.shared.storeguard`), and answered before the upcall returns.
What the store did on the way for others (answers to parked lookups, timers
armed or cancelled) goes to the loop afterwards.  No thread hand-off: the
progress thread answers its own client.

**Through the loop**, as a native client's request, for everything else: a
lookup that must wait (the fast path parks nothing), anything a daemon
passes to the master, everything of a relaying master, a request that finds
the guard held by the loop.  Same rules either way: the identity is the
session's, the routing :func:`~pydvm.runtime.shared.dataops.stores_for`'s, the
store's rules and counters the same; an unknown or closed session is refused
NO_PERMISSIONS on both.

Sessions
--------
Each registered process gets one :class:`PmixSession`, a
:class:`~pydvm.runtime.shared.peers.PeerSession` like a native client's, so the
routing code cannot tell them apart: it admits each request (id, cap),
parks lookups under ``(session, id)`` tickets and sends the one answer with
``send_answer`` or on the session's channel.  The session's channel
(:class:`PmixChannel`) turns that answer -- a reply map, or a pre-encoded
body a router passes on -- into the PMIx reply of the pending upcall.  The
session's identity is the uid/gid the job was registered with (its owner),
never the ``pmix.euid`` a client packs (the binding drops that claim).

The session sits in its process's ``LocalProc.sessions``, so reaping the
process closes it like a native connection (a client that dies without
``PMIx_Finalize`` produces no upcall: reaping is what tells us): its parked
lookups are dropped, what it had passed on is withdrawn, pending upcalls are
answered, and later requests naming it are refused.  libpmix's own record
of the client goes with its namespace, deregistered at the job's cleanup
(its NSPACE purge) -- not at the reap, see :meth:`PmixHost.session_closed`.

Values
------
A PMIx value becomes a store value and back as :mod:`pydvm.runtime.pmixhost.data`
says (which also turns the upcalls into the store's requests, for this
server and for a user's agent).

Partial lookups
---------------
libpmix 4.2 hands lookup data to its client only with ``PMIX_SUCCESS``.  A
lookup the store answers ``PMIX_ERR_PARTIAL_SUCCESS`` (some keys found, or a
``PMIX_WAIT`` count below the number of keys) is therefore answered
``PMIX_SUCCESS`` with the keys found; the others stay ``PMIX_UNDEF`` in the
caller's ``pmix_pdata_t`` array, which is how a C caller tells them apart.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING, Any, Callable

from ... import _trace
from ...errors import Status
from ...wire import MAX_FRAME, Message
from ..shared.peers import process_caller
from . import events as pmixevents
from .data import BAD as _BAD, REFUSED as _REFUSED, RelayedData, answer_reply, \
    data_request
from .session import NoServerHere, PmixSession

if TYPE_CHECKING:
    from .contract import HostJob, HostNode

log = logging.getLogger("pydvm.pmix")

#: What Open MPI 4.1 needs to accept a direct launch: without its ``orte``
#: schizo component no launcher claims the process, so ``ess/pmi`` is chosen
#: and MPI_Init talks to our server (docs/pmix.md).  No resource manager's
#: variable is set, so no real RM tool can take these processes for its own.
OMPI_DIRECT_LAUNCH = {"OMPI_MCA_schizo": "^orte"}
#: Open MPI 4.1 names its shared-memory segments and session directory after
#: the machine's host name (``vader_segment.<host>.<uid>.<job>.<local rank>``):
#: two pydvm nodes on one machine (local daemons) would share those names and
#: crash each other's ranks.  These point them at the node's own directory for
#: the job (NodeServer.job_dir), removed when the job ends -- crashed ranks'
#: segments included.  A value the user set in the job's environment wins,
#: unless it points into a pydvm job directory (a spawned job's copy of its
#: parent's, made on another node: ``ompienv.own_job_dirs``).
OMPI_JOB_DIRS = ("OMPI_MCA_btl_vader_backing_directory", "OMPI_MCA_osc_sm_backing_directory",
                 "OMPI_MCA_orte_tmpdir_base")
#: Variables of other launchers and resource managers a PMIx-launched process
#: must not inherit from ``pydvm run``'s environment: inside a Slurm
#: allocation, Open MPI 4.1's ``schizo/slurm`` sees ``SLURM_JOBID`` and makes
#: every rank a singleton, and a Slurm tool would take the process for one of
#: its steps'; a stale ``PMIX_*`` or PMI variable points at another server.
#: The process sees only what pydvm presents.  (Open MPI's own launch
#: variables are dropped for every job, PMIx or not: ``ompienv.drop_stale``.)
FOREIGN_LAUNCH_PREFIXES = ("SLURM_", "SLURMD_", "SRUN_", "SBATCH_", "SALLOC_", "PMI_",
                           "PMIX_", "PBS_", "FLUX_", "LSB_", "JSM_")
#: ``pydvm_pmix_gds auto``: nodes of at most this many CPUs use libpmix's
#: copying job store (PmixHost.job_store).
COPY_STORE_CPUS = 8
#: How long a node waits for libpmix to hand over a local rank's modex data.
DMODEX_TIMEOUT = 60.0


def _codec():
    """:mod:`pydvm.runtime.pmixhost.codec` (it imports :mod:`pydvm.pmix`, which a
    node loads only once it hosts PMIx: see :func:`pmix_status`)."""
    from . import codec as pmixcodec
    return pmixcodec


def pmix_status():
    """``(available, version or reason, library path)`` without starting anything."""
    try:
        from ...pmix import available
    except Exception as exc:  # pragma: no cover - a broken install
        return False, f"pydvm.pmix cannot be imported: {exc}", None
    return available()


class PmixHost:
    """The node's PMIx server and the upcalls it serves (see the module docstring).

    :meth:`start` returns False (and PMIx stays off on this node) when
    libpmix is missing or refused; :attr:`status` says why, for ``pydvm info``
    and for jobs that require PMIx.
    """

    def __init__(self, node: "HostNode") -> None:
        self.node = node
        self.server = None
        #: (available, version or reason, library path) -- what `pydvm info` shows.
        self.status: tuple[bool, str, str | None] = (False, "not started", None)
        #: (nspace, rank) -> the session of a registered local process.
        self.sessions: dict[tuple[str, int], PmixSession] = {}
        #: the sessions of local processes connected to libpmix now
        #: (PMIx_Init done, PMIx_Finalize not yet, not reaped): who could
        #: have an event handler (:meth:`deliver_event`).
        self.connected: set[tuple[str, int]] = set()
        #: namespaces registered for this node's own processes, each with
        #: the server its processes connect to (``self.server`` or a user's
        #: agent, :mod:`pydvm.runtime.pmixhost.users`).
        self.local_nspaces: dict[str, Any] = {}
        #: other nodes' namespaces registered here so that local processes
        #: connected to them (MPI_Comm_connect, spawn) know their layout,
        #: each with the servers it is registered with.
        self.foreign: dict[str, list] = {}
        #: other users' own PMIx servers on this node (multi-user DVMs).
        from .users import UserServers
        self.users = UserServers(self)
        #: PMIx tools from outside any job (the head node's server only).
        from .tools import ToolHost
        self.tools = ToolHost(self)

    @property
    def running(self) -> bool:
        return self.server is not None

    @property
    def library(self) -> str | None:
        """The path of the libpmix this node serves with (None: none); what
        an Intel MPI process is told to load (``I_MPI_PMI_LIBRARY``)."""
        return self.status[2] if self.running and self.status[0] else None

    def start(self, tmpdir: str, mode: str) -> bool:
        """Start the server (``mode``: the ``pydvm_pmix`` parameter).  Raises
        RuntimeError when ``mode`` is ``on`` and PMIx cannot be hosted."""
        if mode == "off":
            self.status = (False, "disabled (pydvm_pmix=off)", None)
            return False
        ok, what, path = pmix_status()
        if ok:
            from ...pmix import cleanup_stale
            try:
                cleanup_stale(tmpdir)
                if self.isolated:
                    # no libpmix server in this process: server processes only
                    self.server = NoServerHere(tmpdir, self.server_nspace)
                else:
                    self.server = self._in_process(tmpdir)
            except Exception as exc:
                ok, what = False, f"cannot start the PMIx server: {exc}"
        self.status = (ok, what, path)
        if not ok:
            if mode == "on":
                log.error("node %s: pydvm_pmix=on but PMIx cannot be hosted: %s",
                          self.node.name, what)
                raise RuntimeError(f"pydvm_pmix=on but PMIx cannot be hosted: {what}")
            log.info("node %s: PMIx hosting unavailable: %s", self.node.name, what)
        elif self.isolated:
            log.info("node %s: PMIx (%s) served by processes of their own under %s",
                     self.node.name, what, tmpdir)
        else:
            log.info("node %s: PMIx server (%s) in %s", self.node.name, what, self.server.tmpdir)
        return ok

    @property
    def job_store(self) -> str | None:
        """``PMIX_MCA_gds`` for this node's PMIx servers (``pydvm_pmix_gds``;
        None: libpmix's own choice).  ``auto``: the copying store (``hash``)
        on a node of at most :data:`COPY_STORE_CPUS` CPUs.  Each PMIx client
        then receives its job's data at ``PMIx_Init`` instead of attaching
        the node's shared-memory segments; with few ranks per node that is
        cheaper on both sides (libpmix's registration of a one-rank job:
        0.38 ms of CPU against 1.11; ``MPI_Init`` of 1-4 ranks 12-20 ms
        sooner), and its cost -- a copy of the job's data per process --
        stays small where few processes can share a node."""
        v = str(self.node.values.get("pydvm_pmix_gds") or "auto")
        if v != "auto":
            return v
        return "hash" if len(self.node.binding.allowed) <= COPY_STORE_CPUS else None

    @property
    def server_nspace(self) -> str:
        """The libpmix namespace of this node's own server (and of the tool server)."""
        return f"{self.node.dvm_nspace}-{self.node.name}"

    def _in_process(self, tmpdir: str):
        """Start libpmix's server in this process (this node's own server)."""
        from ...pmix import PmixServer
        from ...pmix import constants as C
        # The store judges sizes against its cap (OUT_OF_RESOURCE); the
        # binding only refuses what no frame could carry (BAD_PARAM).
        server = PmixServer(max_value_size=MAX_FRAME // 2, nspace=self.server_nspace)
        # with pydvm_pmix_isolate, tools attach to a process of their own
        server.tool_support = self.tools.wanted() and not self.isolated
        gds = self.job_store
        if gds and "PMIX_MCA_gds" not in os.environ:  # read by PMIx_server_init
            os.environ["PMIX_MCA_gds"] = gds
        server.start(tmpdir, asyncio.get_running_loop(), self,
                     extra_info=[(C.HOSTNAME, self.node.name)], answer_now=self.answer_now,
                     attribute_fix=self.node.values.get("pydvm_pmix_attribute_fix") != "off")
        if server.tool_support:
            self.tools.started(server.tmpdir, os.getpid(),
                               server.lib.version.split()[1] if server.lib else "")
        return server

    def fallback_server(self, why: str):
        """With ``pydvm_pmix_isolate``, when a server process cannot start:
        this node's own server after all (started now, once, logged), so
        that the user's PMIx jobs still run -- with the risk isolation
        avoids.  None if it cannot start either."""
        if not isinstance(self.server, NoServerHere):
            return self.server
        base = os.path.dirname(self.server.tmpdir)
        try:
            server = self._in_process(base)
        except Exception as exc:
            log.error("node %s: no PMIx server for these processes: a server process "
                      "cannot start (%s) and this process's cannot either (%s)",
                      self.node.name, why, exc)
            return None
        log.warning("node %s: a PMIx server process cannot start (%s): this node process "
                    "serves those PMIx jobs itself -- a crash inside libpmix now ends the "
                    "node", self.node.name, why)
        self.server = server
        return server

    @property
    def isolated(self) -> bool:
        """``pydvm_pmix_isolate``: the PMIx servers of jobs and tools run in
        processes of their own (runtime/pmixhost/users.py)."""
        return self.node.values.get("pydvm_pmix_isolate") != "off"

    async def start_tools(self) -> None:
        """On the head node with ``pydvm_pmix_isolate``: start the tool
        server process before the node says it is ready, so that a tool
        started once ``pydvm start`` returned finds it."""
        if self.server is not None and self.isolated and self.tools.wanted():
            await self.users.start_tools()

    def stop(self) -> None:
        self.tools.stop()
        for s in list(self.sessions.values()):
            s.channel.close("node server stopping")
        if self.server is not None:
            guard = self.node.guard
            if guard is not None and guard.check:
                # what a test running with PYDVM_CHECK_STORES reads back
                # (the node's own server's requests, and its server processes')
                stats = [self.server.stats, *(a.stats for a in self.users.running())]
                log.warning("node %s: store checks: %d sections checked, %d broken; pmix: "
                            "%d requests, %d answered at once, %d found the guard held",
                            self.node.name, guard.checked, guard.broken,
                            sum(st["requests"] for st in stats),
                            sum(st["answered_now"] for st in stats), guard.busy)
            self.server.finalize()
            self.server = None
        self.users.stop()

    def prestart_owner(self) -> None:
        """With ``pydvm_pmix_isolate`` on, the DVM owner's PMIx server process
        starts with the node (not with its first job) and stays."""
        if self.server is not None and self.isolated:
            self.node.spawn(self.users.server_for(os.geteuid(), os.getegid()))

    # ------------------------------------------------------------------
    # jobs and processes
    # ------------------------------------------------------------------

    async def register_job(self, job: "HostJob", layout: dict, uid: int, gid: int,
                           proc_extra: dict | None, procs: list[tuple[int, int]]
                           ) -> list[dict[str, str]]:
        """Register a job's share of this node with libpmix: its namespace
        with the job-level information (once per node; ``proc_extra``: rank
        -> more items of its process data) and its local processes
        ``(rank, app_idx)``, all before the first starts.  Returns each
        process's environment, in order.

        A server process gets the whole share as one request and builds
        the job's information itself from the master's ``layout``; this
        node's own server is registered here, call by call."""
        from ...pmix import Proc
        ns = job.nspace
        server = self.local_nspaces.get(ns)
        fresh = server is None
        if fresh:
            server = await self.users.server_for(uid, gid)
            if server is None:
                raise RuntimeError("the node's PMIx server stopped")
            for srv in self.foreign.pop(ns, ()):  # known as a peer's namespace; runs here too
                await srv.deregister_nspace(ns)
            self.local_nspaces[ns] = server
        whole = getattr(server, "register_job", None) if fresh else None
        if whole is not None:
            await whole(ns, layout, job.session_id, self.node.name, proc_extra or {},
                        [(rank, uid, gid) for rank, _ in procs])
        else:
            if fresh:
                jl = _codec().job_layout(ns, layout, job.session_id)
                jl.proc_extra = proc_extra or {}
                from ...pmix.jobinfo import job_info
                await server.register_nspace(ns, jl.local_count(self.node.name),
                                             job_info(jl, self.node.name))
            await asyncio.gather(*[server.register_client(Proc(ns, rank), uid, gid)
                                   for rank, _ in procs])
        return [self._registered(job, server, rank, app_idx, uid, gid)
                for rank, app_idx in procs]

    def _registered(self, job: "HostJob", server, rank: int, app_idx: int, uid: int,
                    gid: int) -> dict[str, str]:
        """A process libpmix now knows: its session here, and its environment."""
        from ...pmix import Proc
        proc = Proc(job.nspace, rank)
        caller = process_caller(job.nspace, rank, uid, gid, self.node.name, app_idx,
                                job.session_id)
        session = PmixSession(self, caller, self.node.values["pydvm_max_outstanding"])
        self.sessions[(job.nspace, rank)] = session
        lp = job.procs.get(rank)
        if lp is not None:
            lp.sessions.add(session)
        env = server.setup_fork(proc)
        env.update(OMPI_DIRECT_LAUNCH)
        if uid != os.geteuid() and server is self.server:
            # Another user's process served by the node's own server (its
            # agent could not start): libpmix 4.2's shared-memory job store
            # (ds21/ds12) belongs to the server's user -- its segments, locks
            # and directory are created for the uid the server was started
            # as -- so such a client would fail to attach it (printing a PMIX
            # ERROR) and fall back to the store that copies the job data into
            # the client at PMIx_Init.  Name that store here: the same data,
            # without the failed attempt (docs/pmix.md, "Users").  It takes
            # the client library's own parameter: the server's
            # PMIX_GDS_MODULE list is only a preference.
            env["PMIX_MCA_gds"] = "hash"
        return env

    def session_closed(self, session: PmixSession | None, reason: str) -> None:
        """A process's session ended (it was reaped, its job ended, the node stops):
        withdraw what it had outstanding and deregister it from libpmix."""
        if session is None:
            return
        key = session.proc_key
        if self.sessions.get(key) is session:
            del self.sessions[key]
            self.connected.discard(key)
        self.node.drop_session(session, *key)
        session.fail_all(Status.ERR_UNREACH)
        # No PMIx_server_deregister_client here: with libpmix 4.2.2, calling it
        # for every reaped process eventually leaves the server deaf to new
        # clients (see PmixServer.deregister_client).  The process can act no
        # more anyway -- its session is gone, so any request naming it is
        # refused NO_PERMISSIONS -- and the namespace's deregistration at the
        # job's end releases libpmix's record of it.

    async def job_ended(self, nspace: str) -> None:
        """The job's cleanup: its namespace leaves libpmix (local or foreign)."""
        if self.server is None:
            return
        for key in [k for k in self.sessions if k[0] == nspace]:
            self.sessions[key].channel.close(f"job {nspace} ended")
        servers = list(self.foreign.pop(nspace, ()))
        local = self.local_nspaces.pop(nspace, None)
        if local is not None:
            servers.append(local)
        for srv in servers:
            if srv is self.server or srv.running:
                await srv.deregister_nspace(nspace)
        if local is not None and local is not self.server:
            self.users.maybe_idle(local)

    async def learn_nspaces(self, layouts: dict, server=None) -> None:
        """Register other nodes' namespaces (from a connect's answer) not known
        to ``server`` (default: the node's own)."""
        from ...pmix.jobinfo import job_info
        server = server or self.server
        for ns, lay in (layouts or {}).items():
            if ns in self.local_nspaces or server in self.foreign.get(ns, ()):
                continue
            jl = _codec().job_layout(ns, lay, lay.get("session_id"))
            self.foreign.setdefault(ns, []).append(server)
            try:
                await server.register_nspace(ns, 0, job_info(jl, self.node.name))
            except Exception as exc:
                self.forget_foreign(ns, server)
                log.warning("cannot register peer namespace %s: %s", ns, exc)

    def forget_foreign(self, ns: str, server) -> None:
        """Peer namespace ``ns`` is no longer registered with ``server``."""
        servers = self.foreign.get(ns)
        if servers is not None and server in servers:
            servers.remove(server)
            if not servers:
                del self.foreign[ns]

    # ------------------------------------------------------------------
    # upcalls (on the loop thread)
    # ------------------------------------------------------------------

    def __call__(self, req) -> Any:
        if _trace.PATH:
            _trace.mark("pmix." + req.kind)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("upcall %s from %s", req.kind, getattr(req, "proc", None) or
                      [str(p) for p in getattr(req, "procs", ())])
        fn = getattr(self, "_up_" + req.kind, None)
        if fn is None:
            from ...pmix import constants as C
            req.reply.fail(C.ERR_NOT_SUPPORTED)
            return None
        return fn(req)

    def _up_client_connected(self, req) -> None:
        self.mark_connected((req.proc.nspace, req.proc.rank))
        req.reply()

    def mark_connected(self, key: tuple[str, int]) -> None:
        """Local process ``key`` connected to libpmix (as a client, or as a tool
        keeping its job's identity)."""
        s = self.sessions.get(key)
        if s is not None and not s.closed:
            s.pmix_state = "connected"
            self.connected.add(key)

    def _up_tool_connected(self, req) -> None:
        self.tools.connected(req)

    def _up_client_finalized(self, req) -> None:
        s = self.sessions.get((req.proc.nspace, req.proc.rank))
        if s is not None:
            s.pmix_state = "finalized"
        self.connected.discard((req.proc.nspace, req.proc.rank))
        req.reply(Status.SUCCESS)

    def check_server(self, nspace: str) -> None:
        """A connected process of ``nspace`` failed: if the agent serving it
        has died meanwhile, its end is handled now (``UserServers.lost``),
        before this exit is reported, so the job ends with the reason."""
        srv = self.local_nspaces.get(nspace)
        if srv is not None and srv is not self.server and srv.died():
            self.users.lost(srv, "its process ended")

    def client_state(self, nspace: str, rank: int) -> str | None:
        """What a local process did with PMIx before it ended (see PmixSession)."""
        s = self.sessions.get((nspace, rank))
        return s.pmix_state if s is not None else None

    # -- events --------------------------------------------------------------

    def _up_register_events(self, req) -> None:
        # libpmix keeps each client's handlers and filters what it delivers;
        # the master sends an event to every node in its range, so there is
        # nothing to record here.
        req.reply(Status.SUCCESS)

    def _up_deregister_events(self, req) -> None:
        req.reply(Status.SUCCESS)

    def _up_notify_event(self, req) -> None:
        pmixevents.notify(self, req)

    def server_tag(self, server) -> str:
        """How the master names one of this node's servers back to it: "node"
        (the node's own), "tools" (the tool server process) or "u<uid>" (that
        user's agent)."""
        if server is None or server is self.server:
            return "node"
        return "tools" if server.tools else f"u{server.uid}"

    async def deliver_event(self, msg: Message) -> int:
        """The master's ``event``: deliver it to this node's clients in range
        (:func:`.events.deliver`)."""
        return await pmixevents.deliver(self, msg)

    # -- groups --------------------------------------------------------------

    def _up_group(self, req) -> None:
        from ...pmix import Value
        from ...pmix import constants as C
        d = req.directives
        endpt = d.get(C.GROUP_ENDPT_DATA)
        data = endpt.value if endpt is not None and isinstance(endpt.value, bytes) else b""
        ctx = d.get(C.GROUP_ASSIGN_CONTEXT_ID)
        t = d.get(C.TIMEOUT)

        def answered(r: Message) -> None:
            status = r.get("status", Status.ERR_UNREACH)
            info = []
            if status == Status.SUCCESS and req.op == "construct":
                if r.get("data"):
                    info.append((C.GROUP_ENDPT_DATA, Value(bytes(r["data"]), C.BYTE_OBJECT)))
                if isinstance(r.get("ctxid"), int):
                    info.append((C.GROUP_CONTEXT_ID, Value(r["ctxid"], C.SIZE)))
            req.reply(status, info)
        self.ask_master({"t": "group", "op": req.op, "grpid": req.grpid,
                          "procs": _codec().procs_to_wire(req.procs), "data": data,
                          "ctxid": bool(ctx is not None and ctx.value),
                          "timeout": t.value if t is not None and isinstance(t.value, int)
                          else None}, answered)

    def _session_of(self, req) -> PmixSession | None:
        s = self.sessions.get((req.proc.nspace, req.proc.rank))
        if s is None or s.closed:
            req.reply.fail(Status.ERR_NO_PERMISSIONS)
            return None
        return s

    def _up_publish(self, req) -> None:
        self._serve(req)

    def _up_lookup(self, req) -> None:
        self._serve(req)

    def _up_unpublish(self, req) -> None:
        self._serve(req)

    def _serve(self, req) -> None:
        """A publish, lookup or unpublish on the loop: the path of a native
        client's request (``NodeServer.serve_data``), as the process's session."""
        s = self._session_of(req)
        if s is None:
            return
        msg = data_request(req, 0)
        if msg is None:
            req.reply.fail(Status.ERR_BAD_PARAM)
            return
        msg["id"] = s.new_id(req)
        self.node.serve_data(s, msg)

    def answer_now(self, req) -> bool:
        """A publish, lookup or unpublish on libpmix's progress thread, inside
        its upcall (the binding's ``answer_now``): answered here when a store
        of this process can answer it at once (``NodeServer.serve_now``),
        else left to the loop (False, nothing done).

        Under the process's store guard (runtime/shared/storeguard.py), taken
        without waiting: when the loop holds it the request goes to the loop.
        The answer is given once the guard is released; what the store
        deferred (other clients' parked lookups it answered, timers) is
        handed to the loop after that.  Identity and refusals are
        the loop path's: the session the process was registered with, a
        closed or unknown one refused NO_PERMISSIONS."""
        guard = self.node.guard
        if guard is None or not guard.try_enter():
            return False
        r = None
        try:
            s = self.sessions.get((req.proc.nspace, req.proc.rank))
            if s is None or s.closed:
                r = _REFUSED
            else:
                msg = data_request(req, 0)
                r = _BAD if msg is None else self.node.serve_now(s, msg)
        finally:
            effects = guard.leave()
        if r is not None:
            if req.kind == "lookup":
                answer_reply(req, r, "pmix")
            else:
                req.reply(int(r.status))  # a status the binding hands back to libpmix
        if effects:
            guard.post(effects)
        return r is not None

    def serve_fast(self, nspace: str, rank: int, msg: Message):
        """A data request from an agent's fast lane (runtime/pmixhost/fast.py), on
        the lane's thread: the store's :class:`~pydvm.store.Reply` when a
        store here answers at once (``NodeServer.serve_now``, as
        :meth:`answer_now`, under the store guard -- waited for: this is no
        libpmix thread), else None having done nothing.  An unknown or
        closed session is refused NO_PERMISSIONS."""
        guard = self.node.guard
        if guard is None:
            return None
        with guard:
            s = self.sessions.get((nspace, rank))
            if s is None or s.closed:
                return _REFUSED
            return self.node.serve_now(s, msg)

    def serve_relayed(self, nspace: str, rank: int, msg: Message, waiting: RelayedData):
        """A data request (:func:`~pydvm.runtime.pmixhost.data.relayed_request`) a
        user's agent relayed for its process ``(nspace, rank)`` -- one
        :meth:`UserServers.may <pydvm.runtime.pmixhost.users.UserServers.may>`
        let through -- served as that process's session, on the loop: the
        store's :class:`~pydvm.store.Reply` when a store here answers at once
        (``NodeServer.serve_now``, as :meth:`answer_now`), else None -- it
        went the way of a native client's request (``serve_data``) and its
        answer goes to ``waiting``.  An unknown or closed session is refused
        NO_PERMISSIONS."""
        s = self.sessions.get((nspace, rank))
        if s is None or s.closed:
            return _REFUSED
        guard = self.node.guard
        if guard is not None:
            with guard:
                r = self.node.serve_now(s, msg)
            if r is not None:
                return r
        msg["id"] = s.new_id(waiting)
        self.node.serve_data(s, msg)
        return None

    # -- what the master coordinates --------------------------------------

    def ask_master(self, msg: Message, answered: Callable[[Message], None]) -> None:
        """Send ``msg`` to the master; ``answered`` gets its reply."""
        self.node.uplink.request(msg, answered)

    def _up_fence(self, req) -> None:
        def answered(r: Message) -> None:
            if _trace.PATH:
                _trace.mark("pmix.fence_done")
            req.reply(r.get("status", Status.ERR_UNREACH), r.get("data") or b"")
        self.ask_master({"t": "fence", "procs": _codec().procs_to_wire(req.procs), "data": req.data,
                          "collect": req.collect, "timeout": req.timeout}, answered)

    def _up_direct_modex(self, req) -> None:
        def answered(r: Message) -> None:
            req.reply(r.get("status", Status.ERR_UNREACH), r.get("data") or b"")
        self.ask_master({"t": "dmodex", "nspace": req.proc.nspace, "rank": req.proc.rank},
                         answered)

    def _up_abort(self, req) -> None:
        def answered(r: Message) -> None:
            req.reply(r.get("status", Status.ERR_UNREACH))
        self.ask_master({"t": "abort", "nspace": req.proc.nspace, "rank": req.proc.rank,
                          "status": req.status, "msg": req.message or "",
                          "procs": _codec().procs_to_wire(req.procs)}, answered)

    def _up_connect(self, req) -> None:
        async def learn_then_reply(r: Message) -> None:
            try:
                await self.learn_nspaces(r.get("layouts"), getattr(req, "origin", None))
            finally:
                req.reply(r.get("status", Status.ERR_UNREACH))

        def answered(r: Message) -> None:
            if r.get("status") == Status.SUCCESS:
                self.node.spawn(learn_then_reply(r))
            else:
                req.reply(r.get("status", Status.ERR_UNREACH))
        self.ask_master({"t": "connect", "procs": _codec().procs_to_wire(req.procs)}, answered)

    def _up_disconnect(self, req) -> None:
        def answered(r: Message) -> None:
            req.reply(r.get("status", Status.ERR_UNREACH))
        self.ask_master({"t": "disconnect", "procs": _codec().procs_to_wire(req.procs)}, answered)

    def _up_spawn(self, req) -> None:
        apps = [{"cmd": a.cmd, "argv": list(a.argv), "env": list(a.env), "cwd": a.cwd,
                 "maxprocs": a.maxprocs} for a in req.apps]

        def answered(r: Message) -> None:
            ok = r.get("status") == Status.SUCCESS
            req.reply(r.get("status", Status.ERR_UNREACH), r.get("nspace") if ok else None)
        from .debugger import spawn_directives
        msg = {"t": "spawn", "parent": [req.proc.nspace, req.proc.rank], "apps": apps,
               **spawn_directives(req.job_info)}
        tool = self.tools.tools.get(req.proc.nspace)
        if tool is not None:  # a tool's spawn: its kernel-checked identity (tools.py)
            msg["tool_uid"], msg["tool_gid"] = tool.uid, tool.gid
        self.ask_master(msg, answered)

    def _up_query(self, req) -> None:
        from .query import serve
        serve(self, req)

    def _up_job_control(self, req) -> None:
        from .jobctl import serve
        serve(self, req)

    def _up_allocate(self, req) -> None:
        from .jobctl import serve_allocate
        serve_allocate(self, req)

    # -- the master asks us ------------------------------------------------

    async def dmodex(self, msg: Message) -> Message:
        """Another node wants the modex data a local rank posted."""
        from ...pmix import Proc
        from ...wire import reply
        ns, rank = msg.get("nspace"), msg.get("rank")
        if self.server is None or (ns, rank) not in self.sessions:
            return reply(msg.get("id"), Status.ERR_NOT_FOUND, f"{ns}:{rank} is not served here")
        server = self.local_nspaces.get(ns) or self.server
        try:
            status, blob = await asyncio.wait_for(server.dmodex_request(Proc(ns, rank)),
                                                  DMODEX_TIMEOUT)
        except asyncio.TimeoutError:
            return reply(msg.get("id"), Status.ERR_TIMEOUT,
                         f"{ns}:{rank} posted no modex data within {DMODEX_TIMEOUT:.0f}s")
        return reply(msg.get("id"), status, data=blob)
