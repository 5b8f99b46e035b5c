"""The metrics endpoint end to end: ``pydvm start --metrics`` scraped over HTTP.

Real DVMs with local daemons, real jobs publishing, looking up, expiring and
being evicted; the endpoint is fetched over loopback HTTP while they run and
its text parsed with prometheus_client's own parser.  Each test checks
specific values against what the workload must have caused.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from dvmkit import CMD_TIMEOUT, PYDVM, finish, job_script, lines, start_dvm, wait_for

pytestmark = pytest.mark.e2e

prometheus_parser = pytest.importorskip("prometheus_client.parser")

METRICS = ["--metrics", "127.0.0.1:0"]
UID = str(os.getuid())


# ----------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------


def metrics_url(dvm) -> str:
    """Where the DVM serves its metrics (``info`` reports it)."""
    code = ("import asyncio, sys;"
            "from pydvm.cli.tool import call, resolve_uri;"
            "print(asyncio.run(call(resolve_uri(None), {'t': 'info'}))['metrics'])")
    env = dict(dvm.env, PYDVM_URI=dvm.uri)
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=CMD_TIMEOUT, check=True)
    url = p.stdout.strip()
    assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics"), url
    return url


class Scrape:
    """One parsed scrape: families by name, and sample values by name and labels."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.families = {f.name: f for f in prometheus_parser.text_string_to_metric_families(text)}
        self.samples = {}
        for fam in self.families.values():
            for s in fam.samples:
                self.samples[(s.name, frozenset(s.labels.items()))] = s.value

    def value(self, name: str, **labels) -> float | None:
        """The sample ``name`` with exactly ``labels``, or None if absent."""
        return self.samples.get((name, frozenset(labels.items())))

    def by(self, name: str, label: str, **fixed) -> dict[str, float]:
        """``{labels[label]: value}`` of the samples ``name`` that carry ``fixed``."""
        out = {}
        for (n, labels), v in self.samples.items():
            d = dict(labels)
            if n == name and all(d.get(k) == val for k, val in fixed.items()):
                out[d[label]] = v
        return out


def scrape(url: str, timeout: float = 15.0) -> Scrape:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        return Scrape(r.read().decode())


@pytest.fixture
def metrics_dvm(tmp_path):
    """Factory: a DVM serving metrics on a free loopback port; stopped at the end."""
    made = []

    def make(hosts: str = "a,b,c", **mca):
        sub = tmp_path / f"dvm{len(made)}"
        sub.mkdir()
        d = start_dvm(sub, hosts, mca, extra=METRICS)
        made.append(d)
        return d, metrics_url(d)

    try:
        yield make
    finally:
        for d in made:
            d.stop()


# ----------------------------------------------------------------------
# the endpoint
# ----------------------------------------------------------------------


def test_every_store_and_node_is_exported_with_help_and_conventional_names(metrics_dvm):
    """A fresh DVM of three nodes: master, a, b and c stores up; three nodes up; each
    family has help text, the pydvm_ prefix, and counters end in _total."""
    dvm, url = metrics_dvm()
    s = scrape(url)
    assert s.by("pydvm_store_up", "store") == {"master": 1, "a": 1, "b": 1, "c": 1}
    assert s.by("pydvm_nodes", "state") == {"launching": 0, "joining": 0, "up": 3, "lost": 0,
                                            "stopped": 0}
    assert s.value("pydvm_jobs_started_total") == 0
    assert s.value("pydvm_sessions") == 1
    assert set(s.by("pydvm_jobs", "state").values()) == {0}
    ours = {n: f for n, f in s.families.items() if n.startswith("pydvm_")}
    assert len(ours) >= 15
    for name, fam in ours.items():
        assert fam.documentation and fam.documentation.endswith("."), name
        if fam.type == "counter":
            assert all(x.name.endswith("_total") for x in fam.samples), name
        if fam.type == "histogram":
            assert name.endswith("_seconds"), name
    # every removal reason is there from the start, at zero, for every store
    reasons = s.by("pydvm_store_removed_items_total", "reason", store="b")
    assert reasons == dict.fromkeys(["unpublished", "replaced", "consumed", "purged_proc",
                                     "purged_app", "purged_nspace", "purged_session",
                                     "expired", "evicted"], 0)
    # the master process's own figures come along
    assert s.value("process_resident_memory_bytes") > 0


def test_every_removal_rule_is_counted_under_its_reason(metrics_dvm):
    """One job publishes an item for each rule in a new session; once its job and
    session have ended and the idle timeout has passed, the master store's
    removal counters say exactly which rule removed what, and node a's store its
    LOCAL PROC item."""
    dvm, url = metrics_dvm(prte_data_server_timeout=2)
    sid = dvm.cmd("session", "new", check=True).stdout.strip()
    p = dvm.run("--session", sid, "--host", "a", "-n", "1", *job_script("every_removal"))
    assert p.returncode == 0 and lines(p, "PUBLISHED ALL"), p.stdout + p.stderr
    dvm.cmd("session", "end", sid, check=True)

    def settled():
        s = scrape(url)
        return s if s.value("pydvm_store_items", store="master") == 0 else None

    s = wait_for(settled, timeout=20, interval=0.25, what="the INDEF items to expire")
    assert s.by("pydvm_store_removed_keys_total", "reason", store="master") == {
        "unpublished": 1, "replaced": 1, "consumed": 1, "purged_proc": 1, "purged_app": 1,
        "purged_nspace": 2, "purged_session": 1, "expired": 2, "evicted": 0}
    assert s.by("pydvm_store_removed_items_total", "reason", store="master") == {
        "unpublished": 0, "replaced": 1, "consumed": 1, "purged_proc": 1, "purged_app": 1,
        "purged_nspace": 1, "purged_session": 1, "expired": 2, "evicted": 0}
    node_a = s.by("pydvm_store_removed_items_total", "reason", store="a")
    assert {r: n for r, n in node_a.items() if n} == {"purged_proc": 1}
    assert s.value("pydvm_store_sweep_passes_total", store="master") >= 1
    assert s.value("pydvm_store_sweep_budget_exhausted_total", store="master") == 0
    assert s.by("pydvm_store_bytes", "uid", store="master") == {}
    # requests as served by each store: 8 publishes, 1 lookup, 1 unpublish reach the
    # master; the LOCAL publish reaches node a -- the unpublish came before it, when
    # node a held nothing of this uid, so its node half was skipped (direct data)
    assert s.by("pydvm_store_requests_total", "op", store="master",
                status="PMIX_SUCCESS") == {"publish": 8, "lookup": 1, "unpublish": 1}
    assert s.by("pydvm_store_requests_total", "op", store="a",
                status="PMIX_SUCCESS") == {"publish": 1}
    assert s.value("pydvm_jobs_started_total") == 1
    assert s.value("pydvm_sessions") == 1


UNPUBLISH_TWICE = """
from pydvm import Client, Persistence, Range
with Client() as c:
    c.publish({"m": 1}, persistence=Persistence.SESSION)
    c.unpublish(["m"])        # node a holds nothing of this uid: only the master serves it
    c.publish({"l": 1}, range=Range.LOCAL, persistence=Persistence.SESSION)
    c.unpublish(["l"])        # now it does: node a's store serves it too
    print("DIRECT", c.direct)
"""


@pytest.mark.parametrize("direct", ["on", "off"])
def test_a_node_store_serves_an_unpublish_only_when_it_holds_something_of_the_uid(
        metrics_dvm, direct):
    """Whichever way an unpublish reaches the master -- straight from the client
    or through the daemon -- node a's store counts it only when it holds an
    item of the caller's uid (it would remove nothing otherwise)."""
    dvm, url = metrics_dvm("a,b", pydvm_direct_data=direct)
    p = dvm.run("--host", "a", "-n", "1", sys.executable, "-c", UNPUBLISH_TWICE)
    assert p.returncode == 0, p.stdout + p.stderr
    assert lines(p, "DIRECT") == [f"DIRECT {direct == 'on'}"], p.stdout
    s = scrape(url)
    assert s.by("pydvm_store_requests_total", "op", store="a",
                status="PMIX_SUCCESS") == {"publish": 1, "unpublish": 1}
    assert s.by("pydvm_store_requests_total", "op", store="master",
                status="PMIX_SUCCESS") == {"publish": 1, "unpublish": 2}


def test_a_flood_at_a_small_cap_shows_as_evictions_and_bytes_within_the_cap(metrics_dvm):
    """50 publishes of 232-byte items at a 2000-byte cap: the uid keeps 8, so 42
    items (and keys) are counted evicted, its bytes stay under the cap, and
    ``pydvm store`` agrees."""
    dvm, url = metrics_dvm(prte_data_server_max_size=2000)
    p = dvm.run("-n", "1", *job_script("flood"), "50", "100")
    assert p.returncode == 0 and lines(p, "FLOODED 50"), p.stdout + p.stderr
    s = scrape(url)
    assert s.value("pydvm_store_items", store="master") == 8
    assert s.value("pydvm_store_removed_items_total", store="master", reason="evicted") == 42
    assert s.value("pydvm_store_removed_keys_total", store="master", reason="evicted") == 42
    assert s.by("pydvm_store_bytes", "uid", store="master") == {UID: 8 * 232}
    assert s.value("pydvm_store_cap_bytes", store="master") == 2000
    assert s.value("pydvm_store_requests_total", store="master", op="publish",
                   status="PMIX_SUCCESS") == 50
    assert dvm.store()["master"]["evictions"] == 42
    # nothing else was removed, and no other store was touched
    assert sum(s.by("pydvm_store_removed_items_total", "reason", store="master").values()) == 42
    assert s.value("pydvm_store_items", store="a") == 0


def test_a_waiting_lookup_shows_as_parked_and_its_job_as_running(metrics_dvm):
    """A job waits for a key nobody has published: the master store shows one
    parked lookup (a LOCAL one on node b's store), the job counts as running;
    once a second job publishes, both parked counts drop to 0 and no job is left."""
    dvm, url = metrics_dvm()
    bg = dvm.run_bg("--host", "b", "-n", "2", "sh", "-c",
                    'if [ "$PYDVM_RANK" = 0 ]; then exec pydvm lookup go --wait --timeout 30;'
                    ' else exec pydvm lookup here --range local --wait --timeout 30; fi')
    try:
        s = wait_for(lambda: (lambda x: x if x.value("pydvm_store_parked_lookups",
                                                     store="master") == 1
                              and x.value("pydvm_store_parked_lookups", store="b") == 1
                              else None)(scrape(url)),
                     timeout=20, interval=0.1, what="both lookups to park")
        assert s.by("pydvm_jobs", "state")["running"] == 1
        assert s.value("pydvm_store_requests_total", store="master", op="lookup",
                       status="parked") == 1
        assert s.value("pydvm_store_parked_lookups", store="a") == 0
        p = dvm.run("--host", "b", "-n", "1", "sh", "-c",
                    "pydvm publish go=1 && pydvm publish here=1 --range local --hold 1")
        assert p.returncode == 0, p.stdout + p.stderr
        assert finish(bg, 30) == 0, bg.stdout.read() + bg.stderr.read()
    finally:
        if bg.poll() is None:
            bg.kill()
            bg.wait(10)
    s = scrape(url)
    assert s.value("pydvm_store_parked_lookups", store="master") == 0
    assert s.value("pydvm_store_parked_lookups", store="b") == 0
    assert set(s.by("pydvm_jobs", "state").values()) == {0}
    assert s.value("pydvm_jobs_started_total") == 2


def test_latency_histogram_counts_every_request_served(metrics_dvm):
    """The duration histogram of each operation counts exactly the requests the
    store served, its buckets are cumulative up to +Inf, and its sum is positive
    and small (a store operation is far under a millisecond on average)."""
    dvm, url = metrics_dvm()
    p = dvm.run("-n", "1", sys.executable, "-c",
                "from pydvm import Client\n"
                "with Client() as c:\n"
                "    for i in range(40):\n"
                "        c.publish({f'k{i}': i})\n"
                "        c.lookup([f'k{i}'])\n"
                "    c.unpublish([f'k{i}' for i in range(40)])\n")
    assert p.returncode == 0, p.stderr
    s = scrape(url)
    fam = s.families["pydvm_store_request_duration_seconds"]
    assert fam.type == "histogram"
    for op, n in (("publish", 40), ("lookup", 40), ("unpublish", 1)):
        assert s.value("pydvm_store_request_duration_seconds_count", store="master", op=op) == n
        buckets = sorted((float(x.labels["le"]), x.value) for x in fam.samples
                         if x.name.endswith("_bucket") and x.labels["store"] == "master"
                         and x.labels["op"] == op)
        assert buckets[-1] == (float("inf"), n)
        assert all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:])), buckets
        total = s.value("pydvm_store_request_duration_seconds_sum", store="master", op=op)
        assert 0 < total < n * 0.01, (op, total)


# ----------------------------------------------------------------------
# nodes that die or stall
# ----------------------------------------------------------------------


def test_queue_jobs_and_job_events_are_counted(metrics_dvm, monkeypatch):
    """A DVM of one slot that queues: a holder runs, three jobs wait; one is
    killed while queued, the holder is killed, the other two run (one
    fails).  The scrapes show the queue's length, what waited and how long,
    how jobs ended, the event subscription and every event sent to it."""
    import threading

    import pydvm.jobs as pj

    dvm, url = metrics_dvm("a:1", pydvm_queue="on")
    monkeypatch.setenv("PYDVM_STATE_DIR", dvm.env["PYDVM_STATE_DIR"])
    s = scrape(url)
    assert s.value("pydvm_queue_jobs") == 0
    assert s.value("pydvm_queue_jobs_queued_total") == 0
    assert s.value("pydvm_queue_jobs_left_total") == 0
    assert s.value("pydvm_queue_wait_seconds_count") == 0
    assert s.by("pydvm_jobs_ended_total", "result") == {"ok": 0, "failed": 0, "killed": 0}
    assert s.value("pydvm_job_event_subscriptions") == 0
    assert s.value("pydvm_job_event_subscriptions_dropped_total") == 0
    with pj.connect(dvm.uri) as api:
        sub = api.on_event(lambda ev: None)
        ready = threading.Event()
        hold = api.submit(["sh", "-c", "echo READY; exec sleep 120"],
                          stdout=lambda rank, line: ready.set())
        assert ready.wait(30)
        waiting = [api.submit("true"), api.submit("false"), api.submit("true")]
        wait_for(lambda: all(j.state == "queued" for j in waiting), what="three jobs queued")
        s = scrape(url)
        assert s.value("pydvm_queue_jobs") == 3
        assert s.value("pydvm_queue_jobs_queued_total") == 3
        assert s.value("pydvm_queue_wait_seconds_count") == 1  # the holder, at once
        assert s.value("pydvm_job_event_subscriptions") == 1
        assert s.by("pydvm_job_events_total", "kind") == {
            "queued": 3, "started": 1, "proc_exit": 0, "ended": 0, "dropped": 0}
        waiting[2].kill()
        assert waiting[2].result(60).returncode == 143
        hold.kill()
        assert hold.result(60).killed == 1
        assert waiting[0].result(60).returncode == 0
        assert waiting[1].result(60).returncode == 1
        s = scrape(url)
        assert s.value("pydvm_queue_jobs") == 0
        assert s.value("pydvm_queue_jobs_left_total") == 1
        assert s.value("pydvm_queue_wait_seconds_count") == 3
        assert s.value("pydvm_queue_wait_seconds_sum") > 0
        assert s.value("pydvm_queue_wait_seconds_bucket", le="+Inf") == 3
        assert s.by("pydvm_jobs_ended_total", "result") == {"ok": 1, "failed": 1, "killed": 1}
        assert s.value("pydvm_jobs_started_total") == 3
        assert s.by("pydvm_job_events_total", "kind") == {
            "queued": 3, "started": 3, "proc_exit": 3, "ended": 4, "dropped": 0}
        sub.close()
        wait_for(lambda: scrape(url).value("pydvm_job_event_subscriptions") == 0,
                 what="the subscription gone")


def test_a_subscriber_dropped_for_not_reading_is_counted(metrics_dvm):
    """A tool subscribes and never reads (small socket buffers, so what it
    leaves unread piles up at the master): past pydvm_event_backlog its
    subscription is dropped, and the scrape counts it."""
    from rawpeers import Peer, master_uri, tool

    from pydvm.protocol import mac

    dvm, url = metrics_dvm("a:4", pydvm_event_backlog="1k")
    uri = master_uri(dvm)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
    s.connect((uri.host, uri.port))
    lazy = Peer(s, "lazy")
    challenge = lazy.recv()
    assert lazy.call({"t": "auth", "role": "tool",
                      "mac": mac(dvm.secret(), challenge["nonce"], "tool")})["status"] == 0
    assert lazy.call({"t": "subscribe", "id": 1})["status"] == 0
    assert scrape(url).value("pydvm_job_event_subscriptions") == 1
    t = tool(dvm)
    # How much the kernels absorb before the master's own buffer passes the
    # backlog varies (send-buffer autotuning, a loaded machine): batches of
    # jobs until the drop, as tests/e2e/test_job_events.py does, each
    # waited for so that a batch's events are all out before the next.
    dropped = lambda: scrape(url).value("pydvm_job_event_subscriptions_dropped_total") == 1  # noqa: E731
    batches = 0
    while not dropped() and batches < 40:
        first = 1000 * (batches + 1)
        specs = [{"id": first + i, "apps": [{"argv": ["true"], "n": 1}],
                  "env": dict(os.environ), "cwd": "/", "queue": True, "output": "discard"}
                 for i in range(100)]
        t.send({"t": "run_many", "id": first - 1, "jobs": specs})
        wait_for(lambda: scrape(url).value("pydvm_jobs_ended_total", result="ok")
                 >= 100 * (batches + 1), timeout=60, what=f"batch {batches} to end")
        batches += 1
    wait_for(dropped, timeout=60, what=f"the lazy subscription dropped ({batches} batches)")
    sc = scrape(url)
    assert sc.value("pydvm_job_event_subscriptions") == 0
    assert sc.value("pydvm_job_events_total", kind="dropped") == 1
    t.close()
    lazy.close()


def test_a_killed_daemon_shows_as_a_lost_node_and_its_store_is_no_longer_asked(metrics_dvm):
    """SIGKILL the daemon of b: the scrape then counts two nodes up and one lost,
    and exports no store b (it is gone with its daemon)."""
    dvm, url = metrics_dvm()
    os.kill(dvm.daemon_pids["b"], signal.SIGKILL)
    s = wait_for(lambda: (lambda x: x if x.value("pydvm_nodes", state="lost") == 1 else None)(
        scrape(url)), timeout=30, interval=0.2, what="node b to count as lost")
    assert s.by("pydvm_nodes", "state") == {"launching": 0, "joining": 0, "up": 2, "lost": 1,
                                            "stopped": 0}
    assert s.by("pydvm_store_up", "store") == {"master": 1, "a": 1, "c": 1}


def test_a_stalled_daemon_does_not_hang_the_scrape(metrics_dvm):
    """SIGSTOP the daemon of c (it stays connected but answers nothing): a scrape
    still returns within the scrape timeout plus a margin, with store c marked
    down and the other stores' figures present.  Heartbeats are slowed so the
    pause is not mistaken for a lost node."""
    dvm, url = metrics_dvm(pydvm_heartbeat_interval=10)
    pid = dvm.daemon_pids["c"]
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        s = scrape(url)
        elapsed = time.monotonic() - t0
    finally:
        os.kill(pid, signal.SIGCONT)
    assert elapsed < 8, elapsed  # the scrape waits 2 s for daemons, 3 s at most
    assert s.by("pydvm_store_up", "store") == {"master": 1, "a": 1, "b": 1, "c": 0}
    assert s.value("pydvm_store_items", store="a") == 0
    assert s.value("pydvm_store_items", store="c") is None
    # and once it runs again it answers again
    wait_for(lambda: scrape(url).value("pydvm_store_up", store="c") == 1, timeout=20,
             interval=0.2, what="node c's store to answer again")


# ----------------------------------------------------------------------
# start and stop
# ----------------------------------------------------------------------


def test_metrics_server_stops_with_the_dvm(metrics_dvm):
    """After ``pydvm stop`` the metrics port is closed."""
    dvm, url = metrics_dvm("a")
    assert scrape(url).value("pydvm_store_up", store="a") == 1
    dvm.stop()
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(url, timeout=5)


def test_metrics_on_a_busy_port_is_a_start_error_naming_the_address(tmp_path):
    """``--metrics`` on a port already bound: start fails with a message naming the
    address, and no DVM is left running (the next start with that id succeeds)."""
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    env = dict(os.environ, PYDVM_STATE_DIR=str(tmp_path / "state"))
    env.pop("PYDVM_URI", None)
    try:
        p = subprocess.run(PYDVM + ["start", "--daemonize", "--hosts", "a", "--dvm-id", "mbusy",
                                    "--metrics", f"127.0.0.1:{port}"],
                           env=env, capture_output=True, text=True, timeout=CMD_TIMEOUT)
    finally:
        busy.close()
    assert p.returncode != 0
    assert f"cannot serve metrics on 127.0.0.1:{port}" in p.stderr, p.stderr
    d = start_dvm(tmp_path, "a", extra=["--dvm-id", "mbusy"])
    d.stop()


@pytest.mark.parametrize("bad", ["9100", "localhost:http", "127.0.0.1:70000", ":9100"])
def test_a_malformed_metrics_address_is_a_usage_error(tmp_path, bad):
    """``--metrics`` must be ADDR:PORT with a port number in range: exit 2, nothing started."""
    env = dict(os.environ, PYDVM_STATE_DIR=str(tmp_path / "state"))
    p = subprocess.run(PYDVM + ["start", "--hosts", "a", "--metrics", bad], env=env,
                       capture_output=True, text=True, timeout=CMD_TIMEOUT)
    assert p.returncode == 2, p.stderr
    assert "--metrics" in p.stderr
    assert not (tmp_path / "state").exists() or not list((tmp_path / "state").glob("*.json"))


def test_metrics_without_prometheus_client_says_what_to_install(tmp_path):
    """With prometheus_client unimportable, ``pydvm start --metrics`` fails at once
    with a message naming the package and how to install it, and starts nothing."""
    env = dict(os.environ, PYDVM_STATE_DIR=str(tmp_path / "state"))
    env.pop("PYDVM_URI", None)
    code = ("import sys; sys.modules['prometheus_client'] = None;"  # as if not installed
            "from pydvm.cli import main;"
            "sys.exit(main(['start', '--hosts', 'a', '--metrics', '127.0.0.1:0']))")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=CMD_TIMEOUT)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "prometheus_client" in p.stderr and "pip install prometheus-client" in p.stderr, \
        p.stderr
    assert not list((tmp_path / "state").glob("*.json")) if (tmp_path / "state").exists() \
        else True
