"""Prometheus metrics of a DVM: every store, every node, every job, one scrape.

``pydvm start --metrics ADDR:PORT`` makes the master serve Prometheus text
at ``http://ADDR:PORT/metrics``.  What is exported, and from where::

    scrape ──http──► master (HTTP thread)            figures read on the loop
                       │ run_coroutine_threadsafe    ───────────────────────
                       ▼
                     master loop: snapshot() ──────► master store: stats(),
                       │                             RequestStats, nodes, jobs
                       └─ "stats" + metrics:true ──► every daemon that is up:
                          (all at once, SCRAPE_TIMEOUT)  its store's stats(),
                                                         its RequestStats

Design
------
* **The store stays pure.**  Its counters are plain integers read through
  :meth:`DataStore.stats() <pydvm.store.DataStore.stats>`; nothing in
  :mod:`pydvm.store` knows Prometheus exists.  This module turns a snapshot
  of plain values into metric families in a custom collector, at scrape
  time, so nothing is copied or updated between scrapes.
* **Node stores are asked at scrape time**, through the master, with the
  existing ``stats`` request (``metrics: true`` adds :func:`store_sample`
  to the reply).  Daemons keep no Prometheus state and need no
  ``prometheus_client``; a daemon that does not answer within
  :data:`SCRAPE_TIMEOUT` is reported ``pydvm_store_up 0`` and the scrape
  goes on without it, so a scrape never hangs on a sick node.  Lost and
  stopped nodes are not asked (their stores are gone; ``pydvm_nodes`` counts
  them).  The alternative -- daemons pushing figures to the master
  periodically -- costs traffic when nobody scrapes and serves stale
  figures when someone does.
* **Latency is measured where a request is served**: :meth:`RequestStats.apply`
  wraps :func:`pydvm.runtime.shared.dataops.apply` in the master (master store) and
  in each daemon (its node store) with two ``perf_counter`` reads, a bisect
  into fixed buckets and three updates of lists and int-keyed dicts --
  under a microsecond on a 100-200 µs request path.  A waiting lookup is timed until it is parked, not
  for its wait (that is the publisher's latency, not the store's).
* **The HTTP server is prometheus_client's own** threaded WSGI server, not
  an asyncio handler: it speaks HTTP properly (content negotiation,
  OpenMetrics, gzip, ``name[]`` filters), a slow or stuck scraper ties up
  only its own thread, and formatting the text happens off the event loop.
  The one thing it must not do is read the master's state from its thread:
  the collector hands a coroutine to the loop and waits for its result (at
  most :data:`SCRAPE_TIMEOUT` plus a second), so every figure is read on
  the loop, between two messages, consistently.  The server stops with the
  DVM (:meth:`MetricsServer.stop` in the master's teardown).

``prometheus_client`` is a dependency of pydvm, imported only when a DVM
is started with ``--metrics``; should it be missing (an install without
dependencies), :func:`require_prometheus` explains what to install.  The
parts daemons use (:class:`RequestStats`, :func:`store_sample`) import
nothing from it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import Counter
from typing import TYPE_CHECKING, Any, Iterator

from ...store import Reason
from ..shared.stats import LATENCY_BUCKETS, store_sample

if TYPE_CHECKING:
    from .server import Master

log = logging.getLogger("pydvm.metrics")

#: Seconds a scrape waits for the daemons' figures.
SCRAPE_TIMEOUT = 2.0

#: Node states (see :mod:`pydvm.runtime.master.nodes`) and job states (``JobRecord.state``, as
#: ``pydvm ps`` shows them).
NODE_STATES = ("launching", "joining", "up", "lost", "stopped")
JOB_STATES = ("starting", "running", "killing", "ending")


class MetricsUnavailable(RuntimeError):
    """``--metrics`` was given but ``prometheus_client`` is not installed.

    Raised by :func:`require_prometheus` (so by the master's start, before
    anything is started); the message says what to install.
    """


def require_prometheus() -> None:
    """Raise :class:`MetricsUnavailable` unless prometheus_client imports."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise MetricsUnavailable(
            "--metrics needs the prometheus_client package, a dependency of pydvm missing "
            "here: pip install prometheus-client (or reinstall pydvm)") from None


def parse_address(text: str) -> tuple[str, int]:
    """``ADDR:PORT`` (``[V6ADDR]:PORT`` for IPv6) -> ``(addr, port)``.

    Port 0 means any free port (the master's ``info`` reply says which,
    as ``metrics``).  Raises ValueError naming the problem.
    """
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected ADDR:PORT, not {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        n = int(port)
    except ValueError:
        raise ValueError(f"bad port {port!r} in {text!r}") from None
    if not 0 <= n <= 65535:
        raise ValueError(f"port {n} is out of range (0-65535)")
    return host, n


async def snapshot(master: "Master", timeout: float = SCRAPE_TIMEOUT) -> dict[str, Any]:
    """Gather one scrape's figures; runs on the master's event loop.

    Asks every node that is up for its store's :func:`store_sample` (all at
    once, each bounded by ``timeout``); a node that does not answer is listed
    in ``unanswered``.
    """
    stores = []
    if master.store is not None:
        stores.append(store_sample(master.store, master.request_stats))
    # Node and job states as of this instant, when we decide whom to ask: a
    # node lost while we wait shows as a store that did not answer now, and
    # as lost in the next scrape.
    nodes = dict(Counter(n.state for n in master.node_records.values()))
    jobs = dict(Counter(j.state for j in master.jobs.values()))
    asked = [n for n in master.node_records.values() if n.up]
    replies = await asyncio.gather(*[
        n.channel.call({"t": "stats", "uid": -1, "metrics": True}, timeout=timeout)
        for n in asked])
    unanswered = []
    for node, r in zip(asked, replies):
        sample = r.get("metrics")
        if r.get("status") == 0 and isinstance(sample, dict):
            stores.append(sample)
        else:
            unanswered.append(node.name)
    return {
        "stores": stores,
        "unanswered": unanswered,
        "nodes": nodes,
        "jobs": jobs,
        "jobs_started": master.events.started,
        "sessions": len(master.sessions),
        "queue": master.queue.stats(),
        "events": master.events.stats(),
    }


# ----------------------------------------------------------------------
# the exported families (prometheus_client from here on)
# ----------------------------------------------------------------------

#: name, type, help, labels -- the one list both describe() and collect() use.
FAMILIES: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("pydvm_store_up", "gauge",
     "1 if the store's figures were gathered for this scrape, 0 if its daemon did not "
     "answer within the scrape timeout.", ("store",)),
    ("pydvm_store_items", "gauge", "Items held in the store.", ("store",)),
    ("pydvm_store_bytes", "gauge",
     "Bytes charged to a uid in the store: the size accounting the per-uid cap "
     "applies to.", ("store", "uid")),
    ("pydvm_store_cap_bytes", "gauge",
     "Bytes each uid may hold in the store (prte_data_server_max_size); 0 means no cap.",
     ("store",)),
    ("pydvm_store_parked_lookups", "gauge",
     "Lookups waiting in the store for keys to be published.", ("store",)),
    ("pydvm_store_removed_keys", "counter",
     "Keys removed from the store, by the rule that removed them.", ("store", "reason")),
    ("pydvm_store_removed_items", "counter",
     "Items that left the store, by the rule that removed their last key.",
     ("store", "reason")),
    ("pydvm_store_sweep_passes", "counter",
     "Idle-timeout sweep passes the store ran.", ("store",)),
    ("pydvm_store_sweep_budget_exhausted", "counter",
     "Sweep passes that stopped at their budget with stale items left; another pass "
     "followed at once.", ("store",)),
    ("pydvm_store_requests", "counter",
     "Data requests the store served, by operation and reply status (parked: a lookup "
     "that had to wait; its answer is not counted again).", ("store", "op", "status")),
    ("pydvm_store_request_duration_seconds", "histogram",
     "Time the master or daemon spent applying a data request to its store; a waiting "
     "lookup until it was parked.", ("store", "op")),
    ("pydvm_nodes", "gauge",
     "Nodes of the DVM by state (launching, joining, up, lost, stopped).", ("state",)),
    ("pydvm_jobs", "gauge",
     "Jobs of the DVM that have not ended yet, by state (starting, running, killing, "
     "ending).", ("state",)),
    ("pydvm_jobs_started", "counter",
     "Jobs the DVM has started (launched; a job that left the queue without starting is "
     "not counted).", ()),
    ("pydvm_sessions", "gauge", "Open sessions of the DVM, the default session included.", ()),
    ("pydvm_jobs_ended", "counter",
     "Jobs the DVM started that have ended, by result: ok (every process exited 0), failed "
     "(a non-zero status), killed (pydvm kill, a signal that ends it, its time limit, a "
     "lost node, abort on failure).", ("result",)),
    ("pydvm_queue_jobs", "gauge", "Jobs waiting in the queue for free slots now.", ()),
    ("pydvm_queue_jobs_queued", "counter",
     "Jobs that had to wait in the queue (submitted with queue and not started at once).",
     ()),
    ("pydvm_queue_jobs_left", "counter",
     "Queued jobs that left the queue without starting (killed, their tool or session "
     "gone, the DVM stopping, a lost node leaving nothing to run on).", ()),
    ("pydvm_queue_wait_seconds", "histogram",
     "Time from submission to start of each job started from the queue (0 for one that "
     "fitted at once).", ()),
    ("pydvm_job_event_subscriptions", "gauge",
     "Job-event subscriptions held now ('pydvm events', the job API's events).", ()),
    ("pydvm_job_events", "counter",
     "Job events sent, one per subscription told, by kind (dropped: a subscription ended "
     "for not reading).", ("kind",)),
    ("pydvm_job_event_subscriptions_dropped", "counter",
     "Job-event subscriptions dropped because their connection left more than "
     "pydvm_event_backlog bytes unread.", ()),
)


def _family(name: str, kind: str, help_: str, labels: tuple[str, ...]):
    from prometheus_client.core import (
        CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily)

    cls = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily,
           "histogram": HistogramMetricFamily}[kind]
    return cls(name, help_, labels=list(labels))


def families(snap: dict[str, Any]) -> list:
    """Metric families of one :func:`snapshot` (plain values in, families out)."""
    from prometheus_client.utils import floatToGoString

    fam = {name: _family(name, kind, help_, labels) for name, kind, help_, labels in FAMILIES}
    for s in snap["stores"]:
        name = str(s.get("store"))
        fam["pydvm_store_up"].add_metric([name], 1)
        fam["pydvm_store_items"].add_metric([name], s.get("items", 0))
        for uid, n in sorted(s.get("bytes_by_uid", {}).items()):
            fam["pydvm_store_bytes"].add_metric([name, str(uid)], n)
        fam["pydvm_store_cap_bytes"].add_metric([name], s.get("cap", 0))
        fam["pydvm_store_parked_lookups"].add_metric([name], s.get("parked", 0))
        for which in ("removed_keys", "removed_items"):
            counts = s.get(which, {})
            for reason in Reason.ALL:
                fam[f"pydvm_store_{which}"].add_metric([name, reason], counts.get(reason, 0))
        fam["pydvm_store_sweep_passes"].add_metric([name], s.get("sweep_passes", 0))
        fam["pydvm_store_sweep_budget_exhausted"].add_metric(
            [name], s.get("sweep_budget_exhausted", 0))
        for op, status, n in s.get("requests", []):
            fam["pydvm_store_requests"].add_metric([name, str(op), str(status)], n)
        bounds = [floatToGoString(b) for b in s.get("bounds", LATENCY_BUCKETS)] + ["+Inf"]
        for op, counts in s.get("latency", {}).items():
            cumulative, total = [], 0
            for le, n in zip(bounds, counts):
                total += n
                cumulative.append((le, total))
            fam["pydvm_store_request_duration_seconds"].add_metric(
                [name, str(op)], cumulative, s.get("latency_sum", {}).get(op, 0.0))
    for node in snap["unanswered"]:
        fam["pydvm_store_up"].add_metric([node], 0)
    for state in NODE_STATES:
        fam["pydvm_nodes"].add_metric([state], snap["nodes"].get(state, 0))
    for state in JOB_STATES:
        fam["pydvm_jobs"].add_metric([state], snap["jobs"].get(state, 0))
    fam["pydvm_jobs_started"].add_metric([], snap["jobs_started"])
    fam["pydvm_sessions"].add_metric([], snap["sessions"])
    _queue_and_events(fam, snap.get("queue") or {}, snap.get("events") or {})
    return list(fam.values())


def _queue_and_events(fam: dict, queue: dict[str, Any], events: dict[str, Any]) -> None:
    """The queue's and the job events' families (:meth:`JobQueue.stats`,
    :meth:`JobEvents.stats`)."""
    from prometheus_client.utils import floatToGoString

    from .jobevents import KINDS, RESULTS
    from .jobqueue import WAIT_BUCKETS

    ended = events.get("ended", {})
    for result in RESULTS:
        fam["pydvm_jobs_ended"].add_metric([result], ended.get(result, 0))
    fam["pydvm_queue_jobs"].add_metric([], queue.get("waiting", 0))
    fam["pydvm_queue_jobs_queued"].add_metric([], queue.get("queued", 0))
    fam["pydvm_queue_jobs_left"].add_metric([], queue.get("left", 0))
    counts = queue.get("wait") or [0] * (len(WAIT_BUCKETS) + 1)
    cumulative, total = [], 0
    for le, n in zip([floatToGoString(b) for b in WAIT_BUCKETS] + ["+Inf"], counts):
        total += n
        cumulative.append((le, total))
    fam["pydvm_queue_wait_seconds"].add_metric([], cumulative, queue.get("wait_sum", 0.0))
    fam["pydvm_job_event_subscriptions"].add_metric([], events.get("subscriptions", 0))
    sent = events.get("sent", {})
    for kind in KINDS:
        fam["pydvm_job_events"].add_metric([kind], sent.get(kind, 0))
    fam["pydvm_job_event_subscriptions_dropped"].add_metric([], events.get("dropped", 0))


class DvmCollector:
    """A prometheus_client collector reading one master at scrape time.

    ``collect()`` runs in the HTTP server's thread; it asks the master's
    loop for a :func:`snapshot` and waits at most ``timeout`` + 1 s.  If
    the loop does not answer (the DVM is going away), the scrape carries
    no DVM figures and a warning is logged.
    """

    def __init__(self, master: "Master", loop: asyncio.AbstractEventLoop,
                 timeout: float = SCRAPE_TIMEOUT) -> None:
        self._master = master
        self._loop = loop
        self._timeout = timeout

    def describe(self) -> Iterator:
        """The families without samples (names and types, for the registry)."""
        for name, kind, help_, labels in FAMILIES:
            yield _family(name, kind, help_, labels)

    def collect(self) -> Iterator:
        fut = None
        try:
            fut = asyncio.run_coroutine_threadsafe(snapshot(self._master, self._timeout),
                                                   self._loop)
            snap = fut.result(self._timeout + 1.0)
        except Exception as exc:  # the loop is closed, stopping or stuck
            if fut is not None:
                fut.cancel()
            log.warning("metrics scrape got no figures from the DVM: %r", exc)
            return
        yield from families(snap)


class MetricsServer:
    """prometheus_client's HTTP server for one master, on its own thread.

    Start it on the master's loop (:meth:`start`); it serves until
    :meth:`stop`.  ``url`` is where it serves.
    """

    def __init__(self, httpd, thread: threading.Thread) -> None:
        self._httpd = httpd
        self._thread = thread
        host, port = httpd.server_address[:2]
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{port}/metrics"

    @classmethod
    def start(cls, master: "Master", host: str, port: int) -> "MetricsServer":
        """Listen on ``host:port`` and serve ``master``'s metrics.

        Raises :class:`MetricsUnavailable` without prometheus_client and
        OSError if the address cannot be bound.  Call on the master's loop.
        """
        require_prometheus()
        from prometheus_client import CollectorRegistry, start_http_server
        from prometheus_client.process_collector import ProcessCollector

        registry = CollectorRegistry()
        registry.register(DvmCollector(master, asyncio.get_running_loop()))
        ProcessCollector(registry=registry)  # the master's own CPU, memory, fds
        httpd, thread = start_http_server(port, addr=host, registry=registry)
        return cls(httpd, thread)

    async def stop(self) -> None:
        """Stop serving and release the port; returns once both are done."""
        # shutdown() waits for serve_forever's next poll (up to 0.5 s): not on the loop.
        await asyncio.get_running_loop().run_in_executor(None, self._httpd.shutdown)
        self._httpd.server_close()
        self._thread.join(timeout=5)
