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

from . import _proto
from ._proto import Found, LookupResult
from .enums import Persistence, Range
from .errors import BadParamError, UnreachableError
from .wire import Channel, Message

__all__ = ["Client", "Found", "LookupResult"]


class Client:
    """An asyncio connection to this node's daemon; make one with :meth:`connect`.

    The same operations as :class:`pydvm.Client`, as coroutines; several may
    be in flight at once.  Cancelling one (``task.cancel()``,
    ``asyncio.wait_for``) withdraws it: a cancelled waiting lookup leaves
    the store.  Attributes: ``nspace``, ``rank``, ``node``.
    """

    def __init__(self, channel: Channel, nspace: str, rank: int, node: str | None,
                 envelope: bool = True) -> None:
        self._ch = channel
        self.nspace = nspace
        self.rank = rank
        self.node = node
        self._envelope = envelope

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
        return cls(ch, nspace, rank, r.get("node"), bool(r.get("envelope", True)))

    async def publish(self, data: Mapping[str, Any], *, range: Range = Range.SESSION,
                      persistence: Persistence | None = None, access_uids: Iterable[int] = (),
                      access_gids: Iterable[int] = (), replace: bool = False) -> None:
        """Publish ``data`` as one item; returns once the store accepted it.

        Arguments, refusals (raised as :mod:`pydvm.errors` exceptions) and
        eviction as :meth:`pydvm.Client.publish`.
        """
        _proto.check(await self._call(_proto.publish_msg(
            data, range, persistence, access_uids, access_gids, replace, self._envelope)))

    async def lookup(self, keys: Iterable[str] | str, *, range: Range = Range.SESSION,
                     wait: bool | int = False, timeout: float | None = None) -> LookupResult:
        """Look keys up; returns a :class:`LookupResult`.

        ``wait``/``timeout`` and the exceptions raised as
        :meth:`pydvm.Client.lookup`; other requests on this client proceed
        while a lookup waits.
        """
        return _proto.lookup_result(await self._call(_proto.lookup_msg(keys, range, wait,
                                                                       timeout, self._envelope)))

    async def unpublish(self, keys: Iterable[str] | str | None = None) -> None:
        """Remove the named keys from every item this user owns; with no keys,
        everything this process published.  Succeeds whether or not anything
        matched."""
        _proto.check(await self._call(_proto.unpublish_msg(keys, self._envelope)))

    async def close(self) -> None:
        """Close the connection; requests still in flight get
        :class:`~pydvm.errors.UnreachableError`."""
        self._ch.close("client closed")

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _call(self, msg: Message) -> Message:
        if self._ch.closed:
            raise UnreachableError(f"connection closed: {self._ch.close_reason}")
        try:
            return await self._ch.call(msg)
        except TypeError as exc:
            raise BadParamError(f"cannot encode request: {exc}") from None


def _ignore(ch: Channel, msg: Message) -> None:
    pass
