"""The reply objects of the PMIx server's upcalls: one C callback each, called once.

Each upcall's request carries one of these as ``request.reply``
(:mod:`pydvm.pmix.requests`).  The first call answers libpmix through the
callback it gave the upcall, with the data converted to C and held until
libpmix releases it; later calls do nothing and return False.  The reply
contract (exceptions, garbage-collected replies, replies pending at
finalize) is :mod:`pydvm.pmix.server`'s module docstring.

A reply is built by the server and given the server itself: this module
never imports it (:class:`Answering` is all a reply uses of it), so the
server, and the helpers that build replies for it (:mod:`.jobctl`,
:mod:`.queries`), import this one and nothing imports back.
"""

from __future__ import annotations

import asyncio
import ctypes
import inspect
import logging
import threading
from typing import Any, Iterable, MutableSet, Protocol

from . import _lib as L
from . import constants as C
from .values import (PmixValueError, Value, build_info, check_key, check_nspace, proc_to_c,
                     value_to_c)

log = logging.getLogger("pydvm.pmix")


class Answering(Protocol):
    """What a reply uses of the server it answers for
    (:class:`~pydvm.pmix.server.PmixServer` is one)."""

    #: the loaded libpmix (its ``malloc`` / ``free``)
    lib: Any
    #: False once finalized: a reply then answers nothing
    _running: bool
    #: the replies handed to the host and not answered yet
    _pending: MutableSet
    #: libpmix's release callback for data held by :meth:`_hold`
    _release_c: Any

    def _hold(self, buf: Any) -> int:
        """Keep ``buf`` alive until libpmix releases it; its token."""


class _Reply:
    """Base of the reply objects: guards the single C callback invocation."""

    __slots__ = ("_server", "_cb", "_cbdata", "_done", "_lock", "kind", "notification",
                 "_tracked", "__weakref__")

    def __init__(self, server: Answering, cbfunc: int | None, cbdata: int | None,
                 proto, kind: str):
        self._server = server
        self._cb = proto(cbfunc) if cbfunc else None
        self._cbdata = cbdata
        # no callback: a notification (client_connected), nothing to answer
        self.notification = self._done = self._cb is None
        self._lock = threading.Lock()
        self.kind = kind
        #: listed in the server's pending replies (once handed to the host's
        #: loop: one answered in its upcall never is).
        self._tracked = False

    def _track(self) -> None:
        if not self._done:
            self._tracked = True
            self._server._pending.add(self)

    @property
    def done(self) -> bool:
        """True once an answer was sent (or the reply was dropped with its server)."""
        return self._done

    def _claim(self) -> bool:
        with self._lock:
            if self._done:
                return False
            self._done = True
        if self._tracked:
            self._server._pending.discard(self)
        if not self._server._running:
            return False
        return True

    def _disarm(self) -> None:
        with self._lock:
            self._done = True
        if self._tracked:
            self._server._pending.discard(self)

    def _late(self) -> bool:
        if self.notification:
            return False
        log.warning("pmix %s reply called again after it was sent: ignored", self.kind)
        return False

    def fail(self, status: int) -> bool:
        """Answer with an error status (no data)."""
        raise NotImplementedError

    def __del__(self):
        try:
            if not self._done and self._server._running:
                log.error("pmix %s reply dropped without an answer: sending PMIX_ERROR",
                          self.kind)
                self.fail(C.ERROR)
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


class OpReply(_Reply):
    """Answer for publish, unpublish, connect, disconnect, abort, client_finalized."""

    __slots__ = ()

    def __call__(self, status: int = C.SUCCESS) -> bool:
        if not self._claim():
            return self._late() if self._server._running else False
        self._cb(int(status), self._cbdata)
        return True

    def fail(self, status: int) -> bool:
        return self(status)


class LookupReply(_Reply):
    """Answer for lookup: ``reply(status, found)``.

    ``found`` is an iterable of ``(key, value, publisher)`` triples (or
    :class:`~pydvm.store.FoundKey`), ``value`` a :class:`Value` (its PMIx type is
    kept) or a native value (default type, see :meth:`Value.of`), ``publisher`` a
    :class:`Proc`.  libpmix 4.2 passes data to the client only with
    ``PMIX_SUCCESS``: with any other status (PARTIAL_SUCCESS included) the
    client receives the status alone.  A triple the binding cannot encode
    (key over PMIX_MAX_KEYLEN, unsupported type) answers the client
    PMIX_ERR_BAD_PARAM / NOT_SUPPORTED and raises :class:`PmixValueError`.
    """

    __slots__ = ()

    def __call__(self, status: int = C.SUCCESS, found: Iterable = ()) -> bool:
        if not self._claim():
            return self._late() if self._server._running else False
        found = list(found)
        keep: list = []
        try:
            arr = (L.pmix_pdata_t * max(len(found), 1))()
            for pd, item in zip(arr, found):
                key, value, proc = item
                pd.key = check_key(key)
                proc_to_c(proc, pd.proc)
                value_to_c(Value.of(value), pd.value, keep)
        except PmixValueError as e:
            self._cb(e.status, None, 0, self._cbdata)
            raise
        self._cb(int(status), ctypes.addressof(arr) if found else None, len(found),
                 self._cbdata)
        return True

    def fail(self, status: int) -> bool:
        return self(status, ())


class ModexReply(_Reply):
    """Answer for fence and direct modex: ``reply(status, data=b"")``.

    The bytes are held until libpmix releases them (its release callback).
    """

    __slots__ = ()

    def __call__(self, status: int = C.SUCCESS, data: bytes = b"") -> bool:
        if not self._claim():
            return self._late() if self._server._running else False
        data = bytes(data or b"")
        if data:
            buf = ctypes.create_string_buffer(data, len(data))
            token = self._server._hold(buf)
            self._cb(int(status), ctypes.addressof(buf), len(data), self._cbdata,
                     self._server._release_c, token)
        else:
            self._cb(int(status), None, 0, self._cbdata, self._server._release_c, None)
        return True

    def fail(self, status: int) -> bool:
        return self(status, b"")


class InfoReply(_Reply):
    """Answer for group operations: ``reply(status, info=())``.

    ``info`` is a list of ``(key, Value or native)`` pairs, held until
    libpmix releases them (its release callback)."""

    __slots__ = ()

    def __call__(self, status: int = C.SUCCESS, info: Iterable = ()) -> bool:
        if not self._claim():
            return self._late() if self._server._running else False
        items = list(info)
        if items:
            keep: list = []
            arr = build_info(items, keep)
            # libpmix takes the bytes of a byte object it is handed here
            # (its buffer adopts them and frees them later): they must come
            # from malloc, and are ours to free only if it left them.
            lib = self._server.lib
            for entry in arr[:len(items)]:
                if entry.value.type == C.BYTE_OBJECT and entry.value.data.bo.size:
                    bo = entry.value.data.bo
                    mem = lib.malloc(bo.size)
                    ctypes.memmove(mem, bo.bytes, bo.size)
                    bo.bytes = mem
            token = self._server._hold(_Adopted(lib, arr, len(items), keep))
            self._cb(int(status), ctypes.addressof(arr), len(items), self._cbdata,
                     self._server._release_c, token)
        else:
            self._cb(int(status), None, 0, self._cbdata, self._server._release_c, None)
        return True

    def fail(self, status: int) -> bool:
        return self(status, ())


class _StatusReply:
    """The reply of a publish or unpublish offered to ``answer_now``: it only
    keeps the status, which the upcall returns to libpmix (see
    :meth:`PmixServer._offer`).  Same contract as :class:`OpReply`: the
    first call answers, later ones are ignored (False)."""

    __slots__ = ("kind", "status")

    notification = False

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.status: int | None = None

    @property
    def done(self) -> bool:
        return self.status is not None

    def __call__(self, status: int = C.SUCCESS) -> bool:
        if self.status is not None:
            log.warning("pmix %s reply called again after it was sent: ignored", self.kind)
            return False
        self.status = int(status)
        return True

    def fail(self, status: int) -> bool:
        return self(status)


class _Adopted:
    """An info array handed to libpmix whose byte objects it may adopt: at
    its release, the bytes it did not take (still set) are freed."""

    __slots__ = ("lib", "arr", "n", "keep")

    def __init__(self, lib, arr, n: int, keep: list) -> None:
        self.lib, self.arr, self.n, self.keep = lib, arr, n, keep

    def release(self) -> None:
        for entry in self.arr[:self.n]:
            if entry.value.type == C.BYTE_OBJECT and entry.value.data.bo.bytes:
                self.lib.free(entry.value.data.bo.bytes)
                entry.value.data.bo.bytes = None


class SpawnReply(_Reply):
    """Answer for spawn: ``reply(status, nspace=None)`` — the new namespace on success."""

    __slots__ = ()

    def __call__(self, status: int = C.SUCCESS, nspace: str | None = None) -> bool:
        if not self._claim():
            return self._late() if self._server._running else False
        ns = check_nspace(nspace) if nspace else None
        self._cb(int(status), ns, self._cbdata)
        return True

    def fail(self, status: int) -> bool:
        return self(status, None)


def run_handler(handler, req, tasks: set, stats: dict) -> None:
    """Hand ``req`` to a host's ``handler``: what it raises answers ``req``
    (:func:`handler_failed`); a coroutine it returns runs as a task kept in
    ``tasks`` until it ends, its failure answering ``req`` likewise."""
    try:
        res = handler(req)
    except BaseException as exc:
        handler_failed(req, exc, stats)
        return
    if inspect.isawaitable(res):
        task = asyncio.ensure_future(res)
        tasks.add(task)

        def done(t: "asyncio.Task") -> None:
            tasks.discard(t)
            task_done(req, t, stats)
        task.add_done_callback(done)


def task_done(req, task: "asyncio.Task", stats: dict) -> None:
    """A host handler's task for ``req`` has ended: a failure answers ``req``
    (:func:`handler_failed`)."""
    if task.cancelled():
        handler_failed(req, asyncio.CancelledError(), stats)
    elif task.exception() is not None:
        handler_failed(req, task.exception(), stats)


def handler_failed(req, exc: BaseException, stats: dict) -> None:
    """A host handler raised ``exc`` for ``req``: it is answered with the
    exception's PMIx ``status`` if it has one, else PMIX_ERROR (unless it
    was answered already), counted and logged."""
    stats["handler_errors"] += 1
    status = getattr(exc, "status", None)
    if not isinstance(status, int) or status == C.SUCCESS:
        status = C.ERROR
    if not req.reply.done:
        log.error("pmix %s handler raised %r: answering %s", req.kind, exc,
                  C.status_name(status))
        req.reply.fail(status)
    else:
        log.error("pmix %s handler raised %r after replying", req.kind, exc)
