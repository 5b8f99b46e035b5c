"""Job programs for pydvm.torch (tests/e2e/test_torch.py).  argv[1] is the mode.

Every check prints ``RULE <name> ok`` or ``RULE <name> FAIL <what happened>``;
other lines carry values for the test to compare across ranks.

* ``contract``: torch's Store contract in one process, each rule called the
  way C++ calls it (through a ``PrefixStore``, whose methods are C++) and,
  where Python callers differ, directly.
* ``ranks``: across the job's ranks: a get blocked until another rank's set,
  ``ADDED`` values of 50 adds per rank, a ``CAS`` race, a wait on keys of
  every rank.
* ``pg [store|url]``: ``init_process_group`` (with a temporary PydvmStore,
  or ``init_method="pydvm://"``), garbage collection, all_reduce, barrier,
  ``new_group``, prints ``SUM`` and ``NUMKEYS``; ``nodestroy`` as a third
  argument skips ``destroy_process_group``; ``crash`` makes rank 1 die by
  SIGKILL once the group is up.
* ``isolated TAG``: sets and adds keys every job of this program shares the
  names of, prints what it reads back (``SEEN``).
* ``refused``: a set larger than the per-user cap (the DVM runs with a
  small one): the refusal comes back on the next call, and from flush().
* ``elastic``: a torchrun worker: ``init_process_group("pydvm://")``,
  all_reduce; prints ``WORKER rank world sum round store-type``.
"""

import datetime
import gc
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist

import pydvm
import pydvm.torch  # noqa: F401  (registers pydvm://)
from pydvm.torch import PydvmStore

RANK = int(os.environ.get("PYDVM_RANK", "0"))
SIZE = int(os.environ.get("PYDVM_JOB_SIZE", "1"))
mode = sys.argv[1]


def rule(name, ok, detail=""):
    print(f"RULE {name} {'ok' if ok else 'FAIL ' + repr(detail)}", flush=True)


def raises(fn, exc_type, *needles):
    try:
        fn()
    except exc_type as exc:
        text = str(exc)
        return all(n in text for n in needles), text
    except Exception as exc:  # noqa: BLE001 - reported as the rule's failure
        return False, f"{type(exc).__name__}: {exc}"
    return False, "nothing raised"


if mode == "contract":
    s = PydvmStore("contract")
    p = dist.PrefixStore("cpp", s)  # its methods are C++: they call ours through pybind

    p.set("k", "one")
    p.set("k", b"two\x00")
    rule("set overwrites, get returns bytes", p.get("k") == b"two\x00", p.get("k"))
    s.set("py", "str from Python")
    rule("set takes str from Python", s.get("py") == b"str from Python", s.get("py"))
    p.set("", b"empty")
    s.set("", b"raw empty")
    rule("empty key", p.get("") == b"empty" and s.get("") == b"raw empty", (p.get(""), s.get("")))

    p.set_timeout(datetime.timedelta(milliseconds=300))  # C++ set_timeout: read on every call
    t0 = time.monotonic()
    ok, text = raises(lambda: p.get("absent-key"), dist.DistStoreError, "300 ms", "absent-key")
    rule("get times out with DistStoreError naming timeout and key",
         ok and 0.25 < time.monotonic() - t0 < 10, text)
    s.set_timeout(datetime.timedelta(seconds=60))

    rule("add makes the counter", p.add("c", 3) == 3)
    rule("add adds and returns the new value", p.add("c", -1) == 2 and p.add("c", 40) == 42)
    rule("add keeps decimal text", p.get("c") == b"42", p.get("c"))
    p.set("text", "abc")
    ok, text = raises(lambda: p.add("text", 1), dist.DistStoreError, "not an integer")
    rule("add to a non-numeric value raises", ok, text)

    r = p.compare_set("cas", "expected", "desired")
    rule("cas absent, non-empty expected: returns expected, stores nothing",
         r == b"expected" and not p.check(["cas"]), r)
    r = p.compare_set("cas", "", "first")
    rule("cas absent, empty expected: stores and returns desired",
         r == b"first" and p.get("cas") == b"first", r)
    r = p.compare_set("cas", "wrong", "second")
    rule("cas wrong expected: returns current", r == b"first" and p.get("cas") == b"first", r)
    r = p.compare_set("cas", "first", "second")
    rule("cas right expected: stores and returns desired",
         r == b"second" and p.get("cas") == b"second", r)

    ok, text = raises(lambda: p.wait(["w1", "w2"], datetime.timedelta(milliseconds=200)),
                      dist.DistStoreError, "200 ms", "w1")
    rule("wait with a timeout raises DistStoreError", ok, text)
    threading.Timer(0.5, lambda: s.set("cpp/w3", b"x")).start()
    t0 = time.monotonic()
    p.wait(["w3"], datetime.timedelta(0))
    rule("wait with timeout 0 waits without limit", time.monotonic() - t0 >= 0.4)
    s.set_timeout(datetime.timedelta(milliseconds=200))
    ok, text = raises(lambda: p.wait(["w4"]), dist.DistStoreError, "w4")
    rule("wait without a timeout uses the store's", ok, text)
    s.set_timeout(datetime.timedelta(seconds=60))
    rule("check", p.check(["k", "c"]) and not p.check(["k", "nope"]) and p.check([]))

    n = p.num_keys()  # C++ PrefixStore -> getNumKeys of the whole store
    keys = ["", "cpp/", "cpp/c", "cpp/cas", "cpp/k", "cpp/text", "cpp/w3", "py"]
    rule("getNumKeys counts the store's keys", n == s.num_keys() == 8 and s.list_keys() == keys,
         (n, s.list_keys()))
    rule("deleteKey returns whether it removed", p.delete_key("k") is True
         and p.delete_key("k") is False and s.num_keys() == n - 1)

    p.append("ap", b"ab")
    p.append("ap", "cd")
    rule("append", p.get("ap") == b"abcd", p.get("ap"))
    p.multi_set(["m1", "m2", ""], [b"1", "2", b"3"])
    rule("multi_set / multi_get", p.multi_get(["m2", "m1", ""]) == [b"2", b"1", b"3"])
    rule("has_extended_api", p.has_extended_api() is True and s.has_extended_api() is True)

    c = p.clone()  # C++ PrefixStore.clone -> our clone
    gc.collect()
    rule("clone survives garbage collection and shares the keys", c.get("m1") == b"1")
    c2 = s.clone()
    rule("a Python clone is a PydvmStore on the same keys",
         isinstance(c2, PydvmStore) and c2.get("cpp/m1") == b"1")

    dist.init_process_group("gloo", store=PydvmStore("gc-temporary"), rank=0, world_size=1)
    gc.collect()
    g = dist.new_group([0])
    t = torch.ones(2)
    dist.all_reduce(t, group=g)
    rule("a temporary store survives gc; new_group works", t.tolist() == [1.0, 1.0])
    dist.destroy_process_group()

elif mode == "ranks":
    s = PydvmStore("ranks", timeout=60)
    s.set(f"hello-{RANK}", str(RANK))
    s.wait([f"hello-{r}" for r in range(SIZE)])
    if RANK == 1:
        t0 = time.monotonic()
        v = s.get("released-by-3")
        rule("a blocking get is released by another rank's set",
             v == b"from 3" and time.monotonic() - t0 >= 0.5, (v, time.monotonic() - t0))
    if RANK == 3:
        time.sleep(1.0)
        s.set("released-by-3", b"from 3")
    got = [s.add("counter", 1) for _ in range(50)]
    print("ADDED", *got, flush=True)
    print("CAS", s.compare_set("winner", "", f"rank{RANK}").decode(), flush=True)
    s.add("done", 1)
    s.wait(["counter"])
    while int(s.get("done")) < SIZE:
        time.sleep(0.01)
    print("FINAL", s.get("counter").decode(), s.get("winner").decode(), flush=True)

elif mode == "pg":
    how = sys.argv[2]
    extra = sys.argv[3] if len(sys.argv) > 3 else ""
    if how == "store":
        dist.init_process_group("gloo", store=PydvmStore(), rank=RANK, world_size=SIZE)
    else:
        dist.init_process_group("gloo", init_method="pydvm://")
    gc.collect()
    t = torch.tensor([float(RANK + 1)])
    dist.all_reduce(t)
    dist.barrier()
    evens = dist.new_group([r for r in range(SIZE) if r % 2 == 0])
    u = torch.ones(1)
    if RANK % 2 == 0:
        dist.all_reduce(u, group=evens)
    dist.barrier()
    store = PydvmStore()
    print("SUM", RANK, t.item(), u.item(), flush=True)
    print("NUMKEYS", store._c.count(f"torch/{os.environ['PYDVM_NSPACE']}/",
                                    range=pydvm.Range.NAMESPACE), flush=True)
    if extra == "crash":
        dist.barrier()
        if RANK == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.5)
        os._exit(3)  # no destroy_process_group, no flush, no atexit
    if extra != "nodestroy":
        dist.destroy_process_group()

elif mode == "isolated":
    tag = sys.argv[2]
    s = PydvmStore()
    s.set("shared-name", tag)
    s.add("shared-counter", 1)
    s.set(f"in-{RANK}", b"1")
    s.wait([f"in-{r}" for r in range(SIZE)])  # every rank of this job has added
    time.sleep(0.5)  # the other job runs meanwhile, on the same key names
    print("SEEN", tag, s.get("shared-name").decode(), s.get("shared-counter").decode(),
          s.num_keys(), flush=True)

elif mode == "refused":
    s = PydvmStore("refused")
    s.set("small", b"x")
    s.set("big", b"x" * 100_000)  # over the DVM's cap: refused, reported later
    ok, text = raises(lambda: s.get("small"), dist.DistStoreError, "OUT_OF_RESOURCE", "earlier")
    rule("a refused set is raised by the next call", ok, text)
    rule("... once", s.get("small") == b"x")
    s.set("big2", b"y" * 100_000)
    ok, text = raises(s.flush, dist.DistStoreError, "OUT_OF_RESOURCE")
    rule("flush raises a refused set", ok, text)

elif mode == "elastic":
    dist.init_process_group("gloo", init_method="pydvm://")
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    store = dist.distributed_c10d._get_default_store()
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    # one write per line: the workers of one agent share its output stream
    sys.stdout.write(" ".join(map(str, [
        "WORKER", dist.get_rank(), dist.get_world_size(), t.item(),
        os.environ.get("PYDVM_TORCH_ROUND", "-").replace(" ", ":"), type(store).__name__,
        os.environ.get("TORCHELASTIC_USE_AGENT_STORE")])) + "\n")
    sys.stdout.flush()
    dist.destroy_process_group()

else:
    sys.exit(f"unknown mode {mode}")
