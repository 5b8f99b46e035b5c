"""The blocking client a job process uses to publish, look up and unpublish.

Inside a job (``pydvm run``) every process has ``PYDVM_SERVER``,
``PYDVM_NSPACE`` and ``PYDVM_RANK`` in its environment; ``Client()`` reads
them and connects to its node's daemon.  Example, a two-application
rendezvous::

    # server.py (app 0)                      # worker.py (app 1)
    from pydvm import Client                 from pydvm import Client
    with Client() as c:                      with Client() as c:
        c.publish({"addr": "10.0.0.1:5555"})     r = c.lookup(["addr"], wait=True,
        ...                                                   timeout=30)
                                                 connect(r["addr"])

    pydvm run -n 1 python server.py : -n 4 python worker.py

Errors come back as exceptions, one class per PMIx status (see
:mod:`pydvm.errors`); a lookup that found only some keys returns a
:class:`LookupResult` whose ``status`` is ``Status.ERR_PARTIAL_SUCCESS``.
"""

from __future__ import annotations

import itertools
import socket
import threading
from typing import Any, Iterable, Mapping

from . import _proto
from ._proto import Found, LookupResult
from .enums import Persistence, Range
from .errors import BadParamError, UnreachableError
from .wire import BlockingChannel, Message

__all__ = ["Client", "Found", "LookupResult"]


class Client:
    """A connection to this node's daemon.  Thread-safe; one request at a time.

    ``server`` (the daemon's socket), ``nspace`` and ``rank`` default to the
    job environment (``PYDVM_SERVER``, ``PYDVM_NSPACE``, ``PYDVM_RANK``).
    Raises :class:`~pydvm.errors.UnreachableError` if they are not set or
    the daemon cannot be reached, and
    :class:`~pydvm.errors.NoPermissionsError` if the daemon does not know
    this process as a running process of its node.

    Attributes: ``nspace`` and ``rank`` (who this process is), ``node``
    (the node's name, from the daemon), ``server``.  Use it as a context
    manager, or call :meth:`close`.  The identity the store records (uid,
    gid) is read by the daemon from the socket, never sent by the client.
    """

    def __init__(self, server: str | None = None, nspace: str | None = None,
                 rank: int | None = None) -> None:
        self.server, self.nspace, self.rank = _proto.identity_from_env(nspace, rank, server)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.server)
        except OSError as exc:
            sock.close()
            raise UnreachableError(f"cannot connect to the daemon at {self.server}: {exc}") from None
        self._ch = BlockingChannel(sock)
        r = self._call(_proto.hello_msg(self.nspace, self.rank))
        _proto.check(r)
        self.node = r.get("node")
        #: whether data requests go as envelopes (a daemon passes them on).
        self._envelope = bool(r.get("envelope", True))

    def publish(
        self,
        data: Mapping[str, Any],
        *,
        range: Range = Range.SESSION,
        persistence: Persistence | None = None,
        access_uids: Iterable[int] = (),
        access_gids: Iterable[int] = (),
        replace: bool = False,
    ) -> None:
        """Publish ``data`` (key -> str/bytes/int/float/bool) as one item.

        ``range`` says who may look it up (:class:`~pydvm.Range`; LOCAL
        items live in this node's store, all others in the master's).
        ``persistence`` says how long it lives (:class:`~pydvm.Persistence`;
        default NSPACE, until this job ends).  ``access_uids`` /
        ``access_gids`` restrict readers to those users or groups (without
        them, only this uid and gid may read).  ``replace=True`` lets this
        publish take over keys this user already published.

        Returns None once the store has accepted the item.  Raises
        :class:`~pydvm.errors.DuplicateKeyError`,
        :class:`~pydvm.errors.OutOfResourceError` (larger than the per-uid
        cap) or :class:`~pydvm.errors.BadParamError`; a refused publish
        stored nothing and evicted nothing.  An accepted one may evict this
        uid's least recently used items to stay within the cap.
        """
        self._check(_proto.publish_msg(data, range, persistence, access_uids, access_gids,
                                       replace, self._envelope))

    def lookup(
        self,
        keys: Iterable[str] | str,
        *,
        range: Range = Range.SESSION,
        wait: bool | int = False,
        timeout: float | None = None,
    ) -> LookupResult:
        """Look keys up (one key may be passed as a plain string).

        ``range`` restricts whose items may answer, as seen from this
        process.  ``wait=True`` waits until all keys can be answered,
        ``wait=N`` until N of them can; a waiting lookup consumes nothing
        until it is answered.  ``timeout`` bounds the wait in seconds (None:
        no limit).

        Returns a :class:`LookupResult` (SUCCESS, or PARTIAL_SUCCESS with the
        keys found).  A FIRST_READ key it returns is removed from the store.
        Raises :class:`~pydvm.errors.NotFoundError` (none found),
        :class:`~pydvm.errors.NoPermissionsError` (found, but not readable by
        this user), :class:`~pydvm.errors.LookupTimeoutError` or
        :class:`~pydvm.errors.BadParamError`.
        """
        return _proto.lookup_result(self._call(_proto.lookup_msg(keys, range, wait, timeout,
                                                                 self._envelope)))

    def unpublish(self, keys: Iterable[str] | str | None = None) -> None:
        """Remove the named keys from every item this user owns; with no
        keys, remove everything this process published.  Succeeds whether or
        not anything matched."""
        self._check(_proto.unpublish_msg(keys, self._envelope))

    def close(self) -> None:
        """Close the connection.  Items this process published stay, as their
        persistence says; a call waiting in another thread fails with
        :class:`~pydvm.errors.UnreachableError`."""
        self._ch.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- plumbing ---------------------------------------------------------

    def _check(self, msg: Message) -> None:
        _proto.check(self._call(msg))

    def _call(self, msg: Message) -> Message:
        with self._lock:
            rid = next(self._ids)
            msg["id"] = rid
            try:
                self._ch.send(msg)
            except TypeError as exc:  # a value msgpack cannot encode
                raise BadParamError(f"cannot encode request: {exc}") from None
            except OSError as exc:
                raise UnreachableError(f"daemon connection failed: {exc}") from None
            try:
                while True:
                    try:
                        r = self._ch.recv()
                    except (OSError, ConnectionError, ValueError) as exc:
                        raise UnreachableError(f"daemon connection lost: {exc}") from None
                    if r.get("t") == "reply" and r.get("id") == rid:
                        return r
                    if r.get("t") == "error":
                        raise UnreachableError(
                            f"daemon dropped the connection: {r.get('msg')}")
                    # Anything else is the late reply of an abandoned call: skipped.
            except (KeyboardInterrupt, SystemExit):
                # Abandoned while waiting (Ctrl-C in a waiting lookup): withdraw
                # it, so it does not stay parked in the store.
                try:
                    self._ch.send({"t": "cancel", "ref": rid})
                except OSError:
                    pass
                raise
