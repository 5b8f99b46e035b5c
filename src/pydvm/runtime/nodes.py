"""The master's nodes: launching daemons, their registration, heartbeats, node loss.

A node's state moves ``launching -> joining -> up -> lost | stopped``:
``joining`` once its daemon has authenticated, ``up`` once the daemon says
it serves clients, ``lost`` when its link breaks or stays silent for three
heartbeat periods, ``stopped`` when the DVM shuts it down.  Only ``up``
nodes get work: the default mapping of a job and a new session use the
nodes that are up at that moment (:meth:`NodesMixin.live_hosts`), and a job
naming only nodes that are not up is refused with their names.

This is one concern of :class:`~pydvm.runtime.master.Master`, written as a
mixin; it owns ``nodes`` and ``_heartbeat``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import params as P
from ..errors import Status
from ..wire import Channel, LocalEnd, Message, heartbeat, local_pair, reply
from .guard import Guardian
from .core import LOST_STATUS, NodeLost  # noqa: F401 (LOST_STATUS: re-exported)
from .jobs import HostSpec
from .launch import DaemonCommand, LaunchError, stderr_sink
from .node import NodeServer
from .peers import DaemonSession

if TYPE_CHECKING:
    from .master import Master

log = logging.getLogger("pydvm.master")

#: How long start-up waits for every daemon to register.
REGISTER_TIMEOUT = 60.0
#: How long a daemon gets to acknowledge a purge or stats request.
ACK_TIMEOUT = 30.0
#: Exit status recorded for processes lost with their node.


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
    #: (``node_holds``; see runtime/direct.py).  None: not reported -- a
    #: daemon without direct data, or the head node -- so assume any.
    holders: set[int] | None = None

    @property
    def up(self) -> bool:
        return self.state == "up" and self.channel is not None


class NodesMixin:
    """Launching, registering, heartbeating and losing nodes."""

    nodes: dict[str, NodeRecord]

    def live_hosts(self: "Master", hosts: list[HostSpec]) -> list[HostSpec]:
        """The entries of ``hosts`` whose node is up, in order."""
        return [h for h in hosts if self.nodes[h.name].up]

    def up_channels(self: "Master") -> list[Channel]:
        return [n.channel for n in self.nodes.values() if n.up]

    async def _launch_daemons(self: "Master") -> None:
        """Serve the head node here, start every other node's daemon with the
        DVM's launcher; return once all have reported in.  A daemon that ends
        before reporting in fails the start-up with what it wrote on stderr
        (:meth:`_start_failure`)."""
        for node in self.nodes.values():
            if node.name == self.head_node:
                await self._serve_head(node)
        daemons = [n for n in self.nodes if n != self.head_node]
        launcher = self.launcher
        cmd = DaemonCommand(str(self.uri), self.log_dir,
                            self.values["pydvm_remote_python"] or sys.executable)
        launcher.tail.sink = stderr_sink(self.log_dir)
        if daemons:
            try:
                await launcher.start(daemons, cmd, self.secret, self.values)
            except LaunchError as exc:
                raise StartError(str(exc)) from None
        for name, proc in launcher.processes().items():
            self.nodes[name].process = proc
        waits = {n: asyncio.ensure_future(self.nodes[n].registered.wait()) for n in daemons}
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
                    raise StartError(self._start_failure(failed))
        finally:
            for w in waits.values():
                w.cancel()
        # From now on a daemon that dies is noticed as before, by its link
        # closing (or falling silent); but a launcher that has lost every
        # daemon for good (the srun step ended) ends the DVM.
        launcher.on_ended = self._launcher_ended
        self._heartbeat = self._spawn(heartbeat(self.up_channels,
                                                self.values["pydvm_heartbeat_interval"]))

    async def _serve_head(self: "Master", node: NodeRecord) -> None:
        """Serve the head node in this process: a NodeServer joined to the
        master by an in-process link instead of a daemon over TCP."""
        mine, its = local_pair(f"head node {node.name}", "master")
        DaemonSession(mine, node.name)
        mine.on_message = self._on_daemon
        node.channel = mine
        node.state = "joining"
        from .routing import MasterRouter

        node.server = NodeServer(node.name, its, self._welcome(), guardian=self.guardian(),
                                 router=MasterRouter(self))
        await node.server.start()
        await node.registered.wait()

    def guardian(self: "Master") -> Guardian:
        """This process's guardian (:mod:`pydvm.runtime.guard`), forked on
        first use: it removes the head node's processes and the master's
        socket directories however the master dies."""
        if self._guardian is None:
            self._guardian = Guardian()
            self._guardian.start()
        return self._guardian

    def _welcome(self: "Master") -> dict[str, Any]:
        """What a node is told when it joins."""
        return {"params": P.to_wire(self.resolved), "dvm": self.dvmid,
                "dvm_nspace": self.dvm_nspace, "multi_user": self.multi_user,
                **self._direct_welcome()}

    def _start_failure(self: "Master", failed: list[str]) -> str:
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
        if self.log_dir:
            text += f"\n(logs in {self.log_dir})"
        return text

    def _launcher_ended(self: "Master", reason: str) -> None:
        if not self._stopping:
            log.error("%s: every daemon is gone; stopping the DVM", reason)
            self._spawn(self.stop())

    def _register_daemon(self: "Master", ch: Channel, msg: Message) -> None:
        name = msg.get("node")
        node = self.nodes.get(name) if isinstance(name, str) else None
        if node is None or node.state != "launching" or node.server is not None:
            why = f"unexpected daemon for node {name!r}"
            ch.send(reply(msg.get("id"), Status.ERR_NO_PERMISSIONS, why))
            ch.close(why, error=True)
            return
        DaemonSession(ch, name)
        ch.name = f"daemon {name}"
        ch.on_message = self._on_daemon
        node.channel = ch
        node.state = "joining"  # up once it says it is ready to serve clients
        ch.send(reply(msg.get("id"), Status.SUCCESS, **self._welcome()))

    def _daemon_ready(self: "Master", node_name: str) -> None:
        node = self.nodes[node_name]
        if node.state == "joining":
            node.state = "up"
            node.registered.set()
            log.info("daemon %s registered", node.name)

    def _node_lost(self: "Master", name: str, reason: str) -> None:
        node = self.nodes[name]
        if node.state not in ("up", "joining"):
            return
        node.state = "stopped" if self._stopping else "lost"
        node.lost_reason = reason
        node.holders = None
        if self._stopping:
            return
        log.error("lost node %s: %s", name, reason)
        self._feed(NodeLost(name, reason))

    async def _broadcast(self: "Master", msg: Message, nodes: set[str] | None = None,
                         what: str = "broadcast") -> list[Any]:
        """Send ``msg`` to every up node (or those of ``nodes`` that are up) and
        wait for each to acknowledge; returns their replies."""
        targets = [n for n in self.nodes.values()
                   if n.up and (nodes is None or n.name in nodes)]
        replies = await asyncio.gather(*[n.channel.call(dict(msg), timeout=ACK_TIMEOUT)
                                         for n in targets])
        for node, r in zip(targets, replies):
            if r.get("status") != 0:
                log.warning("%s not applied on %s: %s", what, node.name, r.get("msg"))
        return replies


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

