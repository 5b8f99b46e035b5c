"""PydvmStore beside a real TCPStore, case by case (tests/e2e/test_torch.py).

Each case is a function of a store that returns what it observed (values,
booleans, and every exception as ``["raised", class name, message]``); the
job runs it on a fresh ``PydvmStore`` of the job and on a fresh
``TCPStore`` (its server in this process, on a free port of 127.0.0.1 --
torch's default libuv backend) and prints::

    CASE <name> <json of {"pydvm": ..., "tcp": ...}>

The test compares the two.  pydvm's messages carry pydvm's detail after
torch's words, in parentheses beginning ``(pydvm store``: it is cut off
here, so that the words torch's stores use are compared exactly.

argv[1]: ``one`` (the cases of one process) or ``ranks`` (a queue shared
by the job's ranks: rank 0 serves the TCPStore and tells the others its
port through the PydvmStore).
"""

import datetime
import json
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import torch.distributed as dist

import pydvm
import pydvm.torch  # noqa: F401
from pydvm.torch import PydvmStore

RANK = int(os.environ.get("PYDVM_RANK", "0"))
SIZE = int(os.environ.get("PYDVM_JOB_SIZE", "1"))
ms = lambda n: datetime.timedelta(milliseconds=n)  # noqa: E731

_made = 0


def pydvm_store(prefix=None):
    global _made
    _made += 1
    s = PydvmStore(f"case{_made}", timeout=60)
    return s if prefix is None else dist.PrefixStore(prefix, s)


def tcp_store(prefix=None):
    s = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=60),
                      wait_for_workers=False)
    return s if prefix is None else dist.PrefixStore(prefix, s)


def outcome(fn, *args):
    """What ``fn(*args)`` gave: its value (bytes as text), or how it raised."""
    try:
        value = fn(*args)
    except Exception as exc:  # noqa: BLE001 - the outcome is the point
        text = str(exc).split(" (pydvm store", 1)[0]
        return ["raised", type(exc).__name__, text]
    return plain(value)


def plain(value):
    if isinstance(value, bytes):
        return "b:" + value.decode("utf-8", "replace")
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def case(fn):
    """Run ``fn`` on each store, report both outcomes."""
    got = {}
    for kind, make in (("pydvm", pydvm_store), ("tcp", tcp_store)):
        got[kind] = outcome(fn, make)
    print("CASE", fn.__name__, json.dumps(got), flush=True)
    return fn


# -- the generic store behaviours (each on a fresh store) ---------------------------

def counters_values_and_key_count(make):
    s = make()
    base = s.num_keys()  # TCPStore may hold keys of its own
    seen = [s.add("n", 1), s.add("n", 2), s.add("n", 3)]
    s.set("v0", "value0")
    seen += [s.add("m", k) for k in range(1, 7)]
    s.set("v1", b"value1")
    seen.append(s.num_keys() - base)
    seen += [s.get("n"), s.get("m"), s.get("v0"), s.get("v1")]
    seen += [s.check(["m"]), s.check(["not-there"]), s.check(["m", "not-there"])]
    s.set("-neg", "7")
    seen += [s.get("-neg"), s.delete_key("-neg"), s.delete_key("-neg"), s.num_keys() - base]
    return seen


def compare_set_rules(make):
    s = make()
    seen = [s.compare_set("k", "not what it holds", "new")]   # absent key
    s.set("k", "old")
    seen += [s.compare_set("k", "wrong", "new"), s.get("k")]
    seen += [s.compare_set("k", "old", "new"), s.get("k")]
    seen += [s.compare_set("fresh", "", "made"), s.get("fresh")]
    return seen


def wait_times_out_then_works(make):
    s = make()
    t0 = time.monotonic()
    seen = [outcome(s.wait, ["missing"], ms(250))]
    seen.append(time.monotonic() - t0 >= 0.24)
    s.add("present", 1)
    s.wait(["present"])
    seen.append(s.get("present"))
    return seen


def get_timeout_wording_and_the_store_still_works(make):
    s = make()
    s.set_timeout(ms(100))
    seen = [outcome(s.get, "nonexistent key"), outcome(s.wait, ["a", "b"]),
            outcome(s.multi_get, ["a", "b"])]
    s.set("the_key", "x")
    seen.append(s.get("the_key"))
    return seen


def append_makes_and_extends(make):
    s = make()
    s.set("x", "po")
    s.append("x", "tato")
    s.append("y", b"po")
    s.append("y", "tato")
    return [s.get("x"), s.get("y")]


def multi_set_and_multi_get(make):
    s = make()
    s.multi_set(["f", "b"], ["po", b"tato"])
    return [s.get("f"), s.get("b"), s.multi_get(["b", "f"])]


def a_clone_sees_the_same_keys(make):
    a = make()
    b = a.clone()
    a.set("foo", "bar")
    return [isinstance(b, dist.Store), b.get("foo")]


def list_keys_lists_the_keys_not_the_queues(make):
    s = make()
    base = set(s.list_keys())
    s.set("a", "1")
    s.add("c", 2)
    s.set("", "empty key")
    s.queue_push("q", "item")
    return [sorted(set(s.list_keys()) - base), s.num_keys() - len(base)]


def a_wait_in_one_thread_is_released_by_a_set_in_another(make):
    s = make()
    s.set_timeout(datetime.timedelta(seconds=30))
    got = []
    waiter = threading.Thread(target=lambda: got.append((s.wait(["key1"]), s.get("key1"))))
    waiter.start()
    s.clone().set("key1", "value1")
    waiter.join()
    return got


def a_signal_to_a_waiting_thread_does_not_break_its_wait(make):
    s = make()
    got = []
    waiter = threading.Thread(target=lambda: got.append(outcome(
        s.wait, ["foo"], datetime.timedelta(seconds=30))))
    old = signal.signal(signal.SIGUSR1, lambda *a: None)
    try:
        waiter.start()
        signal.pthread_kill(waiter.ident, signal.SIGUSR1)
        s.clone().set("foo", "bar")
        waiter.join()
    finally:
        signal.signal(signal.SIGUSR1, old)
    return got


# -- queues -------------------------------------------------------------------------

def queue_fifo_len_check_wait(make):
    s = make()
    seen = [s.check(["q"]), s.queue_len("q")]
    s.queue_push("q", "1")
    s.queue_push("q", b"2")
    seen += [s.check(["q"]), s.queue_len("q")]
    s.wait(["q"])
    seen += [s.queue_pop("q"), s.queue_pop("q", True)]
    seen += [s.check(["q"]), s.queue_len("q")]
    return seen


def queue_pop_without_blocking(make):
    s = make()
    seen = [outcome(s.queue_pop, "q", False)]
    s.queue_push("q", "a")
    seen += [s.queue_len("q"), s.queue_pop("q", block=False), s.queue_len("q"),
             outcome(s.queue_pop, "q", False)]
    return seen


def queue_pop_times_out_in_tcpstore_words(make):
    s = make()
    s.set_timeout(ms(10))
    t0 = time.monotonic()
    seen = [outcome(s.queue_pop, "non_existant"), time.monotonic() - t0 >= 0.009]
    # the queue is not broken by the pop that gave up
    s.queue_push("non_existant", "late")
    seen += [s.queue_len("non_existant"), s.queue_pop("non_existant")]
    return seen


def queues_both_ways_between_two_threads(make):
    store = make()

    def first():
        mine = store.clone()
        mine.queue_push("a", "a1")
        return mine.queue_pop("b")

    def second():
        mine = store.clone()
        got = mine.queue_pop("a")
        mine.queue_push("b", "b1")
        return got

    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(first), pool.submit(second)]
        return [f.result(timeout=60) for f in futures]


def a_key_and_a_queue_of_one_name_live_side_by_side(make):
    s = make()
    base = s.num_keys()
    s.set("k", "v")
    seen = [s.queue_len("k"), outcome(s.queue_pop, "k", False), s.get("k")]
    s.queue_push("k", "q")
    seen += [s.get("k"), s.queue_len("k"), s.num_keys() - base, s.queue_pop("k", False),
             s.get("k")]
    s.queue_push("d", "1")
    seen += [s.delete_key("d"), s.queue_len("d"), s.queue_pop("d"), s.check(["d"])]
    return seen


def empty_values_and_many_items_in_order(make):
    s = make()
    s.queue_push("e", "")
    s.queue_push("e", b"")
    seen = [s.queue_len("e"), s.check(["e"]), s.queue_pop("e"), s.queue_pop("e", False),
            s.check(["e"])]
    for i in range(20):
        s.queue_push("many", str(i))
    seen.append([s.queue_pop("many") for _ in range(20)])
    return seen


def pops_waiting_are_served_in_order_and_a_wait_sees_a_push(make):
    s = make()
    s.set_timeout(datetime.timedelta(seconds=30))
    other = s.clone()
    waited = []
    w = threading.Thread(target=lambda: waited.append(outcome(s.clone().wait, ["w"])))
    w.start()
    other.queue_push("w", "wake")  # a push satisfies a wait, as a set does
    w.join()
    results = {}

    def pop(tag):
        results[tag] = s.clone().queue_pop("p")

    t = threading.Thread(target=pop, args=("first",))
    t.start()
    other.queue_push("p", "one")
    t.join()
    return [waited, results, s.queue_len("w"), s.queue_pop("w")]


def one_process():
    for fn in (counters_values_and_key_count, compare_set_rules, wait_times_out_then_works,
               get_timeout_wording_and_the_store_still_works, append_makes_and_extends,
               multi_set_and_multi_get, a_clone_sees_the_same_keys,
               list_keys_lists_the_keys_not_the_queues,
               a_wait_in_one_thread_is_released_by_a_set_in_another,
               a_signal_to_a_waiting_thread_does_not_break_its_wait,
               queue_fifo_len_check_wait, queue_pop_without_blocking,
               queue_pop_times_out_in_tcpstore_words, queues_both_ways_between_two_threads,
               a_key_and_a_queue_of_one_name_live_side_by_side,
               empty_values_and_many_items_in_order,
               pops_waiting_are_served_in_order_and_a_wait_sees_a_push):
        case(fn)

    # The same generic behaviours through torch's C++ PrefixStore: its methods
    # are C++, calling the store under it as C++ calls any store.
    for fn in (counters_values_and_key_count, compare_set_rules, wait_times_out_then_works,
               get_timeout_wording_and_the_store_still_works, append_makes_and_extends,
               multi_set_and_multi_get, a_clone_sees_the_same_keys,
               a_wait_in_one_thread_is_released_by_a_set_in_another):
        got = {"pydvm": outcome(fn, lambda: pydvm_store("test_prefix")),
               "tcp": outcome(fn, lambda: tcp_store("test_prefix"))}
        print("CASE", "prefix:" + fn.__name__, json.dumps(got), flush=True)

    # What torch does not route: the queue calls and list_keys of a PrefixStore
    # reach a C++ store's methods, but never a Python store's.
    def routed(make):
        p = make("test_prefix")
        return [outcome(p.queue_push, "q", "1"), outcome(p.queue_len, "q"),
                outcome(p.queue_pop, "q", False), outcome(p.list_keys)]
    got = {"pydvm": outcome(routed, pydvm_store), "tcp": outcome(routed, tcp_store)}
    print("CASE", "prefix:queues_and_list_keys", json.dumps(got), flush=True)

    # the queues' keys are the job's: listed under torch/NSPACE/ now, gone after the job
    c = pydvm_store()._c
    queue_keys = [k for k in c.keys(f"torch/{c.nspace}/", range=pydvm.Range.NAMESPACE)
                  if "%q#" in k]
    print("QUEUEKEYS", len(queue_keys), flush=True)


def ranks():
    """Rank 0 pushes 40 items on one queue of each store; every rank pops
    until it reads an end mark (one per rank); each prints what it took,
    then meets the others (a counter and a queue of release marks)."""
    shared = PydvmStore("ranks", timeout=60)
    if RANK == 0:
        server = dist.TCPStore("127.0.0.1", 0, SIZE, True, wait_for_workers=False,
                               timeout=datetime.timedelta(seconds=60))
        shared.set("port", str(server.port))
    port = int(shared.get("port"))
    tcp = server if RANK == 0 else dist.TCPStore(
        "127.0.0.1", port, SIZE, False, timeout=datetime.timedelta(seconds=60))
    for kind, s in (("pydvm", PydvmStore("ranks-queue", timeout=60)), ("tcp", tcp)):
        if RANK == 0:
            for i in range(40):
                s.queue_push("work", f"item{i}")
            for _ in range(SIZE):
                s.queue_push("work", "end")
        took = []
        while True:
            item = s.queue_pop("work").decode()
            if item == "end":
                break
            took.append(item)
        print("TOOK", kind, RANK, " ".join(took) or "-", flush=True)
        if s.add("done", 1) == SIZE:  # the last rank done releases every rank
            for _ in range(SIZE):
                s.queue_push("release", "go")
        s.queue_pop("release")
        print("LEFT", kind, RANK, s.queue_len("work"), flush=True)
    # rank 0 serves the TCPStore: it stays until every other rank is through
    if RANK == 0:
        for _ in range(SIZE - 1):
            shared.queue_pop("bye")
    else:
        shared.queue_push("bye", str(RANK))


def crash():
    """Rank 0 leaves items on a queue; rank 1 waits in a pop on an empty
    one; once rank 1 has taken its turn, rank 0 dies by SIGKILL, which ends
    the job (run with --abort-on-failure) with rank 1 still waiting."""
    s = PydvmStore("crash", timeout=0)
    if RANK == 0:
        for i in range(5):
            s.queue_push("left", f"item{i}")
        # rank 1's turn: the queue's count of pops begun exists
        s._c.lookup(s._qkey("empty", "h"), range=pydvm.Range.NAMESPACE, wait=True)
        print("KILLING", s.queue_len("left"), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    else:
        s.queue_pop("empty")  # never answered


if __name__ == "__main__":
    {"one": one_process, "ranks": ranks, "crash": crash}[sys.argv[1]]()
