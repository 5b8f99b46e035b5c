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

On a node served by a daemon the client sends the requests the master
store serves (every range but LOCAL) straight to the master, on one
connection (TCP, or a Unix socket on the master's own machine) opened on
the first such request, with the credential its
daemon gave the process at launch (``pydvm_direct_data``; see
:mod:`pydvm._direct`): one hop instead of two.

Errors come back as exceptions, one class per PMIx status (see
:mod:`pydvm.errors`); a lookup that found only some keys returns a
:class:`LookupResult` whose ``status`` is ``Status.ERR_PARTIAL_SUCCESS``.
"""

from __future__ import annotations

import itertools
import socket
import threading
from typing import Any, Iterable, Mapping

from . import _direct, _proto
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
    (the node's name, from the daemon), ``server``, ``direct`` (whether a
    direct connection to the master is open).  Use it as a context
    manager, or call :meth:`close`.  The identity the store records (uid,
    gid) is read by the daemon from the socket -- or, on the direct path,
    vouched for by the daemon at launch -- never claimed by the client.
    """

    def __init__(self, server: str | None = None, nspace: str | None = None,
                 rank: int | None = None) -> None:
        self.server, self.nspace, self.rank = _proto.identity_from_env(nspace, rank, server)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._dch: BlockingChannel | None = None
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
        self._direct_info = _direct.DirectInfo.from_hello(r, self.nspace, self.rank)
        self._direct_state = _direct.UNUSED if self._direct_info.usable else _direct.OFF

    @property
    def direct(self) -> bool:
        """True while this client's master-store requests take the direct path."""
        return self._direct_state == _direct.OPEN

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
        _proto.check(self._route("publish", range, lambda env: _proto.publish_msg(
            data, range, persistence, access_uids, access_gids, replace, env)))

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
        until it is answered.  ``timeout`` bounds the wait in seconds (None
        or 0: no limit, as PMIx's ``PMIX_TIMEOUT`` 0).

        Returns a :class:`LookupResult` (SUCCESS, or PARTIAL_SUCCESS with the
        keys found).  A FIRST_READ key it returns is removed from the store.
        Raises :class:`~pydvm.errors.NotFoundError` (none found),
        :class:`~pydvm.errors.NoPermissionsError` (found, but not readable by
        this user), :class:`~pydvm.errors.LookupTimeoutError` or
        :class:`~pydvm.errors.BadParamError`.
        """
        return _proto.lookup_result(self._route(
            "lookup", range, lambda env: _proto.lookup_msg(keys, range, wait, timeout, env)))

    def unpublish(self, keys: Iterable[str] | str | None = None) -> None:
        """Remove the named keys from every item this user owns; with no
        keys, remove everything this process published.  Succeeds whether or
        not anything matched."""
        _proto.check(self._route("unpublish", None,
                                 lambda env, node_only=False: _proto.unpublish_msg(
                                     keys, env, node_only)))

    def close(self) -> None:
        """Close the connection.  Items this process published stay, as their
        persistence says; a call waiting in another thread fails with
        :class:`~pydvm.errors.UnreachableError`."""
        self._ch.close()
        if self._dch is not None:
            self._dch.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- plumbing ---------------------------------------------------------

    def _route(self, t: str, rng, build) -> Message:
        """Send a request where the routing table says and return its answer.

        ``build(envelope)`` makes the request (``build(envelope, True)``:
        an unpublish's node-store part, sent to the daemon once the master
        has answered, unless the master says this node's store holds
        nothing of this uid).  Without a direct connection everything goes
        to the daemon, which routes it itself."""
        with self._lock:
            # A head-node client, or one without a credential, never looks
            # at the routing table: everything goes to its node server.
            to_master, to_node = (False, False) if self._direct_state == _direct.OFF \
                else _direct.master_part(t, rng)
            dch = self._direct_channel() if to_master else None
            if dch is None:
                return self._exchange(self._ch, build(self._envelope))
            master = self._exchange(dch, build(False))
            if not to_node or not _proto.node_part_needed(master):
                return master
            node = self._exchange(self._ch, build(self._envelope, True))
            return _proto.combined(master, node)

    def _direct_channel(self) -> BlockingChannel | None:
        """The direct connection, opened on first use; None: use the daemon."""
        state = self._direct_state
        if state == _direct.OPEN:
            return self._dch
        if state == _direct.OFF:
            return None
        if state == _direct.LOST:
            raise UnreachableError("direct connection to the master lost")
        if not _direct.socket_open(self._ch.sock):
            raise _direct.daemon_gone()  # our process was reaped: act for nobody
        self._dch = _direct.open_blocking(self._direct_info)
        self._direct_state = _direct.OFF if self._dch is None else _direct.OPEN
        return self._dch

    def _call(self, msg: Message) -> Message:
        with self._lock:
            return self._exchange(self._ch, msg)

    def _exchange(self, ch: BlockingChannel, msg: Message) -> Message:
        """Send one request on ``ch`` and wait for its answer."""
        msg["id"] = rid = next(self._ids)
        try:
            ch.send(msg)
        except TypeError as exc:  # a value msgpack cannot encode
            raise BadParamError(f"cannot encode request: {exc}") from None
        except OSError as exc:
            raise self._lost(ch, f"connection lost: {exc}") from None
        try:
            return self._answer(ch, rid)
        except (KeyboardInterrupt, SystemExit):
            # Abandoned while waiting (Ctrl-C in a waiting lookup): withdraw
            # it, so it does not stay parked in the store.
            try:
                ch.send({"t": "cancel", "ref": rid})
            except OSError:
                pass
            raise

    def _answer(self, ch: BlockingChannel, rid: int) -> Message:
        while True:
            try:
                r = ch.recv()
            except (OSError, ConnectionError, ValueError) as exc:
                raise self._lost(ch, f"connection lost: {exc}") from None
            if r.get("t") == "reply" and r.get("id") == rid:
                return r
            if r.get("t") == "error":
                raise self._lost(ch, f"dropped the connection: {r.get('msg')}")
            # Anything else is the late reply of an abandoned call: skipped.

    def _lost(self, ch: BlockingChannel, what: str) -> UnreachableError:
        if ch is self._dch:
            self._direct_state = _direct.LOST
            return UnreachableError(f"master (direct) {what}")
        return UnreachableError(f"daemon {what}")
