"""``PmixServer``: one libpmix server per process, answering through asyncio.

Threading model
---------------
libpmix runs its own progress thread and calls the host's upcalls
(``pmix_server_module_t``) on it.  Each upcall here copies its arguments
into a request object (:mod:`pydvm.pmix.requests`), hands it to the host's
event loop with ``loop.call_soon_threadsafe`` and returns ``PMIX_SUCCESS`` at
once; nothing ever blocks the progress thread.  An argument the binding
refuses (a key over PMIX_MAX_KEYLEN, a value type it cannot carry, an
oversized value, a malformed directive) is answered by returning that status
from the upcall: the host never sees the request and nothing is stored.

One exception, the host's choice: a publish, lookup or unpublish is first
offered to the host's ``answer_now`` (:meth:`PmixServer.start`), on the
progress thread, inside the upcall.  If it answers, libpmix's callback runs
there and then (libpmix 4.2.2 allows that: these callbacks only pack the
answer and queue it for the client) and the request never reaches the loop
-- two thread wake-ups saved.  ``answer_now`` must not block either; the
pydvm host takes its store lock without waiting and leaves the request to
the loop when the loop holds it (:mod:`pydvm.runtime.shared.storeguard`).

Another choice, for a host that only relays: ``take_now``
(:meth:`PmixServer.start`) is offered every upcall on the progress thread
before it would be handed to the loop; taking it means the host has sent it
on (a user's agent writes it to its node: :mod:`pydvm.runtime.pmixhost.agent`)
and answers it later through its reply object, from whatever thread -- the
loop's wake-up saved.  ``take_now`` must not block either.

libpmix's progress thread is not a Python thread: each ctypes callback on it
would get a Python thread state for that call only (made and destroyed per
upcall, with an mmap and munmap of its frame stack on Python 3.11).  The
first upcall keeps one for good (:func:`_keep_thread_state`).

Reply contract
--------------
The host handler runs on the loop thread and answers by calling
``request.reply(...)`` then or later, from any thread.  The first call
invokes libpmix's callback; later calls do nothing and return ``False``
(``reply.done`` tells whether it was sent).  If the handler raises before
replying, the reply is sent with the exception's ``status`` attribute if it
has one (e.g. :class:`PmixServerError`), else ``PMIX_ERROR``.  A reply object that
is garbage-collected unanswered sends ``PMIX_ERROR`` too, so a client is
never left hanging and never told SUCCESS by accident.  Replies still pending
at :meth:`PmixServer.finalize` are dropped with the server.
"""

from __future__ import annotations

import asyncio
import atexit
import ctypes
import itertools
import logging
import os
import shutil
import tempfile
import threading
import weakref
from typing import Any, Callable, Iterable

from . import _lib as L
from . import constants as C
from .directives import (CLAIMS, directives, ids_of, int_of, lenient, persistence_of,
                         range_of, wait_of)
from .replies import (InfoReply, LookupReply, ModexReply, OpReply, SpawnReply, _Adopted,
                      _Reply, _StatusReply, run_handler)
from .requests import (Abort, App, ClientConnected, ClientFinalized, Connect,
                       DeregisterEvents, DirectModex, Disconnect, Fence, Group, Lookup,
                       NotifyEvent, Publish, Query, RegisterEvents, Request, Spawn, Unpublish)
from .tmpdirs import TMPDIR_PREFIX, cleanup_stale, open_topology  # noqa: F401 (re-exported)
from .values import (PmixValueError, Proc, Value, argv_at, build_info, check_key,
                     check_nspace, cstr, info_at, proc_at, proc_to_c, procs_at, validate,
                     PUBLISHABLE_TYPES)

# The server's helpers -- clients (the kernel's check), jobctl and tools (their
# upcalls), queries (reading queries, the attribute fix) -- are imported where
# a server starts or builds its module table: a process that imports this
# package for its constants (the master) does not load them.  The imports go
# one way: neither they nor replies / requests import this module (DESIGN.md).

log = logging.getLogger("pydvm.pmix")

#: Default largest string / byte-object value accepted in a publish (bytes).
DEFAULT_MAX_VALUE_SIZE = 16 * 1024 * 1024

_DONE = (C.SUCCESS, C.OPERATION_SUCCEEDED)


#: The namespace :meth:`PmixServer.probe` deregisters (never registered).
PROBE_NSPACE = "pydvm-probe"


class PmixServerError(RuntimeError):
    """A libpmix call failed, or a host answer to raise from a handler; ``status`` is PMIx's."""

    def __init__(self, status: int, message: str = ""):
        self.status = int(status)
        super().__init__(f"{C.status_name(status)}" + (f": {message}" if message else ""))


# --------------------------------------------------------------------------
# Host handler


class Handler:
    """Convenience base for host handlers: dispatches on ``request.kind``.

    Subclass and define ``publish(req)``, ``lookup(req)``, ... (plain or
    ``async``).  A kind without a method is answered: ``client_connected`` /
    ``client_finalized`` with SUCCESS, everything else with
    PMIX_ERR_NOT_SUPPORTED.  Any callable ``handler(request)`` works as well.
    """

    _OK_BY_DEFAULT = ("client_connected", "client_finalized")

    def __call__(self, req: Request):
        fn = getattr(self, req.kind, None)
        if fn is None:
            status = C.SUCCESS if req.kind in self._OK_BY_DEFAULT else C.ERR_NOT_SUPPORTED
            req.reply.fail(status) if status else req.reply()
            return None
        return fn(req)


# --------------------------------------------------------------------------
# The server

_active_lock = threading.Lock()
_active: "PmixServer | None" = None


class PmixServer:
    """The process's PMIx server.  Construct, :meth:`start`, register, :meth:`finalize`.

    ``max_value_size``: largest string / byte-object value a publish may carry
    (bytes); larger ones are refused with PMIX_ERR_BAD_PARAM.
    """

    def __init__(self, *, max_value_size: int = DEFAULT_MAX_VALUE_SIZE,
                 nspace: str = "pydvm-server", rank: int = 0):
        self.max_value_size = max_value_size
        self.nspace = nspace
        self.rank = rank
        self.lib: L.Lib | None = None
        self.tmpdir: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handler: Callable[[Request], Any] | None = None
        self._answer_now: Callable[[Request], bool] | None = None
        self._take_now: Callable[[Request], bool] | None = None
        self._running = False
        self._pending: "weakref.WeakSet[_Reply]" = weakref.WeakSet()
        self._held: dict[int, Any] = {}
        self._tokens = itertools.count(1)
        self._cfuncs: list = []
        self._module: L.pmix_server_module_t | None = None
        #: accept PMIx tools (PMIX_SERVER_TOOL_SUPPORT and the tool_connected
        #: upcall, pmix/tools.py); set before start()
        self.tool_support = False
        #: libpmix 4.2.0-4.2.4's attribute-query fix (pmix/queries.py): set by start()
        self.attribute_fix: str | None = None
        #: the kernel's check of connecting clients (pmix/clients.py): set by start()
        self.client_guard = None
        self._tasks: set[asyncio.Task] = set()
        self._release_c = L.release_cbfunc_t(self._release)
        self._dmodex_c = L.dmodex_response_fn_t(self._dmodex_response)
        self._dmodex_waiters: dict[int, asyncio.Future] = {}
        #: completion callbacks of registrations in flight (kept alive for libpmix).
        self._sync_cbs: dict[int, Any] = {}
        self._op_done_c = L.op_cbfunc_t(self._op_done)
        #: requests (upcalls handed on), refused by the binding, answered by
        #: ``answer_now`` on libpmix's thread, handlers that raised.
        self.stats = {"requests": 0, "refused": 0, "answered_now": 0, "handler_errors": 0}

    # -- lifecycle -------------------------------------------------------

    def start(self, tmpdir: str | os.PathLike | None, loop: asyncio.AbstractEventLoop,
              handler: Callable[[Request], Any], *,
              extra_info: Iterable[tuple[str, Any]] = (),
              answer_now: Callable[[Request], bool] | None = None,
              take_now: Callable[[Request], bool] | None = None,
              share_topology: bool = True, attribute_fix: bool = True) -> None:
        """Initialise libpmix as this process's server.

        A private directory is created inside ``tmpdir`` (default: the system
        temporary directory) for libpmix's rendezvous files and shared-memory
        stores; :meth:`finalize` removes it.  ``loop`` is the event loop the
        handler runs on; ``handler(request)`` may return a coroutine.

        ``answer_now(request)``, if given, is offered each publish, lookup
        and unpublish first, on libpmix's progress thread inside the upcall:
        it returns True once it has answered (called ``request.reply``),
        False -- having done nothing -- to have the request handed to the
        loop as usual.  It must never block (no waiting for a lock, for I/O,
        for the loop) and must not touch what the loop owns except under
        the host's own lock (see "Threading model" above).

        ``take_now(request)``, if given, is offered each upcall that would be
        handed to the loop, on libpmix's progress thread: it returns True
        once it has taken the request (it is answered later through
        ``request.reply``, from any thread), False -- having done nothing --
        to have it handed to the loop as usual.  It must never block
        either; one that raises gets the upcall refused ``PMIX_ERROR``.

        ``share_topology``: the hardware topology libpmix reads when its
        server starts is handed to every client with its job data -- as
        an hwloc shared-memory image (``PMIX_HWLOC_SHMEM_FILE`` /
        ``_ADDR`` / ``_SIZE``, a file in the private directory) and as XML
        (``PMIX_HWLOC_XML_V2``) -- what PRRTE does for its clients.  Open
        MPI's ``MPI_Init`` adopts the image instead of discovering the
        topology itself (tens of milliseconds of every rank's start, more
        with several ranks on few cores).
        """
        global _active
        lib = L.load()
        with _active_lock:
            if _active is not None:
                raise RuntimeError("a PmixServer is already running in this process "
                                   "(libpmix allows one server per process)")
            _active = self
        try:
            self.lib = lib
            self._loop = loop
            self._handler = handler
            self._answer_now = answer_now
            self._take_now = take_now
            base = os.fspath(tmpdir) if tmpdir is not None else None
            if base:
                os.makedirs(base, exist_ok=True)
            self.tmpdir = tempfile.mkdtemp(prefix=f"{TMPDIR_PREFIX}{os.getpid()}.", dir=base)
            self._module = self._build_module()
            keep: list = []
            items = [
                (C.SERVER_TMPDIR, self.tmpdir),
                (C.SYSTEM_TMPDIR, self.tmpdir),
                (C.SERVER_NSPACE, self.nspace),
                (C.SERVER_RANK, Value(self.rank, C.PROC_RANK)),
                *([(C.SERVER_SHARE_TOPOLOGY, True)] if share_topology else []),
                *([(C.SERVER_TOOL_SUPPORT, True)] if self.tool_support else []),
                *extra_info,
            ]
            info = build_info(items, keep)
            from .clients import ClientGuard
            self.client_guard = ClientGuard(lib, L.parse_version(lib.version))
            self._running = True
            rc = lib.server_init(ctypes.addressof(self._module), ctypes.addressof(info),
                                 len(items))
            if rc != C.SUCCESS:
                self._running = False
                raise PmixServerError(rc, "PMIx_server_init")
            if share_topology:
                open_topology(self.tmpdir)
            from . import queries
            # installed, not needed, off, or why not
            self.attribute_fix = queries.start(self, attribute_fix)
        except BaseException:
            self._running = False
            self._remove_tmpdir()
            with _active_lock:
                _active = None
            raise

    def finalize(self) -> None:
        """Shut libpmix's server down and remove the private tmpdir.

        Replies still pending are dropped (their clients' connections close).
        Safe to call twice.
        """
        global _active
        if not self._running:
            return
        self._running = False
        for r in list(self._pending):
            r._disarm()
        rc = self.lib.server_finalize()
        if rc != C.SUCCESS:
            log.warning("PMIx_server_finalize: %s", C.status_name(rc))
        if self.client_guard is not None:
            self.client_guard.close()
        self._remove_tmpdir()
        with _active_lock:
            if _active is self:
                _active = None

    @property
    def running(self) -> bool:
        return self._running

    @property
    def pending_replies(self) -> int:
        """Requests delivered to the host and not answered yet."""
        return len(self._pending)

    def _remove_tmpdir(self) -> None:
        if self.tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None

    # -- host -> libpmix -------------------------------------------------

    def _need(self) -> L.Lib:
        if not self._running:
            raise RuntimeError("PmixServer is not running")
        return self.lib

    async def register_nspace(self, nspace: str, nlocalprocs: int,
                              info: Iterable[tuple[str, Any]] = ()) -> None:
        """``PMIx_server_register_nspace``; returns once libpmix has stored it.

        ``info``: ``(key, Value or native)`` pairs, e.g. from
        :func:`pydvm.pmix.jobinfo.job_info`.
        """
        lib = self._need()
        keep: list = []
        info = list(info)
        n = len(info)
        arr = build_info(info, keep)
        rc = await self._completed(lambda cb, tok: lib.register_nspace(
            check_nspace(nspace), int(nlocalprocs), ctypes.addressof(arr) if n else None, n,
            cb, tok), keep)
        if rc not in _DONE:
            raise PmixServerError(rc, f"register_nspace({nspace})")

    async def deregister_nspace(self, nspace: str) -> None:
        """``PMIx_server_deregister_nspace``: drops the job's data and its clients;
        returns once libpmix has done it."""
        lib = self._need()
        await self._completed(lambda cb, tok: lib.deregister_nspace(check_nspace(nspace), cb, tok)
                              or C.SUCCESS)
        self.client_guard.release(nspace)

    async def probe(self, timeout: float) -> int:
        """Is libpmix's progress thread still serving?  A call it completes
        on that thread and that changes nothing (the deregistration of a
        namespace never registered: ``PROBE_NSPACE``).  Its status (libpmix's
        "not found") once completed; ``PMIX_ERR_TIMEOUT`` when not completed
        within ``timeout`` seconds -- the thread is stuck."""
        lib = self._need()
        ns = check_nspace(PROBE_NSPACE)
        return await self._completed(lambda cb, tok: lib.deregister_nspace(ns, cb, tok)
                                     or C.SUCCESS, ns, timeout)

    async def _completed(self, call, keep: Any = None, timeout: float = 5.0) -> int:
        """Run a libpmix call that takes (cbfunc, cbdata) and wait -- without
        blocking the event loop -- for its completion callback; returns its
        status.

        libpmix finishes these calls on its progress thread after returning,
        and reads the arguments (``keep`` holds them alive) until then;
        without waiting for the callback, a client connecting meanwhile (a
        job launched right after the last one's clean-up) was seen to hang
        in PMIx_Init.  Calls made in order are completed in order (libpmix
        queues them to its progress thread), so a namespace deregistered
        before another is registered is gone first.
        """
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()
        token = next(self._tokens)
        # One C callback for every such call (made once: a ctypes callback
        # costs a trampoline each), which finds its call by the token.
        self._sync_cbs[token] = (loop, fut, keep)
        rc = call(self._op_done_c, token)
        if rc != C.SUCCESS:  # answered at once: no callback will come
            self._sync_cbs.pop(token, None)
            return rc
        timer = loop.call_later(timeout, _set_result, fut, None)
        try:
            # shielded: a caller cancelled meanwhile leaves the call to finish
            status = await asyncio.shield(fut)
        finally:
            timer.cancel()
        if status is None:
            # the callback may still come: ``keep`` stays registered until then
            log.warning("libpmix did not complete a registration within %.0fs", timeout)
            return C.ERR_TIMEOUT
        return status

    def _op_done(self, status, cbdata) -> None:
        """The completion callback of :meth:`_completed`'s calls (libpmix's
        progress thread, or this thread if libpmix completes at once)."""
        entry = self._sync_cbs.pop(cbdata or 0, None)
        if entry is not None:
            loop, fut, _ = entry
            loop.call_soon_threadsafe(_set_result, fut, int(status))

    async def register_client(self, proc: Proc, uid: int, gid: int) -> None:
        """``PMIx_server_register_client``: libpmix refuses a connecting client whose
        kernel-reported uid/gid differ from these.  Returns once registered."""
        lib = self._need()
        p = L.pmix_proc_t()
        proc_to_c(proc, p)
        rc = await self._completed(lambda cb, tok: lib.register_client(
            ctypes.addressof(p), int(uid), int(gid), None, cb, tok), p)
        if rc not in _DONE:
            raise PmixServerError(rc, f"register_client({proc})")
        self.client_guard.registered(proc, int(uid), int(gid))

    def deregister_client(self, proc: Proc) -> None:
        """``PMIx_server_deregister_client``.

        Measured hazard with libpmix 4.2.2: calling it for each reaped client
        of a long-lived server (a new namespace per job, one client each)
        sooner or later leaves the server unable to answer any new client's
        ``PMIx_Init`` (tens to a few hundred jobs; sooner when the call is
        made right after the exit).  Without it, 300 such jobs ran clean:
        ``deregister_nspace`` at the job's end releases its clients.  The
        pydvm host therefore does not call it (runtime/pmixhost/host.py)."""
        lib = self._need()
        p = L.pmix_proc_t()
        proc_to_c(proc, p)
        lib.deregister_client(ctypes.addressof(p), None, None)

    def setup_fork(self, proc: Proc) -> dict[str, str]:
        """``PMIx_server_setup_fork``: the environment variables the child needs."""
        lib = self._need()
        p = L.pmix_proc_t()
        proc_to_c(proc, p)
        env = ctypes.POINTER(ctypes.c_char_p)()
        rc = lib.setup_fork(ctypes.addressof(p), ctypes.byref(env))
        out: dict[str, str] = {}
        if env:
            i = 0
            raw = ctypes.cast(env, ctypes.POINTER(ctypes.c_void_p))
            while raw[i]:
                s = cstr(raw[i])
                k, _, v = s.partition("=")
                out[k] = v
                lib.free(raw[i])
                i += 1
            lib.free(ctypes.cast(env, ctypes.c_void_p))
        if rc != C.SUCCESS:
            raise PmixServerError(rc, f"setup_fork({proc})")
        return out

    async def dmodex_request(self, proc: Proc) -> tuple[int, bytes]:
        """``PMIx_server_dmodex_request``: the data a local ``proc`` posted, for
        answering another node's :class:`DirectModex`.  Returns ``(status, bytes)``."""
        lib = self._need()
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        token = next(self._tokens)
        self._dmodex_waiters[token] = (loop, fut)
        p = L.pmix_proc_t()
        proc_to_c(proc, p)
        rc = lib.dmodex_request(ctypes.addressof(p), self._dmodex_c, token)
        if rc != C.SUCCESS:
            self._dmodex_waiters.pop(token, None)
            return rc, b""
        return await fut

    def _dmodex_response(self, status, data, size, cbdata):
        # progress thread
        try:
            loop, fut = self._dmodex_waiters.pop(int(cbdata or 0), (None, None))
            if fut is None:
                return
            blob = ctypes.string_at(data, size) if data and size else b""
            loop.call_soon_threadsafe(_set_result, fut, (int(status), blob))
        except Exception:  # pragma: no cover
            log.exception("dmodex response")

    def generate_regex(self, names: Iterable[str]) -> str:
        """``PMIx_generate_regex`` of a node list (node map value)."""
        return self._gen(self._need().generate_regex, ",".join(names))

    def generate_ppn(self, ranks_per_node: Iterable[Iterable[int]]) -> str:
        """``PMIx_generate_ppn``: ranks of each node, nodes in node-map order."""
        s = ";".join(",".join(str(r) for r in node) for node in ranks_per_node)
        return self._gen(self._need().generate_ppn, s)

    def _gen(self, fn, s: str) -> str:
        out = ctypes.c_void_p()
        rc = fn(s.encode(), ctypes.byref(out))
        if rc != C.SUCCESS:
            raise PmixServerError(rc, "generate regex")
        # libpmix's regex is a NUL-terminated string, possibly with a
        # binary-safe tail; the ``pmix:`` / ``raw:`` forms are plain text.
        res = cstr(out.value)
        self.lib.free(out)
        return res

    # -- modex data held for libpmix -------------------------------------

    def _hold(self, buf) -> int:
        token = next(self._tokens)
        self._held[token] = buf
        return token

    def _release(self, cbdata):
        held = self._held.pop(int(cbdata or 0), None)
        if isinstance(held, _Adopted):
            held.release()

    # -- libpmix -> host -------------------------------------------------

    def _build_module(self) -> L.pmix_server_module_t:
        mod = L.pmix_server_module_t()
        impls = {
            "client_connected2": self._up_connected,
            "client_finalized": self._up_finalized,
            "abort": self._up_abort,
            "fence_nb": self._up_fence,
            "direct_modex": self._up_dmodex,
            "publish": self._up_publish,
            "lookup": self._up_lookup,
            "unpublish": self._up_unpublish,
            "spawn": self._up_spawn,
            "connect": self._up_connect,
            "disconnect": self._up_disconnect,
            "register_events": self._up_register_events,
            "deregister_events": self._up_deregister_events,
            "notify_event": self._up_notify_event,
            "group": self._up_group,
            "query": self._up_query,
        }
        from .jobctl import upcalls as job_upcalls   # job_control, allocate
        for name, fn in {**impls, **job_upcalls(self)}.items():
            slot, proto = L.UPCALL_TYPES[name]
            cf = proto(_guarded(name, fn, self))
            self._cfuncs.append(cf)           # kept for the server's life
            setattr(mod, f"slot{slot}", ctypes.cast(cf, ctypes.c_void_p).value)
        from . import tools                   # tools (only client tools without tool_support)
        cf = tools.upcall(self)
        self._cfuncs.append(cf)
        mod.slot16 = ctypes.cast(cf, ctypes.c_void_p).value
        return mod

    def _post(self, req: Request) -> int:
        """Hand ``req`` to the host's ``take_now``, or to the loop; the
        upcall's return value."""
        self.stats["requests"] += 1
        req.reply._track()
        take = self._take_now
        if take is not None:
            try:
                if take(req):
                    return C.SUCCESS
            except BaseException as e:
                # it may have been half sent: never handed on a second time
                req.reply._disarm()
                self.stats["handler_errors"] += 1
                log.error("pmix %s take_now raised %r: PMIX_ERROR", req.kind, e)
                return C.ERROR
        try:
            self._loop.call_soon_threadsafe(self._dispatch, req)
        except RuntimeError:                  # loop closed
            req.reply._disarm()
            return C.ERR_UNREACH
        return C.SUCCESS

    def _offer(self, req: Request, cbfunc, cbdata) -> int:
        """A data request (progress thread): answered here by ``answer_now``
        if it can be, else handed to the loop; the upcall's return value.

        A lookup's answer carries data, so it goes through libpmix's
        callback, called before the upcall returns -- libpmix 4.2.2 allows
        that: its publish / lookup / unpublish callbacks only pack the
        answer and queue it for the client, and it touches none of the
        request's memory once the upcall has returned SUCCESS.  A publish's
        or unpublish's answer is a status: the upcall returns it
        (``PMIX_OPERATION_SUCCEEDED`` for SUCCESS: "done, no callback will
        come", as the PMIx standard has it), and libpmix answers the client
        itself -- no callback, no reply object."""
        now = self._answer_now
        if now is not None:
            lookup = req.kind == "lookup"
            req.reply = (LookupReply(self, cbfunc, cbdata, L.lookup_cbfunc_t, req.kind)
                         if lookup else _StatusReply(req.kind))
            try:
                answered = now(req)
            except BaseException as e:
                # as a handler that raises: the request is answered with an
                # error, never handed on (it may have been half served)
                answered = True
                self.stats["handler_errors"] += 1
                status = getattr(e, "status", None)
                if not isinstance(status, int) or status == C.SUCCESS:
                    status = C.ERROR
                log.error("pmix %s answer_now raised %r: answering %s", req.kind, e,
                          C.status_name(status))
                if not req.reply.done:
                    req.reply.fail(status)
            if answered:
                self.stats["requests"] += 1
                self.stats["answered_now"] += 1
                if lookup:
                    return C.SUCCESS
                status = req.reply.status
                if status is None:  # said answered, never answered
                    log.error("pmix %s: answer_now answered nothing: PMIX_ERROR", req.kind)
                    return C.ERROR
                return C.OPERATION_SUCCEEDED if status == C.SUCCESS else status
            if lookup:
                return self._post(req)
        req.reply = OpReply(self, cbfunc, cbdata, L.op_cbfunc_t, req.kind)
        return self._post(req)

    def _dispatch(self, req: Request) -> None:
        # loop thread
        if not self._running:
            return
        # Not arming the loop's poll (pydvm_master_poll_us) here: a polling
        # loop thread holds the GIL that libpmix's progress thread needs for
        # the next upcall, which made a PMIx publish ~10 µs slower, not faster.
        run_handler(self._handler, req, self._tasks, self.stats)

    # individual upcalls (progress thread).  Returning non-SUCCESS makes
    # libpmix answer the client itself; the reply object is then disarmed.

    def _up_connected(self, proc, server_object, info, ninfo, cbfunc, cbdata):
        who = proc_at(proc)
        if not self.client_guard.check(who):
            self.stats["refused"] += 1
            return C.SUCCESS          # cut in the check; the host never hears of it
        req = ClientConnected(who, directives(info, ninfo))
        req.reply = OpReply(self, cbfunc, cbdata, L.op_cbfunc_t, req.kind)
        return self._post(req)

    def _up_finalized(self, proc, server_object, cbfunc, cbdata):
        req = ClientFinalized(proc_at(proc))
        req.reply = OpReply(self, cbfunc, cbdata, L.op_cbfunc_t, req.kind)
        return self._post(req)

    def _up_abort(self, proc, server_object, status, msg, procs, nprocs, cbfunc, cbdata):
        req = Abort(proc_at(proc), int(status),
                    msg.decode("utf-8", "replace") if msg else None, procs_at(procs, nprocs))
        req.reply = OpReply(self, cbfunc, cbdata, L.op_cbfunc_t, req.kind)
        return self._post(req)

    def _up_fence(self, procs, nprocs, info, ninfo, data, ndata, cbfunc, cbdata):
        d = directives(info, ninfo)
        collect = d.get(C.COLLECT_DATA)
        timeout = d.get(C.TIMEOUT)
        req = Fence(procs_at(procs, nprocs),
                    ctypes.string_at(data, ndata) if data and ndata else b"",
                    bool(collect.value) if collect is not None else False,
                    int_of(timeout, C.TIMEOUT) if timeout is not None else None, d)
        req.reply = ModexReply(self, cbfunc, cbdata, L.modex_cbfunc_t, req.kind)
        return self._post(req)

    def _up_dmodex(self, proc, info, ninfo, cbfunc, cbdata):
        req = DirectModex(proc_at(proc), directives(info, ninfo))
        req.reply = ModexReply(self, cbfunc, cbdata, L.modex_cbfunc_t, req.kind)
        return self._post(req)

    def _up_publish(self, proc, info, ninfo, cbfunc, cbdata):
        pairs: dict[str, Value] = {}
        directives: dict[str, Value] = {}
        for key, val in info_at(info, ninfo, CLAIMS):
            if isinstance(val, PmixValueError):
                raise val
            if key.startswith(C.ATTR_PREFIX):
                directives[key] = val
                continue
            if not key:  # (read from C: NUL-free and within PMIX_MAX_KEYLEN)
                raise PmixValueError(C.ERR_BAD_PARAM, "empty key")
            t = val.type
            if t == C.STRING or t == C.BYTE_OBJECT:
                # of its type by construction, NUL-free if a string: only the size
                if len(val.value) * (4 if t == C.STRING else 1) > self.max_value_size:
                    validate(val, self.max_value_size)
            elif t not in PUBLISHABLE_TYPES:
                raise PmixValueError(C.ERR_NOT_SUPPORTED,
                                     f"cannot publish {key!r}: type "
                                     f"{C.type_name(t)} is not supported")
            else:
                validate(val, self.max_value_size)
            pairs[key] = val
        rng = pers = uids = gids = None
        if directives:
            rng = range_of(directives.pop(C.RANGE, None))
            pers = persistence_of(directives.pop(C.PERSISTENCE, None))
            uids = ids_of(directives.pop(C.ACCESS_USERIDS, None), C.ACCESS_USERIDS)
            gids = ids_of(directives.pop(C.ACCESS_GRPIDS, None), C.ACCESS_GRPIDS)
        req = Publish(proc_at(proc), pairs, rng, pers, uids, gids, directives)
        return self._offer(req, cbfunc, cbdata)

    def _up_lookup(self, proc, keys, info, ninfo, cbfunc, cbdata):
        klist = argv_at(keys) or []
        for k in klist:
            check_key(k)
        d = directives(info, ninfo)
        rng = wait = timeout = None
        if d:
            rng = range_of(d.pop(C.RANGE, None))
            wait = wait_of(d.pop(C.WAIT, None))
            t = d.pop(C.TIMEOUT, None)
            timeout = int_of(t, C.TIMEOUT) if t is not None else None
        req = Lookup(proc_at(proc), klist, rng, wait, timeout, d)
        if self._answer_now is None:
            req.reply = LookupReply(self, cbfunc, cbdata, L.lookup_cbfunc_t, req.kind)
            return self._post(req)
        return self._offer(req, cbfunc, cbdata)

    def _up_unpublish(self, proc, keys, info, ninfo, cbfunc, cbdata):
        klist = argv_at(keys)
        for k in klist or ():
            check_key(k)
        d = directives(info, ninfo)
        rng = range_of(d.pop(C.RANGE, None))
        req = Unpublish(proc_at(proc), klist, rng, d)
        return self._offer(req, cbfunc, cbdata)

    def _up_spawn(self, proc, job_info, ninfo, apps, napps, cbfunc, cbdata):
        alist = []
        if apps and napps:
            for a in (L.pmix_app_t * napps).from_address(apps):
                alist.append(App(cstr(a.cmd), argv_at(a.argv) or [], argv_at(a.env) or [],
                                 cstr(a.cwd), int(a.maxprocs), directives(a.info, a.ninfo)))
        req = Spawn(proc_at(proc), directives(job_info, ninfo), alist)
        req.reply = SpawnReply(self, cbfunc, cbdata, L.spawn_cbfunc_t, req.kind)
        return self._post(req)

    def _up_connect(self, procs, nprocs, info, ninfo, cbfunc, cbdata):
        req = Connect(procs_at(procs, nprocs), directives(info, ninfo))
        req.reply = OpReply(self, cbfunc, cbdata, L.op_cbfunc_t, req.kind)
        return self._post(req)

    def _up_disconnect(self, procs, nprocs, info, ninfo, cbfunc, cbdata):
        req = Disconnect(procs_at(procs, nprocs), directives(info, ninfo))
        req.reply = OpReply(self, cbfunc, cbdata, L.op_cbfunc_t, req.kind)
        return self._post(req)

    def _up_register_events(self, codes, ncodes, info, ninfo, cbfunc, cbdata):
        req = RegisterEvents(_codes_at(codes, ncodes), lenient(info, ninfo))
        req.reply = OpReply(self, cbfunc, cbdata, L.op_cbfunc_t, req.kind)
        return self._post(req)

    def _up_deregister_events(self, codes, ncodes, cbfunc, cbdata):
        req = DeregisterEvents(_codes_at(codes, ncodes))
        req.reply = OpReply(self, cbfunc, cbdata, L.op_cbfunc_t, req.kind)
        return self._post(req)

    def _up_notify_event(self, code, source, rng, info, ninfo, cbfunc, cbdata):
        items = [(k, v) for k, v in info_at(info, ninfo, CLAIMS)
                 if not isinstance(v, PmixValueError)]
        req = NotifyEvent(int(code), proc_at(source), int(rng), items)
        # Answered here, not by the host: libpmix 4.2.2 counts this upcall as
        # pending only if it returns PMIX_OPERATION_IN_PROGRESS, and frees
        # its callback data at once on PMIX_SUCCESS -- a later callback then
        # writes into freed memory.  The client's PMIx_Notify_event needs no
        # more than local delivery (done), so the host's passing the event
        # to other nodes is a notification it does not answer.
        req.reply = OpReply(self, None, None, L.op_cbfunc_t, req.kind)
        rc = self._post(req)
        return C.OPERATION_SUCCEEDED if rc == C.SUCCESS else rc

    def _up_group(self, op, grp, procs, nprocs, directives, ndirs, cbfunc, cbdata):
        req = Group("destruct" if op == GROUP_DESTRUCT else "construct",
                    grp.decode("utf-8", "replace") if grp else "", procs_at(procs, nprocs),
                    lenient(directives, ndirs))
        req.reply = InfoReply(self, cbfunc, cbdata, L.info_cbfunc_t, req.kind)
        return self._post(req)

    def _up_query(self, proct, queries, nqueries, cbfunc, cbdata):
        from .queries import queries_at
        req = Query(proc_at(proct), queries_at(queries, nqueries))
        req.reply = InfoReply(self, cbfunc, cbdata, L.info_cbfunc_t, req.kind)
        return self._post(req)

    # -- host -> libpmix: events ------------------------------------------

    async def notify_event(self, code: int, source: Proc, rng: int,
                           info: Iterable[tuple[str, Any]] = (), timeout: float = 5.0) -> int:
        """``PMIx_Notify_event``: deliver an event to this server's clients in
        range (libpmix filters by each handler's codes and affected procs).

        Returns libpmix's completion status once it has passed the event on
        (``PMIX_ERR_TIMEOUT`` if that takes longer than ``timeout``).
        """
        lib = self._need()
        keep: list = []
        items = [(k, v) for k, v in info if k != C.SERVER_INTERNAL_NOTIFY]
        arr = build_info(items, keep) if items else None
        src = L.pmix_proc_t()
        proc_to_c(source, src)
        keep.append(src)
        rc = await self._completed(lambda cb, tok: lib.notify_event(
            int(code), ctypes.addressof(src), int(rng) & 0xFF,
            ctypes.addressof(arr) if arr is not None else None, len(items), cb, tok),
            keep, timeout)
        return C.SUCCESS if rc == C.OPERATION_SUCCEEDED else rc


def _set_result(fut: asyncio.Future, value) -> None:
    if not fut.done():
        fut.set_result(value)


#: Threads of libpmix whose Python thread state is kept (see _keep_thread_state).
_kept_threads: set[int] = set()


def _keep_thread_state() -> None:
    """Keep the calling foreign thread's Python thread state for good.

    A ctypes callback on a thread Python did not start gets a thread state
    for the call only: ``PyGILState_Ensure`` makes one and the matching
    release destroys it, so every upcall on libpmix's progress thread paid
    for a new thread state -- and, on Python 3.11, for an mmap of its frame
    stack and an munmap at the end (system calls, page faults, and TLB
    shootdowns across the process's threads): about a tenth of that
    thread's time in a PMIx publish benchmark.  One extra
    ``PyGILState_Ensure`` that is never released keeps it alive.  libpmix
    has one progress thread per server (one server per process); the kept
    state is freed with the interpreter, after the server is finalized
    (:func:`_finalize_at_exit` at the latest)."""
    tid = threading.get_ident()
    if tid not in _kept_threads:
        _kept_threads.add(tid)
        ctypes.pythonapi.PyGILState_Ensure()


@atexit.register
def _finalize_at_exit() -> None:
    """A server still running when the interpreter exits is finalized first:
    the interpreter frees every thread state as it shuts down, the kept one
    of libpmix's thread too, and an upcall after that would use it."""
    server = _active
    if server is not None:
        try:
            server.finalize()
        except Exception:  # pragma: no cover - exiting anyway
            pass


def _guarded(name: str, fn, server: PmixServer):
    """Never let an exception cross into C (ctypes would return 0, i.e. SUCCESS)."""

    def upcall(*args):
        try:
            if threading.get_ident() not in _kept_threads:
                _keep_thread_state()
            if not server._running:
                return C.ERR_INIT
            return fn(*args)
        except PmixValueError as e:
            server.stats["refused"] += 1
            log.info("pmix %s refused: %s (%s)", name, e, C.status_name(e.status))
            return e.status
        except BaseException:
            log.exception("pmix %s upcall failed", name)
            return C.ERROR

    upcall.__name__ = f"upcall_{name}"
    return upcall


#: pmix_group_operation_t
GROUP_CONSTRUCT = 0
GROUP_DESTRUCT = 1


def _codes_at(addr, n) -> list[int]:
    if not addr or not n:
        return []
    return [int(x) for x in (ctypes.c_int * n).from_address(addr)]
