"""Parked lookups: lookups told to wait until enough of their keys exist.

A parked lookup holds no reference to any item and consumes nothing; it is
only a question to ask again.  :class:`ParkedLookups` indexes the waiting
requests by the keys they want (so a publish re-asks only the lookups it can
affect) and by the requestor's namespace and session (so a purge drops only
the requests whose requestor has terminated).  It never answers anything
itself: :class:`pydvm.store.DataStore` owns the single answering path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable

from ..enums import Range
from .clock import TimerHandle
from .model import Caller


@dataclass(slots=True, eq=False)
class Parked:
    """One waiting lookup.

    ``need`` is how many of ``keys`` must be found before it is answered
    (all of them unless the caller asked for fewer).  ``timer`` is the
    handle of its timeout, ``None`` when it waits without limit.
    """

    ticket: Hashable
    seq: int
    requestor: Caller
    keys: tuple[str, ...]
    range: Range
    need: int
    timer: TimerHandle | None = field(default=None)


class ParkedLookups:
    """The waiting lookups of one store, indexed for publish and purge.

    Invariant: a request is in ``by_ticket`` iff it is in ``by_key[k]`` for
    each of its keys, in ``by_nspace[requestor.nspace]``, and (when its
    requestor's session is known) in ``by_session[requestor.session_id]``.
    """

    def __init__(self) -> None:
        self.by_ticket: dict[Hashable, Parked] = {}
        self.by_key: dict[str, dict[Hashable, Parked]] = {}
        self.by_nspace: dict[str, dict[Hashable, Parked]] = {}
        self.by_session: dict[int, dict[Hashable, Parked]] = {}
        self._seq = 0

    def __len__(self) -> int:
        return len(self.by_ticket)

    def __contains__(self, ticket: Hashable) -> bool:
        return ticket in self.by_ticket

    def add(
        self, ticket: Hashable, requestor: Caller, keys: tuple[str, ...], rng: Range, need: int
    ) -> Parked:
        if ticket in self.by_ticket:
            raise ValueError(f"ticket {ticket!r} is already parked")
        self._seq += 1
        p = Parked(ticket, self._seq, requestor, keys, rng, need)
        self.by_ticket[ticket] = p
        for k in keys:
            self.by_key.setdefault(k, {})[ticket] = p
        self.by_nspace.setdefault(requestor.nspace, {})[ticket] = p
        if requestor.session_id is not None:
            self.by_session.setdefault(requestor.session_id, {})[ticket] = p
        return p

    def remove(self, ticket: Hashable) -> Parked | None:
        """Unlink a request from every index and cancel its timer."""
        p = self.by_ticket.pop(ticket, None)
        if p is None:
            return None
        for k in p.keys:
            _discard(self.by_key, k, ticket)
        _discard(self.by_nspace, p.requestor.nspace, ticket)
        if p.requestor.session_id is not None:
            _discard(self.by_session, p.requestor.session_id, ticket)
        if p.timer is not None:
            p.timer.cancel()
            p.timer = None
        return p

    def wanting(self, keys) -> list[Parked]:
        """Requests waiting on any of ``keys``, oldest first."""
        if not self.by_key:
            return []
        seen: dict[Hashable, Parked] = {}
        for k in keys:
            seen.update(self.by_key.get(k, ()))
        return sorted(seen.values(), key=lambda p: p.seq)

    def of_requestors(
        self,
        nspace: str | None,
        rank: int | None,
        app_idx: int | None,
        session_id: int | None,
    ) -> list[Parked]:
        """Requests whose requestor a purge target covers."""
        if nspace is not None:
            pool = self.by_nspace.get(nspace, {})
        elif session_id is not None:
            pool = self.by_session.get(session_id, {})
        else:
            pool = self.by_ticket
        out = []
        for p in pool.values():
            r = p.requestor
            if rank is not None and r.rank != rank:
                continue
            if app_idx is not None and r.app_idx != app_idx:
                continue
            if session_id is not None and r.session_id != session_id:
                continue
            out.append(p)
        return out

    def check_invariants(self) -> None:
        for t, p in self.by_ticket.items():
            assert p.ticket == t
            for k in p.keys:
                assert self.by_key[k][t] is p, f"parked {t!r} missing from by_key[{k!r}]"
            assert self.by_nspace[p.requestor.nspace][t] is p
            if p.requestor.session_id is not None:
                assert self.by_session[p.requestor.session_id][t] is p
        for index in (self.by_key, self.by_nspace, self.by_session):
            for bucket in index.values():
                assert bucket, "empty bucket left in a parked index"
                for t, p in bucket.items():
                    assert self.by_ticket.get(t) is p, f"stale parked entry {t!r}"


def _discard(index: dict, key, ticket) -> None:
    bucket = index.get(key)
    if bucket is not None:
        bucket.pop(ticket, None)
        if not bucket:
            del index[key]
