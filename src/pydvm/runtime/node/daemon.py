"""The daemon: the process that serves one node of a DVM.

It connects to the master (TCP, the DVM secret's challenge), hosts the
node's :class:`~pydvm.runtime.node.server.NodeServer` -- which launches and reaps
the node's job processes, serves their clients and holds the node store --
and heartbeats the master.  If the master connection is lost, the daemon
kills its processes and exits: a daemon without its DVM has nobody to report
to.  A master that is merely silent (its connection open: stopped, or its
machine stalled) is waited for ``pydvm_master_grace`` seconds of this
daemon's running time, the node's jobs running on meanwhile; only then is
it given up the same way.  Before its event loop starts, ``pydvm daemon``
forks the guardian (:mod:`pydvm.runtime.shared.guard`) that kills the node's job
processes if the daemon dies however it dies.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import signal

from ...wire import Channel, heartbeat
from ..shared.auth import DvmUri, connect
from ..shared.guard import Guardian
from ..shared.logs import store_verbosity
from .server import NodeServer

log = logging.getLogger("pydvm.daemon")


class Daemon:
    def __init__(self, master_uri: DvmUri, node: str, secret: bytes,
                 guardian: Guardian | None = None) -> None:
        self.uri = master_uri
        self.node = node
        self.secret = secret
        self.guardian = guardian or Guardian()
        self.master: Channel | None = None
        self.server: NodeServer | None = None
        self._lost = asyncio.Event()

    async def run(self) -> int:
        self.master, welcome = await connect(
            self.uri, self.secret, "daemon", lambda ch, m: None, self._on_master_lost,
            fields={"node": self.node})
        self.server = NodeServer(self.node, self.master, welcome, guardian=self.guardian,
                                 vouch=(self.secret, str(self.uri)))
        # The DVM's parameters arrive with the welcome: the store's trace too.
        store_verbosity(self.server.values["prte_data_server_verbose"])
        await self.server.start()
        # SIGTERM (Slurm ending the allocation or the step, an admin): end the
        # node's processes and leave, as when the master is lost.
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, self._terminated)
        values = self.server.values
        beat = asyncio.ensure_future(heartbeat(
            lambda: [self.master], values["pydvm_heartbeat_interval"],
            grace=float(values.get("pydvm_master_grace", 0) or 0), torpid=self._master_torpid))
        lost = asyncio.ensure_future(self._lost.wait())
        try:
            await asyncio.wait([asyncio.ensure_future(self.server.done.wait()), lost],
                               return_when=asyncio.FIRST_COMPLETED)
            if self._lost.is_set():
                # The master is gone: end the processes quickly, then exit.
                await self.server.stop(grace=1.0)
        finally:
            beat.cancel()
        return 0

    def _terminated(self) -> None:
        if self.server is not None and not self.server.done.is_set():
            log.warning("SIGTERM: killing local processes and exiting")
        self._lost.set()

    def _master_torpid(self, ch: Channel, silent: float | None) -> None:
        """The master fell silent (``silent`` seconds, past three heartbeat
        periods) or was heard again (None): the node's jobs run on meanwhile."""
        if silent is None:
            log.warning("the master is heard again; the node carries on")
        else:
            log.warning("the master has been silent for %.1fs (while this daemon ran): the "
                        "node's jobs keep running; it is given up after %.0fs of silence",
                        silent, max(3 * self.server.values["pydvm_heartbeat_interval"],
                                    float(self.server.values.get("pydvm_master_grace", 0) or 0)))

    def _on_master_lost(self, ch: Channel, reason: str) -> None:
        if self.server is not None and not self.server.done.is_set():
            log.error("lost the master (%s); killing local processes and exiting", reason)
        self._lost.set()


async def run_daemon(master_uri: str, node: str, secret: bytes,
                     guardian: Guardian | None = None) -> int:
    d = Daemon(DvmUri.parse(master_uri), node, secret, guardian)
    try:
        return await d.run()
    except ConnectionError as exc:
        log.error("daemon %s cannot join the DVM: %s", node, exc)
        return 1
    finally:
        if d.server is not None and d.server.socket_dir is not None:
            shutil.rmtree(d.server.socket_dir, ignore_errors=True)
