"""Cross-DVM relay: a master that keeps no data store of its own (SPEC 7).

``pydvm start --data-server-uri URI`` makes this DVM's master a *tool* of
the DVM at URI: one connection per DVM, however many daemons.  Every data
request its daemons relay (publish, lookup, unpublish) and every purge its
lifetimes cause (PROC, APP, NSPACE, SESSION) is reissued there, carrying
the originating process as ``requestor`` and its uid/gid as
``req_uid``/``req_gid`` (plus ``req_app`` so APP purges can match).  The
remote store honours those claims from root and from its own user (who
holds its secret); any other user may claim only its own uid, which is what
a single-user relay of that user sends (it connects on a multi-user data
server's tool socket when it has no secret for it).

LOCAL-range requests are *not* relayed: LOCAL means "behind the same
daemon", which only this DVM's daemons can judge (the remote DVM sees one
tool connection for all of them), so they stay in the daemons' own stores.

No relayed request waits on a dead link:

* the link is heartbeated (a ``ping`` request every
  ``pydvm_heartbeat_interval`` seconds); silent for three periods of this
  process's running time -- a partition that sends no FIN, a data server
  stopped -- it is closed, and every request on it is answered
  ``PMIX_ERR_UNREACH`` (a stall of the relay's own machine is not silence:
  :func:`pydvm.wire.heartbeat`);
* each relayed request has a deadline: a lookup's own timeout (if any)
  plus :data:`DEADLINE_PERIODS` heartbeat periods, other requests that many
  periods alone; a waiting lookup without timeout relies on the heartbeat.
  Past its deadline a request is withdrawn there and answered UNREACH
  (time this process did not run -- a stall of its machine -- does not
  count: :mod:`pydvm.stalls`);
* while the link is down, requests fail at once with UNREACH, and a
  background task reconnects every :data:`RETRY` seconds (re-reading the
  secret), so a data server that comes back -- the same DVM after a
  partition heals, or a new one under the same URI -- is used again.

Lifetime purges are durable: each is kept, in order, until the data
server acknowledges it; one that gets no acknowledgement (the link drops)
is re-sent, in order, as soon as the relay reconnects, and applying a purge
twice removes nothing more (its process, job or session has ended, so
nothing new is published under it).  :meth:`Relay.purge` returns a future
that is done once the purge is *applied* (acknowledged) or *queued* for
re-send (the link is down); the master reports a job's end only then.  A
purge subsumes queued ones of the same namespace that it covers (a job's
NSPACE purge its PROC and APP purges, a SESSION purge all of them), so the
queue holds at most a few entries per namespace.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ...enums import Persistence
from ...errors import Status
from ...stalls import stalls
from ...store import Caller
from ...store.rules import expires_by
from ...wire import Channel, Message, ReplyCallback, heartbeat, reply
from ..shared.auth import DvmUri, UriError, connect, read_secret, tool_socket_path

log = logging.getLogger("pydvm.relay")

#: Seconds between reconnection attempts while the remote DVM is away.
RETRY = 1.0
#: A relayed request is answered UNREACH this many heartbeat periods after
#: its own timeout (or after it was sent, for requests that do not wait).
DEADLINE_PERIODS = 6


#: Which queued purges a new one makes redundant: the persistences a
#: horizon removes (the store's own table), compared as sets.
_LIFETIMES = (Persistence.PROC, Persistence.APP, Persistence.NSPACE, Persistence.SESSION)


def _covers(new: Message, old: Message) -> bool:
    """True if purge ``new`` removes at least everything purge ``old`` does."""
    if new["nspace"] != old["nspace"]:
        return False
    hn, ho = Persistence(new["horizon"]), Persistence(old["horizon"])
    if hn is Persistence.PROC:
        return ho is Persistence.PROC and new["rank"] == old["rank"]
    if hn is Persistence.APP and ho is Persistence.APP and new["app_idx"] != old["app_idx"]:
        return False
    if hn is Persistence.APP and ho is Persistence.PROC:
        return False  # a PROC purge may name a rank of another application
    return all(expires_by(p, hn) for p in _LIFETIMES if expires_by(p, ho))


@dataclass(eq=False)
class _Purge:
    msg: Message
    done: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop()
                                 .create_future())

    def settle(self, how: str) -> None:
        if not self.done.done():
            self.done.set_result(how)


class Relay:
    """The connection from this master to the remote data server."""

    def __init__(self, uri: DvmUri, values: dict[str, Any] | None = None) -> None:
        self.uri = uri
        self.interval = float((values or {}).get("pydvm_heartbeat_interval", 2.0))
        self.channel: Channel | None = None
        self._task: asyncio.Task | None = None
        self._beat: asyncio.Task | None = None
        self._stopped = False
        self.connected = asyncio.Event()
        #: purges not yet acknowledged by the data server, in issue order.
        self._purges: deque[_Purge] = deque()

    async def start(self) -> None:
        """Connect once (raising ConnectionError with the reason), then keep connected."""
        await self._connect()
        self._task = asyncio.ensure_future(self._keep_connected())
        self._beat = asyncio.ensure_future(heartbeat(
            lambda: [self.channel] if self.channel is not None else [], self.interval, ask=True))

    async def _connect(self) -> None:
        try:
            secret: bytes | None = read_secret(self.uri.dvmid)
            unix = None
        except UriError:
            # Not our own DVM: a multi-user data server knows us by our uid.
            sock = tool_socket_path(self.uri.dvmid)
            if not sock.exists():
                raise
            secret, unix = None, str(sock)
        ch, _ = await connect(self.uri, secret, "tool", self._on_message, self._on_close,
                              fields={"relay": True}, unix_path=unix)
        ch.name = f"data server {self.uri}"
        self.channel = ch
        self.connected.set()
        log.info("relaying data requests to %s", self.uri)
        if self._purges:
            log.info("re-sending %d purge(s) to %s", len(self._purges), self.uri)
        for p in list(self._purges):
            self._send_purge(p)

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
        pass  # the remote master sends us only replies

    def stop(self) -> None:
        self._stopped = True
        for task in (self._task, self._beat):
            if task is not None:
                task.cancel()
        if self.channel is not None:
            self.channel.close("DVM stopped")

    # ------------------------------------------------------------------

    @staticmethod
    def claims(caller: Caller) -> dict[str, Any]:
        return {"requestor": [caller.nspace, caller.rank], "req_uid": caller.uid,
                "req_gid": caller.gid, "req_app": caller.app_idx}

    def deadline(self, msg: Message) -> float | None:
        """Seconds after which a relayed ``msg`` is given up (None: never)."""
        grace = DEADLINE_PERIODS * self.interval
        if msg.get("t") == "lookup" and msg.get("wait") is not None:
            timeout = msg.get("timeout")
            if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) \
                    and timeout > 0:
                return float(timeout) + grace
            return None
        return grace

    def request(self, msg: Message, callback: ReplyCallback) -> int | None:
        """Reissue ``msg`` remotely; ``callback`` gets exactly one reply.

        Returns the remote request id (for a later ``cancel``), or None if
        the remote DVM is unreachable -- then ``callback`` has already run
        with an UNREACH reply.  A request past its :meth:`deadline` is
        withdrawn remotely and answered UNREACH.
        """
        ch = self.channel
        if ch is None or ch.closed:
            callback(reply(msg.get("id"), Status.ERR_UNREACH,
                           f"the data server {self.uri} is unreachable"))
            return None
        limit = self.deadline(msg)
        timer: list[asyncio.TimerHandle] = []

        def answered(r: Message) -> None:
            if timer:
                timer[0].cancel()
            callback(r)

        rid = ch.request(msg, answered)
        if rid is not None and limit is not None:
            loop = asyncio.get_running_loop()
            sent = time.monotonic()
            counted = [0.0]  # stall time already added to the deadline

            def expire() -> None:
                if ch.closed:
                    return
                # Time this process did not run is not the data server's
                # silence: a deadline that fell in a stall is moved by it.
                stalls.check(timer[0].when())  # (the loop's clock is time.monotonic)
                more = stalls.within(sent) - counted[0]
                if more > 0.01:
                    counted[0] += more
                    timer[0] = loop.call_later(more, expire)
                    return
                ch.withdraw(rid)
                log.warning("relayed %s got no answer from %s within %.1fs", msg.get("t"),
                            self.uri, limit)
                callback(reply(rid, Status.ERR_UNREACH,
                               f"no answer from the data server {self.uri} within {limit:.0f}s"))
            timer.append(loop.call_later(limit, expire))
        return rid

    def cancel(self, remote_id: int) -> None:
        ch = self.channel
        if ch is not None and not ch.closed:
            ch.withdraw(remote_id)

    def purge(self, horizon: int, nspace: str, rank: int | None = None,
              app_idx: int | None = None) -> asyncio.Future:
        """Have the remote store apply one of this DVM's lifetimes, durably.

        Returns a future whose result is ``"applied"`` once the data server
        acknowledged it, or ``"queued"`` once it is known to wait for a
        reconnection (it will be re-sent then); ``"refused"`` if the data
        server rejected it, ``"superseded"`` if a later purge covers it.
        """
        msg = {"t": "purge", "horizon": int(horizon), "nspace": nspace, "rank": rank,
               "app_idx": app_idx}
        for old in list(self._purges):
            if _covers(msg, old.msg):
                self._purges.remove(old)
                old.settle("superseded")
        p = _Purge(msg)
        self._purges.append(p)
        self._send_purge(p)
        return p.done

    @property
    def pending_purges(self) -> int:
        """Purges waiting for the data server's acknowledgement."""
        return len(self._purges)

    def _send_purge(self, p: _Purge) -> None:
        ch = self.channel
        if ch is None or ch.closed:
            p.settle("queued")
            return

        def answered(r: Message) -> None:
            st = r.get("status")
            if st == 0:
                if p in self._purges:
                    self._purges.remove(p)
                p.settle("applied")
            elif st == int(Status.ERR_UNREACH):
                log.warning("purge of %s (%s) not acknowledged by %s: queued for re-send",
                            p.msg["nspace"], Persistence(p.msg["horizon"]).name, self.uri)
                p.settle("queued")
            else:
                log.warning("data server refused a purge: %s", r.get("msg"))
                if p in self._purges:
                    self._purges.remove(p)
                p.settle("refused")

        ch.request(dict(p.msg), answered)
