"""Many PMIx clients and threads at once: the stores under libpmix's thread and the loop.

A PMIx publish, lookup or unpublish that a store of the node's process can
answer at once is answered on libpmix's progress thread, under the
process's store guard (runtime/shared/storeguard.py); everything else -- a lookup
that waits, a daemon's requests to the master, purges, timers, tool
requests -- runs on the event loop under the same guard.  This drives both
at once on a real DVM (the head node, whose PMIx server is the master's,
and a daemon node): threads of C PMIx clients (tests/pmix_e2e/clients/
pmix_stress.c) publishing and waiting across nodes, parked lookups woken by
publishes answered on libpmix's thread, FIRST_READ keys raced for by two
waiters, jobs ending while others still work, and ``pydvm store`` read
throughout.  The DVM runs with PYDVM_CHECK_STORES=1: every guarded section
ends with each store's ``check_invariants()``, and each node logs how many
it checked and how many found a store broken.
"""

from __future__ import annotations

import re
import time
from collections import Counter

import pytest

from dvmkit import wait_for
from pmixkit import FAR, HEAD

#: pmix_stress pairs: jobs of 4 ranks (2 per node) x THREADS threads, each
#: job with its own number of iterations so that they end one after another
#: while the others still publish and look up.
THREADS = 3
PAIR_ITERS = (4, 8, 12, 16)
#: the waiting job: ranks x threads x keys, published later by another job.
W_THREADS, W_KEYS = 4, 5
#: keys each awaited by two waiters (one per node) and published twice, each
#: publication FIRST_READ: each waiter must get one, and none may be left.
RACE_KEYS, RACE_TIMEOUT = 6, 60


def stores(d) -> dict:
    """Every store's counts (``pydvm store --json``), listing none of the keys."""
    import json
    p = d.cmd("store", "--json", "--prefix", "#none", check=True)
    return {s["store"]: s for s in json.loads(p.stdout)["stores"]}


def parked(d) -> int:
    return stores(d)["master"]["parked"]


def lines(out: str, word: str) -> list[str]:
    return [ln.split()[1] for ln in out.splitlines() if ln.startswith(word + " ")]


@pytest.mark.timeout(420)
def test_threads_of_pmix_clients_on_two_nodes_with_jobs_ending_meanwhile(
        make_pdvm, pmixcc, monkeypatch):
    """No answer lost or given twice, waiting lookups woken by publishes
    answered on libpmix's thread, every store consistent after every step,
    nothing left once every job has ended."""
    monkeypatch.setenv("PYDVM_CHECK_STORES", "1")
    # direct data off: the daemon node answers its LOCAL requests in the
    # upcall too (with it on, its node store keeps the master told which
    # uids it holds, from the loop)
    d = make_pdvm(pydvm_direct_data="off")
    exe = pmixcc("pmix_stress")
    both = f"{HEAD},{FAR}"

    # Waiters first: their lookups park in the master store (one per thread).
    waiters = d.run_bg("--pmix", "--host", both, "-n", "2", exe, "wait", str(W_THREADS),
                       str(W_KEYS), "w")
    wait_for(lambda: parked(d) == 2 * W_THREADS, timeout=60, what="the waiters to park")
    racers = d.run_bg("--pmix", "--host", both, "-n", "2", exe, "race", str(RACE_KEYS),
                      str(RACE_TIMEOUT), "r")
    wait_for(lambda: parked(d) == 2 * W_THREADS + 2 * RACE_KEYS, timeout=60,
             what="the racers to park")

    # Now everything at once: the publishers, on the head node (answered on
    # libpmix's thread, waking the parked lookups of both nodes), and jobs
    # of publishing / waiting threads on both nodes ending one by one.
    feeder = d.run_bg("--pmix", "--host", HEAD, "-n", "1", exe, "feed", str(W_THREADS),
                      str(W_KEYS), "w", "2")
    racefeed = d.run_bg("--pmix", "--host", HEAD, "-n", "1", exe, "racefeed", str(RACE_KEYS),
                        "0", "r")
    pairs = [d.run_bg("--pmix", "--host", f"{HEAD}:2,{FAR}:2", "-n", "4", exe, "pairs",
                      str(THREADS), str(n), f"p{k}") for k, n in enumerate(PAIR_ITERS)]
    jobs = [waiters, racers, feeder, racefeed, *pairs]
    names = ["waiters", "racers", "feeder", "racefeed", *[f"pairs{k}" for k in range(len(pairs))]]
    # (each lookup gives up after 60 s: a lost answer shows as a BAD line
    # well before this deadline, which only bounds a machine far too slow)
    deadline = time.monotonic() + 300
    reads = 0
    while any(p.poll() is None for p in jobs) and time.monotonic() < deadline:
        stores(d)  # the stores read (under the guard) while all this goes on
        reads += 1
    late = [n for n, p in zip(names, jobs) if p.poll() is None]
    if late:
        left = stores(d)
    outs, errs = {}, {}
    for name, p in zip(names, jobs):
        if p.poll() is None:
            p.kill()
        outs[name], errs[name] = p.communicate()
    assert not late, (f"still running after 300 s: {late}; stores: {left}; their output: "
                      f"{ {n: outs[n][-1500:] + errs[n][-1500:] for n in late} }")
    for name, p in zip(names, jobs):
        assert p.returncode == 0, (name, outs[name][-3000:], errs[name][-3000:])
        assert not re.search(r"^(BAD|PUB|UNPUB|FENCE) ", outs[name], re.M), \
            (name, outs[name][-3000:])
    assert reads > 0

    # every waited-for key answered once, with its value
    got = Counter(lines(outs["waiters"], "GOT"))
    assert len(got) == 2 * W_THREADS * W_KEYS and set(got.values()) == {1}, got
    # each raced key reached both its waiters, one publication each (a
    # publication given to both would leave the other one in the store,
    # and a lost answer would time out)
    got = Counter(lines(outs["racers"], "GOT"))
    assert got == {f"r.r.{t}": 2 for t in range(RACE_KEYS)}, outs["racers"]
    assert "TIMEOUT" not in outs["racers"]
    for k, n in enumerate(PAIR_ITERS):
        done = re.findall(r"^DONE rank=(\d+) got=(\d+) bad=(\d+)$", outs[f"pairs{k}"], re.M)
        assert sorted(int(r) for r, _, _ in done) == [0, 1, 2, 3], outs[f"pairs{k}"][-2000:]
        assert all(int(g) == 2 * THREADS * n and b == "0" for _, g, b in done), done

    # Every job has ended: FIRST_READ keys consumed, the rest purged with
    # their process or job; nothing waits any more.
    left = stores(d)
    assert all(s["items"] == 0 and s["parked"] == 0 for s in left.values()), left
    d.stop()
    for name in ("master", f"daemon-{FAR}"):
        text = d.log(name) if d.log(name) else ""
        if not text:
            continue
        assert "store invariants broken" not in text, text[-4000:]
        assert "called again" not in text and "dropped without an answer" not in text
    logs = "".join(d.log(p.stem) for p in d.log_dir.glob("*.log"))
    summaries = re.findall(r"node (\S+): store checks: (\d+) sections checked, (\d+) broken; "
                           r"pmix: (\d+) requests, (\d+) answered at once", logs)
    by_node = {n: tuple(int(x) for x in rest) for n, *rest in summaries}
    assert set(by_node) == {HEAD, FAR}, logs[-4000:]
    for node, (checked, broken, requests, now) in by_node.items():
        assert checked > 0 and broken == 0, (node, by_node)
    # Answered on libpmix's thread: on the head node its LOCAL requests (the
    # node store) and those of its SESSION requests that need not wait (the
    # master store, in the same process); on the daemon node its LOCAL ones
    # (its node store).  At least half of the LOCAL ones on each (a request
    # finding the guard held by the loop goes to the loop).
    local = 2 * THREADS * sum(PAIR_ITERS)   # per node: 2 ranks, a publish and a lookup each
    assert by_node[HEAD][3] >= local // 2, by_node
    assert by_node[FAR][3] >= local // 2, by_node
