"""Cross-DVM relay: DVMs started with --data-server-uri keep no store of their own.

Three DVMs at once -- a data server S and two client DVMs C1, C2 pointed at
it -- plus a control DVM X that was not given the URI.
"""

from __future__ import annotations

import os
import re
import time

import pytest

from dvmkit import job_script, lines, start_dvm, wait_for


@pytest.fixture
def dvms(tmp_path):
    """S (data server), C1 and C2 relaying to S, and X on its own; all stopped at the end."""
    state = tmp_path / "state"  # shared: a relay reads its data server's credentials here
    made = {}
    try:
        made["S"] = start_dvm(tmp_path / "S", "s1", state_dir=state)
        for name, hosts in (("C1", "p1,p2"), ("C2", "q1")):
            made[name] = start_dvm(tmp_path / name, hosts, state_dir=state,
                                   extra=["--data-server-uri", made["S"].uri])
        made["X"] = start_dvm(tmp_path / "X", "x1", state_dir=state)
        yield made
    finally:
        for d in made.values():
            d.stop()


def _nspace(p) -> str:
    m = re.search(r"from (\S+):(\d+)", p.stdout)
    assert m, p.stdout
    return m.group(1)


def _dvmid(d) -> str:
    return d.uri.rsplit("/", 1)[1]


def test_relayed_data_crosses_dvms_and_answers_name_the_publisher_not_the_relay(dvms):
    """C1 publishes, C2 finds it naming C1's process; S holds it; X and the relays hold nothing."""
    s, c1, c2, x = dvms["S"], dvms["C1"], dvms["C2"], dvms["X"]
    p = c1.run("--host", "p2", "-n", "1", "pydvm", "publish", "addr=c1", "--persistence",
               "session")
    assert p.returncode == 0, p.stderr
    q = c2.run("-n", "1", "pydvm", "lookup", "addr")
    assert q.returncode == 0, q.stderr
    assert lines(q, "FOUND")[0].startswith(f"FOUND addr c1 from pydvm-{_dvmid(c1)}@1:0")
    assert s.store()["master"]["keys"] == ["addr"]
    assert c1.store()["master"]["items"] == 0 and c2.store()["master"]["items"] == 0
    r = x.run("-n", "1", "pydvm", "lookup", "addr")
    assert r.returncode == 1 and "STATUS PMIX_ERR_NOT_FOUND" in r.stdout
    assert x.store()["master"]["items"] == 0


def test_parked_lookup_in_one_client_dvm_is_woken_by_a_publish_in_the_other(dvms):
    """A waiting lookup relayed from C1 is answered when C2 publishes the key."""
    s, c1, c2 = dvms["S"], dvms["C1"], dvms["C2"]
    waiter = c1.run_bg("-n", "1", "pydvm", "lookup", "handover", "--wait", "--timeout", "30")
    wait_for(lambda: s.store()["master"]["parked"] == 1, timeout=30,
             what="the relayed lookup to park in S")
    p = c2.run("-n", "1", "pydvm", "publish", "handover=from-c2", "--persistence", "session")
    assert p.returncode == 0, p.stderr
    out, err = waiter.communicate(timeout=30)
    assert waiter.returncode == 0, (out, err)
    assert f"FOUND handover from-c2 from pydvm-{_dvmid(c2)}@1:0" in out
    assert s.store()["master"]["parked"] == 0


def test_job_end_in_a_relaying_dvm_purges_only_that_jobs_items(dvms):
    """C1's job ends: its NSPACE item leaves S; a running C1 job's and a C2 job's items stay."""
    s, c1, c2 = dvms["S"], dvms["C1"], dvms["C2"]
    held = [c1.run_bg("--host", "p1", "-n", "1", "pydvm", "publish", "c1-held=1", "--hold", "60"),
            c2.run_bg("-n", "1", "pydvm", "publish", "c2-held=1", "--hold", "60")]
    try:
        wait_for(lambda: set(s.store()["master"]["keys"]) == {"c1-held", "c2-held"},
                 timeout=30, what="both held items in S")
        p = c1.run("--host", "p2", "-n", "1", "pydvm", "publish", "c1-short=1")
        assert p.returncode == 0, p.stderr
        # The short job has ended (run returned): its default-persistence item is gone.
        assert sorted(s.store()["master"]["keys"]) == ["c1-held", "c2-held"]
    finally:
        for h in held:
            h.kill()
            h.communicate(timeout=30)
    wait_for(lambda: s.store()["master"]["items"] == 0, timeout=30,
             what="the killed jobs' items to be purged")


def test_local_range_stays_in_the_relaying_dvms_own_daemon(dvms):
    """LOCAL is judged by this DVM's daemons, so it is not relayed: S never sees it."""
    s, c1 = dvms["S"], dvms["C1"]
    p = c1.run("--host", "p1", "-n", "1", "sh", "-c",
               "pydvm publish near=1 --range local && pydvm lookup near --range local")
    assert p.returncode == 0, p.stderr
    assert "FOUND near 1" in p.stdout
    assert s.store()["master"]["items"] == 0


def test_requestor_claims_from_a_client_are_ignored(dvms):
    """A client claiming another process and uid is recorded as itself (claims are for tools)."""
    s, c1 = dvms["S"], dvms["C1"]
    p = c1.run("-n", "1", *job_script("claims"), "claimed-key")
    assert p.returncode == 0 and "STATUS 0" in p.stdout, (p.stdout, p.stderr)
    q = c1.run("-n", "1", "pydvm", "lookup", "claimed-key")
    assert f"from pydvm-{_dvmid(c1)}@1:0" in q.stdout, q.stdout
    assert list(s.store()["master"]["bytes_by_uid"]) == [str(os.getuid())]


def test_unreachable_data_server_fails_fast_and_the_relay_reconnects(dvms, tmp_path):
    """S stops: C1's publish gets UNREACH at once; S restarted under the same URI is used again."""
    s, c1 = dvms["S"], dvms["C1"]
    port, dvmid = s.uri.rsplit(":", 1)[1].split("/")
    s.stop()
    t0 = time.monotonic()
    p = c1.run("-n", "1", "pydvm", "publish", "k=1")
    assert "STATUS PMIX_ERR_UNREACH" in p.stdout, (p.stdout, p.stderr)
    assert time.monotonic() - t0 < 15
    s2 = start_dvm(tmp_path / "S2", "s1", state_dir=tmp_path / "state",
                   extra=["--port", port, "--dvm-id", dvmid])
    dvms["S"] = s2
    assert s2.uri == s.uri

    def published() -> bool:
        r = c1.run("-n", "1", "pydvm", "publish", "back=1", "--persistence", "session")
        return r.returncode == 0

    wait_for(published, timeout=30, interval=0.5, what="the relay to reconnect")
    assert s2.store()["master"]["keys"] == ["back"]


ADD_FIVE = """
from pydvm import Client, Persistence
with Client() as c:
    print("ADDED", *[c.add("shared", 1, persistence=Persistence.SESSION) for _ in range(5)])
"""

COUNT_AND_REMOVE = """
from pydvm import Client
with Client() as c:
    print("VALUE", c.lookup("shared")["shared"], "COUNT", c.count("sha"),
          "KEYS", *c.keys(""), "REMOVED", c.unpublish("shared"))
"""


def test_atomic_updates_key_counts_and_unpublish_counts_are_served_by_the_data_server(dvms):
    """Adds from two relaying DVMs' jobs meet in one counter held by S (each
    value returned once); counting, listing and unpublish answer from there."""
    import sys

    s, c1, c2 = dvms["S"], dvms["C1"], dvms["C2"]
    runs = [c1.run_bg("--host", "p1:1,p2:1", "-n", "2", sys.executable, "-c", ADD_FIVE),
            c2.run_bg("-n", "1", sys.executable, "-c", ADD_FIVE)]
    got = []
    for r in runs:
        out, err = r.communicate(timeout=60)
        assert r.returncode == 0, out + err
        got += [int(v) for ln in out.splitlines() if ln.startswith("ADDED") for v in ln.split()[1:]]
    assert sorted(got) == list(range(1, 16)), got
    assert s.store()["master"]["keys"] == ["shared"]
    q = c2.run("-n", "1", sys.executable, "-c", COUNT_AND_REMOVE)
    assert q.stdout.split() == ["VALUE", "15", "COUNT", "1", "KEYS", "shared", "REMOVED", "1"], \
        q.stdout + q.stderr
    assert s.store()["master"]["items"] == 0
