"""The rule tables and predicates of pydvm.store.rules, checked directly."""

from __future__ import annotations

import pytest

from pydvm.store.model import Item, item_nbytes
from pydvm.store.rules import expires_by, may_access, owns, sweep_interval
from storekit import (
    GID_A, GID_B, UID_A, UID_B, Caller, Persistence as P, Range, caller,
)

# ---------------------------------------------------------------------------
# expires_by: the horizon table, written out literally (SPEC 5, design 8.9.2.6)
# ---------------------------------------------------------------------------

HORIZONS = [P.PROC, P.APP, P.NSPACE, P.SESSION, P.INVALID]

#: persistence -> removed by horizon   PROC   APP    NSPACE SESSION INVALID(unpublish-all)
EXPECTED_EXPIRES = {
    P.INDEF:      dict(zip(HORIZONS, [False, False, False, False, True])),
    P.FIRST_READ: dict(zip(HORIZONS, [False, False, False, False, True])),
    P.PROC:       dict(zip(HORIZONS, [True,  True,  True,  True,  True])),
    P.APP:        dict(zip(HORIZONS, [False, True,  True,  True,  True])),
    P.NSPACE:     dict(zip(HORIZONS, [False, False, True,  True,  True])),
    P.SESSION:    dict(zip(HORIZONS, [False, False, False, True,  True])),
}

STORED_PERSISTENCES = [p for p in P if p is not P.INVALID]


def test_expires_by_table_covers_every_stored_persistence():
    """The literal table below names every persistence an item can carry."""
    assert set(EXPECTED_EXPIRES) == set(STORED_PERSISTENCES)


@pytest.mark.parametrize("horizon", HORIZONS, ids=lambda h: h.name)
@pytest.mark.parametrize("persistence", STORED_PERSISTENCES, ids=lambda p: p.name)
def test_expires_by_matches_horizon_table(persistence, horizon):
    """expires_by(persistence, horizon) equals the literal SPEC 5 table cell."""
    assert expires_by(persistence, horizon) is EXPECTED_EXPIRES[persistence][horizon]


@pytest.mark.parametrize("horizon", [P.PROC, P.APP, P.NSPACE, P.SESSION], ids=lambda h: h.name)
@pytest.mark.parametrize("persistence", [P.INDEF, P.FIRST_READ], ids=lambda p: p.name)
def test_indef_and_first_read_removed_by_no_lifetime_horizon(persistence, horizon):
    """No lifetime ending (process, app, namespace, session) takes INDEF or FIRST_READ."""
    assert expires_by(persistence, horizon) is False


@pytest.mark.parametrize("persistence", STORED_PERSISTENCES, ids=lambda p: p.name)
def test_explicit_unpublish_all_horizon_removes_every_persistence(persistence):
    """INVALID as a horizon (explicit unpublish()) removes every persistence."""
    assert expires_by(persistence, P.INVALID) is True


@pytest.mark.parametrize("bad", [P.INDEF, P.FIRST_READ, 99, -1, 6])
def test_expires_by_non_horizon_raises_value_error(bad):
    """INDEF, FIRST_READ and numbers that are no persistence are not horizons."""
    with pytest.raises(ValueError, match="not a purge horizon"):
        expires_by(P.NSPACE, bad)


# ---------------------------------------------------------------------------
# owns: the removal predicate
# ---------------------------------------------------------------------------


def _item(owner: Caller, uids=(), gids=()) -> Item:
    pairs = {"k": "v"}
    return Item(1, pairs, owner, Range.SESSION, P.NSPACE, tuple(uids), tuple(gids), 0.0,
                item_nbytes(pairs, tuple(uids), tuple(gids)))


# (requestor uid, requestor gid, item uid, item gid) -> owns?
OWNS_TABLE = [
    (UID_A, GID_A, UID_A, GID_A, True),    # same uid and gid
    (UID_A, GID_B, UID_A, GID_A, False),   # same uid, other known gid
    (UID_B, GID_A, UID_A, GID_A, False),   # other uid, same gid
    (UID_B, GID_B, UID_A, GID_A, False),   # other uid and gid
    (UID_A, None, UID_A, GID_A, True),     # requestor gid unknown: uid alone
    (UID_A, GID_B, UID_A, None, True),     # item gid unknown: uid alone
    (UID_A, None, UID_A, None, True),      # both unknown: uid alone
    (UID_B, None, UID_A, GID_A, False),    # gid unknown never rescues another uid
    (UID_B, GID_A, UID_A, None, False),
    (UID_B, None, UID_A, None, False),
]


@pytest.mark.parametrize("ruid,rgid,iuid,igid,expected", OWNS_TABLE)
def test_owns_same_uid_and_gid_when_both_known(ruid, rgid, iuid, igid, expected):
    """owns() compares uid, and gid only when both sides know it."""
    req = caller(nspace="ns-x", rank=7, uid=ruid, gid=rgid)
    it = _item(caller(uid=iuid, gid=igid))
    assert owns(req, it) is expected


def test_owns_ignores_process_identity():
    """Ownership is by uid/gid: another process (other nspace, rank, node) of the same user owns."""
    it = _item(caller(nspace="ns-a", rank=0, node="node1"))
    other = caller(nspace="ns-zzz", rank=42, node="node9", app_idx=None, session_id=None)
    assert owns(other, it)


def test_owns_accessor_list_never_confers_removal():
    """A uid/gid named in an item's accessor lists does not own it."""
    it = _item(caller(uid=UID_A, gid=GID_A), uids=[UID_B], gids=[GID_B])
    b = caller(uid=UID_B, gid=GID_B)
    assert may_access(b, it)
    assert not owns(b, it)


def test_owns_owner_excluded_by_own_accessor_list_still_owns():
    """An owner its own accessor list excludes cannot access but still owns."""
    a = caller(uid=UID_A, gid=GID_A)
    it = _item(a, uids=[UID_B])
    assert not may_access(a, it)
    assert owns(a, it)


# ---------------------------------------------------------------------------
# may_access: check (a)
# ---------------------------------------------------------------------------

ACCESS_TABLE = [
    # (item uids, item gids, requestor uid, requestor gid, owner gid, expected)
    ((), (), UID_A, GID_A, GID_A, True),        # no lists: owner uid+gid
    ((), (), UID_A, GID_B, GID_A, False),       # no lists: gid differs
    ((), (), UID_A, None, GID_A, True),         # no lists, requestor gid unknown: uid alone
    ((), (), UID_A, GID_B, None, True),         # no lists, owner gid unknown: uid alone
    ((), (), UID_B, GID_A, GID_A, False),       # no lists: other uid
    ((UID_B,), (), UID_B, GID_B, GID_A, True),  # uid list admits
    ((UID_B,), (), UID_A, GID_A, GID_A, False), # uid list excludes even the owner
    ((), (GID_B,), UID_B, GID_B, GID_A, True),  # gid list admits
    ((), (GID_B,), UID_B, None, GID_A, False),  # gid list: unknown gid fails it
    ((UID_B,), (GID_A,), UID_B, GID_B, GID_A, False),  # both lists: must meet each
    ((UID_B,), (GID_B,), UID_B, GID_B, GID_A, True),
]


@pytest.mark.parametrize("uids,gids,ruid,rgid,ogid,expected", ACCESS_TABLE)
def test_may_access_each_accessor_list_is_a_requirement(uids, gids, ruid, rgid, ogid, expected):
    """Without lists the owner's uid/gid is required; each list given is a requirement."""
    it = _item(caller(uid=UID_A, gid=ogid), uids=uids, gids=gids)
    assert may_access(caller(nspace="ns-r", uid=ruid, gid=rgid), it) is expected


# ---------------------------------------------------------------------------
# sweep_interval
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "timeout,interval",
    [(0.5, 1.0), (1, 1.0), (4, 1.0), (6, 1.5), (8, 2.0), (300, 60.0), (240, 60.0), (1000, 60.0)],
)
def test_sweep_interval_is_quarter_timeout_clamped_1_to_60(timeout, interval):
    """The sweep interval is timeout/4 clamped to [1 s, 60 s]."""
    assert sweep_interval(timeout) == interval
