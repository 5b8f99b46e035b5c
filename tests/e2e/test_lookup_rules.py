"""Lookup, publish and unpublish rules end to end (SPEC 1 routing, SPEC 4):
LOCAL range, partial answers, access refusal, ownership and duplicates."""

from __future__ import annotations

import os

import pytest

from dvmkit import lines, status

pytestmark = pytest.mark.e2e

UID = str(os.getuid())
OTHER_UID = "424242"


def test_local_range_item_is_held_by_its_daemon_and_seen_only_from_its_node(dvm):
    """`--range local` on a: found by a local lookup on a; not from b; not by a SESSION lookup."""
    p = dvm.run("--host", "a", "-n", "1", "sh", "-c",
                'echo "NS $PYDVM_NSPACE"; exec pydvm publish lk=lv --range local '
                '--persistence session')
    assert lines(p, "PUBLISHED") == ["PUBLISHED lk"], p.stdout + p.stderr
    ns = lines(p, "NS ")[0].split()[1]
    st = dvm.store()
    assert st["a"]["items"] == 1, st
    assert int(st["a"]["bytes_by_uid"][UID]) == len("lk") + len("lv") + 128, st
    assert st["master"]["items"] == 0 and st["b"]["items"] == 0, st

    q = dvm.run("--host", "a", "-n", "1", "pydvm", "lookup", "lk", "--range", "local")
    assert lines(q, "FOUND") == [f"FOUND lk lv from {ns}:0"], q.stdout
    assert status(q) == "PMIX_SUCCESS"
    q = dvm.run("--host", "b", "-n", "1", "pydvm", "lookup", "lk", "--range", "local")
    assert status(q) == "PMIX_ERR_NOT_FOUND", q.stdout
    # A SESSION-range lookup goes to the master store: no fallback to a daemon's.
    q = dvm.run("--host", "a", "-n", "1", "pydvm", "lookup", "lk")
    assert status(q) == "PMIX_ERR_NOT_FOUND", q.stdout
    assert lines(q, "FOUND") == []


def test_lookup_of_one_found_and_one_missing_key_is_partial_success(dvm):
    """Lookup of an existing and a missing key: PMIX_ERR_PARTIAL_SUCCESS with the FOUND line."""
    p = dvm.run("--host", "a", "-n", "1", "pydvm", "publish", "e1=v1", "--persistence", "session")
    assert status(p) == "PMIX_SUCCESS", p.stdout + p.stderr
    q = dvm.run("--host", "b", "-n", "1", "pydvm", "lookup", "e1", "missing")
    found = lines(q, "FOUND")
    assert len(found) == 1 and found[0].startswith("FOUND e1 v1 from "), q.stdout
    assert status(q) == "PMIX_ERR_PARTIAL_SUCCESS"
    assert q.returncode == 1


def test_item_restricted_to_another_uid_is_refused_to_us_but_we_own_and_may_unpublish_it(dvm):
    """--access-uid 424242: we get NO_PERMISSIONS, yet may unpublish it and republish the key."""
    assert UID != OTHER_UID
    p = dvm.run("--host", "a", "-n", "1", "pydvm", "publish", "sec=1", "--access-uid", OTHER_UID,
                "--persistence", "session")
    assert lines(p, "PUBLISHED") == ["PUBLISHED sec"], p.stdout + p.stderr
    q = dvm.run("--host", "b", "-n", "1", "pydvm", "lookup", "sec")
    assert status(q) == "PMIX_ERR_NO_PERMISSIONS", q.stdout
    assert lines(q, "FOUND") == []
    q = dvm.run("--host", "b", "-n", "1", "pydvm", "lookup", "nokey")
    assert status(q) == "PMIX_ERR_NOT_FOUND", q.stdout
    q = dvm.run("--host", "b", "-n", "1", "pydvm", "lookup", "sec", "nokey")
    assert status(q) == "PMIX_ERR_NO_PERMISSIONS", q.stdout
    assert dvm.store()["master"]["items"] == 1

    # The owner (same uid and gid) may remove what its own list keeps it from reading,
    # from another job, the publisher being gone.
    u = dvm.run("--host", "c", "-n", "1", "pydvm", "unpublish", "sec")
    assert status(u) == "PMIX_SUCCESS" and u.returncode == 0, u.stdout + u.stderr
    assert dvm.store()["master"]["items"] == 0
    q = dvm.run("--host", "b", "-n", "1", "pydvm", "lookup", "sec")
    assert status(q) == "PMIX_ERR_NOT_FOUND", q.stdout
    r = dvm.run("--host", "a", "-n", "1", "pydvm", "publish", "sec=2", "--persistence", "session")
    assert lines(r, "PUBLISHED") == ["PUBLISHED sec"] and status(r) == "PMIX_SUCCESS", r.stdout
    q = dvm.run("--host", "b", "-n", "1", "pydvm", "lookup", "sec")
    assert lines(q, "FOUND")[0].startswith("FOUND sec 2 from "), q.stdout


def test_duplicate_publish_is_refused_unless_replace(dvm):
    """Publishing a key again: PMIX_ERR_DUPLICATE_KEY and no PUBLISHED line; --replace wins."""
    p = dvm.run("--host", "a", "-n", "1", "pydvm", "publish", "d=1", "--persistence", "session")
    assert status(p) == "PMIX_SUCCESS", p.stdout + p.stderr
    q = dvm.run("--host", "b", "-n", "1", "pydvm", "publish", "d=2", "--persistence", "session")
    assert status(q) == "PMIX_ERR_DUPLICATE_KEY", q.stdout + q.stderr
    assert lines(q, "PUBLISHED") == []
    assert q.returncode == 1
    r = dvm.run("--host", "c", "-n", "1", "pydvm", "lookup", "d")
    assert lines(r, "FOUND")[0].startswith("FOUND d 1 from "), r.stdout
    s = dvm.run("--host", "b", "-n", "1", "pydvm", "publish", "d=3", "--replace",
                "--persistence", "session")
    assert lines(s, "PUBLISHED") == ["PUBLISHED d"] and status(s) == "PMIX_SUCCESS", s.stdout
    r = dvm.run("--host", "c", "-n", "1", "pydvm", "lookup", "d")
    assert lines(r, "FOUND")[0].startswith("FOUND d 3 from "), r.stdout
    assert dvm.store()["master"]["items"] == 1
