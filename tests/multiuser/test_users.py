"""Identity with real uids: a shared DVM whose users cannot touch each other's data.

Users A, B and C are real accounts; every publish, lookup and unpublish runs
in a job submitted by that user, so the store sees their uid through the
daemon socket's peer credentials.  Each test would fail without its rule.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

A, B, C = "pdvmtesta", "pdvmtestb", "pdvmtestc"


def _found(p, key: str, value: str) -> bool:
    return f"FOUND {key} {value} " in p.stdout


def test_jobs_run_as_their_submitter_and_items_carry_the_publishers_uid(mudvm, users):
    """A's job runs with A's uid; its item is accounted to A, not to root."""
    p = mudvm.as_user(A, "run", "-n", "1", "sh", "-c",
                      "id -u && pydvm publish mine=1 --persistence session")
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[0] == str(users[A])
    assert list(mudvm.store(A)["master"]["bytes_by_uid"]) == [str(users[A])]


def test_another_user_cannot_unpublish_an_item_and_its_owner_later_can(mudvm, users):
    """B's unpublish of A's key is SUCCESS and removes nothing; a later job of A removes it."""
    assert mudvm.run(A, "publish", "k=a", "--persistence", "session").returncode == 0
    p = mudvm.run(B, "unpublish", "k")
    assert p.returncode == 0 and "STATUS PMIX_SUCCESS" in p.stdout
    assert _found(mudvm.run(A, "lookup", "k"), "k", "a")
    assert mudvm.store(A)["master"]["bytes_by_uid"] == {str(users[A]): 130}  # len("k") + len("a") + 128
    assert mudvm.run(A, "unpublish", "k").returncode == 0
    assert "STATUS PMIX_ERR_NOT_FOUND" in mudvm.run(A, "lookup", "k").stdout


def test_a_reader_named_by_the_accessor_list_may_read_but_not_replace_or_remove(mudvm, users):
    """A's item lists B: B reads it, B's replace is DUPLICATE_KEY, B's unpublish leaves it."""
    p = mudvm.run(A, "publish", "shared=a", "--persistence", "session",
                  "--access-uid", str(users[B]), "--access-uid", str(users[A]))
    assert p.returncode == 0, p.stdout + p.stderr
    assert _found(mudvm.run(B, "lookup", "shared"), "shared", "a")
    r = mudvm.run(B, "publish", "shared=b", "--persistence", "session", "--replace")
    assert r.returncode == 1 and "STATUS PMIX_ERR_DUPLICATE_KEY" in r.stdout
    assert "PUBLISHED" not in r.stdout
    assert mudvm.run(B, "unpublish", "shared").returncode == 0
    assert _found(mudvm.run(A, "lookup", "shared"), "shared", "a")
    # The owner's later job may replace it.
    assert mudvm.run(A, "publish", "shared=a2", "--persistence", "session",
                     "--replace").returncode == 0
    assert _found(mudvm.run(A, "lookup", "shared"), "shared", "a2")


def test_an_owner_excluded_by_its_own_list_cannot_read_but_can_remove(mudvm, users):
    """A's item lists only B: A's lookup is NO_PERMISSIONS, A's unpublish removes it."""
    assert mudvm.run(A, "publish", "forb=1", "--persistence", "session",
                     "--access-uid", str(users[B])).returncode == 0
    assert "STATUS PMIX_ERR_NO_PERMISSIONS" in mudvm.run(A, "lookup", "forb").stdout
    assert mudvm.run(A, "unpublish", "forb").returncode == 0
    assert "STATUS PMIX_ERR_NOT_FOUND" in mudvm.run(B, "lookup", "forb").stdout


def test_one_users_flood_at_the_cap_evicts_only_that_users_items(make_mudvm, users):
    """B floods a 1 KiB cap: B's oldest go, A's items (published first) all stay."""
    d = make_mudvm(prte_data_server_max_size=1024)
    p = d.as_user(A, "run", "-n", "1", "sh", "-c",
                  "for i in 1 2 3; do pydvm publish a$i=x --persistence session || exit 1; done")
    assert p.returncode == 0, p.stdout + p.stderr
    p = d.as_user(B, "run", "-n", "1", "sh", "-c",
                  "for i in $(seq 10 39); do pydvm publish b$i=x --persistence session "
                  "|| exit 1; done")
    assert p.returncode == 0, p.stdout + p.stderr
    st = d.store()["master"]
    assert st["evictions"] > 0
    assert st["bytes_by_uid"][str(users[A])] == 3 * 131  # len("a1") + len("x") + 128 each
    assert st["bytes_by_uid"][str(users[B])] <= 1024
    a = d.run(A, "lookup", "a1", "a2", "a3")
    assert a.returncode == 0 and "STATUS PMIX_SUCCESS" in a.stdout, a.stdout
    assert "STATUS PMIX_ERR_NOT_FOUND" in d.run(B, "lookup", "b10").stdout
    assert _found(d.run(B, "lookup", "b39"), "b39", "x")


def test_a_first_read_item_for_b_cannot_be_consumed_by_a_third_user(mudvm, users):
    """A publishes first-read for B only: C is refused (NO_PERMISSIONS); B reads it once."""
    assert mudvm.run(A, "publish", "token=t", "--persistence", "first-read",
                     "--access-uid", str(users[B])).returncode == 0
    assert "STATUS PMIX_ERR_NO_PERMISSIONS" in mudvm.run(C, "lookup", "token").stdout
    assert _found(mudvm.run(B, "lookup", "token"), "token", "t")
    assert "STATUS PMIX_ERR_NOT_FOUND" in mudvm.run(B, "lookup", "token").stdout


def test_users_cannot_stop_the_dvm_end_a_session_or_see_others_key_names(mudvm, users):
    """B is refused stop and session end; B's store view counts A's bytes but names no key."""
    sid = mudvm.as_user(A, "session", "new").stdout.strip()
    assert sid.isdigit()
    assert mudvm.run(A, "publish", "secretname=1", "--persistence", "session").returncode == 0
    p = mudvm.as_user(B, "stop")
    assert p.returncode == 1 and "PMIX_ERR_NO_PERMISSIONS" in p.stderr
    q = mudvm.as_user(B, "session", "end", sid)
    assert q.returncode == 1 and "PMIX_ERR_NO_PERMISSIONS" in q.stderr
    view = mudvm.store(B)["master"]
    assert view["bytes_by_uid"] == {str(users[A]): 139}
    assert view["keys"] == []
    assert "secretname" not in mudvm.as_user(B, "store").stdout
    # The DVM is still up for everyone, and root may end the session.
    assert mudvm.run(A, "lookup", "secretname").returncode == 0
    assert mudvm.as_user(None, "session", "end", sid).returncode == 0


def test_a_user_cannot_pose_as_another_users_process(mudvm, users):
    """B connecting to the daemon socket claiming A's running process is refused."""
    shared = Path(tempfile.mkdtemp(prefix="pydvm-probe-"))  # readable by the test users
    probe = shared / "probe.py"
    probe.write_text(
        "import os, socket, sys\n"
        "from pydvm.channel import BlockingChannel\n"
        "s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
        "ch = BlockingChannel(s)\n"
        "ch.send({'t': 'hello', 'id': 1, 'nspace': sys.argv[2], 'rank': 0})\n"
        "print('STATUS', ch.recv(10)['status'])\n")
    os.chmod(shared, 0o755)
    os.chmod(probe, 0o644)
    job = mudvm.popen_as(A, "run", "-n", "1", "sh", "-c",
                         'echo "$PYDVM_SERVER $PYDVM_NSPACE"; sleep 20')
    try:
        server, nspace = job.stdout.readline().split()
        p = mudvm.as_user_python(B, str(probe), server, nspace)
        assert "STATUS -23" in p.stdout, (p.stdout, p.stderr)
        q = mudvm.as_user_python(A, str(probe), server, nspace)
        assert "STATUS 0" in q.stdout, (q.stdout, q.stderr)
    finally:
        job.kill()
        job.wait(timeout=30)
        shutil.rmtree(shared, ignore_errors=True)
