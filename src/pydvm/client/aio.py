"""The asyncio client: the same operations as :class:`pydvm.Client`, awaitable.

Several requests may be in flight on one connection at once (a waiting
lookup does not hold up a publish)::

    async with await pydvm.aio.Client.connect() as c:
        await c.publish({"port": 5555})
        r = await c.lookup(["peer"], wait=True, timeout=10)
"""

from __future__ import annotations

import asyncio
from typing import Any, Iterable, Mapping

from . import direct as _direct, proto as _proto
from .proto import Found, LookupResult
from ..enums import Persistence, Range
from ..errors import UnreachableError, error_for
from ..wire import Channel, Message

__all__ = ["Client", "Found", "LookupResult"]


class Client:
    """An asyncio connection to this node's daemon; make one with :meth:`connect`.

    The same operations as :class:`pydvm.Client`, as coroutines; several may
    be in flight at once.  Cancelling one (``task.cancel()``,
    ``asyncio.wait_for``) withdraws it: a cancelled waiting lookup leaves
    the store.  Attributes: ``nspace``, ``rank``, ``node``, ``direct``.

    On a daemon's node, master-store requests take the direct path to the
    master, as for :class:`pydvm.Client` (the connection opens on the first
    such request).
    """

    def __init__(self, channel: Channel, nspace: str, rank: int, node: str | None,
                 direct: "_direct.DirectInfo | None" = None) -> None:
        self._ch = channel
        self.nspace = nspace
        self.rank = rank
        self.node = node
        self._direct_info = direct
        self._direct_state = (_direct.UNUSED if direct is not None and direct.usable
                              else _direct.OFF)
        self._dch: Channel | None = None
        self._opening: asyncio.Lock | None = None
        #: answers of publishes sent with ack=False, not yet in.
        self._unacked: set[asyncio.Future] = set()
        #: the first refusal among them, until raised.
        self._failed: Exception | None = None

    @property
    def direct(self) -> bool:
        """True while master-store requests take the direct path."""
        return self._direct_state == _direct.OPEN and not self._dch.closed

    @classmethod
    async def connect(cls, server: str | None = None, nspace: str | None = None,
                      rank: int | None = None) -> "Client":
        """Connect to the daemon and introduce this process.

        Arguments default to the job environment, as for
        :class:`pydvm.Client`.  Raises :class:`~pydvm.errors.UnreachableError`
        (not in a job, or the daemon cannot be reached) or
        :class:`~pydvm.errors.NoPermissionsError` (the daemon does not know
        this process).
        """
        server, nspace, rank = _proto.identity_from_env(nspace, rank, server)
        loop = asyncio.get_running_loop()
        try:
            _, ch = await loop.create_unix_connection(
                lambda: Channel(_ignore, name=f"daemon {server}"), server)
        except OSError as exc:
            raise UnreachableError(f"cannot connect to the daemon at {server}: {exc}") from None
        r = await ch.call(_proto.hello_msg(nspace, rank))
        try:
            _proto.check(r)
        except BaseException:
            ch.close("hello refused")
            raise
        return cls(ch, nspace, rank, r.get("node"), _direct.DirectInfo.from_hello(r, nspace, rank))

    async def publish(self, data: Mapping[str, Any], *, range: Range = Range.SESSION,
                      persistence: Persistence | None = None, access_uids: Iterable[int] = (),
                      access_gids: Iterable[int] = (), replace: bool = False,
                      ack: bool = True) -> None:
        """Publish ``data`` as one item; returns once the store accepted it.

        Arguments, refusals (raised as :mod:`pydvm.errors` exceptions) and
        eviction as :meth:`pydvm.Client.publish`.  ``ack=False`` returns
        once the request is sent; a refusal is raised by the next call,
        :meth:`flush` or :meth:`close`.
        """
        build = lambda: _proto.publish_msg(  # noqa: E731
            data, range, persistence, access_uids, access_gids, replace)
        if ack:
            _proto.check(await self._route("publish", range, build))
            return
        self._check_failed()
        to_master, _ = _direct.master_part("publish", range)
        dch = await self._direct_channel() if to_master else None
        ch = self._ch if dch is None else dch
        if ch.closed:
            raise self._closed_error(ch)
        fut = asyncio.get_running_loop().create_future()
        self._unacked.add(fut)

        def answered(r: Message) -> None:
            self._unacked.discard(fut)
            if self._failed is None and not _proto._succeeded(r):
                st = _proto.status_of(r)
                self._failed = error_for(
                    st, "an earlier publish, sent without waiting for its answer, failed: "
                        f"{r.get('msg') or st.pmix_name}")
            if not fut.done():
                fut.set_result(None)

        try:
            ch.request(build(), answered)
        except _proto.UNENCODABLE as exc:
            self._unacked.discard(fut)
            raise _proto.cannot_encode(exc) from None

    async def add(self, key: str, delta: int | str | bytes = 1, *, range: Range = Range.SESSION,
                  persistence: Persistence | None = None, access_uids: Iterable[int] = (),
                  access_gids: Iterable[int] = ()) -> Any:
        """Add ``delta`` atomically; returns the new value (as
        :meth:`pydvm.Client.add`)."""
        return _proto.update_result(await self._route(
            "update", range, lambda: _proto.update_msg(
                key, "add", delta, None, range, persistence, access_uids, access_gids)))[0]

    async def compare_and_set(self, key: str, expected: Any, desired: Any, *,
                              range: Range = Range.SESSION,
                              persistence: Persistence | None = None,
                              access_uids: Iterable[int] = (),
                              access_gids: Iterable[int] = ()) -> tuple[Any, bool]:
        """Store ``desired`` if ``key`` holds ``expected``; returns ``(value,
        stored)`` (as :meth:`pydvm.Client.compare_and_set`)."""
        return _proto.update_result(await self._route(
            "update", range, lambda: _proto.update_msg(
                key, "cas", desired, expected, range, persistence, access_uids, access_gids)))

    async def append(self, key: str, suffix: str | bytes, *, range: Range = Range.SESSION,
                     persistence: Persistence | None = None, access_uids: Iterable[int] = (),
                     access_gids: Iterable[int] = ()) -> Any:
        """Append ``suffix`` atomically; returns the new value (as
        :meth:`pydvm.Client.append`)."""
        return _proto.update_result(await self._route(
            "update", range, lambda: _proto.update_msg(
                key, "append", suffix, None, range, persistence, access_uids, access_gids)))[0]

    async def keys(self, prefix: str = "", *, range: Range = Range.SESSION,
                   limit: int | None = None) -> list[str]:
        """The keys under ``prefix`` a lookup could return (as
        :meth:`pydvm.Client.keys`)."""
        return _proto.keys_result(await self._route(
            "keys", range, lambda: _proto.keys_msg(prefix, range, limit)))

    async def count(self, prefix: str = "", *, range: Range = Range.SESSION) -> int:
        """How many keys :meth:`keys` would list without a limit."""
        return _proto.count_of(await self._route(
            "keys", range, lambda: _proto.keys_msg(prefix, range, 0)))

    async def flush(self) -> None:
        """Wait for the answers of the publishes sent with ``ack=False``;
        raise the first refusal among them (once)."""
        if self._unacked:
            await asyncio.gather(*list(self._unacked))
        self._check_failed()

    def _check_failed(self) -> None:
        failed, self._failed = self._failed, None
        if failed is not None:
            raise failed

    async def lookup(self, keys: Iterable[str] | str, *, range: Range = Range.SESSION,
                     wait: bool | int = False, timeout: float | None = None) -> LookupResult:
        """Look keys up; returns a :class:`LookupResult`.

        ``wait``/``timeout`` and the exceptions raised as
        :meth:`pydvm.Client.lookup`; other requests on this client proceed
        while a lookup waits.
        """
        return _proto.lookup_result(await self._route(
            "lookup", range, lambda: _proto.lookup_msg(keys, range, wait, timeout)))

    async def unpublish(self, keys: Iterable[str] | str | None = None) -> int:
        """Remove the named keys from every item this user owns; with no keys,
        everything this process published.  Succeeds whether or not anything
        matched; returns how many keys it removed."""
        return _proto.count_of(await self._route(
            "unpublish", None,
            lambda node_only=False: _proto.unpublish_msg(keys, node_only)))

    async def close(self) -> None:
        """Close the connection once the publishes sent with ``ack=False``
        are answered (raising a refusal among them, as :meth:`flush`);
        requests still in flight get :class:`~pydvm.errors.UnreachableError`."""
        try:
            await self.flush()
        finally:
            self._close()

    def _close(self) -> None:
        self._ch.close("client closed")
        if self._dch is not None:
            self._dch.close("client closed")

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            await self.close()
        else:
            self._close()

    async def _route(self, t: str, rng, build) -> Message:
        """Send a request where the routing table says (see
        :meth:`pydvm.Client._route`) and return its answer."""
        self._check_failed()
        to_master, to_node = _direct.master_part(t, rng)
        dch = await self._direct_channel() if to_master else None
        if dch is None:
            return await self._call(self._ch, build())
        master = await self._call(dch, build())
        if not to_node or not _proto.node_part_needed(master):
            return master
        node = await self._call(self._ch, build(True))
        return _proto.combined(master, node)

    async def _direct_channel(self) -> Channel | None:
        if self._direct_state == _direct.OFF:
            return None
        if self._direct_state == _direct.UNUSED:
            if self._opening is None:
                self._opening = asyncio.Lock()
            async with self._opening:
                if self._direct_state == _direct.UNUSED:
                    if self._ch.closed:  # our process was reaped: act for nobody
                        raise _direct.daemon_gone()
                    self._dch = await _direct.open_async(self._direct_info)
                    self._direct_state = _direct.OFF if self._dch is None else _direct.OPEN
        return self._dch

    def _closed_error(self, ch: Channel) -> UnreachableError:
        who = "master (direct)" if ch is self._dch else "daemon"
        return UnreachableError(f"{who} connection closed: {ch.close_reason}")

    async def _call(self, ch: Channel, msg: Message) -> Message:
        if ch.closed:
            raise self._closed_error(ch)
        try:
            return await ch.call(msg)
        except _proto.UNENCODABLE as exc:
            raise _proto.cannot_encode(exc) from None


def _ignore(ch: Channel, msg: Message) -> None:
    pass
