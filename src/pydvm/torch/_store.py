"""PydvmStore: a ``torch.distributed.Store`` whose keys live in pydvm's data store."""

from __future__ import annotations

import atexit
import os
import sys
import threading
from datetime import timedelta
from typing import Any, Iterable

import torch.distributed as dist

from ..client import Client
from ..enums import Persistence, Range
from ..errors import LookupTimeoutError, NotFoundError, PMIxError, UnreachableError

#: scope -> (range, persistence) of a store's keys.
SCOPES: dict[str, tuple[Range, Persistence]] = {
    "job": (Range.NAMESPACE, Persistence.NSPACE),
    "session": (Range.SESSION, Persistence.SESSION),
    "dvm": (Range.GLOBAL, Persistence.INDEF),
}

#: Every store not yet closed.  pybind keeps only the C++ half of a Python
#: subclass of ``Store`` alive: a store handed to C++ as a temporary
#: (``init_process_group(store=PydvmStore())``) or made by ``clone()``
#: would lose its Python half to the garbage collector while C++ still
#: calls it (``new_group`` after ``gc.collect()`` then fails an internal
#: assertion).  Holding each store here keeps both halves; a store is
#: small (the connection is shared), so they are kept until
#: :meth:`PydvmStore.close`.
_live: set["PydvmStore"] = set()
_live_lock = threading.Lock()

_client: Client | None = None
_client_pid = 0
_client_lock = threading.Lock()


def shared_client() -> Client:
    """The process's one :class:`pydvm.Client` for its stores (thread-safe,
    so shared by every store and thread).  A process forked from one that
    had it opens its own: a connection is never shared across processes."""
    global _client, _client_pid
    with _client_lock:
        if _client is None or _client_pid != os.getpid():
            _client = Client()
            _client_pid = os.getpid()
        return _client


@atexit.register
def _flush_at_exit() -> None:
    """A set() not waited for is applied before the process goes (its
    publish could otherwise reach the master after the process's end)."""
    c = _client
    if c is None or _client_pid != os.getpid():
        return
    try:
        c.flush()
    except PMIxError as exc:
        sys.stderr.write(f"pydvm.torch: {exc}\n")


def _bytes(value: Any) -> bytes:
    """A value as torch hands it out: bytes (str as UTF-8, an int as its
    decimal text, as a counter made elsewhere reads)."""
    if value.__class__ is bytes:
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value).encode("ascii")
    return str(value).encode("utf-8")


def _seconds(timeout: timedelta | float | None) -> float | None:
    """A torch timeout as the lookup's: None (no limit) for None or zero."""
    if timeout is None:
        return None
    s = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    return s if s > 0 else None


class PydvmStore(dist.Store):
    """A ``torch.distributed.Store`` kept in pydvm's data store.

    Made inside a ``pydvm run`` job, with no argument, it is the job's
    store: its keys are seen by the job's processes only (NAMESPACE range)
    and leave the DVM when the job ends (NSPACE persistence) -- even when
    ranks crash or never call ``destroy_process_group``::

        store = PydvmStore()
        dist.init_process_group("gloo", store=store, rank=rank, world_size=size)

    ``name`` keeps stores of one scope apart (any str; stores of different
    names never see each other's keys).  ``scope``:

    * ``"job"`` (default): the job's processes; gone when the job ends;
    * ``"session"``: every job of this session (``pydvm run --session``);
      gone when the session ends (never, in the DVM's default session: then
      with the DVM);
    * ``"dvm"``: every job of the DVM; kept until deleted, or idle longer
      than ``prte_data_server_timeout``.

    ``timeout`` (a ``timedelta`` or seconds; default torch's 300 s) bounds
    ``get``, ``wait`` and ``multi_get``; ``set_timeout`` changes it (zero:
    no limit).  A lookup that times out raises ``DistStoreError`` naming
    the keys and the timeout; a lost DVM ``DistNetworkError``; any other
    refusal ``DistStoreError`` with pydvm's reason.

    Semantics are torch's: ``set`` overwrites; ``get`` waits for the key;
    ``add`` makes or increments a counter kept as decimal text
    (``get`` returns ``b"3"``; adding to a non-numeric value raises);
    ``compare_set`` is atomic (an absent key with expected ``""`` takes
    ``desired``; with another expected stores nothing and returns
    ``expected``; otherwise the current value, or ``desired`` once
    stored); ``deleteKey`` says whether it removed something;
    ``getNumKeys`` counts this store's keys; ``append``, ``multi_get`` and
    ``multi_set`` are real operations.  Empty keys are allowed: every key
    is stored under the store's :attr:`prefix` (``torch/NSPACE/NAME#``,
    ``torch/session-ID/NAME#`` or ``torch/dvm/NAME#``).

    ``set`` does not wait for the store's answer (as TCPStore's does not):
    it is served before any later call of this process's connection, and
    if it was refused (the per-user cap, another user holding the key) the
    refusal is raised by the next call, by :meth:`flush`, or printed at
    exit.  Every store of a process shares one connection (a thread-safe
    :class:`pydvm.Client`); ``client`` gives another.
    """

    def __init__(self, name: str = "", *, scope: str = "job",
                 timeout: timedelta | float | None = None,
                 client: Client | None = None) -> None:
        super().__init__()
        if scope not in SCOPES:
            raise ValueError(f"scope must be one of {', '.join(SCOPES)}, not {scope!r}")
        if not isinstance(name, str):
            raise ValueError(f"name must be a str, not {type(name).__name__}")
        self._c = client if client is not None else shared_client()
        self.scope = scope
        self.name = name
        self._range, self._persist = SCOPES[scope]
        if scope == "job":
            base = f"torch/{self._c.nspace}/"
        elif scope == "session":
            base = f"torch/session-{os.environ.get('PYDVM_SESSION', '0')}/"
        else:
            base = "torch/dvm/"
        #: what every key of this store is stored under: the scope's base,
        #: the name, ``#`` (which no name holds: it is escaped, as ``%``),
        #: so that no store's prefix begins another's.
        self.prefix = base + name.replace("%", "%25").replace("#", "%23") + "#"
        if timeout is not None:
            self.set_timeout(timeout if isinstance(timeout, timedelta)
                             else timedelta(seconds=float(timeout)))
        with _live_lock:
            _live.add(self)

    def __repr__(self) -> str:
        return f"PydvmStore(prefix={self.prefix!r}, scope={self.scope!r})"

    # -- the Store interface (C++ calls these through pybind) -----------------

    def set(self, key: str, value: str | bytes) -> None:
        """Store ``value`` under ``key``, replacing what it held."""
        try:
            self._c.publish({self.prefix + key: _bytes(value)}, range=self._range,
                            persistence=self._persist, replace=True, ack=False)
        except PMIxError as exc:
            self._fail(exc, "set", [key])

    def get(self, key: str) -> bytes:
        """The value of ``key``, waiting for it up to the store's timeout."""
        k = self.prefix + key
        timeout = _seconds(self.timeout)
        try:
            r = self._c.lookup(k, range=self._range, wait=True, timeout=timeout)
        except PMIxError as exc:
            self._fail(exc, "get", [key], timeout)
        return _bytes(r[k])

    def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the counter ``key`` (made at ``amount`` if
        absent), atomically; return its new value."""
        try:
            value = self._c.add(self.prefix + key, str(int(amount)).encode("ascii"),
                                range=self._range, persistence=self._persist)
        except PMIxError as exc:
            self._fail(exc, "add", [key])
        return int(value)

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        """Set ``key`` to ``desired`` if it holds ``expected`` (or is absent
        and ``expected`` is empty), atomically; see the class docstring for
        what is returned."""
        exp = _bytes(expected)
        try:
            value, _ = self._c.compare_and_set(self.prefix + key, exp, _bytes(desired),
                                               range=self._range, persistence=self._persist)
        except PMIxError as exc:
            self._fail(exc, "compare_set", [key])
        return exp if value is None else _bytes(value)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        """Wait until every key of ``keys`` is set, up to ``timeout`` (the
        store's when not given; zero: no limit)."""
        if not keys:
            return
        limit = _seconds(self.timeout if timeout is None else timeout)
        try:
            self._c.lookup([self.prefix + k for k in keys], range=self._range, wait=True,
                           timeout=limit)
        except PMIxError as exc:
            self._fail(exc, "wait", keys, limit)

    def check(self, keys: list[str]) -> bool:
        """Whether every key of ``keys`` is set now (does not wait)."""
        if not keys:
            return True
        try:
            r = self._c.lookup([self.prefix + k for k in keys], range=self._range)
        except NotFoundError:
            return False
        except PMIxError as exc:
            self._fail(exc, "check", keys)
        return not r.partial

    def deleteKey(self, key: str) -> bool:  # noqa: N802 - the name C++ calls
        """Remove ``key``; True if it was there."""
        try:
            return self._c.unpublish([self.prefix + key]) > 0
        except PMIxError as exc:
            self._fail(exc, "delete_key", [key])

    delete_key = deleteKey

    def getNumKeys(self) -> int:  # noqa: N802 - the name C++ calls
        """How many keys this store holds (every key under its prefix)."""
        try:
            return self._c.count(self.prefix, range=self._range)
        except PMIxError as exc:
            self._fail(exc, "num_keys")

    num_keys = getNumKeys

    def list_keys(self) -> list[str]:
        """This store's keys, sorted (at most 10,000; from Python only: torch
        does not pass this call on to a store written in Python)."""
        try:
            n = len(self.prefix)
            return [k[n:] for k in self._c.keys(self.prefix, range=self._range)]
        except PMIxError as exc:
            self._fail(exc, "list_keys")

    def append(self, key: str, value: str | bytes) -> None:
        """Append ``value`` to what ``key`` holds (making it if absent), atomically."""
        try:
            self._c.append(self.prefix + key, _bytes(value), range=self._range,
                           persistence=self._persist)
        except PMIxError as exc:
            self._fail(exc, "append", [key])

    def multi_get(self, keys: list[str]) -> list[bytes]:
        """The values of ``keys``, in order, waiting for all of them (one request)."""
        if not keys:
            return []
        full = [self.prefix + k for k in keys]
        timeout = _seconds(self.timeout)
        try:
            r = self._c.lookup(full, range=self._range, wait=True, timeout=timeout)
        except PMIxError as exc:
            self._fail(exc, "multi_get", keys, timeout)
        return [_bytes(r[k]) for k in full]

    def multi_set(self, keys: list[str], values: list[str | bytes]) -> None:
        """Set every key of ``keys`` to its value (one request; not waited for,
        as :meth:`set`)."""
        if len(keys) != len(values):
            raise ValueError(f"multi_set: {len(keys)} keys but {len(values)} values")
        if not keys:
            return
        try:
            self._c.publish({self.prefix + k: _bytes(v) for k, v in zip(keys, values)},
                            range=self._range, persistence=self._persist, replace=True,
                            ack=False)
        except PMIxError as exc:
            self._fail(exc, "multi_set", keys)

    def has_extended_api(self) -> bool:
        """append, multi_get and multi_set are real operations here."""
        return True

    def clone(self) -> "PydvmStore":
        """Another store on the same keys (same scope, name and timeout),
        sharing this one's connection."""
        other = PydvmStore(self.name, scope=self.scope, timeout=self.timeout, client=self._c)
        other.prefix = self.prefix
        return other

    # -- beyond torch's interface ---------------------------------------------

    def flush(self) -> None:
        """Wait until every ``set`` of this process's connection has been
        applied; raise the first refusal among them as ``DistStoreError``."""
        try:
            self._c.flush()
        except PMIxError as exc:
            self._fail(exc, "set")

    def close(self) -> None:
        """Flush, and stop keeping this store alive (the shared connection
        stays open for the process's other stores)."""
        with _live_lock:
            _live.discard(self)
        self.flush()

    # -- for the rendezvous backend --------------------------------------------

    def _peek(self, key: str) -> bytes | None:
        """The value of ``key`` now, or None if it is absent (no waiting)."""
        k = self.prefix + key
        try:
            return _bytes(self._c.lookup(k, range=self._range)[k])
        except NotFoundError:
            return None
        except PMIxError as exc:
            self._fail(exc, "get", [key])

    def _swap(self, key: str, expected: bytes | None, desired: bytes) -> tuple[bytes | None, bool]:
        """Compare-and-set with pydvm's own semantics: ``expected`` None
        means absent; returns (value afterwards or None, whether stored)."""
        try:
            value, stored = self._c.compare_and_set(self.prefix + key, expected, desired,
                                                    range=self._range,
                                                    persistence=self._persist)
        except PMIxError as exc:
            self._fail(exc, "compare_set", [key])
        return (None if value is None else _bytes(value)), stored

    def _fail(self, exc: PMIxError, op: str, keys: Iterable[str] = (),
              timeout: float | None = None) -> None:
        """Raise ``exc`` as torch's callers expect it."""
        names = ", ".join(repr(k) for k in keys)
        if isinstance(exc, LookupTimeoutError):
            ms = int((timeout or 0) * 1000)
            raise dist.DistStoreError(
                f"pydvm store {self.prefix!r}: {op} timed out after {ms} ms "
                f"(timeout {timeout} s) waiting for key(s) {names}") from exc
        if isinstance(exc, UnreachableError):
            raise dist.DistNetworkError(
                f"pydvm store {self.prefix!r}: {op} {names}: {exc}") from exc
        raise dist.DistStoreError(f"pydvm store {self.prefix!r}: {op} {names}: {exc}") from exc
