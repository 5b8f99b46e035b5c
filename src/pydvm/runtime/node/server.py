"""Serving one node: its job processes, their client connections, its node store.

:class:`NodeServer` is the one piece of code that serves a node's clients.
It is hosted either by a daemon process (:mod:`pydvm.runtime.node.daemon`, one
per node, talking to the master over TCP) or, for the head node, by the
master process itself (:mod:`pydvm.runtime.master.nodes`), so that a head-node
client reaches the master store in one hop.  Whatever else serves a node's
clients comes with it.  The host gives it two things:

* an **uplink** to the master -- a :class:`~pydvm.wire.Channel` in a daemon,
  an in-process :class:`~pydvm.wire.LocalEnd` in the master -- for launch,
  kill, purge and stats requests coming down, and ``ready``, ``exited`` and
  ``output`` going up;
* a **router** for the data requests that are not its own to answer
  (every range but LOCAL): :class:`~.dataops.UplinkRouter` passes them on
  over the uplink; the master's router serves them in place.

Request path of a client call::

    client --unix--> node server --+-- range LOCAL --> node store
                                   +-- other ranges --> router --> master store

(which store takes which request is :func:`dataops.stores_for`).  On a
daemon's node with ``pydvm_direct_data on`` the node server also vouches
for every process it launches (:class:`~pydvm.runtime.shared.credential.Voucher`):
the process's client then sends its master-store requests straight to the
master (:mod:`pydvm.runtime.master.direct`) and only LOCAL ones -- and the node
part of an ``unpublish``, marked ``node_only`` -- come here.

The node server fills the caller's identity itself: uid/gid/pid from the
Unix socket's peer credentials, namespace/rank from the client's hello
(checked against the processes it launched).  Requestor claims a client
puts in a message are never forwarded (see ``dataops.FORWARDED_FIELDS``).
Each accepted client is a :class:`~pydvm.runtime.shared.peers.ClientSession`.

A connection acts for a process only while that process lives: once the
node server has reaped a process it closes every connection acting for it,
and a ``hello`` naming it is refused ``PMIX_ERR_NO_PERMISSIONS`` -- so a
child that lingers after its job process cannot store anything no lifetime
reaches.  When a job ends, whatever is left of its processes' groups on this
node (lingering children) is killed, as a resource manager ends a step.

``unpublish`` is applied to both stores: removal is a question of ownership,
not of range, so an owner's key goes wherever it is.

What the node server purges in its own store: PROC when it reaps a process;
APP, NSPACE and SESSION when the master says that application, job or
session has ended (the application notice goes to the nodes that ran the
application, once it has ended on all of them).  Its own share of a job or
application finishing purges nothing more: that is not a lifetime.

No orphans (:mod:`pydvm.runtime.shared.guard`): job processes get a parent-death
signal and their process groups are listed with a guardian process that
kills them if the process hosting the node server dies, however it dies.

Output is read with flow control: at most ``pydvm_output_window`` bytes of
one job's output -- each message charged its bytes plus a fixed overhead
(:func:`~pydvm.runtime.node.jobio.output_cost`) -- may be unacknowledged by the
master; beyond that the node server stops reading the job's streams until
the master's ``output_ack``.  A process's stdout is a pseudo-terminal (so C
programs write it line by line), its stderr a pipe, its stdin ``/dev/null``
-- or, for the rank (``--stdin N``, rank 0 by default) or every rank
(``--stdin all``) of a job whose ``pydvm run`` forwards its stdin, a pipe
fed from it (:mod:`pydvm.runtime.node.jobio`).

Starting a job's share and watching each process until it is reaped is
:mod:`pydvm.runtime.node.launch`'s; how one process is started, signalled and
reaped, :mod:`pydvm.runtime.shared.jobproc`'s; the private directory of the client
socket, :mod:`pydvm.runtime.shared.sockdir`'s.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
from pathlib import Path

from ... import _trace
from ... import params as P
from ...enums import Persistence
from ...errors import Status
from ...store import DataStore, MonotonicClock, StoreParams
from ...wire import Channel, Message, peer_credentials, refuse, reply
from ..pmixhost import PmixHost, jobctl_on_master, pids_of
from ..shared import dataops
from ..shared import jobproc
from ..shared.auth import host_identity
from ..shared.credential import Voucher
from ..shared.door import Door, Listener
from ..shared.guard import Guardian, group_alive
from ..shared.jobproc import KILL_GRACE
from ..shared.peers import ClientSession, process_caller, route_answer
from ..shared.sockdir import make_socket_dir, same_host_socket
from ..shared.stats import RequestStats, store_sample
from ..shared.storeguard import GuardedStats, StoreGuard, guard_for, guarded_store
from .cpubind import NodeBinding
from .heap import IdleTrim, tune as tune_heap
from .jobio import StdinFeed
from .launch import LocalJob, LocalProc, start_share
from .pmi1host import Pmi1Host

log = logging.getLogger("pydvm.node")

class NodeServer:
    """Serves one node (see the module docstring).

    ``uplink`` is the link to the master (its ``on_message`` is set to
    :meth:`on_master`); ``router`` takes the data requests that are not
    LOCAL (default: a :class:`~.dataops.UplinkRouter` over ``uplink``).  ``welcome``
    is what the master told the node when it joined (parameters, DVM id,
    namespace, multi-user).  ``vouch`` -- (DVM secret, master URI), given by
    a daemon -- lets it hand its processes direct-data credentials when
    ``pydvm_direct_data`` is on (the head node, one hop already, has none).
    :meth:`start` opens the client socket and says ``ready``; :meth:`stop`
    ends every process and closes everything; :attr:`done` is set once it has.
    """

    def __init__(self, node: str, uplink, welcome: Message, *, guardian: Guardian,
                 router=None, vouch: tuple[bytes, str] | None = None,
                 tools_only: bool = False) -> None:
        #: the node's name, as the master knows it.
        self.name = node
        #: no node of the DVM: the master's tool side when no node lives in
        #: its process (runtime/master/nodes.py, ``NodeTable.tool_side``) -- a PMIx
        #: server for tools and their data, no jobs, no client socket.
        self.tools_only = tools_only
        self.uplink = uplink
        self.router = router or dataops.UplinkRouter(uplink)
        self.guardian = guardian
        self.values = P.values(P.from_wire(welcome["params"]))
        self.dvmid = welcome["dvm"]
        self.dvm_nspace = welcome["dvm_nspace"]
        self.multi_user = bool(welcome.get("multi_user"))
        #: vouches for launched processes' direct connections (None: none handed out).
        self.voucher: Voucher | None = None
        if vouch is not None and self.values["pydvm_direct_data"] == "on":
            self.voucher = Voucher(vouch[0], self.dvmid, node, vouch[1])
            self.voucher.master_unix = same_host_socket(welcome.get("direct_unix"))
        self.store: DataStore | None = None
        #: the lock the store is used under (made at start; see storeguard).
        self.guard: StoreGuard | None = None
        self.jobs: dict[str, LocalJob] = {}
        self.socket_dir: Path | None = None
        #: where this node's PMIx jobs keep their shared-memory files, one
        #: directory per job (made on the first such job; see job_dir).
        self.shm_dir: Path | None = None
        self.socket_path = ""
        self._server: Listener | None = None
        self.done = asyncio.Event()
        self._clients: set[ClientSession] = set()
        #: uids whose first node-store item the last request stored, to be
        #: announced to the master before that request is answered.
        self._new_holders: list[int] = []
        self._tasks: set[asyncio.Task] = set()
        self._exiting = False
        #: counts and latencies of the data requests the node store served.
        self.request_stats = RequestStats()
        #: the node's PMIx server (runtime/pmixhost/host.py); off when libpmix is missing.
        self.pmix = PmixHost(self)
        #: the node's PMI-1 server, for the MPICH family (runtime/node/pmi1host.py).
        self.pmi1 = Pmi1Host(self)
        #: nspace -> what its pydvm run sends to the stdin of its ranks here
        #: that read it (rank 0, ``--stdin N``'s rank, or all with ``--stdin all``).
        self.stdin_feeds: dict[str, StdinFeed] = {}
        #: topology, live bindings, the affinity switch (runtime/node/cpubind.py).
        self.binding = NodeBinding(node)
        #: returns the heap's free pages once a burst of jobs has drained
        self.trim = IdleTrim()

    # ------------------------------------------------------------------
    # life cycle
    # ------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        values = self.values
        # The store is reached by the loop and, for PMIx requests it can
        # answer at once, by libpmix's thread: always under the process's
        # one store guard (runtime/shared/storeguard.py).
        self.guard = guard_for(loop)
        self.request_stats = GuardedStats(self.guard)
        self.store = guarded_store(
            self.guard,
            name=self.name,
            clock=MonotonicClock(),
            on_answer=route_answer,
            params=StoreParams(
                timeout=values["prte_data_server_timeout"],
                max_size=values["prte_data_server_max_size"],
                verbose=values["prte_data_server_verbose"],
            ),
            dvm_nspace=self.dvm_nspace,
            on_holder=self._holder_changed if self.voucher is not None else None,
        )
        self._make_socket_dir()
        if not self.tools_only:
            self._server = Door(f"node {self.name}").listen_unix(
                lambda: Channel(self._on_client_hello, self._on_client_closed, name="client"),
                self.socket_path)
            os.chmod(self.socket_path, 0o666 if self.multi_user else 0o700)
        # PMIx rendezvous files live in the socket directory, so the guardian
        # removes them (and libpmix's shared-memory stores) however we die.
        self.pmix.start(str(self.socket_dir), self.values["pydvm_pmix"])
        if not self.tools_only:
            self.pmix.prestart_owner()
        await self.pmix.start_tools()
        self.uplink.on_message = self.on_master
        if self.tools_only:
            log.info("PMIx tools served beside the master (no node in its process)")
            return
        ready = {"t": "ready", "pmix": list(self.pmix.status),
                 # what ppr:N:socket and --map-by core:SPAN count (placement.py)
                 "topo": self.binding.topology.counts(),
                 # which process this is, where: a PMIx tool that sees what the
                 # master sees may name it (--pid) to reach the DVM (pmixhost/tools.py)
                 "pid": os.getpid(), "where": host_identity()}
        if self.voucher is not None:
            ready["holders"] = []  # from now on announced (see _holder_changed)
        self.uplink.send(ready)
        log.info("node %s serving clients at %s", self.name, self.socket_path)
        tune_heap()
        if ((self.multi_user or self.values["pydvm_death_signal"] == "on")
                and not jobproc.death_signal_available()):
            log.warning("node %s: setpriv (util-linux) not found: job processes get no "
                        "parent-death signal; only the guardian ends them if this process "
                        "dies", self.name)

    def _make_socket_dir(self) -> None:
        self.socket_dir = make_socket_dir(self.dvmid, self.name, self.multi_user)
        self.socket_path = str(self.socket_dir / "client.sock")
        self.guardian.remove_on_exit(str(self.socket_dir))
        # every job process carries it (PYDVM_SERVER): ended with the node
        self.guardian.kill_carriers_on_exit("PYDVM_SERVER", self.socket_path)

    async def stop(self, grace: float = KILL_GRACE) -> None:
        """End every process (SIGTERM, SIGKILL after ``grace``), close the
        client socket and every client connection, remove the socket directory."""
        if self._exiting:
            await self.done.wait()
            return
        self._exiting = True
        await self._kill_all(grace)
        for feed in self.stdin_feeds.values():
            feed.close()
        self.stdin_feeds.clear()
        self.pmix.stop()
        self.pmi1.stop()
        if self._server is not None:
            self._server.close()
        for s in list(self._clients):
            s.channel.close("node server stopping")
        if self.socket_dir is not None:
            shutil.rmtree(self.socket_dir, ignore_errors=True)
        if self.shm_dir is not None:
            shutil.rmtree(self.shm_dir, ignore_errors=True)
        self.binding.close()  # this node binds nothing any more
        self.trim.close()
        self.done.set()

    def stdin_feed(self, nspace: str) -> StdinFeed:
        """The feed of the stdin of ``nspace``'s ranks here that read it, made
        on first use: the tool's first ``stdin`` may come before the launch.
        Dropped with the job (NSPACE purge)."""
        feed = self.stdin_feeds.get(nspace)
        if feed is None:
            def ack(n: int, closed: bool) -> None:
                if not self.uplink.closed:
                    self.uplink.send({"t": "stdin_ack", "nspace": nspace, "bytes": n,
                                      "closed": closed})
            feed = self.stdin_feeds[nspace] = StdinFeed(ack)
        return feed

    def spawn(self, coro, answer_id=None) -> asyncio.Task:
        """Run ``coro`` as a task; if it fails and ``answer_id`` names a master
        request, answer that request with the failure."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)

        def done(t: asyncio.Task) -> None:
            self._tasks.discard(t)
            if t.cancelled() or t.exception() is None:
                return
            log.error("internal error", exc_info=t.exception())
            if answer_id is not None:
                self.uplink.send(reply(answer_id, Status.ERR_UNREACH,
                                       f"{self.name}: internal error: {t.exception()!r}"))
        task.add_done_callback(done)
        return task

    # ------------------------------------------------------------------
    # master messages
    # ------------------------------------------------------------------

    def on_master(self, ch, msg: Message) -> None:
        t = msg["t"]
        rid = msg.get("id")
        if t == "launch":
            self.spawn(self._launch(msg), rid)
        elif t == "launch_many":
            self.spawn(self._launch_many(msg), rid)
        elif t == "output_ack":
            job = self.jobs.get(msg.get("nspace"))
            n = msg.get("bytes")
            if job is not None and isinstance(n, int) and not isinstance(n, bool) and n > 0:
                job.credit += n
                job.credit_ok.set()  # each waiting pump checks whether it is enough
        elif t == "stdin":
            ns, data = msg.get("nspace"), msg.get("data", b"")
            if isinstance(ns, str) and isinstance(data, bytes):
                self.stdin_feed(ns).feed(data, msg.get("eof") is True)
        elif t == "kill":
            job = self.jobs.get(msg.get("nspace"))
            if job is not None:
                self.spawn(self.kill_procs(list(job.procs.values()), KILL_GRACE))
        elif t == "purge":
            if isinstance(msg.get("event"), dict) and self.pmix.running:
                async def purge_after_event() -> None:
                    # the job's end reaches its watchers before its namespace goes
                    try:
                        await self.pmix.deliver_event(msg["event"])
                    except Exception as exc:
                        log.warning("job-end event of %s not delivered: %r",
                                    msg.get("nspace"), exc)
                    self._apply_purge(msg)
                self.spawn(purge_after_event(), rid)
            else:
                self._apply_purge(msg)
        elif t == "dmodex":
            async def dmodex() -> None:
                ch.send(await self.pmix.dmodex(msg))
            self.spawn(dmodex(), rid)
        elif t == "jobctl":
            jobctl_on_master(self, ch, msg)
        elif t == "pids":
            ch.send(reply(rid, Status.SUCCESS, pids=pids_of(self, msg.get("nspace"))))
        elif t == "signal":  # signal_job: one signal to each live process's group
            n = jobproc.signal_all(self.jobs.get(msg.get("nspace")), msg.get("signal"))
            if rid is not None:
                ch.send(reply(rid, Status.SUCCESS, signalled=n))
        elif t == "event":
            async def event() -> None:
                ch.send(reply(rid, await self.pmix.deliver_event(msg)))
            self.spawn(event(), rid)
        elif t == "stats":
            uid = msg.get("uid")
            uid = uid if isinstance(uid, int) else -1
            prefix = msg.get("prefix")
            prefix = prefix if isinstance(prefix, str) else None
            extra = {"metrics": store_sample(self.store, self.request_stats)} \
                if msg.get("metrics") else {}
            ch.send(reply(rid, Status.SUCCESS, store=dataops.stats_row(self.store, uid, prefix),
                          **extra))
        elif t == "shutdown":
            async def run() -> None:
                await self._kill_all(KILL_GRACE)
                ch.send(reply(rid, Status.SUCCESS))
                await self.stop()
            self.spawn(run(), rid)
        elif t == "ping":
            if rid is not None:
                ch.send(reply(rid, Status.SUCCESS))
        else:
            if t != "reply":
                log.warning("master sent unknown message type %r", t)
            if rid is not None:
                refuse(ch, msg, Status.ERR_BAD_PARAM, f"unknown message type {t!r}")

    def _apply_purge(self, msg: Message) -> None:
        """A lifetime the master decided has ended: APP (an application has
        ended on every node), NSPACE (the job) or SESSION.  Acknowledged."""
        rid = msg.get("id")
        try:
            horizon = Persistence(msg.get("horizon"))
            app = msg.get("app_idx")
            if horizon is Persistence.APP:
                if not isinstance(msg.get("nspace"), str) or not isinstance(app, int) \
                        or isinstance(app, bool):
                    raise ValueError("an APP purge names its namespace and app_idx")
            else:
                app = None
            n = self.store.purge(horizon, nspace=msg.get("nspace"), app_idx=app,
                                 session_id=msg.get("session_id"))
        except (ValueError, TypeError) as exc:
            self.uplink.send(reply(rid, Status.ERR_BAD_PARAM, str(exc)))
            return
        if horizon is Persistence.NSPACE:
            if _trace.PATH:
                _trace.mark("node.purge", msg.get("nspace"))
            feed = self.stdin_feeds.pop(msg.get("nspace"), None)
            if feed is not None:
                feed.close()
            job = self.jobs.pop(msg.get("nspace"), None)
            if job is not None:
                self._clean_up_job(job)
            self.pmi1.job_ended(msg.get("nspace"))
            if self.pmix.running:
                # acknowledged once libpmix has dropped the namespace, so that
                # nothing of it is left when the job's end is reported
                async def deregistered() -> None:
                    if _trace.PATH:
                        _trace.mark("node.deregister", msg.get("nspace"))
                    await self.pmix.job_ended(msg.get("nspace"))
                    if _trace.PATH:
                        _trace.mark("node.deregistered", msg.get("nspace"))
                    self.uplink.send(reply(rid, Status.SUCCESS, removed=n))
                self.spawn(deregistered(), rid)
                return
        self.uplink.send(reply(rid, Status.SUCCESS, removed=n))

    def _clean_up_job(self, job: LocalJob) -> None:
        """The job has ended everywhere: end what is left of it on this node
        (lingering children of its processes, their output pumps)."""
        for lp in job.procs.values():
            pgid = lp.pgid
            if pgid is not None and pgid in self.guardian.groups:
                jobproc.signal_group(pgid, signal.SIGKILL)
                self.guardian.release(pgid)
            for s in list(lp.sessions):
                s.channel.close(f"job {job.nspace} ended")
        for task in list(job.pumps):
            task.cancel()
        self.binding.release_job(job.nspace)
        if job.work_dir is not None:
            # the job's shared-memory segments and session files, even
            # those of processes that crashed and never removed theirs
            shutil.rmtree(job.work_dir, ignore_errors=True)
            job.work_dir = None
        if not self.jobs:
            self.trim.idle(lambda: not self.jobs)

    # ------------------------------------------------------------------
    # processes
    # ------------------------------------------------------------------

    async def _launch(self, msg: Message) -> None:
        """A job's ``launch``: its share here started, answered (see :func:`.launch.start_share`)."""
        self._expect_stdin(msg)
        self.uplink.send({**await start_share(self, msg), "id": msg.get("id")})

    def _expect_stdin(self, msg: Message) -> None:
        """Tell the job's stdin feed which of the ranks a launch starts here
        read it, before any starts: what is acknowledged to the tool is what
        every one of them has been given (:class:`.jobio.StdinFeed`)."""
        procs = msg.get("procs")
        ns = msg.get("nspace")
        if not isinstance(procs, list) or not isinstance(ns, str):
            return
        readers = [p["rank"] for p in procs if isinstance(p, dict) and p.get("stdin") is True]
        if readers:
            self.stdin_feed(ns).expect(readers)

    async def _launch_many(self, msg: Message) -> None:
        """Several jobs' launches in one message (``launches``: each a
        ``launch`` without its type), answered once with ``results``, one
        answer per launch in order, when every share has started or failed."""
        shares = msg.get("launches") if isinstance(msg.get("launches"), list) else []
        log.debug("%s: %d jobs' launches in one message", self.name, len(shares))
        for m in shares:
            if isinstance(m, dict):
                self._expect_stdin(m)
        out = await asyncio.gather(*[start_share(self, m if isinstance(m, dict) else {})
                                     for m in shares], return_exceptions=True)
        self.uplink.send(reply(msg.get("id"), Status.SUCCESS, results=[
            r if isinstance(r, dict) else
            reply(None, Status.ERR_UNREACH, f"{self.name}: internal error: {r!r}")
            for r in out]))

    def reaped(self, job: LocalJob, lp: LocalProc) -> None:
        """``lp`` has ended: nothing may act for it any more."""
        lp.ended = True
        self.pmi1.reaped(lp.nspace, lp.rank)
        self.binding.release(lp.nspace, lp.rank)
        for s in list(lp.sessions):
            s.channel.close(f"process {lp.nspace}:{lp.rank} ended")
        pgid = lp.pgid
        if pgid is not None and not group_alive(pgid):
            self.guardian.release(pgid)
        self.store.purge(Persistence.PROC, nspace=lp.nspace, rank=lp.rank)

    async def kill_procs(self, procs: list[LocalProc], grace: float) -> None:
        await jobproc.end_groups([lp.process for lp in procs if lp.process is not None], grace)

    async def _kill_all(self, grace: float) -> None:
        procs = [lp for job in self.jobs.values() for lp in job.procs.values()]
        await self.kill_procs(procs, grace)
        for pgid in self.guardian.groups:  # lingering children of ended processes
            jobproc.signal_group(pgid, signal.SIGKILL)
        # Let the watchers report and purge.
        for _ in range(50):
            if all(lp.ended for lp in procs):
                break
            await asyncio.sleep(0.01)

    # ------------------------------------------------------------------
    # clients
    # ------------------------------------------------------------------

    def _on_client_hello(self, ch: Channel, msg: Message) -> None:
        rid = msg.get("id")
        if msg["t"] != "hello":
            refuse(ch, msg, Status.ERR_BAD_PARAM, "first message must be hello")
            ch.close(f"client sent {msg['t']!r} before hello", error=True)
            return
        try:
            pid, uid, gid = peer_credentials(ch.transport.get_extra_info("socket"))
        except OSError as exc:
            ch.close(f"no peer credentials: {exc}", error=True)
            return
        ns, rank = msg.get("nspace"), msg.get("rank")
        job = self.jobs.get(ns) if isinstance(ns, str) else None
        ok_rank = isinstance(rank, int) and not isinstance(rank, bool)
        lp = job.procs.get(rank) if job is not None and ok_rank else None
        if lp is not None and job.uid is not None and uid not in (job.uid, 0):
            lp = None  # another user's process: claiming it would be claiming them
        if lp is None or lp.ended:
            why = (f"process {ns}:{rank} has ended" if lp is not None else
                   f"{ns!r}:{rank!r} is not a running process of this node")
            ch.send(reply(rid, Status.ERR_NO_PERMISSIONS, why))
            ch.close(f"client pid {pid} refused: {why}", error=True)
            return
        ch.name = f"client {ns}:{rank} pid {pid}"
        caller = process_caller(ns, rank, uid, gid, self.name, lp.app_idx, job.session_id)
        session = ClientSession(ch, caller, pid, self.values["pydvm_max_outstanding"])
        lp.sessions.add(session)
        ch.on_message = self._on_client
        self._clients.add(session)
        extra = {}
        if self.voucher is not None:
            extra["direct"] = self.voucher.master_uri
            # which of the client's TCP links to the master must be sealed: it
            # has no secret to check the master's word on that with.
            extra["direct_seal"] = self.values["pydvm_seal"]
            if self.voucher.master_unix:
                extra["direct_unix"] = self.voucher.master_unix
        ch.send(reply(rid, Status.SUCCESS, node=self.name, **extra))

    def _on_client(self, ch: Channel, msg: Message) -> None:
        session: ClientSession = ch.session
        t = msg["t"]
        if t == "cancel":
            self._cancel(session, msg.get("ref"))
            return
        if t not in dataops.DATA_OPS:
            refuse(ch, msg, Status.ERR_BAD_PARAM, f"unknown message type {t!r}")
            return
        self.serve_data(session, msg)

    def serve_data(self, session, msg: Message) -> None:
        """Serve one data request of a local process's session -- a native
        client's, or a PMIx client's (:mod:`pydvm.runtime.pmixhost.host`): admit
        it, then serve it where :func:`dataops.stores_for` says: the node
        store for LOCAL, the router for every other range, ``unpublish``
        both (the node store only if it holds something of the caller's
        uid) -- or only the node store when marked ``node_only`` (a direct
        client sends the master's part itself).  Exactly one answer goes to
        the session."""
        refusal = session.admit(msg)
        if refusal is not None:
            session.send(refusal)
            return
        rid = msg["id"]
        t = msg["t"]
        stores = dataops.stores_for(t, dataops.request_range(msg))
        to_master = dataops.MASTER in stores and not (t == "unpublish" and msg.get("node_only"))
        here = dataops.NODE in stores
        if here and to_master and t == "unpublish" and not self.store.holds(session.caller.uid):
            here = False  # it would remove nothing here; the master's answer is the answer
        adjust = None
        if here:
            out = self.request_stats.apply(self.store, session.caller, msg, (session, rid))
            if not to_master:
                if out is None:
                    session.parked.add(rid)
                elif self._new_holders:
                    self._announce_holders(lambda r: session.send(out))
                else:
                    session.send(out)
                return
            # An unpublish: the master's answer is the answer, counting the
            # keys removed here too.
            removed = out.get("count", 0) if out is not None and out.get("status") == 0 else 0
            if removed:
                adjust = dataops.add_count(removed)
        self._forward(session, msg, adjust)

    def serve_now(self, session, msg: Message):
        """:meth:`serve_data` for a plain request answered where it arrived,
        on whichever thread holds :attr:`guard` -- a PMIx request on
        libpmix's thread (:meth:`PmixHost.answer_now
        <pydvm.runtime.pmixhost.host.PmixHost.answer_now>`).  The same routing,
        store rules and counters; returns the one answer (the store's
        :class:`~pydvm.store.Reply`), or None having changed nothing when
        serving it means waiting: a lookup that would park, a router that
        passes requests on (a daemon's uplink, a relaying master), the node
        store of a daemon with direct data (it keeps the master told, in
        order, which uids it holds), or a session at its cap (serve_data
        refuses it).  Called under :attr:`guard`."""
        cap = session.max_outstanding
        if cap is not None and session.outstanding() >= cap:
            return None
        t = msg["t"]
        stores = dataops.stores_for(t, dataops.request_range(msg))
        to_master = dataops.MASTER in stores
        if to_master and not self.router.answers_now:
            return None
        here = dataops.NODE in stores
        if here and self.voucher is not None:
            # With direct data the node store tells the master which uids it
            # holds (_holder_changed): a uid's first item before the publish
            # is answered (a round trip), and every change in order, from the
            # loop.  A lookup can change it too (a FIRST_READ read, an
            # expiry); done here, its notice would reach the loop late.
            return None
        if here and to_master and t == "unpublish" and not self.store.holds(session.caller.uid):
            here = False
        if not here:
            return self.router.serve_now(session, msg)
        r = self.request_stats.apply_now(self.store, session.caller, msg)
        if r is None or not to_master:
            return r
        # An unpublish: the master's answer is the answer, counting the keys
        # removed here too (dataops.add_count on the loop path).
        removed = r.count if r.status == 0 else 0
        r = self.router.serve_now(session, msg)
        return r._replace(count=r.count + removed) if removed and r.status == 0 else r

    # A direct client's unpublish skips the node store when it holds nothing
    # of the client's uid (runtime/master/direct.py): the master must know which
    # uids this store holds, and learn of a new one before the publish that
    # stored it is answered -- anyone told of that publish afterwards then
    # finds the master knowing.  A uid's last item leaving is a mere notice:
    # until it lands, an unpublish visits this store for nothing.

    def _holder_changed(self, uid: int, holds: bool) -> None:
        if holds:
            self._new_holders.append(uid)
        else:
            self.uplink.send({"t": "node_holds", "uids": [uid], "holds": False})

    def _announce_holders(self, then) -> None:
        uids, self._new_holders = self._new_holders, []
        self.uplink.request({"t": "node_holds", "uids": uids, "holds": True}, then)

    def _forward(self, session: ClientSession, msg: Message, adjust=None) -> None:
        self.router.forward(session, msg, adjust)

    def _cancel(self, session: ClientSession, ref) -> None:
        """The client gave up on request ``ref`` (a cancelled asyncio call):
        withdraw it here or wherever it went.  No reply (it is a notice)."""
        if not isinstance(ref, int) or isinstance(ref, bool):
            return
        if ref in session.parked and self.store.cancel((session, ref)):
            session.parked.discard(ref)
            return
        self.router.cancel(session, ref)

    def _on_client_closed(self, ch: Channel, reason: str) -> None:
        session = ch.session
        if not isinstance(session, ClientSession):
            return
        self._clients.discard(session)
        self.drop_session(session, session.caller.nspace, session.caller.rank)

    def drop_session(self, session, nspace: str, rank: int) -> None:
        """A client's connection (native or PMIx) has ended: unlink it from
        its process, drop its lookups parked here and withdraw those it has
        waiting at the master."""
        job = self.jobs.get(nspace)
        lp = job.procs.get(rank) if job is not None else None
        if lp is not None:
            lp.sessions.discard(session)
        for rid in list(session.parked):
            if self.store.cancel((session, rid)):
                session.parked.discard(rid)
        self.router.withdraw_all(session)
