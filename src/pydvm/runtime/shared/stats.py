"""What a store served: counts and latencies of its data requests, and a sample of its figures.

Both kinds of store record here -- the master's (``DataService``) and each
node's (``NodeServer``, through the store guard on a multi-threaded node) --
and the master's metrics (:mod:`pydvm.runtime.master.metrics`) read it at
scrape time.  Plain lists and int-keyed dicts: nothing here imports
``prometheus_client``, so daemons need none.
"""

from __future__ import annotations

from bisect import bisect_left
from time import perf_counter
from typing import Any, Hashable

from ...errors import Status
from ...store import Caller, DataStore
from ...wire import Message
from . import dataops

#: Upper bounds (seconds) of the request latency histogram's buckets; +Inf
#: is implied.  A store operation takes tens of microseconds; the upper
#: buckets catch an event loop that was busy elsewhere.
LATENCY_BUCKETS: tuple[float, ...] = (
    10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6,
    1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 1.0,
)

#: Operations timed, in the order they are exported.
OPS = ("publish", "lookup", "unpublish", "update", "keys")
#: The ``status`` label of a lookup that had to wait (its answer comes later).
PARKED = "parked"


class RequestStats:
    """Counts and latencies of the data requests one store served.

    Plain numbers, updated under the store's guard (the event loop that
    serves the store, or a PMIx request answered on libpmix's thread:
    :class:`~pydvm.runtime.shared.storeguard.GuardedStats`).  For
    each op, ``_ops[op]`` is ``(acc, statuses)``: ``acc[0]`` the sum of the
    times, ``acc[1 + i]`` how many fell in bucket ``i`` of
    :data:`LATENCY_BUCKETS` (not cumulative; the last is +Inf), and
    ``statuses[status]`` how many replies had that status (None: the lookup
    was parked).  Lists and int-keyed dicts keep :meth:`apply` to a few
    hundred nanoseconds.
    """

    __slots__ = ("_ops",)

    def __init__(self) -> None:
        self._ops: dict[str, tuple[list, dict[int | None, int]]] = {
            op: ([0.0] + [0] * (len(LATENCY_BUCKETS) + 1), {}) for op in OPS}

    def apply(self, store: DataStore, caller: Caller, msg: Message,
              ticket: Hashable) -> Message | None:
        """:func:`pydvm.runtime.shared.dataops.apply`, timed and counted.

        Same contract: returns the reply, or None when a lookup parked.
        """
        t0 = perf_counter()
        out = dataops.apply(store, caller, msg, ticket)
        self.record(msg["t"], perf_counter() - t0, None if out is None else out.get("status"))
        return out

    def record(self, op: str, dt: float, status: int | None) -> None:
        """Count one request of ``op`` that took ``dt`` seconds and was answered
        ``status`` (None: a lookup that parked)."""
        entry = self._ops.get(op)
        if entry is not None:
            acc, statuses = entry
            acc[0] += dt
            acc[1 + bisect_left(LATENCY_BUCKETS, dt)] += 1
            statuses[status] = statuses.get(status, 0) + 1

    def sample(self) -> dict[str, Any]:
        """The figures as plain, msgpack-able values (see :func:`store_sample`)."""
        requests = []
        for op in OPS:
            statuses = self._ops[op][1]
            for status in sorted(statuses, key=str):
                name = PARKED if status is None else _status_name(status)
                requests.append([op, name, statuses[status]])
        return {
            "requests": requests,
            "latency": {op: list(self._ops[op][0][1:]) for op in OPS},
            "latency_sum": {op: self._ops[op][0][0] for op in OPS},
            "bounds": list(LATENCY_BUCKETS),
        }


def _status_name(code: Any) -> str:
    try:
        return Status(code).pmix_name
    except ValueError:
        return str(code)


def store_sample(store: DataStore, requests: RequestStats | None) -> dict[str, Any]:
    """Everything exported about one store, as plain msgpack-able values.

    What a daemon puts in its ``stats`` reply when asked for ``metrics``,
    and what the master computes for its own store.  Reads no clock.
    """
    st = store.stats()
    out: dict[str, Any] = {
        "store": store.name,
        "items": st.items,
        "bytes_by_uid": {str(u): b for u, b in st.bytes_by_uid.items()},
        "parked": st.parked,
        "cap": store.params.max_size,
        "removed_keys": dict(st.removed_keys),
        "removed_items": dict(st.removed_items),
        "sweep_passes": st.sweep_passes,
        "sweep_budget_exhausted": st.sweep_budget_exhausted,
    }
    out.update((requests or RequestStats()).sample())
    return out
