"""The job program of bench/integrations/torch_store.py (run by it under ``pydvm run``).

    _torch_probe.py latency PROBES OUT.json    (2 ranks)
    _torch_probe.py init REPS OUT.json         (4 ranks)

``latency``: rank 0 hosts a TCPStore (as torchrun's rank 0 does) and waits;
rank 1, a client of both stores, times set, get, add and compare_set on
each, in alternating blocks so both share the machine's noise.

``init``: REPS rounds, each timing on every rank -- from a common start,
after a barrier -- ``init_process_group("gloo")`` and one all_reduce, once
with ``init_method="pydvm://"`` and once torchrun-style: ``env://`` with
``TORCHELASTIC_USE_AGENT_STORE``, every rank a client of a TCPStore that
was up before the round began (torchrun's agent hosts it; here rank 0, on
a fresh port each round).  A round's figure is its slowest rank.

Rank 0 writes ``{op: [microseconds...]}`` to OUT.json.  Coordination
(ports, barriers, results) goes through a pydvm Client outside the timing.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from pydvm import Client, Persistence, Range
from pydvm.torch import PydvmStore

RANK = int(os.environ["PYDVM_RANK"])
SIZE = int(os.environ["PYDVM_JOB_SIZE"])
NS = Range.NAMESPACE
BLOCK = 50


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def barrier(c: Client, tag: str) -> None:
    """Every rank arrives before any leaves (the last to arrive opens it)."""
    if c.add(f"barrier/{tag}", 1, range=NS) == SIZE:
        c.publish({f"open/{tag}": 1}, range=NS)
    c.lookup(f"open/{tag}", range=NS, wait=True, timeout=120)


def timed(fn, n: int) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def latency(probes: int, path: str, c: Client) -> None:
    if RANK == 0:
        port = free_port()
        server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                               timeout=timedelta(seconds=60))
        c.publish({"port": port}, range=NS, persistence=Persistence.PROC)
        c.lookup("done", range=NS, wait=True, timeout=600)
        del server
        return
    port = c.lookup("port", range=NS, wait=True, timeout=60)["port"]
    stores = {"tcpstore": dist.TCPStore("127.0.0.1", port, is_master=False,
                                        timeout=timedelta(seconds=60)),
              "pydvm": PydvmStore("bench")}
    results: dict[str, dict[str, list[float]]] = {name: {} for name in stores}
    for s in stores.values():  # warm up: connections, the direct path, caches
        for i in range(200):
            s.set(f"w{i}", b"x")
            s.get(f"w{i}")
            s.add("warm", 1)
        s.set("cas", b"0")
    done = 0
    while done < probes:
        n = min(BLOCK, probes - done)
        for name, s in stores.items():
            r = results[name]
            r.setdefault("set", []).extend(timed(lambda i: s.set(f"k{done + i}", b"12345678"), n))
            r.setdefault("get", []).extend(timed(lambda i: s.get(f"k{done + i}"), n))
            r.setdefault("add", []).extend(timed(lambda i: s.add("ctr", 1), n))
            r.setdefault("compare_set", []).extend(timed(
                lambda i: s.compare_set("cas", str(done + i).encode(),
                                        str(done + i + 1).encode()), n))
        done += n
    stores["pydvm"].flush()
    for name, r in results.items():
        r["check_cas"] = [float(stores[name].get("cas") == str(probes).encode())]
    with open(path, "w") as f:
        json.dump(results, f)
    c.publish({"done": 1}, range=NS)


def init(reps: int, path: str, c: Client) -> None:
    times: dict[str, list[float]] = {"pydvm": [], "tcpstore": []}
    for rep in range(reps):
        for how in ("pydvm", "tcpstore"):
            tag = f"{how}-{rep}"
            server = None
            if how == "tcpstore":
                # torchrun's way: the store is up before the workers start (its
                # agent hosts it) and every worker connects to it (env://).
                if RANK == 0:
                    port = free_port()
                    server = dist.TCPStore("127.0.0.1", port, is_master=True,
                                           wait_for_workers=False, timeout=timedelta(seconds=60))
                    c.publish({f"port/{tag}": port}, range=NS)
                port = c.lookup(f"port/{tag}", range=NS, wait=True, timeout=60)[f"port/{tag}"]
                os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(RANK),
                                  WORLD_SIZE=str(SIZE), TORCHELASTIC_USE_AGENT_STORE="True")
            barrier(c, tag)
            t0 = time.perf_counter()
            dist.init_process_group("gloo", init_method="pydvm://" if how == "pydvm"
                                    else "env://")
            t = torch.ones(1)
            dist.all_reduce(t)
            us = (time.perf_counter() - t0) * 1e6
            assert t.item() == SIZE
            c.publish({f"us/{tag}/{RANK}": us}, range=NS)
            barrier(c, tag + "-end")
            dist.destroy_process_group()
            for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
                      "TORCHELASTIC_USE_AGENT_STORE"):
                os.environ.pop(k, None)
            if RANK == 0:
                keys = [f"us/{tag}/{r}" for r in range(SIZE)]
                got = c.lookup(keys, range=NS, wait=True, timeout=60)
                times[how].append(max(got[k] for k in keys))
            barrier(c, tag + "-destroyed")
            del server
    if RANK == 0:
        with open(path, "w") as f:
            json.dump(times, f)


def main() -> None:
    mode, n, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    with Client() as c:
        latency(n, path, c) if mode == "latency" else init(n, path, c)


if __name__ == "__main__":
    main()
