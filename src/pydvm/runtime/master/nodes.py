"""The master's node table: daemons, their registration, heartbeats, node loss, broadcasts.

A node's state moves ``launching -> joining -> up -> lost | stopped``:
``joining`` once its daemon has authenticated, ``up`` once the daemon says
it serves clients, ``lost`` when its link breaks or stays silent for three
heartbeat periods, ``stopped`` when the DVM shuts it down.  Only ``up``
nodes get work: the default mapping of a job and a new session use the
nodes that are up at that moment (:meth:`NodeTable.live_hosts`), and a job
naming only nodes that are not up is refused with their names.

:class:`NodeTable` owns every :class:`NodeRecord` (and what each daemon
reported of itself: PMIx hosting, which uids its store holds), the
launcher, the heartbeat task and the head node's in-process server.  Other
components reach nodes only through its methods (:meth:`~NodeTable.send`,
:meth:`~NodeTable.call`, :meth:`~NodeTable.broadcast`,
:meth:`~NodeTable.deliver_event`...) and hear of a lost node through
:meth:`NodeListener.node_lost`.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

from ...errors import Status
from ...wire import Channel, LocalEnd, Message, heartbeat, local_pair, refuse, reply
from ..node import NodeServer
from ..shared.auth import host_identity
from ..shared.guard import Guardian
from ..shared.jobs import HostSpec
from ..shared.peers import DaemonSession
from .launchers import DaemonCommand, LaunchError, Launcher, stderr_sink
from .tasks import Tasks

log = logging.getLogger("pydvm.master")

#: How long start-up waits for every daemon to register.
REGISTER_TIMEOUT = 60.0
#: How long a daemon gets to acknowledge a purge or stats request.
ACK_TIMEOUT = 30.0
#: Seconds a failed process's PMIx event is given to reach its job's
#: handlers before the job is killed (and twice that, at most, for the
#: nodes to pass any event on: :meth:`NodeTable.deliver_event`).
EVENT_GRACE = 1.0


class StartError(RuntimeError):
    """The DVM could not be brought up (the message says why)."""


@dataclass
class NodeRecord:
    name: str
    slots: int
    channel: Channel | LocalEnd | None = None
    process: asyncio.subprocess.Process | None = None
    #: the head node's server, hosted by the master itself (None elsewhere).
    server: NodeServer | None = None
    state: str = "launching"  # launching -> joining -> up -> lost | stopped
    registered: asyncio.Event = field(default_factory=asyncio.Event)
    #: why the node was lost (shown by ``pydvm info``).
    lost_reason: str = ""
    #: uids the node's store holds items of, as its daemon reports them
    #: (``node_holds``; see runtime/master/direct.py).  None: not reported -- a
    #: daemon without direct data, or the head node -- so assume any.
    holders: set[int] | None = None
    #: [available, version or reason, path] of its PMIx server, as its
    #: ``ready`` said (None until then).
    pmix: list | None = None
    #: how many sockets, cores, NUMA domains, hardware threads and L3
    #: caches its daemon may use, as its ``ready`` said (None: not said).
    topo: dict[str, int] | None = None
    #: its daemon's pid, when that runs here: this machine, loopback and
    #: mount namespace (as its ``ready`` said)
    local_pid: int | None = None

    @property
    def up(self) -> bool:
        return self.state == "up" and self.channel is not None


class NodeListener:
    """What a component hears from the node table (the master wires it)."""

    def node_lost(self, name: str, reason: str) -> None:
        """Node ``name``'s link broke or fell silent (not when the DVM stops it)."""


class NodeTable:
    """Every node of the DVM (see the module docstring).

    ``on_message`` handles a registered daemon's messages (the master's
    dispatch); ``welcome()`` is what a joining node is told; ``guardian()``
    is the master process's guardian; ``all_gone(reason)`` is called when
    the launcher has lost every daemon for good.
    """

    def __init__(self, hosts: list[HostSpec], *, values: dict[str, Any], launcher: Launcher,
                 tasks: Tasks, on_message: Callable[[Channel, Message], None],
                 welcome: Callable[[], dict[str, Any]], guardian: Callable[[], Guardian],
                 all_gone: Callable[[str], None]) -> None:
        self.records: dict[str, NodeRecord] = {h.name: NodeRecord(h.name, h.slots)
                                               for h in hosts}
        self.values = values
        self.launcher = launcher
        self._tasks = tasks
        self._on_message = on_message
        self._welcome = welcome
        self._guardian = guardian
        self._all_gone = all_gone
        self._listeners: list[NodeListener] = []
        self._heartbeat: asyncio.Task | None = None
        #: the node this process serves itself (see :func:`choose_head_node`).
        self.head_node: str | None = None
        #: without a head node: the master's tool side, a node server of no
        #: node that takes PMIx tools beside the master (:meth:`tool_host`),
        #: and the master's end of its in-process link.
        self.tool_side: NodeServer | None = None
        self._tool_link: LocalEnd | None = None
        self._tool_start: asyncio.Future | None = None
        #: set by :meth:`begin_stop`: links closing from now on are stops, not losses.
        self.stopping = False
        #: node -> launches asked for in this turn of the loop, each with the
        #: future its answer resolves (:meth:`launch`); sent by :meth:`_send_launches`.
        self._launches: dict[str, list[tuple[Message, asyncio.Future]]] = {}

    def add_listener(self, listener: NodeListener) -> None:
        self._listeners.append(listener)

    # ------------------------------------------------------------------
    # queries
    # ------------------------------------------------------------------

    def get(self, name: Any) -> NodeRecord | None:
        return self.records.get(name) if isinstance(name, str) else None

    def is_up(self, name: Any) -> bool:
        node = self.get(name)
        return node is not None and node.up

    def hosts(self) -> list[HostSpec]:
        return [HostSpec(n.name, n.slots) for n in self.records.values()]

    def live_hosts(self, hosts: list[HostSpec]) -> list[HostSpec]:
        """The entries of ``hosts`` whose node is up, in order."""
        return [h for h in hosts if self.records[h.name].up]

    def topologies(self) -> dict[str, dict[str, int]]:
        """Each node's object counts, for nodes that reported them."""
        return {n.name: n.topo for n in self.records.values() if n.topo is not None}

    def up_names(self) -> list[str]:
        return [n.name for n in self.records.values() if n.up]

    def up_channels(self) -> list[Channel]:
        return [n.channel for n in self.records.values() if n.up]

    def node_ids(self) -> dict[str, int]:
        """Each node's index in the DVM's host list (PMIx's node ids)."""
        return {name: i for i, name in enumerate(self.records)}

    def may_hold(self, name: str | None, uid: int) -> bool:
        """Whether node ``name``'s store may hold items of ``uid`` (True
        unless its daemon's reports say it holds none)."""
        rec = self.records.get(name) if name is not None else None
        return rec is None or rec.holders is None or uid in rec.holders

    def hosting_pmix(self, names: set[str]) -> set[str]:
        """Those of ``names`` whose node server hosts PMIx."""
        out = set()
        for n in names:
            rec = self.records.get(n)
            if rec is not None and rec.pmix and rec.pmix[0]:
                out.add(n)
        return out

    def pmix_missing(self, names: set[str]) -> list[str]:
        """``name (why)`` for each of ``names`` (sorted) without PMIx."""
        out = []
        for n in sorted(names):
            rec = self.records.get(n)
            pmix = (rec.pmix if rec is not None else None) or [False, "not reported"]
            if not pmix[0]:
                out.append(f"{n} ({pmix[1]})")
        return out

    def pmix_report(self) -> dict[str, list]:
        """node -> its PMIx report, for the nodes that made one (``pydvm info``)."""
        return {n.name: n.pmix for n in self.records.values() if n.pmix is not None}

    def info(self) -> dict[str, Any]:
        """``pydvm info``'s fields about nodes and how they were started."""
        return {
            "nodes": [[n.name, n.slots, n.state] for n in self.records.values()],
            "node_reasons": {n.name: n.lost_reason for n in self.records.values()
                             if n.lost_reason},
            "daemon_pids": {n.name: n.process.pid for n in self.records.values() if n.process},
            "launcher": self.launcher.name, "hosts_from": self.launcher.source,
            "head_node": self.head_node,
        }

    # ------------------------------------------------------------------
    # start-up
    # ------------------------------------------------------------------

    def choose_head(self, setting: str) -> None:
        """Decide which node this process serves (``pydvm_head_node``); raises StartError."""
        self.head_node = choose_head_node(setting, self.hosts())

    async def start(self, uri: str, secret: bytes, log_dir: str | None, head_router: Any) -> None:
        """Serve the head node here (its data requests through ``head_router``)
        -- or, without one, the tool side, started while the daemons start
        --, start every other node's daemon with the DVM's launcher; return
        once all have reported in.  A daemon that ends before reporting in
        fails the start-up with what it wrote on stderr (:meth:`_start_failure`)."""
        for node in self.records.values():
            if node.name == self.head_node:
                await self._serve_head(node, head_router)
        if self.head_node is None:
            self._start_tool_side(head_router)
        daemons = [n for n in self.records if n != self.head_node]
        launcher = self.launcher
        cmd = DaemonCommand(uri, log_dir, self.values["pydvm_remote_python"] or sys.executable)
        launcher.tail.sink = stderr_sink(log_dir)
        if daemons:
            try:
                await launcher.start(daemons, cmd, secret, self.values)
            except LaunchError as exc:
                raise StartError(str(exc)) from None
        for name, proc in launcher.processes().items():
            self.records[name].process = proc
        waits = {n: asyncio.ensure_future(self.records[n].registered.wait()) for n in daemons}
        gone = {name: launcher.gone(name) for name in daemons}
        deadline = asyncio.get_running_loop().time() + REGISTER_TIMEOUT
        try:
            while any(not w.done() for w in waits.values()):
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    missing = sorted(n for n, w in waits.items() if not w.done())
                    raise StartError(f"daemons did not report in within {REGISTER_TIMEOUT:.0f}s: "
                                     f"{', '.join(missing)}")
                pending = [w for w in waits.values() if not w.done()]
                pending += [g for n, g in gone.items() if not waits[n].done()]
                await asyncio.wait(pending, timeout=left, return_when=asyncio.FIRST_COMPLETED)
                failed = [n for n, g in gone.items() if g.done() and not waits[n].done()]
                if failed:
                    raise StartError(self._start_failure(failed, log_dir))
        finally:
            for w in waits.values():
                w.cancel()
        if self._tool_start is not None:
            await self._tool_start  # a tool started once `pydvm start` returned finds it
        # From now on a daemon that dies is noticed as before, by its link
        # closing (or falling silent); but a launcher that has lost every
        # daemon for good (the srun step ended) ends the DVM.
        launcher.on_ended = self._launcher_ended
        self._heartbeat = self._tasks.start(heartbeat(self.up_channels,
                                                      self.values["pydvm_heartbeat_interval"]))

    async def _serve_head(self, node: NodeRecord, router: Any) -> None:
        """Serve the head node in this process: a NodeServer joined to the
        master by an in-process link instead of a daemon over TCP."""
        mine, its = local_pair(f"head node {node.name}", "master")
        DaemonSession(mine, node.name)
        mine.on_message = self._on_message
        node.channel = mine
        node.state = "joining"
        node.server = NodeServer(node.name, its, self._welcome(), guardian=self._guardian(),
                                 router=router)
        await node.server.start()
        await node.registered.wait()

    def _start_tool_side(self, router: Any) -> None:
        """A DVM without a head node still serves PMIx tools on the master's
        machine, as PRRTE's ``prte`` does whatever its hosts: a node server of
        no node (``tools_only``: no jobs, no client socket) whose PMIx server
        -- a tool server process, or with isolation off the master's own --
        takes tools, their data served by the master in place (``router``)
        and their other requests sent here over an in-process link like the
        head node's (:meth:`trusts_tools`).  Not when PMIx is off."""
        if self.values.get("pydvm_pmix") == "off":
            return
        name = "tools"
        while name in self.records:   # (a node may be called so)
            name += "_"
        mine, its = local_pair("tool side", "master")
        DaemonSession(mine, name)
        mine.on_message = self._on_message
        self._tool_link = mine
        self.tool_side = NodeServer(name, its, self._welcome(), guardian=self._guardian(),
                                    router=router, tools_only=True)

        async def start(server: NodeServer) -> None:
            try:
                await server.start()
            except Exception as exc:   # the DVM runs on, without tools
                log.error("no PMIx tool server beside the master: %s", exc)
        self._tool_start = asyncio.ensure_future(start(self.tool_side))

    def tool_host(self) -> NodeServer | None:
        """The node server of this process whose PMIx server takes tools from
        outside: the head node's, else the tool side (None: neither)."""
        head = self.records.get(self.head_node or "")
        if head is not None and head.server is not None:
            return head.server
        return self.tool_side

    def trusts_tools(self, daemon: DaemonSession) -> bool:
        """Does ``daemon`` speak for the tools of this process's tool host --
        is it that host's in-process link, whose ``tool_uid`` (a kernel's
        uid, found by its server) the master believes?  A daemon's link never
        is, whatever node it names."""
        head = self.records.get(self.head_node or "")
        link = head.channel if head is not None and head.server is not None \
            else self._tool_link
        return link is not None and daemon.channel is link

    def _start_failure(self, failed: list[str], log_dir: str | None) -> str:
        """The start-up error for daemons that ended before reporting in:
        the first one's reason and the last lines of its stderr."""
        name = failed[0]
        why = self.launcher.gone(name).result()
        text = f"the daemon for {name} {why} before reporting in"
        if len(failed) > 1:
            text += f" (so did {', '.join(failed[1:])})"
        tail = self.launcher.stderr_tail(name)
        if tail:
            text += "; its standard error ended with:\n" + "\n".join(f"  {ln}" for ln in tail)
        else:
            text += "; it wrote nothing on its standard error"
        if log_dir:
            text += f"\n(logs in {log_dir})"
        return text

    def _launcher_ended(self, reason: str) -> None:
        if not self.stopping:
            log.error("%s: every daemon is gone; stopping the DVM", reason)
            self._all_gone(reason)

    # ------------------------------------------------------------------
    # a daemon's life
    # ------------------------------------------------------------------

    def register(self, ch: Channel, msg: Message) -> bool:
        """A daemon's ``auth``: accept it for the node it names (welcomed,
        its messages to ``on_message``) or refuse it; True if accepted."""
        name = msg.get("node")
        node = self.get(name)
        if node is None or node.state != "launching" or node.server is not None:
            why = f"unexpected daemon for node {name!r}"
            ch.send(reply(msg.get("id"), Status.ERR_NO_PERMISSIONS, why))
            ch.close(why, error=True)
            return False
        DaemonSession(ch, name)
        ch.name = f"daemon {name}"
        ch.on_message = self._on_message
        node.channel = ch
        node.state = "joining"  # up once it says it is ready to serve clients
        ch.send(reply(msg.get("id"), Status.SUCCESS, **self._welcome()))
        return True

    def ready(self, daemon: DaemonSession, msg: Message) -> None:
        """A daemon's ``ready``: it serves clients; what it says of PMIx and
        whether it reports its store's holders is recorded."""
        node = self.records.get(daemon.node)
        if node is None:
            return
        pmix = msg.get("pmix")
        node.pmix = list(pmix) if isinstance(pmix, list) else [False, "not reported", None]
        if msg.get("holders") == []:
            node.holders = set()
        topo = msg.get("topo")
        if isinstance(topo, dict) and all(isinstance(k, str) and isinstance(v, int)
                                          and not isinstance(v, bool) and v >= 1
                                          for k, v in topo.items()):
            node.topo = dict(topo)
        pid = msg.get("pid")
        here = host_identity()
        if (isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 and here
                and msg.get("where") == here):
            node.local_pid = pid   # a daemon that sees this machine, loopback and files as we do
            self._tools_alias(pid, True)
        if node.state == "joining":
            node.state = "up"
            node.registered.set()
            log.info("daemon %s registered", node.name)

    def _tools_alias(self, pid: int, on: bool) -> None:
        """A daemon on this machine: a PMIx tool naming its pid (``--pid``)
        finds the head node's tool server, as one naming the master's
        (runtime/pmixhost/tools.py)."""
        server = self.tool_host()
        if server is not None and server.pmix is not None:
            server.pmix.tools.alias(pid, on)

    def holds(self, daemon: DaemonSession, msg: Message) -> None:
        """A daemon's ``node_holds``: ``uids`` now own items in its store
        (``holds`` true; a call, answered once recorded, before the daemon
        answers the publish that stored them) or no longer do (a notice).
        A direct client's unpublish then tells the client whether its node
        part is needed (:meth:`may_hold`): the node store of a uid that
        holds nothing there is skipped, saving a wake-up of the daemon.
        """
        uids, holds = msg.get("uids"), msg.get("holds")
        node = self.records.get(daemon.node)
        if (node is None or not isinstance(holds, bool) or not isinstance(uids, list)
                or not all(isinstance(u, int) and not isinstance(u, bool) for u in uids)):
            refuse(daemon.channel, msg, Status.ERR_BAD_PARAM, "malformed node_holds")
            return
        if node.holders is None:
            pass  # it never said it would report (ready): keep assuming any uid
        elif holds:
            node.holders.update(uids)
        else:
            node.holders.difference_update(uids)
        if "id" in msg:
            daemon.send(reply(msg["id"], Status.SUCCESS))

    def link_closed(self, name: str, reason: str) -> None:
        """Node ``name``'s link is gone: the node is lost (its listeners told),
        or stopped if the DVM is stopping."""
        node = self.records[name]
        if node.state not in ("up", "joining"):
            return
        node.state = "stopped" if self.stopping else "lost"
        node.lost_reason = reason
        node.holders = None
        if node.local_pid is not None:
            self._tools_alias(node.local_pid, False)
        if self.stopping:
            return
        log.error("lost node %s: %s", name, reason)
        for listener in self._listeners:
            listener.node_lost(name, reason)

    # ------------------------------------------------------------------
    # talking to nodes
    # ------------------------------------------------------------------

    def send(self, name: str, msg: Message) -> bool:
        """Send ``msg`` to node ``name`` if it is up; whether it was."""
        node = self.records.get(name)
        if node is None or not node.up:
            return False
        node.channel.send(msg)
        return True

    async def call(self, name: str, msg: Message) -> Message:
        """Ask node ``name`` and return its answer (``PMIX_ERR_UNREACH`` if
        it is not up, or does not answer within :data:`ACK_TIMEOUT`)."""
        node = self.records[name]
        if not node.up:
            return reply(None, Status.ERR_UNREACH, f"node {name} is not available")
        return await node.channel.call(msg, timeout=ACK_TIMEOUT)

    def launch(self, name: str, msg: Message) -> "asyncio.Future[Message]":
        """Send node ``name`` a job's ``launch``; resolved with its answer.

        Launches asked for in the same turn of the loop (a ``run_many``, the
        jobs a queue starts together) go to each node as one ``launch_many``
        message carrying all of them, answered with one result per launch
        in order; a lone launch is sent as itself.
        """
        fut = asyncio.get_running_loop().create_future()
        if not self._launches:
            asyncio.get_running_loop().call_soon(self._send_launches)
        self._launches.setdefault(name, []).append((msg, fut))
        return fut

    def _send_launches(self) -> None:
        batches, self._launches = self._launches, {}
        for name, items in batches.items():
            self._tasks.start(self._launch_batch(name, items))

    async def _launch_batch(self, name: str, items: list[tuple[Message, asyncio.Future]]) -> None:
        try:
            if len(items) == 1:
                answers = [await self.call(name, items[0][0])]
            else:
                node = self.records[name]
                launches = [{k: v for k, v in m.items() if k != "t"} for m, _ in items]
                if not node.up:
                    r = reply(None, Status.ERR_UNREACH, f"node {name} is not available")
                else:  # a node spawns each process: give a big batch its time
                    r = await node.channel.call({"t": "launch_many", "launches": launches},
                                                timeout=ACK_TIMEOUT + 0.05 * len(items))
                results = r.get("results")
                if r.get("status") == 0 and isinstance(results, list) \
                        and len(results) == len(items):
                    answers = [a if isinstance(a, dict) else
                               reply(None, Status.ERR_UNREACH, f"{name}: malformed answer")
                               for a in results]
                else:
                    answers = [r] * len(items)
        except BaseException as exc:
            for _, fut in items:
                if not fut.done():
                    fut.set_result(reply(None, Status.ERR_UNREACH,
                                         f"launch on {name} failed: {exc!r}"))
            raise
        for (_, fut), a in zip(items, answers):
            if not fut.done():
                fut.set_result(a)

    def request(self, name: str, msg: Message, answered: Callable[[Message], None]) -> bool:
        """Send a request to node ``name`` (if up); ``answered`` gets its reply."""
        node = self.records.get(name)
        if node is None or not node.up:
            return False
        node.channel.request(msg, answered)
        return True

    async def broadcast(self, msg: Message, nodes: set[str] | None = None,
                        what: str = "broadcast") -> list[tuple[str, Message]]:
        """Send ``msg`` to every up node (or those of ``nodes`` that are up)
        and wait for each to acknowledge; returns (node, reply) pairs."""
        targets = [n for n in self.records.values()
                   if n.up and (nodes is None or n.name in nodes)]
        if len(targets) == 1:   # the common one-node DVM: no task to gather
            replies = [await targets[0].channel.call(dict(msg), timeout=ACK_TIMEOUT)]
        else:
            replies = await asyncio.gather(*[n.channel.call(dict(msg), timeout=ACK_TIMEOUT)
                                             for n in targets])
        for node, r in zip(targets, replies):
            if r.get("status") != 0:
                log.warning("%s not applied on %s: %s", what, node.name, r.get("msg"))
        return [(n.name, r) for n, r in zip(targets, replies)]

    async def deliver_event(self, nodes: set[str], code: int, source: tuple[str, int],
                            rng: int, info: list, skip: tuple[str, str] | None = None) -> bool:
        """Deliver a PMIx event through the PMIx servers of ``nodes`` (those
        hosting PMIx), each to its clients in range; returns once each has
        passed it on, or after :data:`EVENT_GRACE` x 2 at most.  False when
        none of ``nodes`` hosts PMIx.  ``skip``: (node, server) -- the server
        of that node that has delivered it already (the event's origin)."""
        targets = self.hosting_pmix(nodes)
        if not targets:
            return False
        msg = {"t": "event", "code": code, "source": list(source), "range": rng,
               "info": info}
        if skip is not None:
            msg["skip"] = list(skip)
        try:
            await asyncio.wait_for(self.broadcast(msg, targets, what="event"), 2 * EVENT_GRACE)
        except asyncio.TimeoutError:
            log.warning("event %d from %s:%s not passed on by every node within %.0fs",
                        code, source[0], source[1], 2 * EVENT_GRACE)
        return True

    # ------------------------------------------------------------------
    # stopping
    # ------------------------------------------------------------------

    def begin_stop(self) -> None:
        self.stopping = True

    def shut_down(self) -> list[asyncio.Future]:
        """Stop heartbeating; tell every daemon to shut down (returns the
        acknowledgements to await in :meth:`finish`)."""
        self.stopping = True
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        acks = []
        for node in self.records.values():
            if node.channel is not None and not node.channel.closed:
                acks.append(node.channel.call({"t": "shutdown"}, timeout=10))
        return acks

    async def finish(self, acks: list[asyncio.Future]) -> None:
        """Wait for the daemons' acknowledgements and their processes; stop
        the head node's server; every node is ``stopped``."""
        if acks:
            await asyncio.gather(*acks)
        await self.launcher.finish(timeout=10)
        for node in self.records.values():
            if node.server is not None:
                await node.server.stop()
            node.state = "stopped"
        if self.tool_side is not None:
            if self._tool_start is not None and not self._tool_start.done():
                await asyncio.wait([self._tool_start], timeout=30)
            await self.tool_side.stop()


def choose_head_node(setting: str, hosts: list[HostSpec]) -> str | None:
    """Which node the master serves itself (``pydvm_head_node``).

    ``auto``: the node named like this machine (``socket.gethostname()``, or
    its short form), if the DVM has one -- the only node of a one-shot
    ``pydvm run`` and of a ``pydvm start`` without ``--hosts``, or the
    master's own host in a host list; ``none``: no head node; otherwise the
    named node, which must be one of ``hosts``.  Raises StartError.
    """
    names = [h.name for h in hosts]
    if setting == "none":
        return None
    if setting == "auto":
        me = socket.gethostname()
        for candidate in (me, me.split(".")[0]):
            if candidate in names:
                return candidate
        return None
    if setting not in names:
        raise StartError(f"pydvm_head_node {setting!r} is not one of the DVM's hosts "
                         f"({', '.join(names)})")
    return setting
