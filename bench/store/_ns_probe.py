"""Probe program of bench/store/vs_openmpi.py: one side's name service, timed from inside a job.

    _ns_probe.py ompi|pydvm latency HELD PROBES OUT
    _ns_probe.py ompi|pydvm throughput SECONDS OUT

Run as a 2-rank job (latency: rank 0 measures, rank 1 only waits) or an
N-rank job (throughput: every rank loops).  ``ompi`` uses mpi4py's
MPI.Publish_name / Lookup_name / Unpublish_name under ``mpirun``; ``pydvm``
uses the blocking pydvm.Client in a ``pydvm run`` job.  Rank 0 writes a JSON
result to OUT.
"""

import json
import os
import sys
import time

side, mode = sys.argv[1], sys.argv[2]

if side == "ompi":
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()

    def publish(name: str) -> None:
        MPI.Publish_name(name, "tcp://127.0.0.1:1")

    def lookup(name: str) -> None:
        MPI.Lookup_name(name)

    def unpublish(name: str) -> None:
        MPI.Unpublish_name(name, "tcp://127.0.0.1:1")

    def barrier() -> None:
        comm.Barrier()

    def total(x: float) -> float:
        return comm.allreduce(x)

    def done() -> None:
        MPI.Finalize()
else:
    from pydvm import Client

    client = Client()
    rank, size = int(os.environ["PYDVM_RANK"]), int(os.environ["PYDVM_JOB_SIZE"])
    _seq = [0]

    def publish(name: str) -> None:
        client.publish({name: "tcp://127.0.0.1:1"})

    def lookup(name: str) -> None:
        client.lookup([name])

    def unpublish(name: str) -> None:
        client.unpublish([name])

    def barrier() -> None:
        _seq[0] += 1
        client.publish({f"bench-barrier-{_seq[0]}-{rank}": 1})
        client.lookup([f"bench-barrier-{_seq[0]}-{r}" for r in range(size)], wait=True,
                      timeout=120)

    def total(x: float) -> float:
        _seq[0] += 1
        client.publish({f"bench-sum-{_seq[0]}-{rank}": float(x)})
        r = client.lookup([f"bench-sum-{_seq[0]}-{q}" for q in range(size)], wait=True,
                          timeout=120)
        return sum(r.values())

    def done() -> None:
        client.close()


def cpu_ticks() -> tuple[int, int]:
    """Machine-wide CPU ticks so far: (busy, stolen by the hypervisor)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = v[:8]
    return user + nice + system + irq + softirq, steal


def median_us(samples: list[float]) -> float:
    samples.sort()
    return samples[len(samples) // 2] * 1e6


if mode == "latency":
    held, probes, out = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    result = {}
    if rank == 0:
        for i in range(held):
            publish(f"held-{i}")
        times = {"publish": [], "lookup": [], "unpublish": []}
        clock = time.perf_counter
        for i in range(probes):
            name = f"probe-{i}"
            t0 = clock()
            publish(name)
            t1 = clock()
            lookup(name)
            t2 = clock()
            unpublish(name)
            t3 = clock()
            times["publish"].append(t1 - t0)
            times["lookup"].append(t2 - t1)
            times["unpublish"].append(t3 - t2)
        result = {op: median_us(v) for op, v in times.items()}
        with open(out, "w") as f:
            json.dump(result, f)
    barrier()
    done()
else:
    seconds, out = float(sys.argv[3]), sys.argv[4]
    barrier()
    cpu0 = cpu_ticks()
    ops = 0
    end = time.perf_counter() + seconds
    i = 0
    while time.perf_counter() < end:
        name = f"tp-{rank}-{i}"
        publish(name)
        lookup(name)
        unpublish(name)
        ops += 3
        i += 1
    cpu1 = cpu_ticks()
    n = total(ops)
    if rank == 0:
        busy, steal = (b - a for a, b in zip(cpu0, cpu1))
        tick = os.sysconf("SC_CLK_TCK")
        with open(out, "w") as f:
            json.dump({"ops_per_s": n / seconds, "cpu_us_per_op": busy / tick / n * 1e6,
                       "steal": steal / tick / seconds}, f)
    barrier()
    done()
