"""Retention end to end (SPEC 5): every item goes at its lifetime's end, and not before.

Real DVMs, real daemons and real job processes; each lifetime is ended by
the event itself (a process, an application, a job or a session ending; the
idle timeout; a first read; the byte cap), never by a mock.
"""

from __future__ import annotations

import os
import time

import pytest

from dvmkit import LineReader, finish, job_script, lines, status, wait_for

pytestmark = pytest.mark.e2e

UID = str(os.getuid())


def _ns(p) -> str:
    """The namespace a job printed as ``NS <nspace>``."""
    got = lines(p, "NS ")
    assert got, p.stdout
    return got[0].split()[1]


def test_first_read_item_survives_its_publishers_job_and_goes_with_the_first_read(dvm):
    """Job 1 publishes FIRST_READ and exits; job 2 reads it (value, publisher); job 3: NOT_FOUND."""
    p = dvm.run("--host", "a", "-n", "1", "sh", "-c",
                'echo "NS $PYDVM_NSPACE"; exec pydvm publish tok=abc --persistence first-read')
    assert p.returncode == 0, p.stderr
    assert lines(p, "PUBLISHED") == ["PUBLISHED tok"]
    ns1 = _ns(p)
    # The publisher's job has ended (run returned): the item is still held.
    assert dvm.store()["master"]["items"] == 1

    q = dvm.run("--host", "b", "-n", "1", "pydvm", "lookup", "tok")
    assert q.returncode == 0, q.stdout + q.stderr
    assert lines(q, "FOUND") == [f"FOUND tok abc from {ns1}:0"]
    assert status(q) == "PMIX_SUCCESS"
    m = dvm.store()["master"]
    assert m["items"] == 0 and not m["bytes_by_uid"].get(UID), m

    r = dvm.run("--host", "c", "-n", "1", "pydvm", "lookup", "tok")
    assert r.returncode == 1
    assert lines(r, "FOUND") == []
    assert status(r) == "PMIX_ERR_NOT_FOUND"
    # A consumed key is republishable at once.
    s = dvm.run("-n", "1", "pydvm", "publish", "tok=again")
    assert status(s) == "PMIX_SUCCESS" and lines(s, "PUBLISHED") == ["PUBLISHED tok"]


def test_app_item_goes_with_its_application_while_nspace_item_stays_until_job_end(dvm):
    """MPMD: app 0's APP item is gone once app 0 ended; its NSPACE item stays until the job ends."""
    p = dvm.run("-n", "1", *job_script("mpmd_app_items"), ":",
                "-n", "1", *job_script("mpmd_app_items"))
    assert p.returncode == 0, p.stdout + p.stderr
    saw = lines(p, "APP1 SAW")
    assert len(saw) == 1 and saw[0].startswith("APP1 SAW app_item=a0 ns_item=n0 from "), p.stdout
    assert saw[0].endswith(":0")  # published by rank 0, the process of app 0
    assert "APP0 EXIT" in p.stdout
    assert lines(p, "APP_ITEM") == ["APP_ITEM GONE"], p.stdout
    assert lines(p, "NS_ITEM") == ["NS_ITEM FOUND"], p.stdout
    # The job has ended now: its NSPACE item went with it.
    q = dvm.run("-n", "1", "pydvm", "lookup", "ns_item")
    assert status(q) == "PMIX_ERR_NOT_FOUND", q.stdout
    assert dvm.store()["master"]["items"] == 0


def test_local_app_item_goes_with_its_application_while_another_app_runs_on_its_node(dvm):
    """Issue 13: MPMD, both apps on node a: app 0's LOCAL APP item leaves a's store
    when app 0 ends (the application notice), while app 1 still runs; the LOCAL
    NSPACE item stays until the job ends."""
    p = dvm.run("--host", "a", "-n", "1", *job_script("mpmd_app_items"), "local", ":",
                "--host", "a", "-n", "1", *job_script("mpmd_app_items"), "local")
    assert p.returncode == 0, p.stdout + p.stderr
    assert lines(p, "APP1 SAW")[0].startswith("APP1 SAW app_item=a0 ns_item=n0 from "), p.stdout
    assert lines(p, "APP_ITEM") == ["APP_ITEM GONE"], p.stdout
    assert lines(p, "NS_ITEM") == ["NS_ITEM FOUND"], p.stdout
    assert dvm.store()["a"]["items"] == 0
    assert "application purge not applied" not in dvm.log("master")


def test_session_item_survives_its_job_and_goes_when_the_session_ends(dvm):
    """A SESSION item (master and daemon store) outlives its job; `session end` removes it."""
    sp = dvm.cmd("session", "new", check=True)
    sid = sp.stdout.strip()
    assert sid.isdigit() and sid != "0", sp.stdout
    p = dvm.run("--session", sid, "--host", "a", "-n", "1", "sh", "-c",
                "pydvm publish skey=sv --persistence session && "
                "pydvm publish lskey=lv --range local --persistence session && "
                "pydvm publish nkey=nv")
    assert p.returncode == 0, p.stdout + p.stderr
    assert lines(p, "PUBLISHED") == ["PUBLISHED skey", "PUBLISHED lskey", "PUBLISHED nkey"]
    st = dvm.store()
    assert st["master"]["items"] == 1, st  # skey; nkey (NSPACE) went with the job
    assert st["a"]["items"] == 1, st  # lskey

    # A later job of the same session finds it; so does one in the default session.
    q = dvm.run("--session", sid, "--host", "b", "-n", "1", "pydvm", "lookup", "skey")
    assert lines(q, "FOUND") and lines(q, "FOUND")[0].startswith("FOUND skey sv from ")
    assert status(q) == "PMIX_SUCCESS"
    q = dvm.run("--host", "c", "-n", "1", "pydvm", "lookup", "skey")
    assert status(q) == "PMIX_SUCCESS", q.stdout
    q = dvm.run("--session", sid, "--host", "a", "-n", "1", "pydvm", "lookup", "lskey",
                "--range", "local")
    assert status(q) == "PMIX_SUCCESS", q.stdout

    e = dvm.cmd("session", "end", sid)
    assert e.returncode == 0, e.stderr
    # `session end` returns once the purge is applied in every store.
    st = dvm.store()
    assert st["master"]["items"] == 0, st
    assert st["a"]["items"] == 0, st
    assert not st["master"]["bytes_by_uid"].get(UID), st
    q = dvm.run("--host", "b", "-n", "1", "pydvm", "lookup", "skey")
    assert status(q) == "PMIX_ERR_NOT_FOUND", q.stdout
    q = dvm.run("--host", "a", "-n", "1", "pydvm", "lookup", "lskey", "--range", "local")
    assert status(q) == "PMIX_ERR_NOT_FOUND", q.stdout


def test_proc_item_goes_when_its_process_exits_while_a_sibling_runs(dvm):
    """Rank 0's PROC item reads NOT_FOUND after rank 0 exits, seen by a still-running rank 1."""
    for rng, hosts in (("session", ["--host", "a,b"]), ("local", ["--host", "a:2"])):
        p = dvm.run(*hosts, "-n", "2", *job_script("proc_sibling"), rng)
        assert p.returncode == 0, f"{rng}: {p.stdout}{p.stderr}"
        assert "RANK1 SAW p0" in p.stdout and "RANK0 EXIT" in p.stdout, p.stdout
        assert lines(p, "P0 ") == ["P0 GONE"], f"{rng}: {p.stdout}"
        # Rank 1's own PROC item is untouched by its sibling's exit.
        assert lines(p, "P1 ") == ["P1 FOUND"], f"{rng}: {p.stdout}"
    st = dvm.store()
    assert st["master"]["items"] == 0 and st["a"]["items"] == 0, st


def test_nspace_item_survives_an_early_finishing_daemons_share_of_the_job(dvm):
    """Rank 0 on a exits early; rank 1 on b (its child process, and itself) still finds its item."""
    p = dvm.run("--host", "a,b", "-n", "2", *job_script("early_finisher"))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "RANK0 EXIT on a" in p.stdout and "RANK1 on b" in p.stdout, p.stdout
    assert lines(p, "R0 ") == ["R0 ACCOUNTED"], p.stdout
    child = lines(p, "CHILD ")
    assert len(child) == 1 and child[0].startswith("CHILD FOUND r1_data keep from "), p.stdout
    assert child[0].endswith(":1 | STATUS PMIX_SUCCESS"), p.stdout
    assert lines(p, "SELF ") == ["SELF R1_DATA FOUND"], p.stdout
    # And the job's end (not a daemon's share of it) does remove it.
    q = dvm.run("-n", "1", "pydvm", "lookup", "r1_data")
    assert status(q) == "PMIX_ERR_NOT_FOUND", q.stdout


TIMEOUT = 2.0  # prte_data_server_timeout in the expiry tests
INTERVAL = 1.0  # its sweep interval: timeout/4 clamped to [1 s, 60 s]


def test_indef_and_unread_first_read_items_expire_after_the_idle_timeout_not_before(make_dvm):
    """timeout=2: INDEF and unread FIRST_READ items are found at first, then expire; never early."""
    dvm = make_dvm(prte_data_server_timeout=TIMEOUT)
    t_pub = time.monotonic()
    p = dvm.run("-n", "1", "sh", "-c", "pydvm publish fr=1 --persistence first-read && "
                "pydvm publish ind=1 --persistence indef")
    assert lines(p, "PUBLISHED") == ["PUBLISHED fr", "PUBLISHED ind"], p.stdout + p.stderr
    t_look = time.monotonic()  # the lookup restamps ind no earlier than this
    q = dvm.run("-n", "1", "pydvm", "lookup", "ind")
    t_look_end = time.monotonic()
    assert status(q) == "PMIX_SUCCESS", q.stdout

    polls = []  # (start, end, items, expiries)
    deadline = t_look_end + TIMEOUT + INTERVAL + 8.0
    while True:
        t0 = time.monotonic()
        m = dvm.store()["master"]
        polls.append((t0, time.monotonic(), m["items"], m["expiries"]))
        if m["items"] == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert polls[-1][2] == 0, f"items never expired: {polls}"
    assert polls[-1][3] == 2, f"expected 2 expiries: {polls}"
    for _start, end, items, expiries in polls:
        # Never earlier than the timeout after each item's last access.
        if end < t_pub + TIMEOUT:
            assert items == 2 and expiries == 0, f"an item expired early: {polls}"
        if end < t_look + TIMEOUT:
            assert items >= 1, f"ind expired before its timeout: {polls}"
    r = dvm.run("-n", "1", "pydvm", "lookup", "ind")
    assert status(r) == "PMIX_ERR_NOT_FOUND", r.stdout
    r = dvm.run("-n", "1", "pydvm", "lookup", "fr")
    assert status(r) == "PMIX_ERR_NOT_FOUND", r.stdout


def test_nspace_item_never_idle_expires_while_its_job_runs(make_dvm, tmp_path):
    """timeout=2: a job's NSPACE item is still found after an INDEF item published later expired."""
    dvm = make_dvm(prte_data_server_timeout=TIMEOUT)
    go = tmp_path / "go"
    bg = dvm.run_bg("-n", "1", *job_script("nspace_outlives_timeout"), str(go))
    out = LineReader(bg.stdout)
    try:
        out.wait_line("READY", timeout=30)
        # The canary was published after nskey, so once it has expired nskey
        # has been idle for longer than the timeout too.
        m = wait_for(lambda: (lambda s: s if s["expiries"] >= 1 else None)(dvm.store()["master"]),
                     timeout=TIMEOUT + INTERVAL + 10, interval=0.2, what="the canary to expire")
        assert m["items"] == 1, m  # nskey alone: not expired
        go.touch()
        assert finish(bg, 30) == 0, bg.stderr.read()
    finally:
        if bg.poll() is None:
            bg.kill()
            bg.wait(10)
    got = out.join()
    assert "NSKEY FOUND" in got, got
    m = dvm.store()["master"]
    assert m["items"] == 0 and m["expiries"] == 1, m  # the job's end removed nskey, not the sweep


def test_one_uids_flood_at_the_cap_evicts_its_own_oldest_items(make_dvm):
    """cap=4096: 60 sequential 152-byte items leave the newest 26; one warning names the cap."""
    # This shows a single uid's flood evicting its own oldest items only; that
    # eviction never crosses a uid is unit-tested (tests/store), as it needs real uids.
    cap = 4096
    dvm = make_dvm(prte_data_server_max_size=cap)
    n, size = 60, 20
    per_item = len("k000") + size + 128  # SPEC 3: key + value + ITEM_OVERHEAD
    keep = cap // per_item  # 26
    p = dvm.run("-n", "1", *job_script("flood"), str(n), str(size))
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"FLOODED {n}" in p.stdout

    m = dvm.store()["master"]
    assert m["evictions"] == n - keep, m
    assert m["items"] == keep, m
    assert int(m["bytes_by_uid"][UID]) == keep * per_item <= cap, m

    keys = [f"k{i:03d}" for i in range(n)]
    q = dvm.run("-n", "1", "pydvm", "lookup", *keys)
    found = [ln.split()[1] for ln in lines(q, "FOUND")]
    assert found == keys[n - keep:], q.stdout  # the newest kept, the oldest evicted
    assert status(q) == "PMIX_ERR_PARTIAL_SUCCESS"
    r = dvm.run("-n", "1", "pydvm", "lookup", "k000")
    assert status(r) == "PMIX_ERR_NOT_FOUND", r.stdout

    log = dvm.log("master")
    warned = [ln for ln in log.splitlines() if "prte_data_server_max_size" in ln]
    assert len(warned) == 1, log
    assert "WARNING" in warned[0] and str(cap) in warned[0], warned


def test_unpublish_without_keys_removes_everything_the_calling_process_published(dvm):
    """Rank 0's unpublish() drops its INDEF, SESSION, FIRST_READ and LOCAL items; rank 1's stay."""
    p = dvm.run("--host", "a:2", "-n", "2", *job_script("unpublish_all"))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "RANK0 UNPUBLISHED" in p.stdout and "RANK1 PUBLISHED" in p.stdout
    st = dvm.store()
    # Without the unpublish all of these would outlive the job.
    assert st["master"]["items"] == 1, st
    assert st["a"]["items"] == 1, st
    q = dvm.run("--host", "b", "-n", "1", "pydvm", "lookup", "u_indef", "u_sess", "u_fr")
    assert lines(q, "FOUND") == [] and status(q) == "PMIX_ERR_NOT_FOUND", q.stdout
    q = dvm.run("--host", "a", "-n", "1", "pydvm", "lookup", "u_loc", "--range", "local")
    assert status(q) == "PMIX_ERR_NOT_FOUND", q.stdout
    q = dvm.run("--host", "b", "-n", "1", "pydvm", "lookup", "other")
    assert lines(q, "FOUND")[0].startswith("FOUND other o from ") and \
        lines(q, "FOUND")[0].endswith(":1"), q.stdout
    q = dvm.run("--host", "a", "-n", "1", "pydvm", "lookup", "other_loc", "--range", "local")
    assert status(q) == "PMIX_SUCCESS", q.stdout
