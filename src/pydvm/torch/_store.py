"""PydvmStore: a ``torch.distributed.Store`` whose keys live in pydvm's data store."""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
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
    ``get``, ``wait``, ``multi_get`` and ``queue_pop``; ``set_timeout``
    changes it (zero: no limit).  A wait that times out raises
    ``DistStoreError`` in TCPStore's words (``wait timeout after 100ms,
    keys: /KEY``), pydvm's detail after them in parentheses; a lost DVM
    ``DistNetworkError``; any other refusal ``DistStoreError`` with
    pydvm's reason.

    Semantics are torch's: ``set`` overwrites; ``get`` waits for the key;
    ``add`` makes or increments a counter kept as decimal text
    (``get`` returns ``b"3"``; adding to a non-numeric value raises);
    ``compare_set`` is atomic (an absent key with expected ``""`` takes
    ``desired``; with another expected stores nothing and returns
    ``expected``; otherwise the current value, or ``desired`` once
    stored); ``deleteKey`` says whether it removed something;
    ``getNumKeys`` counts this store's keys; ``append``, ``multi_get`` and
    ``multi_set`` are real operations.  Queues (``queue_push``,
    ``queue_pop``, ``queue_len``) are TCPStore's: first in, first out, each
    item to one caller, kept beside the keys (a key and a queue may share a
    name; ``check`` and ``wait`` count a queue holding an item as a set
    key) with the keys' lifetime.  Empty keys are allowed: every key
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
        """Wait until every key of ``keys`` is set -- or, as TCPStore counts
        it, holds an item in its queue -- up to ``timeout`` (the store's
        when not given; zero: no limit)."""
        if not keys:
            return
        limit = _seconds(self.timeout if timeout is None else timeout)
        try:
            self._wait(keys, limit)
        except PMIxError as exc:
            self._fail(exc, "wait", keys, limit)

    def check(self, keys: list[str]) -> bool:
        """Whether every key of ``keys`` is set, or holds an item in its
        queue, now (does not wait)."""
        if not keys:
            return True
        try:
            return not self._absent(keys)[0]
        except PMIxError as exc:
            self._fail(exc, "check", keys)

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

    # -- queues -----------------------------------------------------------------
    #
    # A queue QUEUE is two counters and one key per item, made and changed
    # only by the store's atomic operations, with the store's range and
    # persistence (a job's queues go with the job):
    #
    #   QUEUE#t  slots taken by pushes (add)     QUEUE#N  the item of slot N
    #   QUEUE#h  pops begun (add)
    #
    # A push takes slot N = t++ and stores its item there by compare-and-set
    # from absent.  A pop takes ticket N = h++ and waits (a parked lookup, no
    # polling) for slot N, then removes it: the n-th pop gets the n-th push,
    # whichever comes first.  A pop that stops waiting (timeout, no block,
    # interrupt) puts a str mark in its slot by compare-and-set from absent;
    # if that fails, the push came first and the pop takes the item after
    # all.  A push that finds a mark removes it and takes the next slot.  So
    # every slot is consumed exactly once, the number of items queued is
    # max(0, t - h), and a pop that gave up breaks nothing.  A process killed
    # while it waits in a pop (SIGKILL: no mark) leaves its ticket behind,
    # and the item pushed to that slot is not seen by other pops.

    def queue_push(self, key: str, value: str | bytes) -> None:
        """Append ``value`` to the queue ``key`` (made if absent).

        A queue is not a key: ``get``, ``num_keys``, ``list_keys`` and
        ``delete_key`` do not see it, and a key and a queue of one name
        live side by side; ``check`` and ``wait`` count a queue holding
        an item as a set key (TCPStore's rules).  Waits for the store's
        answer.  (Called from Python only: torch does not pass the queue
        calls on to a store written in Python, so a ``PrefixStore`` over
        this one raises ``NotImplementedError`` for them.)"""
        data = _bytes(value)
        tail, base = self._qkey(key, "t"), self._qprefix + key + "#"
        try:
            while True:
                n = int(self._c.add(tail, b"1", range=self._range,
                                    persistence=self._persist)) - 1
                _, stored = self._c.compare_and_set(base + str(n), None, data,
                                                    range=self._range,
                                                    persistence=self._persist)
                if stored:
                    return
                # slot n was given up by a pop that stopped waiting for it:
                # free it and take the next one
                self._c.unpublish([base + str(n)])
        except PMIxError as exc:
            self._fail(exc, "queue_push", [key])

    def queue_pop(self, key: str, block: bool = True,
                  timeout: timedelta | float | None = None) -> bytes:
        """Remove and return the oldest item of the queue ``key``.

        ``block=True`` waits for one up to ``timeout`` (a ``timedelta`` or
        seconds; the store's timeout when not given; zero: no limit) and
        raises ``DistStoreError`` worded as TCPStore's (``wait timeout
        after 100ms, keys: /KEY``) when none came; ``block=False`` raises
        ``QueueEmptyError`` (``queue is empty``) at once when the queue
        holds nothing.  Each item goes to exactly one caller, in the order
        the pushes were served; callers waiting on one queue are served in
        the order they started waiting."""
        limit = _seconds(self.timeout if timeout is None else
                         timeout if isinstance(timeout, timedelta)
                         else timedelta(seconds=float(timeout)))
        head, base = self._qkey(key, "h"), self._qprefix + key + "#"
        try:
            # our ticket: the n-th pop takes the n-th push, whenever it comes
            slot = base + str(int(self._c.add(head, b"1", range=self._range,
                                              persistence=self._persist)) - 1)
            if not block:
                value = self._give_up(slot)
                if value is None:
                    raise dist.QueueEmptyError(
                        f"queue is empty (pydvm store {self.prefix!r}: queue_pop {key!r} "
                        "without blocking)")
            else:
                try:
                    value = self._c.lookup(slot, range=self._range, wait=True,
                                           timeout=limit)[slot]
                except BaseException:  # a timeout, an interrupt, a lost DVM
                    value = self._give_up(slot)
                    if value is None:
                        raise
            self._c.unpublish([slot])
        except PMIxError as exc:
            self._fail(exc, "queue_pop", [key], limit)
        return _bytes(value)

    def queue_len(self, key: str) -> int:
        """How many items the queue ``key`` holds (0 for a queue never used)."""
        try:
            return self._queued([key])[key][1]
        except PMIxError as exc:
            self._fail(exc, "queue_len", [key])

    @property
    def _qprefix(self) -> str:
        """What every queue key of this store is stored under: the
        prefix's ``#`` replaced by ``%q#`` (no escaped name holds ``%q``),
        so that no queue is counted or listed among the keys."""
        return self.prefix[:-1] + "%q#"

    def _qkey(self, key: str, part: str) -> str:
        """A queue's counter: ``h`` (pops begun) or ``t`` (slots taken by
        pushes).  Its items are ``QUEUE#N``: the part after the last ``#``
        tells them apart from another queue's, whatever the names hold."""
        return f"{self._qprefix}{key}#{part}"

    def _queued(self, keys: Iterable[str], found: Any = None) -> dict[str, tuple[int, int]]:
        """key -> (pops begun, items queued now) of each queue: from
        ``found`` (a lookup's result that asked for the counters), else
        looked up (one request)."""
        keys = list(dict.fromkeys(keys))
        if found is None:
            try:
                found = self._c.lookup([self._qkey(k, p) for k in keys for p in "ht"],
                                       range=self._range)
            except NotFoundError:
                found = {}
        out = {}
        for k in keys:
            h, t = int(found.get(self._qkey(k, "h"), 0)), int(found.get(self._qkey(k, "t"), 0))
            out[k] = (h, max(0, t - h))
        return out

    def _give_up(self, slot: str) -> bytes | None:
        """Leave a mark in the slot of a pop that stops waiting, so that the
        push which gets the slot takes the next one (None); or, if the push
        came first, its value (the pop takes it after all).  A mark is a
        str, which no pushed value (bytes) is."""
        try:
            value, stored = self._c.compare_and_set(slot, None, "given up",
                                                    range=self._range,
                                                    persistence=self._persist)
        except PMIxError:
            return None  # the caller raises what stopped it
        return None if stored else value

    def _absent(self, keys: list[str]) -> tuple[list[str], dict[str, int]]:
        """The keys of ``keys`` neither set nor holding a queued item now,
        with each one's count of pops begun (one lookup: the keys and
        their queues' counters)."""
        keys = list(dict.fromkeys(keys))
        full = [self.prefix + k for k in keys]
        try:
            r = self._c.lookup(full + [self._qkey(k, p) for k in keys for p in "ht"],
                               range=self._range)
        except NotFoundError:
            r = {}
        unset = [k for k, f in zip(keys, full) if f not in r]
        if not unset:
            return [], {}
        queued = self._queued(unset, r)
        absent = [k for k in unset if queued[k][1] == 0]
        return absent, {k: queued[k][0] for k in absent}

    def _wait(self, keys: list[str], limit: float | None) -> None:
        """Wait for ``keys`` as :meth:`wait` (raises ``LookupTimeoutError``)."""
        deadline = None if limit is None else time.monotonic() + limit
        absent, heads = self._absent(keys)
        while absent:
            k = absent[0]
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise LookupTimeoutError("timed out")
            # the key set, or the push that fills the next slot no pop holds
            # (the queue then holds an item)
            r = self._c.lookup([self.prefix + k, f"{self._qprefix}{k}#{heads[k]}"],
                               range=self._range, wait=1, timeout=left or None)
            if self.prefix + k in r:  # k is set: no need to look at it again
                absent = absent[1:]
                if not absent:
                    return
            absent, heads = self._absent(absent)

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
        keys = list(keys)
        names = ", ".join(repr(k) for k in keys)
        if isinstance(exc, LookupTimeoutError):
            # TCPStore's words first (torch's tests and users match on
            # them: it names its keys with its own "/" in front), then ours
            ms = round((timeout or 0) * 1000)
            raise dist.DistStoreError(
                f"wait timeout after {ms}ms, keys: {', '.join('/' + k for k in keys)} "
                f"(pydvm store {self.prefix!r}: {op} timed out after {ms} ms "
                f"(timeout {timeout} s) waiting for key(s) {names})") from exc
        if isinstance(exc, UnreachableError):
            raise dist.DistNetworkError(
                f"pydvm store {self.prefix!r}: {op} {names}: {exc}") from exc
        raise dist.DistStoreError(f"pydvm store {self.prefix!r}: {op} {names}: {exc}") from exc
