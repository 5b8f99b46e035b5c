"""Cross-DVM relay: a master that keeps no data store of its own (SPEC 7).

``pydvm start --data-server-uri URI`` makes this DVM's master a *tool* of
the DVM at URI: one connection per DVM, however many daemons.  Every data
request its daemons relay (publish, lookup, unpublish) and every purge its
lifetimes cause (PROC, APP, NSPACE, SESSION) is reissued there, carrying
the originating process as ``requestor`` and its uid/gid as
``req_uid``/``req_gid`` (plus ``req_app`` so APP purges can match).  The
remote store honours those claims because they come from a tool.

LOCAL-range requests are *not* relayed: LOCAL means "behind the same
daemon", which only this DVM's daemons can judge (the remote DVM sees one
tool connection for all of them), so they stay in the daemons' own stores.

If the remote DVM is unreachable, relayed requests fail at once with
``PMIX_ERR_UNREACH`` (no caller waits on a dead link) and a background task
retries the connection every :data:`RETRY` seconds, re-reading the secret,
so a remote DVM restarted under the same URI is picked up again.  Purges
issued while it is away are lost with the remote store's contents anyway.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ..errors import Status
from ..store import Caller
from ..wire import Channel, Message, ReplyCallback, reply
from .auth import DvmUri, connect, read_secret

log = logging.getLogger("pydvm.relay")

#: Seconds between reconnection attempts while the remote DVM is away.
RETRY = 1.0


class Relay:
    """The connection from this master to the remote data server."""

    def __init__(self, uri: DvmUri) -> None:
        self.uri = uri
        self.channel: Channel | None = None
        self._task: asyncio.Task | None = None
        self._stopped = False
        self.connected = asyncio.Event()

    async def start(self, timeout: float = 10.0) -> None:
        """Connect once (raising ConnectionError with the reason), then keep connected."""
        await self._connect()
        self._task = asyncio.ensure_future(self._keep_connected())

    async def _connect(self) -> None:
        secret = read_secret(self.uri.dvmid)
        ch, _ = await connect(self.uri, secret, "tool", self._on_message, self._on_close)
        ch.name = f"data server {self.uri}"
        self.channel = ch
        self.connected.set()
        log.info("relaying data requests to %s", self.uri)

    async def _keep_connected(self) -> None:
        while not self._stopped:
            if self.channel is None or self.channel.closed:
                try:
                    await self._connect()
                except (ConnectionError, OSError, ValueError) as exc:
                    log.debug("data server %s still unreachable: %s", self.uri, exc)
            await asyncio.sleep(RETRY)

    def _on_close(self, ch: Channel, reason: str) -> None:
        if ch is self.channel:
            self.connected.clear()
            if not self._stopped:
                log.warning("lost the data server %s: %s", self.uri, reason)

    def _on_message(self, ch: Channel, msg: Message) -> None:
        pass  # the remote master sends us only replies and pings

    def stop(self) -> None:
        self._stopped = True
        if self._task is not None:
            self._task.cancel()
        if self.channel is not None:
            self.channel.close("DVM stopped")

    # ------------------------------------------------------------------

    @staticmethod
    def claims(caller: Caller) -> dict[str, Any]:
        return {"requestor": [caller.nspace, caller.rank], "req_uid": caller.uid,
                "req_gid": caller.gid, "req_app": caller.app_idx}

    def request(self, msg: Message, callback: ReplyCallback) -> int | None:
        """Reissue ``msg`` remotely; ``callback`` gets exactly one reply.

        Returns the remote request id (for a later ``cancel``), or None if
        the remote DVM is unreachable -- then ``callback`` has already run
        with an UNREACH reply.
        """
        ch = self.channel
        if ch is None or ch.closed:
            callback(reply(msg.get("id"), Status.ERR_UNREACH,
                           f"the data server {self.uri} is unreachable"))
            return None
        return ch.request(msg, callback)

    def cancel(self, remote_id: int) -> None:
        ch = self.channel
        if ch is not None and not ch.closed:
            ch.forget(remote_id)
            ch.send({"t": "cancel", "ref": remote_id})

    def purge(self, horizon: int, nspace: str, rank: int | None = None,
              app_idx: int | None = None) -> None:
        """Ask the remote store to apply one of this DVM's lifetimes."""
        self.request({"t": "purge", "horizon": int(horizon), "nspace": nspace, "rank": rank,
                      "app_idx": app_idx}, _ignore)


def _ignore(r: Message) -> None:
    if r.get("status") not in (0, int(Status.ERR_UNREACH)):
        log.warning("data server refused a purge: %s", r.get("msg"))
