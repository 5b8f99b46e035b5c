"""How items leave when their lifetime ends: purges at a horizon, the idle sweep.

:class:`StoreLifetimes` is the part of :class:`~pydvm.store.DataStore` that
ends items because a real event ended their lifetime (SPEC 5): a process,
an application, a job or a session ending (:meth:`~StoreLifetimes.purge`,
told by the runtime), or an INDEF / FIRST_READ item left unread past the
idle timeout (:meth:`~StoreLifetimes.sweep`, which the store arms on its
injected timer while such items exist).  Every removal goes through the
store's one removal helper (``_remove_item``, :mod:`pydvm.store.store`);
the tables that say which persistence ends at which horizon are
:mod:`pydvm.store.rules`'.  The store inherits these methods, so callers
use them as ``store.purge(...)``, ``store.sweep()``.
"""

from __future__ import annotations

import logging

from ..enums import Persistence
from .model import Caller, Item
from .results import PURGE_REASON, Reason
from .rules import LIFETIME_HORIZONS, expires_by, owns, sweep_interval
from .validate import as_persistence

log = logging.getLogger("pydvm.store")

#: Items the sweep removes per pass before yielding back to the event loop.
SWEEP_BUDGET = 1000


class StoreLifetimes:
    """Purges and the idle sweep of a :class:`~pydvm.store.DataStore`."""

    __slots__ = ()

    # ------------------------------------------------------------------
    # purge
    # ------------------------------------------------------------------

    def purge(
        self,
        horizon: Persistence | int,
        *,
        nspace: str | None = None,
        rank: int | None = None,
        app_idx: int | None = None,
        session_id: int | None = None,
        owner: Caller | None = None,
    ) -> int:
        """Apply a lifetime's end (SPEC 5) and return how many items left.

        The target is a process (``nspace`` and ``rank``), a namespace with
        all ranks (``nspace``), or every namespace (``nspace=None``, which
        needs ``session_id``).  ``app_idx`` / ``session_id`` further require
        the item's own to be equal (an unknown one never matches).  Items go
        when :func:`~pydvm.store.rules.expires_by` says their persistence
        ends at ``horizon``; with ``owner``, only items it
        :func:`~pydvm.store.rules.owns` (a purge asked for by an
        unprivileged relay).  For lifetime horizons (not ``INVALID``, the
        explicit unpublish) parked lookups whose requestor the target covers
        are dropped unanswered.  Raises ValueError for an ill-formed target.
        """
        return self._purge(horizon, nspace, rank, app_idx, session_id, owner)[0]

    def _purge(self, horizon, nspace, rank, app_idx, session_id, owner) -> tuple[int, int]:
        """:meth:`purge`, returning ``(items removed, keys removed)``."""
        h = as_persistence(horizon)
        if h is None or h not in (LIFETIME_HORIZONS | {Persistence.INVALID}):
            raise ValueError(f"{horizon!r} is not a purge horizon")
        if nspace is None and session_id is None:
            raise ValueError("a purge of every namespace needs a session id")
        if rank is not None and nspace is None:
            raise ValueError("a purge naming a rank needs its namespace")
        now = self._clock.now()
        if nspace is not None:
            ranks = self._by_owner.get(nspace, {})
            if rank is not None:
                pools = [ranks.get(rank, {})]
            else:
                pools = list(ranks.values())
        else:
            pools = [bucket
                     for ns in self._by_session.get(session_id, {})  # type: ignore[arg-type]
                     for bucket in self._by_owner[ns].values()]
        doomed = [
            item
            for pool in pools
            for item in pool.values()
            if expires_by(item.persistence, h)
            and (app_idx is None or item.owner.app_idx == app_idx)
            and (session_id is None or item.owner.session_id == session_id)
            and (owner is None or owns(owner, item))
        ]
        reason = PURGE_REASON[h]
        keys = 0
        for item in doomed:
            keys += len(item.pairs)
            self._remove_item(item, reason, now)
        if h in LIFETIME_HORIZONS:
            for p in self._parked.of_requestors(nspace, rank, app_idx, session_id):
                if owner is None or p.requestor.uid == owner.uid:
                    self._parked.remove(p.ticket)
        if doomed and self.params.verbose >= 1:
            log.info("[%s] purge %s ns=%s rank=%s app=%s session=%s removed %d item(s)",
                     self.name, h.name, nspace, rank, app_idx, session_id, len(doomed))
        return len(doomed), keys

    # ------------------------------------------------------------------
    # idle sweep
    # ------------------------------------------------------------------

    def sweep(self, budget: int = SWEEP_BUDGET) -> tuple[int, bool]:
        """Remove up to ``budget`` idle-expired items.

        An INDEF or FIRST_READ item expires when ``now - last_access`` is
        *more than* the timeout, never at or before it.  Returns
        ``(removed, finished)``; ``finished`` is False when the budget ran
        out with stale items left.
        """
        timeout = self.params.timeout
        if not timeout:
            return 0, True
        now = self._clock.now()
        self._sweep_passes += 1
        removed = 0
        while True:
            oldest = self._idle.front()
            if oldest is None:
                return removed, True
            if not now - oldest.last_access > timeout:
                return removed, True
            if removed >= budget:
                self._sweep_budget_exhausted += 1
                return removed, False
            self._remove_item(oldest, Reason.EXPIRED, now)
            removed += 1

    def _stale(self, item: Item, now: float) -> bool:
        t = self.params.timeout
        return bool(t) and item.idle_expires and now - item.last_access > t

    def _arm_sweep(self) -> None:
        if self._sweep_handle is None and self.params.timeout and self._idle.live:
            self._sweep_handle = self._timer.call_later(
                sweep_interval(self.params.timeout), self._on_sweep_timer
            )

    def _on_sweep_timer(self) -> None:
        self._sweep_handle = None
        _, finished = self.sweep()
        if self._idle.live and self.params.timeout:
            delay = sweep_interval(self.params.timeout) if finished else 0.0
            self._sweep_handle = self._timer.call_later(delay, self._on_sweep_timer)

    @property
    def sweep_armed(self) -> bool:
        """True while the sweep timer is scheduled."""
        return self._sweep_handle is not None
