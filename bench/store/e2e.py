"""End-to-end latency and throughput of the data store through a real DVM.

    python bench/store/e2e.py            # full run (~1 minute)
    python bench/store/e2e.py --quick    # fewer samples

What it measures, in one run:

* **floor** -- a bare request/response over the same socket kinds and hop
  count as a client call: a blocking client on a Unix socket to a relay
  process, which forwards over TCP to a server process that answers; relay
  and server are plain asyncio protocols on the same event loop the DVM
  uses (uvloop when installed).  Nothing is decoded on the way.
* **publish / lookup / unpublish** -- the same path through pydvm: one job
  process with ``pydvm.Client`` -> its daemon (Unix socket) -> the master
  store (TCP), median and p99 latency over many calls, with 1,000 other items
  held in the store.
* **throughput** -- 8 and 64 concurrent clients spread over 3 daemons, each
  looping publish + lookup + unpublish for a fixed time after a barrier
  (itself a waiting lookup through the store).

Prints a table and, last, ``worst median ratio to floor X`` (target <= 3).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)
PYDVM = [sys.executable, "-m", "pydvm"]


# ----------------------------------------------------------------------
# floor: bare relay + server
# ----------------------------------------------------------------------


def _loop_run(coro):
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


class _Echo(asyncio.Protocol):
    def connection_made(self, t):
        self.t = t
        s = t.get_extra_info("socket")
        if s is not None and s.family == socket.AF_INET:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data):
        self.t.write(data)


async def _floor_server(port_file: str) -> None:
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(_Echo, "127.0.0.1", 0)
    with open(port_file, "w") as f:
        f.write(str(srv.sockets[0].getsockname()[1]))
    await asyncio.Event().wait()


class _Up(asyncio.Protocol):
    """Relay's upstream (TCP) side: sends answers back to the client."""

    def __init__(self, down):
        self.down = down

    def connection_made(self, t):
        self.t = t
        t.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data):
        self.down.write(data)


async def _floor_relay(sock_path: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    up_t, up = None, None

    class Down(asyncio.Protocol):
        def connection_made(self, t):
            self.t = t
            up.down = t

        def data_received(self, data):
            up_t.write(data)

    up_t, up = await loop.create_connection(lambda: _Up(None), "127.0.0.1", port)
    await loop.create_unix_server(Down, sock_path)
    await asyncio.Event().wait()


def measure_floor(n: int, payload: int) -> list[float]:
    tmp = tempfile.mkdtemp(prefix="pydvm-bench-")
    port_file = os.path.join(tmp, "port")
    sock_path = os.path.join(tmp, "relay.sock")
    server = subprocess.Popen([sys.executable, HERE, "--floor-server", port_file])
    relay = None
    try:
        _wait(lambda: os.path.exists(port_file) and open(port_file).read())
        port = int(open(port_file).read())
        relay = subprocess.Popen([sys.executable, HERE, "--floor-relay", sock_path, str(port)])
        _wait(lambda: os.path.exists(sock_path))
        s = socket.socket(socket.AF_UNIX)
        s.connect(sock_path)
        msg = struct.pack("!I", payload) + b"x" * payload
        samples = []
        for i in range(n + n // 10):
            t0 = time.perf_counter_ns()
            s.sendall(msg)
            got = 0
            while got < len(msg):
                got += len(s.recv(65536))
            if i >= n // 10:  # warm-up excluded
                samples.append((time.perf_counter_ns() - t0) / 1000)
        s.close()
        return samples
    finally:
        for p in (server, relay):
            if p is not None:
                p.kill()
                p.wait()


def _wait(pred, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.01)
    raise RuntimeError("benchmark helper did not come up")


# ----------------------------------------------------------------------
# workers (run inside a pydvm job)
# ----------------------------------------------------------------------


def worker_latency(n: int, background: int) -> None:
    from pydvm import Client

    c = Client()
    for i in range(0, background, 100):
        for j in range(i, min(i + 100, background)):
            c.publish({f"bg-{j}": "v" * 16})
    out: dict[str, list[float]] = {"publish": [], "lookup": [], "unpublish": []}
    warm = n // 10
    for i in range(n + warm):
        key = f"lat-{i}"
        t0 = time.perf_counter_ns()
        c.publish({key: "tcp://10.0.0.1:5555"})
        t1 = time.perf_counter_ns()
        r = c.lookup([key])
        t2 = time.perf_counter_ns()
        c.unpublish([key])
        t3 = time.perf_counter_ns()
        assert r[key] == "tcp://10.0.0.1:5555"
        if i >= warm:
            out["publish"].append((t1 - t0) / 1000)
            out["lookup"].append((t2 - t1) / 1000)
            out["unpublish"].append((t3 - t2) / 1000)
    c.unpublish()
    print(json.dumps(out), flush=True)


def worker_throughput(duration: float) -> None:
    from pydvm import Client

    rank = int(os.environ["PYDVM_RANK"])
    size = int(os.environ["PYDVM_JOB_SIZE"])
    c = Client()
    c.publish({f"ready-{rank}": 1})
    c.lookup([f"ready-{r}" for r in range(size)], wait=True, timeout=120)
    ops = 0
    t0 = time.perf_counter()
    end = t0 + duration
    i = 0
    while time.perf_counter() < end:
        key = f"tp-{rank}-{i}"
        c.publish({key: i})
        c.lookup([key])
        c.unpublish([key])
        ops += 3
        i += 1
    elapsed = time.perf_counter() - t0
    print(json.dumps({"ops": ops, "elapsed": elapsed}), flush=True)


# ----------------------------------------------------------------------
# driver
# ----------------------------------------------------------------------


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--floor-server")
    ap.add_argument("--floor-relay", nargs=2)
    ap.add_argument("--worker", choices=["latency", "throughput"])
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--background", type=int, default=1000)
    ap.add_argument("--duration", type=float, default=3.0)
    a = ap.parse_args()
    if a.floor_server:
        _loop_run(_floor_server(a.floor_server))
        return 0
    if a.floor_relay:
        _loop_run(_floor_relay(a.floor_relay[0], int(a.floor_relay[1])))
        return 0
    if a.worker == "latency":
        worker_latency(a.n, a.background)
        return 0
    if a.worker == "throughput":
        worker_throughput(a.duration)
        return 0

    n = 800 if a.quick else a.n
    duration = 1.5 if a.quick else a.duration
    env = dict(os.environ)
    env["PYDVM_STATE_DIR"] = tempfile.mkdtemp(prefix="pydvm-bench-state-")
    env.pop("PYDVM_URI", None)
    # The floor is two hops (Unix socket, then TCP), so the client takes the
    # two-hop path too: the direct path (one TCP hop) is bench/store/vs_openmpi.py's.
    uri = subprocess.run(PYDVM + ["start", "--daemonize", "--hosts", "a,b,c",
                                  "--mca", "pydvm_direct_data", "off"], env=env,
                         capture_output=True, text=True, timeout=120, check=True).stdout.strip()
    env["PYDVM_URI"] = uri
    try:
        floor = measure_floor(n, 96)
        p = subprocess.run(
            PYDVM + ["run", "--host", "a", "-n", "1", sys.executable, HERE, "--worker", "latency",
                     "--n", str(n), "--background", str(a.background)],
            env=env, capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            sys.stderr.write(p.stderr)
            return 1
        lat = json.loads(p.stdout.strip().splitlines()[-1])
        tput = {}
        for clients in (8, 64):
            p = subprocess.run(
                PYDVM + ["run", "-n", str(clients), sys.executable, HERE, "--worker", "throughput",
                         "--duration", str(duration)],
                env=env, capture_output=True, text=True, timeout=600)
            if p.returncode != 0:
                sys.stderr.write(p.stderr)
                return 1
            rows = [json.loads(x) for x in p.stdout.split("\n") if x.startswith("{")]
            tput[clients] = sum(r["ops"] / r["elapsed"] for r in rows)
    finally:
        subprocess.run(PYDVM + ["stop"], env=env, capture_output=True, timeout=60)

    fmed = statistics.median(floor)
    print(f"{'operation':<12} {'median µs':>10} {'p99 µs':>10} {'ratio to floor':>15}")
    print(f"{'floor':<12} {fmed:>10.1f} {pct(floor, 0.99):>10.1f} {1.0:>15.2f}")
    worst = 0.0
    for op in ("publish", "lookup", "unpublish"):
        med = statistics.median(lat[op])
        ratio = med / fmed
        worst = max(worst, ratio)
        print(f"{op:<12} {med:>10.1f} {pct(lat[op], 0.99):>10.1f} {ratio:>15.2f}")
    print()
    print(f"{'clients':<12} {'ops/s':>10}   (publish+lookup+unpublish over 3 daemons)")
    for clients, rate in tput.items():
        print(f"{clients:<12} {rate:>10.0f}")
    print()
    print(f"worst median ratio to floor {worst:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
