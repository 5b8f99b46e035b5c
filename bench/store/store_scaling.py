"""How the pure data store's per-operation cost scales with its size.

What it measures
----------------
For stores of 1k, 10k and 100k items (``--sizes``), held by 1 uid and by
100 uids, the median cost of one

* ``publish``        -- a new key by a random process (SUCCESS asserted);
* ``lookup``         -- a random existing key, read by a process of its uid
                        (SUCCESS and the stored value asserted);
* ``unpublish``      -- a random existing key, by its owner;
* ``purge (PROC)``   -- ``purge(Persistence.PROC, nspace=, rank=)`` of a
                        random process (its PROC items removed, asserted);
* ``publish at cap`` -- a new key by a random process whose uid is exactly
                        at ``max_size``, so it evicts one of that uid's least
                        recently used items (one eviction each, asserted);
* ``sweep / item``   -- ``sweep()`` when exactly ``k`` INDEF items are idle
                        past the timeout and all others are fresh, divided
                        by ``k`` (``k`` removed, asserted).

Each item is one key ``key-<i>`` with a short str value, range SESSION,
published by processes spread over namespaces of 100 ranks, 10 items per
process, processes dealt round-robin to the uids.  Of each process's items 2
are PROC and 8 NSPACE (the sweep store holds INDEF items; timeout 300 s).
Keys and values are zero-padded so every item accounts the same ``nbytes``,
which lets ``max_size`` be set so each uid is exactly full at the target size.

Method: the stores of every size are built first; then, round after round,
each store is visited in turn and every operation timed in a batch with
:func:`time.perf_counter_ns` (garbage collection off).  A visit runs one
unrecorded warm-up round before the recorded one, and the per-operation cost
is the median over the recorded rounds.  Visiting the sizes in turn makes a
slow spell of the (shared) machine hit every size alike.  Operations that
remove items are balanced outside the timed region (a publish's key is
unpublished again, unpublished and purged items are published again, the
sweep's victims replaced), so each store stays at its size.  Keys and
processes are picked at random, the same way at every size.  Time is a
:class:`~pydvm.store.clock.FakeScheduler`, which also serves as the timer.

Then the Python memory per item (tracemalloc) of a store of 1 KiB values is
shown next to the accounted ``nbytes`` (:func:`pydvm.store.item_nbytes`).

The last line is ``scaling ratio R``: the worst, over all operations and uid
counts, of the per-operation cost at the largest size divided by that at the
smallest.  The target is R <= 1.5.

Run
---
From the project root, with the package installed::

    python bench/store/store_scaling.py              # the default run (~20 s)
    python bench/store/store_scaling.py --quick      # 1k and 10k, few rounds: a smoke test
    python bench/store/store_scaling.py --sizes 1000 10000 --rounds 31
"""

from __future__ import annotations

import argparse
import gc
import logging
import random
import statistics
import sys
import time
import tracemalloc
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Generator, Iterator

from pydvm.enums import Persistence, Range
from pydvm.errors import Status
from pydvm.store import (
    DEFAULT_MAX_SIZE,
    Caller,
    DataStore,
    FakeScheduler,
    StoreParams,
    item_nbytes,
)
from pydvm.store.lifetimes import SWEEP_BUDGET

# -- the item population ---------------------------------------------------

RANKS_PER_NSPACE = 100
ITEMS_PER_PROC = 10
PROC_ITEMS_PER_PROC = 2  # the first 2 of a process's items are PROC, the rest NSPACE
BASE_UID = 1000
SESSION_ID = 1
NODES = 64
TIMEOUT = 300.0  # prte_data_server_timeout of every store (SPEC 6 default)

UID_COUNTS = (1, 100)
DEFAULT_SIZES = (1_000, 10_000, 100_000)
QUICK_SIZES = (1_000, 10_000)
MEMORY_ITEMS = 10_000
MEMORY_VALUE_BYTES = 1024


def key_of(i: int) -> str:
    return f"key-{i:08d}"


def value_of(i: int) -> str:
    return f"val-{i:08d}"


def big_value_of(i: int) -> str:
    v = value_of(i)
    return v + "x" * (MEMORY_VALUE_BYTES - len(v))


#: Every benchmark item accounts the same size (fixed-width key and value).
ITEM_NBYTES = item_nbytes({key_of(0): value_of(0)}, (), ())


class Layout:
    """Who publishes which item, for ``n_items`` items over ``n_uids`` uids.

    Item ``i`` belongs to process ``i // ITEMS_PER_PROC``; process ``p`` is
    rank ``p % 100`` of namespace ``job-<p // 100>`` and has uid
    ``BASE_UID + p % n_uids``.  Keys past ``n_items`` (published during the
    measurement) wrap around onto the same processes.
    """

    def __init__(self, n_items: int, n_uids: int) -> None:
        if n_items % (ITEMS_PER_PROC * n_uids):
            raise ValueError(
                f"a size must be a multiple of {ITEMS_PER_PROC * n_uids} "
                f"({ITEMS_PER_PROC} items per process, {n_uids} uids), not {n_items}"
            )
        self.n_items = n_items
        self.n_uids = n_uids
        self.n_procs = n_items // ITEMS_PER_PROC
        self.items_per_uid = n_items // n_uids
        self.callers = [
            Caller(
                nspace=f"job-{p // RANKS_PER_NSPACE}",
                rank=p % RANKS_PER_NSPACE,
                uid=BASE_UID + p % n_uids,
                gid=BASE_UID + p % n_uids,
                node=f"node-{p % NODES}",
                app_idx=0,
                session_id=SESSION_ID,
            )
            for p in range(self.n_procs)
        ]

    def owner(self, i: int) -> Caller:
        return self.callers[(i // ITEMS_PER_PROC) % self.n_procs]

    @staticmethod
    def persistence(i: int) -> Persistence:
        if i % ITEMS_PER_PROC < PROC_ITEMS_PER_PROC:
            return Persistence.PROC
        return Persistence.NSPACE

    @staticmethod
    def proc_items_of(p: int) -> range:
        """The PROC items of process ``p``."""
        first = p * ITEMS_PER_PROC
        return range(first, first + PROC_ITEMS_PER_PROC)


# -- timing helpers ----------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    rounds: int
    batch: int  # operations per timed batch (publish, lookup, unpublish, at cap)
    purge_batch: int  # processes purged per timed batch
    k: int  # items the sweep expires per timed call
    seed: int


@contextmanager
def gc_paused() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def new_store(sched: FakeScheduler, max_size: int) -> DataStore:
    return DataStore(
        name="bench",
        clock=sched,
        timer=sched,
        on_answer=lambda ticket, reply: None,
        params=StoreParams(timeout=TIMEOUT, max_size=max_size),
    )


def roomy_cap(layout: Layout) -> int:
    """A cap the uids never reach, so plain publishes evict nothing."""
    return max(DEFAULT_MAX_SIZE, 2 * layout.items_per_uid * ITEM_NBYTES)


def publish_ok(store: DataStore, caller: Caller, i: int, persistence: Persistence) -> None:
    reply = store.publish(caller, {key_of(i): value_of(i)}, Range.SESSION, persistence)
    assert reply.status is Status.SUCCESS, reply


def build_store(layout: Layout, sched: FakeScheduler, max_size: int) -> DataStore:
    """A store holding items ``0 .. n_items-1`` of ``layout``."""
    store = new_store(sched, max_size)
    with gc_paused():
        for i in range(layout.n_items):
            publish_ok(store, layout.owner(i), i, layout.persistence(i))
    assert len(store) == layout.n_items and store.evictions == 0
    return store


class Rounds:
    """One per-operation cost (ns) per recorded round, per operation name.

    While ``recording`` is False (warm-up rounds) :meth:`add` drops its sample.
    """

    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = {}
        self.recording = True

    def add(self, op: str, elapsed_ns: int, n_ops: int) -> None:
        if self.recording:
            self.samples.setdefault(op, []).append(elapsed_ns / n_ops)

    def medians(self) -> dict[str, float]:
        return {op: statistics.median(s) for op, s in self.samples.items()}


#: A benchmark is a generator: it builds its store and stops at its first
#: ``yield``; each ``send(True)`` then runs one timed round (recording into
#: the :class:`Rounds` it was given), and ``send(False)`` ends it after a
#: final consistency check of the store.
Bench = Generator[None, bool, None]
BenchFn = Callable[[Layout, Settings, random.Random, Rounds], Bench]


# -- the benchmarks ----------------------------------------------------------


def bench_basic(layout: Layout, cfg: Settings, rng: random.Random, rounds: Rounds) -> Bench:
    """publish, lookup, unpublish and PROC purge on a store of NSPACE/PROC items."""
    sched = FakeScheduler()
    store = build_store(layout, sched, roomy_cap(layout))
    n = layout.n_items
    fresh = n  # next never-published key index
    while (yield):
        # publish: new keys by random processes; unpublished again afterwards
        args = []
        for _ in range(cfg.batch):
            args.append((rng.choice(layout.callers), {key_of(fresh): value_of(fresh)}))
            fresh += 1
        replies = []
        with gc_paused():
            t0 = time.perf_counter_ns()
            for caller, pairs in args:
                replies.append(store.publish(caller, pairs, Range.SESSION, Persistence.NSPACE))
            t1 = time.perf_counter_ns()
        rounds.add("publish", t1 - t0, len(args))
        assert all(r.status is Status.SUCCESS for r in replies), replies
        assert len(store) == n + len(args)
        for caller, pairs in args:
            store.unpublish(caller, tuple(pairs))
        assert len(store) == n

        # lookup: random existing keys, by their owners
        picks = rng.sample(range(n), cfg.batch)
        args = [(layout.owner(i), (key_of(i),)) for i in picks]
        replies = []
        with gc_paused():
            t0 = time.perf_counter_ns()
            for caller, keys in args:
                replies.append(store.lookup(caller, keys, Range.SESSION))
            t1 = time.perf_counter_ns()
        rounds.add("lookup", t1 - t0, len(args))
        for i, r in zip(picks, replies):
            assert r.status is Status.SUCCESS and r.found[0].value == value_of(i), (i, r)

        # unpublish: random existing keys by their owners; published again afterwards
        picks = rng.sample(range(n), cfg.batch)
        args = [(layout.owner(i), (key_of(i),)) for i in picks]
        replies = []
        with gc_paused():
            t0 = time.perf_counter_ns()
            for caller, keys in args:
                replies.append(store.unpublish(caller, keys))
            t1 = time.perf_counter_ns()
        rounds.add("unpublish", t1 - t0, len(args))
        assert all(r.status is Status.SUCCESS for r in replies), replies
        assert len(store) == n - len(args)
        for i in picks:
            publish_ok(store, layout.owner(i), i, layout.persistence(i))
        assert len(store) == n

        # purge: a PROC horizon for random processes; their PROC items come back
        procs = rng.sample(range(layout.n_procs), cfg.purge_batch)
        args = [layout.callers[p] for p in procs]
        removed = []
        with gc_paused():
            t0 = time.perf_counter_ns()
            for c in args:
                removed.append(store.purge(Persistence.PROC, nspace=c.nspace, rank=c.rank))
            t1 = time.perf_counter_ns()
        rounds.add("purge (PROC)", t1 - t0, len(args))
        assert removed == [PROC_ITEMS_PER_PROC] * len(args), removed
        for p in procs:
            for i in layout.proc_items_of(p):
                publish_ok(store, layout.callers[p], i, Persistence.PROC)
        assert len(store) == n

    assert store.evictions == 0
    store.check_invariants()


def bench_cap(layout: Layout, cfg: Settings, rng: random.Random, rounds: Rounds) -> Bench:
    """publish into a store where every uid is exactly at ``max_size``."""
    cap = layout.items_per_uid * ITEM_NBYTES
    sched = FakeScheduler()
    store = build_store(layout, sched, cap)
    n = layout.n_items
    assert all(v == cap for v in store.stats().bytes_by_uid.values())
    fresh = n
    # First eviction of each uid logs its one warning; get that out of the way.
    first_proc_of_uid = layout.callers[: layout.n_uids]
    for caller in first_proc_of_uid:
        publish_ok(store, caller, fresh, Persistence.NSPACE)
        fresh += 1
    assert store.evictions == layout.n_uids and len(store) == n

    while (yield):
        args = []
        for _ in range(cfg.batch):
            args.append((rng.choice(layout.callers), {key_of(fresh): value_of(fresh)}))
            fresh += 1
        evictions = store.evictions
        replies = []
        with gc_paused():
            t0 = time.perf_counter_ns()
            for caller, pairs in args:
                replies.append(store.publish(caller, pairs, Range.SESSION, Persistence.NSPACE))
            t1 = time.perf_counter_ns()
        rounds.add("publish at cap", t1 - t0, len(args))
        assert all(r.status is Status.SUCCESS for r in replies), replies
        assert store.evictions - evictions == len(args), "each publish must evict one item"
        assert len(store) == n
    store.check_invariants()


def sweep_step(n_batches: int) -> float:
    """Publish-time spacing of the sweep store's batches: a power of two <= 1 s.

    The batches must span at most the timeout.  A power of two keeps every
    time exact in floating point (see :func:`bench_sweep`).
    """
    step = 1.0
    while (n_batches - 1) * step > TIMEOUT:
        step /= 2
    return step


def bench_sweep(layout: Layout, cfg: Settings, rng: random.Random, rounds: Rounds) -> Bench:
    """sweep() of exactly ``k`` stale INDEF items in a store of ``n`` INDEF items.

    The store holds ``n // k`` batches of ``k`` items, batch ``b`` published
    at grid time ``S + b*step``.  A round moves the clock to half a step past
    the oldest batch's expiry (so only it is stale), times ``sweep()``, then
    steps onto the next grid point and publishes a fresh batch there.

    The store's own periodic sweep (every 60 s, first armed at ``S``) fires on
    the grid as well, inside ``advance``.  It always finds nothing stale: a
    batch turns stale half a step after a grid point and is swept by us
    before the next one.  The expiry counter is checked to prove it.
    """
    n, k = layout.n_items, cfg.k
    n_batches = n // k
    step = sweep_step(n_batches)
    ticks_per_timeout = round(TIMEOUT / step)
    sched = FakeScheduler()
    store = new_store(sched, roomy_cap(layout))
    origin = sched.now()

    def advance_to(t: float) -> None:
        sched.advance(t - sched.now())
        assert sched.now() == t

    fresh = 0

    def publish_batch() -> None:
        nonlocal fresh
        for _ in range(k):
            publish_ok(store, layout.owner(fresh), fresh, Persistence.INDEF)
            fresh += 1

    batches: deque[int] = deque()  # grid ticks of the batches, oldest first
    with gc_paused():
        for b in range(n_batches):
            advance_to(origin + b * step)
            publish_batch()
            batches.append(b)
    assert len(store) == n and store.expiries == 0

    while (yield):
        oldest = batches.popleft()
        expiries = store.expiries
        advance_to(origin + oldest * step + TIMEOUT + step / 2)
        assert store.expiries == expiries and len(store) == n, "the timer swept"
        with gc_paused():
            t0 = time.perf_counter_ns()
            removed, finished = store.sweep()
            t1 = time.perf_counter_ns()
        rounds.add("sweep / item", t1 - t0, k)
        assert (removed, finished) == (k, True), (removed, finished)
        tick = oldest + ticks_per_timeout + 1
        assert tick > batches[-1]
        advance_to(origin + tick * step)
        publish_batch()
        batches.append(tick)
        assert len(store) == n
    store.check_invariants()


BENCHES: tuple[BenchFn, ...] = (bench_basic, bench_cap, bench_sweep)
OPERATIONS = ("publish", "lookup", "unpublish", "purge (PROC)", "publish at cap", "sweep / item")


def measure(sizes: list[int], cfg: Settings) -> dict[tuple[str, int], dict[int, float]]:
    """(operation, uids) -> size -> median ns per operation.

    The stores of all sizes are built first and visited in turn (in
    rotating order), so a slow spell of the machine hits every size alike
    instead of one size's whole run.  Each visit runs a warm-up round, not
    recorded, before the timed one: the store was cold after the others ran.
    """
    results: dict[tuple[str, int], dict[int, float]] = {}
    for n_uids in UID_COUNTS:
        for bench in BENCHES:
            rounds = {n: Rounds() for n in sizes}
            runs = {}
            for n in sizes:
                rng = random.Random(f"{cfg.seed}-{bench.__name__}-{n_uids}-{n}")
                runs[n] = bench(Layout(n, n_uids), cfg, rng, rounds[n])
                next(runs[n])  # build the store
            for r in range(cfg.rounds):
                for j in range(len(sizes)):
                    n = sizes[(r + j) % len(sizes)]
                    for recording in (False, True):
                        rounds[n].recording = recording
                        runs[n].send(True)
            for n in sizes:
                try:
                    runs[n].send(False)  # final checks
                except StopIteration:
                    pass
                for op, ns in rounds[n].medians().items():
                    results.setdefault((op, n_uids), {})[n] = ns
            del runs
            gc.collect()
    return results


def memory_per_item(n_items: int, n_uids: int) -> tuple[float, int]:
    """(traced Python bytes per item, accounted nbytes per item), 1 KiB str values."""
    layout = Layout(n_items, n_uids)
    sched = FakeScheduler()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        store = new_store(sched, 0)
        for i in range(n_items):
            reply = store.publish(
                layout.owner(i), {key_of(i): big_value_of(i)}, Range.SESSION,
                layout.persistence(i),
            )
            assert reply.status is Status.SUCCESS, reply
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(store) == n_items
    accounted = item_nbytes({key_of(0): big_value_of(0)}, (), ())
    assert sum(store.stats().bytes_by_uid.values()) == accounted * n_items
    return (after - before) / n_items, accounted


# -- output -------------------------------------------------------------------


def fmt_size(n: int) -> str:
    if n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n % 1000 == 0:
        return f"{n // 1000}k"
    return str(n)


def report(results: dict[tuple[str, int], dict[int, float]], sizes: list[int]) -> float:
    """Print the cost table; return the worst largest/smallest ratio."""
    lo, hi = sizes[0], sizes[-1]
    ratio_head = f"{fmt_size(hi)}/{fmt_size(lo)}"
    print("per-operation cost in µs (median of rounds; sweep: per expired item)")
    print(f"{'operation':<16}{'uids':>5}" + "".join(f"{fmt_size(n):>10}" for n in sizes)
          + f"{ratio_head:>11}")
    worst = 0.0
    for n_uids in UID_COUNTS:
        for op in OPERATIONS:
            row = results[(op, n_uids)]
            ratio = row[hi] / row[lo]
            worst = max(worst, ratio)
            print(f"{op:<16}{n_uids:>5}" + "".join(f"{row[n] / 1000:>10.2f}" for n in sizes)
                  + f"{ratio:>11.2f}")
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Per-operation cost of the pydvm data store at growing sizes.")
    parser.add_argument("--sizes", type=int, nargs="+", default=None, metavar="N",
                        help="store sizes in items, multiples of 1000 "
                             "(default: 1000 10000 100000; 1000 10000 with --quick)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="recorded rounds per operation (default 31, 5 with --quick)")
    parser.add_argument("--batch", type=int, default=100,
                        help="operations per timed batch (default 100)")
    parser.add_argument("--purge-batch", type=int, default=25,
                        help="processes purged per timed batch (default 25)")
    parser.add_argument("-k", "--sweep-k", type=int, default=100,
                        help="stale items per timed sweep (default 100)")
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    parser.add_argument("--quick", action="store_true",
                        help="1k and 10k, 5 rounds: a smoke test, not a measurement")
    args = parser.parse_args(argv)

    if args.sizes is None:
        args.sizes = list(QUICK_SIZES if args.quick else DEFAULT_SIZES)
    sizes = sorted(set(args.sizes))
    rounds = args.rounds if args.rounds is not None else (5 if args.quick else 31)
    cfg = Settings(rounds=rounds, batch=args.batch, purge_batch=args.purge_batch,
                   k=args.sweep_k, seed=args.seed)
    if len(sizes) < 2:
        parser.error("give at least two sizes")
    if not 0 < cfg.k <= SWEEP_BUDGET:
        parser.error(f"--sweep-k must be in 1..{SWEEP_BUDGET} (one sweep pass)")
    if rounds < 1 or cfg.batch < 1 or cfg.purge_batch < 1:
        parser.error("--rounds, --batch and --purge-batch must be positive")
    for n in sizes:
        for n_uids in UID_COUNTS:
            try:
                Layout(n, n_uids)
            except ValueError as e:
                parser.error(str(e))
        if n % cfg.k or n // cfg.k < 2:
            parser.error(f"a size must be a multiple of --sweep-k and at least 2k, not {n}")
        if n // ITEMS_PER_PROC < cfg.purge_batch or n < cfg.batch:
            parser.error(f"size {n} is too small for the batch sizes")

    # The first eviction of a uid logs a warning (SPEC 5); keep it off the table.
    logging.getLogger("pydvm.store").setLevel(logging.ERROR)

    start = time.perf_counter()
    results = measure(sizes, cfg)
    worst = report(results, sizes)

    print()
    print(f"memory per item ({fmt_size(MEMORY_ITEMS)} items, {MEMORY_VALUE_BYTES} B str values,"
          f" tracemalloc)")
    print(f"{'uids':>5}{'python B/item':>15}{'accounted B/item':>18}{'python/accounted':>18}")
    for n_uids in UID_COUNTS:
        traced, accounted = memory_per_item(MEMORY_ITEMS, n_uids)
        print(f"{n_uids:>5}{traced:>15.0f}{accounted:>18}{traced / accounted:>18.2f}")
    print()
    print(f"(ran in {time.perf_counter() - start:.0f} s)")
    print(f"scaling ratio {worst:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
