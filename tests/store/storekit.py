"""Shared helpers for the store tests: identities, snapshots, shortcuts.

Imported by the test modules as ``storekit`` (the directory has no
``__init__.py``, so pytest puts it on ``sys.path``).
"""

from __future__ import annotations

from pydvm.enums import Persistence, Range
from pydvm.errors import Status
from pydvm.store import Caller, DataStore, FoundKey, Pending, Reply

__all__ = [
    "Caller", "FoundKey", "Pending", "Persistence", "Range", "Reply", "Status",
    "UID_A", "GID_A", "UID_B", "GID_B", "UID_C", "GID_C",
    "caller", "alice", "alice2", "bob", "carol",
    "snapshot", "found_map", "keys_in_store", "item_with_key", "usage",
]

UID_A, GID_A = 1000, 100
UID_B, GID_B = 2000, 200
UID_C, GID_C = 3000, 300


def caller(
    nspace: str = "ns-a",
    rank: int = 0,
    uid: int = UID_A,
    gid: int | None = GID_A,
    node: str | None = "node1",
    app_idx: int | None = 0,
    session_id: int | None = 1,
) -> Caller:
    return Caller(nspace=nspace, rank=rank, uid=uid, gid=gid, node=node,
                  app_idx=app_idx, session_id=session_id)


#: rank 0 of ns-a, uid A
alice = caller()
#: rank 1 of ns-a, uid A, same node
alice2 = caller(rank=1)
#: a process of another user, in another namespace on another node
bob = caller(nspace="ns-b", rank=0, uid=UID_B, gid=GID_B, node="node2", session_id=1)
#: a third user
carol = caller(nspace="ns-c", rank=0, uid=UID_C, gid=GID_C, node="node3", session_id=1)


def snapshot(store: DataStore):
    """Everything observable about a store, as comparable plain values."""
    items = sorted(
        (
            it.id,
            tuple(it.pairs.items()),
            it.owner,
            it.range,
            it.persistence,
            it.access_uids,
            it.access_gids,
            it.last_access,
            it.nbytes,
        )
        for it in store.items()
    )
    st = store.stats()
    uids = sorted({it.uid for it in store.items()})
    return {
        "items": items,
        "bytes_by_uid": dict(st.bytes_by_uid),
        "n_items": st.items,
        "parked": st.parked,
        "evictions": st.evictions,
        "expiries": st.expiries,
        "consumed": st.consumed,
        "removed_keys": dict(st.removed_keys),
        "removed_items": dict(st.removed_items),
        "lru": {u: store.keys_of_uid(u) for u in uids},
        "sweep_armed": store.sweep_armed,
    }


def found_map(reply: Reply) -> dict:
    """{key: (value, publisher)} of a reply."""
    return {f.key: (f.value, f.publisher) for f in reply.found}


def keys_in_store(store: DataStore) -> set[str]:
    return {k for it in store.items() for k in it.pairs}


def item_with_key(store: DataStore, key: str):
    """The single item holding ``key`` (asserts there is exactly one)."""
    hits = [it for it in store.items() if key in it.pairs]
    assert len(hits) == 1, f"expected one item holding {key!r}, found {len(hits)}"
    return hits[0]


def usage(store: DataStore, uid: int) -> int:
    return store.stats().bytes_by_uid.get(uid, 0)
