"""The store guard: the one lock between a process's event loop and libpmix's thread.

A store (:class:`~pydvm.store.DataStore`) is a plain object with no lock of
its own.  In a process that hosts a PMIx server (every node server: a
daemon, or the master for the head node) a PMIx publish, lookup or
unpublish that a store of this process can answer at once is answered on
libpmix's progress thread, inside the upcall (:meth:`PmixHost.answer_now
<pydvm.runtime.pmixhost.host.PmixHost.answer_now>`), instead of being handed to
the event loop and its answer handed back (two thread wake-ups).  So two
threads reach the stores, and this module is where that is made safe.

One guard per event loop (:func:`guard_for`), so one per process: the
master store and the head node's store share it (a head-node unpublish
touches both in one step).

What runs under the guard -- the whole list
-------------------------------------------
1. every method and property of the process's stores, on any thread: the
   runtime holds each store only as a :class:`GuardedStore`, so a call site
   cannot forget the lock (publish, lookup, unpublish from a client, a
   daemon, a direct client or a tool; cancel; every purge -- process, app,
   job, session, ``pydvm purge``; stats, ``pydvm store`` rows, metrics);
2. the stores' timer callbacks -- the sweep and parked lookups' timeouts
   (:class:`GuardedTimer`), on the loop;
3. the request counters (:class:`GuardedStats`: ``apply``, ``record``,
   ``sample``);
4. the PMIx fast path, on libpmix's thread: the session check, the routing
   decision and the store operations of one request
   (``PmixHost.answer_now`` -> ``NodeServer.serve_now`` ->
   ``MasterRouter.serve_now``).

What never runs under it
------------------------
* **the stores' sinks** (``on_answer``: a parked lookup's answer;
  ``on_holder``: a daemon's holder notice).  They are *deferred*: collected
  while the guard is held and run once it is released -- on the loop at
  once, in order, before the guarded call returns (so the loop sees the
  same order of events as without the guard); from libpmix's thread they
  are handed to the loop, one ``call_soon_threadsafe`` for the lot.  Sinks
  write to sockets and answer other PMIx requests: loop work.
* **any call into libpmix.**  A PMIx reply is given after the guard is
  released (``PmixHost.answer_now``).  A thread holding the guard never
  waits for libpmix, so libpmix's thread can never be stuck behind a
  thread that waits for it.
* I/O of any kind.

Who waits for whom
------------------
The loop takes the guard blocking: it may wait for one fast-path request
(microseconds).  libpmix's thread never waits: it *tries* the guard and,
when the loop holds it, hands the request to the loop exactly as it did
before this path existed -- "nothing blocks libpmix's progress thread"
still holds.  The GIL: an upcall holds it from its start (ctypes takes it);
a thread blocking on the guard releases the GIL while it waits, and the
guard's holder runs only Python (store code) until it releases, so the two
locks are always taken GIL first and never waited for in the other order.

Timers from libpmix's thread
----------------------------
Store code may arm or cancel a timer (the sweep when the first idle item
arrives or the last leaves; a parked lookup's timeout when a publish
answers it).  An asyncio (or uvloop) loop's timers are the loop's alone, so
:class:`GuardedTimer` arms on the loop: from another thread the arming is
deferred like a sink, with its deadline fixed when it was asked for.  A
handle cancelled from another thread is marked at once (its callback, run
under the guard, checks the mark) and taken off the loop's heap by a
deferred cancel; one armed and cancelled within one section (a lookup
tried and withdrawn) leaves nothing to do.

Checking
--------
With ``PYDVM_CHECK_STORES=1`` in the environment (tests), each guarded
section ends, still under the guard, with every guarded store's
``check_invariants()``; a failure is logged (``store invariants broken``)
and counted, never raised into the caller.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import weakref
from time import perf_counter
from typing import Any, Callable, Hashable

from ...store import DataStore, Reply
from ...wire import Message
from . import dataops
from .stats import RequestStats

log = logging.getLogger("pydvm.storeguard")

#: Set (to anything but "" or "0") to check every guarded store's
#: invariants at the end of each guarded section (tests).
CHECK_ENV = "PYDVM_CHECK_STORES"

_guards: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, StoreGuard]" = \
    weakref.WeakKeyDictionary()
_guards_lock = threading.Lock()


def guard_for(loop: asyncio.AbstractEventLoop) -> "StoreGuard":
    """The guard of ``loop`` (made on first use; call it on the loop's thread)."""
    with _guards_lock:
        g = _guards.get(loop)
        if g is None:
            g = _guards[loop] = StoreGuard(loop)
        return g


#: what :meth:`StoreGuard.leave` returns when nothing was deferred (never appended to).
_NONE: list = []


def _run_all(effects: list) -> None:
    for fn, args in effects:
        try:
            fn(*args)
        except Exception:
            log.exception("a deferred store effect (%s) failed",
                          getattr(fn, "__qualname__", fn))


class StoreGuard:
    """The lock, the effects deferred while it is held, and the loop that runs them.

    Use ``with guard:`` on the loop (blocking, reentrant).  Another thread
    uses :meth:`try_enter` / :meth:`leave` and dispatches what ``leave``
    returns with :meth:`post` once it has done what it must do first.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.RLock()
        self._depth = 0
        self._effects: list = []
        #: the loop's thread: the guard is made there (guard_for).
        self.loop_thread = threading.get_ident()
        #: stores whose invariants are checked (CHECK_ENV).
        self.stores: list[DataStore] = []
        self.check = os.environ.get(CHECK_ENV, "") not in ("", "0")
        #: sections checked, and those that found a store broken (CHECK_ENV).
        self.checked = 0
        self.broken = 0
        #: times another thread found the guard held and gave its request to the loop.
        self.busy = 0

    # -- the loop (or any thread that may wait) --------------------------

    def __enter__(self) -> "StoreGuard":
        self._lock.acquire()
        self._depth += 1
        return self

    def __exit__(self, *exc) -> bool:
        effects = self.leave()
        if effects:
            self.post(effects)
        return False

    # -- a thread that must not wait ---------------------------------------

    def try_enter(self) -> bool:
        """Take the guard if it is free (or already ours); False if another thread holds it."""
        if not self._lock.acquire(blocking=False):
            self.busy += 1  # a plain int: a lost count is harmless
            return False
        self._depth += 1
        return True

    def leave(self) -> list:
        """Release one level; at the outermost, return the deferred effects
        (to :meth:`post`) after checking the stores if asked to."""
        depth = self._depth = self._depth - 1
        if depth:
            self._lock.release()
            return _NONE
        try:
            if self.check:
                self._check()
        finally:
            effects = self._effects
            if effects:
                self._effects = []
            else:
                effects = _NONE  # never the live list: it is another holder's next
            self._lock.release()
        return effects

    def post(self, effects: list) -> None:
        """Run ``effects`` now on the loop's thread, or hand them to the loop."""
        if threading.get_ident() == self.loop_thread:
            _run_all(effects)
        else:
            try:
                self.loop.call_soon_threadsafe(_run_all, effects)
            except RuntimeError:  # the loop is closed: nobody is left to tell
                log.warning("%d store effects dropped: the loop is closed", len(effects))

    # -- under the guard ------------------------------------------------------

    def defer(self, fn: Callable, *args) -> None:
        """Run ``fn(*args)`` once the guard is released (on the loop).  Only
        called by code running under the guard."""
        self._effects.append((fn, args))

    def deferring(self, fn: Callable) -> Callable:
        """``fn`` as a sink that defers each call (see :meth:`defer`)."""
        def sink(*args):
            self._effects.append((fn, args))
        sink.__qualname__ = f"deferred {getattr(fn, '__qualname__', fn)}"
        return sink

    def _check(self) -> None:
        self.checked += 1
        for store in self.stores:
            try:
                store.check_invariants()
            except Exception as exc:
                self.broken += 1
                log.error("store invariants broken: %s: %r", store.name, exc, exc_info=True)


# ----------------------------------------------------------------------
# the store, its timer, its counters
# ----------------------------------------------------------------------


class GuardedStore:
    """A :class:`DataStore` whose every method and property runs under the guard.

    Plain attributes (``name``, ``params``, ``dvm_nspace``) are read through
    as they are.  ``raw`` is the store itself (tests, benchmarks).
    """

    __slots__ = ("raw", "guard")

    def __init__(self, store: DataStore, guard: StoreGuard) -> None:
        self.raw = store
        self.guard = guard

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)

    def __len__(self) -> int:
        with self.guard:
            return len(self.raw)

    def __repr__(self) -> str:
        return f"<GuardedStore {self.raw.name}>"


def _guarded_method(fn: Callable) -> Callable:
    def method(self, *args, **kw):
        with self.guard:
            return fn(self.raw, *args, **kw)
    method.__name__ = fn.__name__
    method.__qualname__ = f"GuardedStore.{fn.__name__}"
    method.__doc__ = fn.__doc__
    return method


def _guarded_property(prop: property) -> property:
    def get(self):
        with self.guard:
            return prop.fget(self.raw)
    return property(get, doc=prop.__doc__)


# Every public method and property, the inherited ones too (the read-only
# views of store/views.py): bases first, so a subclass's own definition wins.
for _cls in reversed(DataStore.__mro__[:-1]):
    for _name, _attr in vars(_cls).items():
        if _name.startswith("_"):
            continue
        if isinstance(_attr, property):
            setattr(GuardedStore, _name, _guarded_property(_attr))
        elif callable(_attr):
            setattr(GuardedStore, _name, _guarded_method(_attr))
del _cls, _name, _attr


class _Handle:
    """A :class:`GuardedTimer` handle (cancelled only under the guard)."""

    __slots__ = ("_timer", "cancelled", "real", "arming")

    def __init__(self, timer: "GuardedTimer") -> None:
        self._timer = timer
        self.cancelled = False
        #: the loop's handle once armed (None: not yet, or no longer).
        self.real: asyncio.TimerHandle | None = None
        #: the deferred arming, while it waits in the guard's effects.
        self.arming: tuple | None = None

    def cancel(self) -> None:
        if self.cancelled:
            return
        self.cancelled = True
        guard = self._timer.guard
        if self.arming is not None:
            # armed and cancelled in one section: drop the arming (no
            # wake-up of the loop for nothing); if it was handed to the
            # loop already, it finds the handle cancelled
            try:
                guard._effects.remove(self.arming)
            except ValueError:
                pass
            self.arming = None
        real, self.real = self.real, None
        if real is not None:
            if threading.get_ident() == guard.loop_thread:
                real.cancel()
            else:
                guard.defer(real.cancel)


class GuardedTimer:
    """The stores' timer: armed on the loop whatever thread asks; each
    callback runs under the guard (see the module docstring)."""

    def __init__(self, guard: StoreGuard) -> None:
        self.guard = guard

    def call_later(self, delay: float, callback: Callable, *args) -> _Handle:
        h = _Handle(self)
        if threading.get_ident() == self.guard.loop_thread:
            h.real = self.guard.loop.call_later(delay, self._fire, h, callback, args)
        else:
            h.arming = (self._arm, (h, time.monotonic() + delay, callback, args))
            self.guard._effects.append(h.arming)
        return h

    def _arm(self, h: _Handle, deadline: float, callback: Callable, args: tuple) -> None:
        with self.guard:
            h.arming = None
            if not h.cancelled:
                h.real = self.guard.loop.call_later(max(0.0, deadline - time.monotonic()),
                                                    self._fire, h, callback, args)

    def _fire(self, h: _Handle, callback: Callable, args: tuple) -> None:
        with self.guard:
            if h.cancelled:
                return
            h.cancelled = True  # it has run: a later cancel() is a no-op
            h.real = None
            callback(*args)


#: The ticket of a lookup answered now if it can be (see GuardedStats.apply_now):
#: parked and withdrawn within one guarded section, so never seen parked.
_PROBE = ("pmix-now",)


class GuardedStats(RequestStats):
    """:class:`~pydvm.runtime.shared.stats.RequestStats` counted and read under the guard."""

    __slots__ = ("guard",)

    def __init__(self, guard: StoreGuard) -> None:
        super().__init__()
        self.guard = guard

    def apply(self, store, caller, msg: Message, ticket: Hashable) -> Message | None:
        with self.guard:
            return super().apply(store, caller, msg, ticket)

    def record(self, op: str, dt: float, status: int | None) -> None:
        with self.guard:
            super().record(op, dt, status)

    def sample(self) -> dict[str, Any]:
        with self.guard:
            return super().sample()

    def apply_now(self, store: GuardedStore, caller, msg: Message) -> Reply | None:
        """:meth:`apply` for a plain request that must not wait, answered with
        the store's :class:`~pydvm.store.Reply` (:func:`dataops.run`), or
        None when it is a lookup that would park -- then nothing is counted
        and the store is as it was (the lookup was parked and withdrawn
        within this one section; only items found past their idle timeout
        were expired, as any read does).  Called under the guard, so the
        store is used directly (its wrapper would only take the guard again)."""
        raw = store.raw
        t0 = perf_counter()
        r = dataops.run(raw, caller, msg, _PROBE)
        if r is None:
            raw.cancel(_PROBE)
            return None
        RequestStats.record(self, msg["t"], perf_counter() - t0, r.status)
        return r


def guarded_store(guard: StoreGuard, **kw) -> GuardedStore:
    """A :class:`DataStore` built with ``kw`` for use under ``guard``: its
    sinks deferred, its timer a :class:`GuardedTimer`.  ``timer`` in ``kw``
    is ignored (the guard's loop is the timer)."""
    kw.pop("timer", None)
    kw["on_answer"] = guard.deferring(kw["on_answer"])
    if kw.get("on_holder") is not None:
        kw["on_holder"] = guard.deferring(kw["on_holder"])
    store = DataStore(timer=GuardedTimer(guard), **kw)
    guard.stores.append(store)
    return GuardedStore(store, guard)
