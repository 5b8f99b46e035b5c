"""pydvm's data store: a pure core with no I/O and no event loop.

Public names:

* :class:`DataStore` -- the store; :class:`StoreParams` its parameters.
* :class:`Caller` -- an identity (requestor or owner); :class:`Item`.
* :class:`Reply`, :class:`FoundKey`, :class:`Pending`, :class:`StoreStats`,
  :class:`KeyInfo` -- what operations and inspection return.
* :class:`Clock`, :class:`Timer`, :class:`MonotonicClock`,
  :class:`FakeScheduler` -- time, injected.
* :mod:`pydvm.store.rules` -- the range table, the access and ownership
  predicates, the horizon table.

See ``DESIGN.md`` in this directory for the contracts.
"""

from .clock import Clock, FakeScheduler, MonotonicClock, Timer, TimerHandle
from .model import (ACCESSOR_OVERHEAD, ITEM_OVERHEAD, Caller, Item, Typed, item_nbytes,
                    pmix_type_of, value_size)
from .results import (
    DEFAULT_MAX_SIZE,
    DEFAULT_TIMEOUT,
    FoundKey,
    KeyInfo,
    Pending,
    Reason,
    Reply,
    StoreParams,
    StoreStats,
)
from .store import DataStore

__all__ = [
    "ACCESSOR_OVERHEAD",
    "Caller",
    "Clock",
    "DEFAULT_MAX_SIZE",
    "DEFAULT_TIMEOUT",
    "DataStore",
    "FakeScheduler",
    "FoundKey",
    "ITEM_OVERHEAD",
    "Item",
    "KeyInfo",
    "MonotonicClock",
    "Pending",
    "Reason",
    "Reply",
    "StoreParams",
    "StoreStats",
    "Timer",
    "TimerHandle",
    "Typed",
    "item_nbytes",
    "pmix_type_of",
    "value_size",
]
