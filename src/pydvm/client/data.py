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
:mod:`pydvm.client.direct`): one hop instead of two.

Errors come back as exceptions, one class per PMIx status (see
:mod:`pydvm.errors`); a lookup that found only some keys returns a
:class:`LookupResult` whose ``status`` is ``Status.ERR_PARTIAL_SUCCESS``.

One client may be shared by all the threads of a process: each call sends
its request at once and waits for its own answer (:mod:`pydvm.client.mux`), so a
lookup waiting in one thread holds up no other thread's requests.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping

from . import direct as _direct, proto as _proto
from .mux import Mux
from .proto import Found, LookupResult
from ..enums import Persistence, Range
from ..errors import UnreachableError
from ..channel import BlockingChannel
from ..protocol import Message

TYPE_CHECKING = False  # (not typing's: importing typing costs every job process)
if TYPE_CHECKING:  # for type checkers and the API reference only
    from typing import Any

__all__ = ["Client", "Found", "LookupResult"]


class Client:
    """A connection to this node's daemon.  Thread-safe: several threads may
    have calls in flight at once, each waiting only for its own answer.

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
        self._dmux: Mux | None = None
        #: held while the direct connection is being opened (once).
        self._opening = threading.Lock()
        import socket  # at the first connection, not at ``import pydvm``
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.server)
        except OSError as exc:
            sock.close()
            raise UnreachableError(f"cannot connect to the daemon at {self.server}: {exc}") from None
        self._ch = BlockingChannel(sock)
        self._mux = Mux(self._ch, lambda text: UnreachableError(f"daemon {text}"))
        r = self._exchange(self._mux, _proto.hello_msg(self.nspace, self.rank))
        _proto.check(r)
        self.node = r.get("node")
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
        ack: bool = True,
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

        ``ack=False`` returns as soon as the request is sent, without
        waiting for the store's answer.  Requests on one connection are
        served in order, so every later call of this client (from any
        thread) sees the publish done; a refusal is raised -- once -- by
        the next call of this client (after that call was served: an
        ``add`` has been applied, say; a waiting lookup is withdrawn), by
        :meth:`flush`, or by :meth:`close`.  At most 256 such publishes
        are unanswered at a time (beyond that the next one waits for
        answers).
        """
        build = lambda: _proto.publish_msg(  # noqa: E731
            data, range, persistence, access_uids, access_gids, replace)
        if ack:
            _proto.check(self._route("publish", range, build))
        else:
            self._post("publish", range, build)

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
        or 0: no limit, as PMIx's ``PMIX_TIMEOUT`` 0).  Other threads'
        calls on this client proceed while it waits.

        Returns a :class:`LookupResult` (SUCCESS, or PARTIAL_SUCCESS with the
        keys found).  A FIRST_READ key it returns is removed from the store.
        Raises :class:`~pydvm.errors.NotFoundError` (none found),
        :class:`~pydvm.errors.NoPermissionsError` (found, but not readable by
        this user), :class:`~pydvm.errors.LookupTimeoutError` or
        :class:`~pydvm.errors.BadParamError`.
        """
        return _proto.lookup_result(self._route(
            "lookup", range, lambda: _proto.lookup_msg(keys, range, wait, timeout),
            withdrawable=wait is not False and wait is not None))

    def unpublish(self, keys: Iterable[str] | str | None = None) -> int:
        """Remove the named keys from every item this user owns; with no
        keys, remove everything this process published.  Succeeds whether or
        not anything matched; returns how many keys it removed (a key held
        by two of this user's items counts twice)."""
        return _proto.count_of(self._route(
            "unpublish", None,
            lambda node_only=False: _proto.unpublish_msg(keys, node_only)))

    def add(self, key: str, delta: int | str | bytes = 1, *, range: Range = Range.SESSION,
            persistence: Persistence | None = None, access_uids: Iterable[int] = (),
            access_gids: Iterable[int] = ()) -> Any:
        """Add ``delta`` to the integer ``key`` holds, atomically, and return
        the new value.

        The value may be an int or decimal text (str or bytes) and keeps its
        form: a counter published as ``b"3"`` becomes ``b"5"`` after
        ``add(key, 2)``.  An absent key is created holding ``delta`` as given
        (as a new item of this process, with ``range``, ``persistence`` and
        the accessor lists, which are ignored otherwise).  The key must be
        this user's (same uid; same gid when both are known): one held by
        another user's item, readable here, is refused
        :class:`~pydvm.errors.NoPermissionsError`.  A value that is not an
        integer, or a result beyond 64 bits, is
        :class:`~pydvm.errors.BadParamError`; an item grown larger than the
        per-uid cap :class:`~pydvm.errors.OutOfResourceError` (growth may
        evict this uid's least recently used other items, as a publish
        does).  The item keeps its owner, range and persistence.  Lookups
        waiting for the key are answered.
        """
        return _proto.update_result(self._route("update", range, lambda: _proto.update_msg(
            key, "add", delta, None, range, persistence, access_uids, access_gids)))[0]

    def compare_and_set(self, key: str, expected: Any, desired: Any, *,
                        range: Range = Range.SESSION, persistence: Persistence | None = None,
                        access_uids: Iterable[int] = (),
                        access_gids: Iterable[int] = ()) -> tuple[Any, bool]:
        """Store ``desired`` under ``key`` if it holds ``expected``, atomically.

        ``expected`` None means the key must be absent; ``""`` or ``b""``
        also matches an absent key (it reads as empty).  Values compare by
        Python type and value (``b"1"`` never equals ``"1"`` or ``1``).
        Returns ``(value, stored)``: what the key holds afterwards (None if
        it is absent) and whether this call stored ``desired``.  Ownership,
        the cap and new items as :meth:`add`.
        """
        return _proto.update_result(self._route("update", range, lambda: _proto.update_msg(
            key, "cas", desired, expected, range, persistence, access_uids, access_gids)))

    def append(self, key: str, suffix: str | bytes, *, range: Range = Range.SESSION,
               persistence: Persistence | None = None, access_uids: Iterable[int] = (),
               access_gids: Iterable[int] = ()) -> Any:
        """Append ``suffix`` to the value of ``key`` (str to str, bytes to
        bytes), atomically; return the new value.  An absent key is created
        holding ``suffix``.  Ownership, the cap and new items as :meth:`add`."""
        return _proto.update_result(self._route("update", range, lambda: _proto.update_msg(
            key, "append", suffix, None, range, persistence, access_uids, access_gids)))[0]

    def keys(self, prefix: str = "", *, range: Range = Range.SESSION,
             limit: int | None = None) -> list[str]:
        """The keys starting with ``prefix`` that a lookup in ``range`` by
        this process could return, in sorted order: the first ``limit``
        (at most 10,000 in one call; :meth:`count` says how many there
        are).  Touches nothing: listing keeps no item alive."""
        return _proto.keys_result(self._route(
            "keys", range, lambda: _proto.keys_msg(prefix, range, limit)))

    def count(self, prefix: str = "", *, range: Range = Range.SESSION) -> int:
        """How many keys :meth:`keys` would list without a limit."""
        return _proto.count_of(self._route(
            "keys", range, lambda: _proto.keys_msg(prefix, range, 0)))

    def flush(self) -> None:
        """Wait for the answers of every publish sent with ``ack=False``;
        raise the first refusal among them (once)."""
        for mux in self._muxes():
            mux.flush()

    def close(self) -> None:
        """Close the connection, once the publishes sent with ``ack=False``
        are answered (raising a refusal among them, as :meth:`flush`).
        Items this process published stay, as their persistence says; a call
        waiting in another thread fails with
        :class:`~pydvm.errors.UnreachableError`."""
        try:
            self.flush()
        finally:
            self._close()

    def _close(self) -> None:
        for mux in self._muxes():
            try:
                # wakes a thread blocked reading it (close alone would not)
                import socket
                mux.ch.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            mux.ch.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.close()
        else:
            self._close()  # an exception is on its way: do not mask it

    # -- plumbing ---------------------------------------------------------

    @property
    def _dch(self) -> BlockingChannel | None:
        """The direct connection's channel (None: not open)."""
        return self._dmux.ch if self._dmux is not None else None

    def _check(self) -> None:
        """Raise the refusal of an earlier ``ack=False`` publish, if one came back."""
        if self._mux._failed is not None:
            self._mux.check()
        dmux = self._dmux
        if dmux is not None and dmux._failed is not None:
            dmux.check()

    def _muxes(self) -> list[Mux]:
        return [self._mux] if self._dmux is None else [self._dmux, self._mux]

    def _route(self, t: str, rng, build, withdrawable: bool = False) -> Message:
        """Send a request where the routing table says and return its answer.

        ``build()`` makes the request (``build(True)``:
        an unpublish's node-store part, sent to the daemon once the master
        has answered, unless the master says this node's store holds
        nothing of this uid).  Without a direct connection everything goes
        to the daemon, which routes it itself.  First raises the refusal of
        an earlier ``ack=False`` publish, if one came back."""
        dmux = self._dmux
        if self._mux._failed is not None or (dmux is not None and dmux._failed is not None):
            self._check()
        # A head-node client, or one without a credential, never looks
        # at the routing table: everything goes to its node server.
        to_master, to_node = (False, False) if self._direct_state == _direct.OFF \
            else _direct.master_part(t, rng)
        dmux = self._direct_mux() if to_master else None
        if dmux is None:
            return self._exchange(self._mux, build(), withdrawable)
        master = self._exchange(dmux, build(), withdrawable)
        if not to_node or not _proto.node_part_needed(master):
            return master
        node = self._exchange(self._mux, build(True))
        return _proto.combined(master, node)

    def _post(self, t: str, rng, build) -> None:
        """Send a request where :meth:`_route` would, without waiting."""
        self._check()
        to_master = self._direct_state != _direct.OFF and _direct.master_part(t, rng)[0]
        dmux = self._direct_mux() if to_master else None
        mux = self._mux if dmux is None else dmux
        try:
            mux.post(build())
        except _proto.UNENCODABLE as exc:
            raise _proto.cannot_encode(exc) from None

    def _direct_mux(self) -> Mux | None:
        """The direct connection, opened on first use; None: use the daemon."""
        state = self._direct_state
        if state == _direct.OPEN:
            return self._dmux
        if state == _direct.OFF:
            return None
        with self._opening:
            state = self._direct_state
            if state == _direct.UNUSED:
                if not _direct.socket_open(self._ch.sock):
                    raise _direct.daemon_gone()  # our process was reaped: act for nobody
                dch = _direct.open_blocking(self._direct_info)
                if dch is None:
                    self._direct_state = _direct.OFF
                else:
                    self._dmux = Mux(dch, self._direct_lost)
                    self._direct_state = _direct.OPEN
                state = self._direct_state
        if state == _direct.LOST:
            raise UnreachableError("direct connection to the master lost")
        return self._dmux if state == _direct.OPEN else None

    def _direct_lost(self, text: str) -> UnreachableError:
        self._direct_state = _direct.LOST
        return UnreachableError(f"master (direct) {text}")

    def _exchange(self, mux: Mux, msg: Message, withdrawable: bool = False) -> Message:
        """Send one request through ``mux`` and wait for its answer."""
        try:
            return mux.call(msg, withdrawable=withdrawable)
        except _proto.UNENCODABLE as exc:
            raise _proto.cannot_encode(exc) from None
