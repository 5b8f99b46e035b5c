"""The metrics module's pure parts: addresses, request timing, families, job states.

No DVM here (tests/e2e/test_metrics.py scrapes real ones): a real store on a
fake clock, real prometheus_client formatting and parsing.
"""

from __future__ import annotations

import pytest

from pydvm.runtime.shared.jobs import HostSpec, ProcState, build_job
from pydvm.runtime.master.metrics import FAMILIES, families, parse_address
from pydvm.runtime.shared.stats import LATENCY_BUCKETS, OPS, PARKED, RequestStats, store_sample
from pydvm.store import Caller, DataStore, FakeScheduler, Reason, StoreParams

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

ALICE = Caller("ns", 0, 1000, 100, "n1", 0, None)


def _store(**params) -> tuple[DataStore, list]:
    sched = FakeScheduler()
    answers: list = []
    store = DataStore(name="n1", clock=sched, timer=sched,
                      on_answer=lambda t, r: answers.append((t, r)),
                      params=StoreParams(**params))
    return store, answers


def _text(snap: dict) -> str:
    registry = prometheus_client.CollectorRegistry()

    class Fixed:
        def collect(self):
            return families(snap)

    registry.register(Fixed())
    return prometheus_client.generate_latest(registry).decode()


def _snap(stores: list[dict], **over) -> dict:
    snap = {"stores": stores, "unanswered": [], "nodes": {"up": 2}, "jobs": {},
            "jobs_started": 0, "sessions": 1}
    snap.update(over)
    return snap


@pytest.mark.parametrize("text,want", [
    ("127.0.0.1:9100", ("127.0.0.1", 9100)),
    ("localhost:0", ("localhost", 0)),
    ("[::1]:9100", ("::1", 9100)),
    ("0.0.0.0:65535", ("0.0.0.0", 65535)),
])
def test_metrics_address_is_addr_colon_port(text, want):
    """ADDR:PORT, [V6]:PORT; port 0 means any free port."""
    assert parse_address(text) == want


@pytest.mark.parametrize("text,pattern", [
    ("9100", "expected ADDR:PORT"),
    (":9100", "expected ADDR:PORT"),
    ("host:", "bad port"),
    ("host:x", "bad port"),
    ("host:65536", "out of range"),
    ("host:-1", "out of range"),
])
def test_malformed_metrics_address_is_refused_naming_the_problem(text, pattern):
    with pytest.raises(ValueError, match=pattern):
        parse_address(text)


def test_request_timing_counts_each_request_by_op_and_status():
    """Every apply() is counted once, under its op and reply status; a lookup that
    parks counts as 'parked'; the histogram's count per op equals the requests."""
    store, _ = _store()
    rs = RequestStats()
    rs.apply(store, ALICE, {"t": "publish", "id": 1, "pairs": {"k": 1}}, 1)
    rs.apply(store, ALICE, {"t": "publish", "id": 2, "pairs": {"k": 1}}, 2)  # duplicate
    rs.apply(store, ALICE, {"t": "lookup", "id": 3, "keys": ["k"]}, 3)
    assert rs.apply(store, ALICE, {"t": "lookup", "id": 4, "keys": ["x"], "wait": 0}, 4) is None
    rs.apply(store, ALICE, {"t": "unpublish", "id": 5, "keys": ["k"]}, 5)
    rs.apply(store, ALICE, {"t": "update", "id": 6, "key": "n", "op": "add", "value": 1}, 6)
    rs.apply(store, ALICE, {"t": "update", "id": 7, "key": "n", "op": "mul", "value": 1}, 7)
    rs.apply(store, ALICE, {"t": "keys", "id": 8, "prefix": "n"}, 8)
    s = rs.sample()
    assert sorted(map(tuple, s["requests"])) == sorted([
        ("publish", "PMIX_SUCCESS", 1), ("publish", "PMIX_ERR_DUPLICATE_KEY", 1),
        ("lookup", "PMIX_SUCCESS", 1), ("lookup", PARKED, 1),
        ("unpublish", "PMIX_SUCCESS", 1), ("update", "PMIX_SUCCESS", 1),
        ("update", "PMIX_ERR_BAD_PARAM", 1), ("keys", "PMIX_SUCCESS", 1)])
    assert {op: sum(s["latency"][op]) for op in OPS} == {"publish": 2, "lookup": 2,
                                                         "unpublish": 1, "update": 2,
                                                         "keys": 1}
    assert all(len(h) == len(LATENCY_BUCKETS) + 1 for h in s["latency"].values())
    assert all(v > 0 for v in s["latency_sum"].values())


def test_a_request_exactly_at_a_bucket_bound_falls_in_that_bucket():
    """Prometheus buckets are 'less than or equal': a time equal to a bound counts in it."""
    from bisect import bisect_left

    for i, bound in enumerate(LATENCY_BUCKETS):
        assert bisect_left(LATENCY_BUCKETS, bound) == i
    assert bisect_left(LATENCY_BUCKETS, LATENCY_BUCKETS[-1] * 2) == len(LATENCY_BUCKETS)


def test_store_sample_round_trips_through_prometheus_text():
    """A store's sample becomes families whose text the library parses back to the
    same values: items, bytes per uid, cap, removal counters, cumulative buckets."""
    store, _ = _store(max_size=1000)
    rs = RequestStats()
    for i in range(10):
        rs.apply(store, ALICE, {"t": "publish", "id": i, "pairs": {f"k{i}": "v" * 100}}, i)
    st = store.stats()
    assert st.evictions > 0
    text = _text(_snap([store_sample(store, rs)]))
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for f in fams.values() for s in f.samples}
    assert got[("pydvm_store_items", (("store", "n1"),))] == st.items
    assert got[("pydvm_store_bytes", (("store", "n1"), ("uid", "1000")))] == \
        st.bytes_by_uid[1000]
    assert got[("pydvm_store_cap_bytes", (("store", "n1"),))] == 1000
    assert got[("pydvm_store_removed_items_total", (("reason", "evicted"), ("store", "n1")))] \
        == st.evictions
    assert got[("pydvm_store_request_duration_seconds_count",
                (("op", "publish"), ("store", "n1")))] == 10
    assert got[("pydvm_store_request_duration_seconds_bucket",
                (("le", "+Inf"), ("op", "publish"), ("store", "n1")))] == 10
    assert got[("pydvm_store_requests_total",
                (("op", "publish"), ("status", "PMIX_SUCCESS"), ("store", "n1")))] == 10
    for reason in Reason.ALL:
        assert ("pydvm_store_removed_keys_total",
                (("reason", reason), ("store", "n1"))) in got


def test_a_store_that_did_not_answer_is_exported_as_down():
    """A daemon that missed the scrape timeout: pydvm_store_up 0 and no figures."""
    store, _ = _store()
    text = _text(_snap([store_sample(store, None)], unanswered=["c"]))
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    up = {s.labels["store"]: s.value for s in fams["pydvm_store_up"].samples}
    assert up == {"n1": 1, "c": 0}
    assert {s.labels["store"] for s in fams["pydvm_store_items"].samples} == {"n1"}


def test_every_family_is_declared_once_with_help_and_a_conventional_name():
    """Names carry the pydvm_ prefix; histograms are in seconds; counters are not
    declared with _total (the library adds it); help text is a sentence."""
    names = [f[0] for f in FAMILIES]
    assert len(names) == len(set(names))
    for name, kind, help_, labels in FAMILIES:
        assert name.startswith("pydvm_")
        assert not name.endswith("_total")
        assert kind != "histogram" or name.endswith("_seconds")
        assert (help_[0].isupper() or help_[0].isdigit()) and help_.endswith(".")
        assert set(labels) <= {"store", "uid", "reason", "op", "status", "state", "result",
                               "kind"}


def test_job_state_follows_its_processes():
    """starting while a process is pending, running, killing once killed, ending
    once every process has ended."""
    job = build_job("ns@1", 0, [(["true"], 2, [HostSpec("a", 2)])])
    assert job.state == "starting"
    for p in job.procs.values():
        p.state = ProcState.RUNNING
    assert job.state == "running"
    job.killed = True
    assert job.state == "killing"
    job.proc_ended(0, 0)
    job.proc_ended(1, 0)
    assert job.state == "ending"


def test_queue_and_event_figures_round_trip_with_cumulative_wait_buckets():
    """The queue's per-bucket wait counts become cumulative buckets; jobs
    ended, events by kind and the gauges come back as given."""
    from pydvm.runtime.master.jobqueue import WAIT_BUCKETS

    wait = [0] * (len(WAIT_BUCKETS) + 1)
    wait[0], wait[2], wait[-1] = 2, 1, 1  # two under 10 ms, one under 1 s, one past 10 h
    text = _text(_snap([], queue={"waiting": 3, "queued": 5, "left": 1, "wait": wait,
                                  "wait_sum": 40000.5},
                       events={"subscriptions": 2, "sent": {"queued": 5, "ended": 4},
                               "dropped": 1, "ended": {"ok": 3, "killed": 1}}))
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for f in text_string_to_metric_families(text) for s in f.samples}
    assert got[("pydvm_queue_jobs", ())] == 3
    assert got[("pydvm_queue_jobs_queued_total", ())] == 5
    assert got[("pydvm_queue_jobs_left_total", ())] == 1
    assert got[("pydvm_queue_wait_seconds_bucket", (("le", "0.01"),))] == 2
    assert got[("pydvm_queue_wait_seconds_bucket", (("le", "0.1"),))] == 2
    assert got[("pydvm_queue_wait_seconds_bucket", (("le", "1.0"),))] == 3
    assert got[("pydvm_queue_wait_seconds_bucket", (("le", "36000.0"),))] == 3
    assert got[("pydvm_queue_wait_seconds_bucket", (("le", "+Inf"),))] == 4
    assert got[("pydvm_queue_wait_seconds_count", ())] == 4
    assert got[("pydvm_queue_wait_seconds_sum", ())] == 40000.5
    assert got[("pydvm_jobs_ended_total", (("result", "ok"),))] == 3
    assert got[("pydvm_jobs_ended_total", (("result", "failed"),))] == 0
    assert got[("pydvm_job_events_total", (("kind", "proc_exit"),))] == 0
    assert got[("pydvm_job_events_total", (("kind", "ended"),))] == 4
    assert got[("pydvm_job_event_subscriptions", ())] == 2
    assert got[("pydvm_job_event_subscriptions_dropped_total", ())] == 1
