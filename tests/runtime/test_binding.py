"""The binding core: topology from a (fake) sysfs, mpirun's policy, the report line.

Pure unit tests (tests/e2e/test_binding_e2e.py compares real DVMs with mpirun):
a fake sysfs tree of a 2-socket x 4-core x 2-thread machine numbered as
Linux numbers Intel's (cpu N and N+8 are one core's threads) and of this
test VM's shape (2 cores, 1 socket, 1 NUMA node, 1 L3); the real machine's
topology is checked against hwloc's own numbering (``hwloc-calc``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from pydvm.runtime.node import binding as B
from pydvm.runtime.node import topology as T


def fake_sysfs(root: Path, sockets: int, cores: int, threads: int) -> Path:
    """A sysfs tree: ``sockets`` x ``cores`` x ``threads``, cpu numbering
    socket-major within a thread plane (cpu = t * S*C + s*C + c), a shared
    L3 and a NUMA node per socket, L1d/L1i/L2 per core."""
    n = sockets * cores * threads
    plane = sockets * cores
    cpu_dir = root / "devices" / "system" / "cpu"
    cpu_dir.mkdir(parents=True)
    (cpu_dir / "online").write_text(f"0-{n - 1}\n")

    def siblings(cpu):
        base = cpu % plane
        return [base + t * plane for t in range(threads)]

    for cpu in range(n):
        s = (cpu % plane) // cores
        topo = cpu_dir / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{s}\n")
        (topo / "core_id").write_text(f"{cpu % cores}\n")
        (topo / "thread_siblings_list").write_text(T.format_cpu_list(siblings(cpu)) + "\n")
        sock = [c for c in range(n) if (c % plane) // cores == s]
        for ix, (level, kind, members) in enumerate([(1, "Data", siblings(cpu)),
                                                     (1, "Instruction", siblings(cpu)),
                                                     (2, "Unified", siblings(cpu)),
                                                     (3, "Unified", sock)]):
            d = cpu_dir / f"cpu{cpu}" / "cache" / f"index{ix}"
            d.mkdir(parents=True)
            (d / "level").write_text(f"{level}\n")
            (d / "type").write_text(f"{kind}\n")
            (d / "shared_cpu_list").write_text(T.format_cpu_list(members) + "\n")
    for s in range(sockets):
        d = root / "devices" / "system" / "node" / f"node{s}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(
            T.format_cpu_list(c for c in range(n) if (c % plane) // cores == s) + "\n")
    return root


@pytest.fixture
def big(tmp_path):
    """2 sockets x 4 cores x 2 threads (16 cpus)."""
    return T.read(str(fake_sysfs(tmp_path / "big", 2, 4, 2)), allowed=set(range(16)))


@pytest.fixture
def vm(tmp_path):
    """This VM's shape: 1 socket x 2 cores x 1 thread."""
    return T.read(str(fake_sysfs(tmp_path / "vm", 1, 2, 1)), allowed={0, 1})


def idx(topo, level, cpu):
    return topo.containing(level, cpu).index


# ----------------------------------------------------------------------
# topology
# ----------------------------------------------------------------------


def test_cpu_lists_round_trip():
    assert T.parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert T.format_cpu_list({11, 0, 1, 2, 3, 8, 10}) == "0-3,8,10-11"
    assert T.parse_cpu_list("") == set() and T.format_cpu_list([]) == ""


def test_two_sockets_four_cores_two_threads_numbered_as_hwloc(big):
    assert [len(big.objects(lv)) for lv in ("package", "l3cache", "l2cache", "l1cache",
                                            "core", "hwthread", "numa")] == [2, 2, 8, 8, 8, 16, 2]
    # cpu 8 is core 0's second thread: PU logical 1 (tree order), core 0, socket 0
    assert [o.cpus for o in big.objects("hwthread")][:4] == [{0}, {8}, {1}, {9}]
    assert (idx(big, "core", 8), idx(big, "package", 8), idx(big, "hwthread", 8)) == (0, 0, 1)
    assert (idx(big, "core", 12), idx(big, "package", 12), idx(big, "numa", 12)) == (4, 1, 1)
    assert big.objects("package")[1].cpus == {4, 5, 6, 7, 12, 13, 14, 15}


def test_the_topology_stays_within_the_allowed_cpus(tmp_path):
    """A Slurm step given cpus 4-7,12-15 (socket 1): only that socket, numbered
    from 0 as hwloc numbers a cgroup-restricted machine."""
    topo = T.read(str(fake_sysfs(tmp_path, 2, 4, 2)), allowed={4, 5, 6, 7, 12, 13, 14, 15})
    assert topo.cpus == {4, 5, 6, 7, 12, 13, 14, 15}
    assert len(topo.objects("package")) == 1 and len(topo.objects("core")) == 4
    assert idx(topo, "core", 4) == 0 and idx(topo, "numa", 4) == 0
    p = B.plan(topo, {}, 2, 2, False, {}, "n")
    assert p.cpus == [{4, 12}, {5, 13}]  # never outside the step's cpus


def test_this_vm_shape(vm):
    assert [len(vm.objects(lv)) for lv in ("package", "core", "hwthread", "numa",
                                           "l3cache")] == [1, 2, 2, 1, 1]


def test_the_real_machine_is_numbered_as_hwloc_numbers_it():
    """This machine's sysfs read by pydvm, against hwloc-calc (hwloc's own
    logical indexes) for every cpu and level."""
    calc = shutil.which("hwloc-calc")
    if calc is None:
        pytest.skip("hwloc-calc not installed (apt-get install hwloc)")
    topo = T.read()
    names = {"package": "package", "l3cache": "l3cache", "l2cache": "l2cache",
             "l1cache": "l1cache", "core": "core", "hwthread": "pu", "numa": "numa"}
    for cpu in sorted(topo.cpus):
        for level, hw in names.items():
            if not topo.objects(level):
                continue
            out = subprocess.run([calc, "--physical-input", "--logical-output", f"pu:{cpu}",
                                  "--intersect", hw], capture_output=True, text=True,
                                 timeout=30).stdout.strip()
            assert str(idx(topo, level, cpu)) == out, (cpu, level, out)


def test_reading_the_topology_is_cheap():
    import time
    t0 = time.perf_counter()
    T.read()
    assert time.perf_counter() - t0 < 0.5 * max(1, len(os.sched_getaffinity(0)) / 16)


# ----------------------------------------------------------------------
# the policy
# ----------------------------------------------------------------------


def test_default_policy_core_up_to_two_numa_above_none_when_oversubscribed(big, vm):
    assert B.plan(big, {}, 2, 2, False).cpus == [{0, 8}, {1, 9}]
    p = B.plan(big, {}, 3, 3, False)
    assert p.policy == "numa" and p.cpus == [big.objects("numa")[0].cpus,
                                             big.objects("numa")[1].cpus,
                                             big.objects("numa")[0].cpus]
    assert B.plan(big, {}, 2, 2, True).cpus == [None, None]  # oversubscribed
    # 3 procs on this VM's one 2-core NUMA node: the default overloads -> unbound
    p = B.plan(vm, {}, 3, 3, False)
    assert p.cpus == [None] * 3 and not p.refusal and p.policy == "none"


def test_explicit_binding_overload_is_refused_as_mpirun_words_it(vm):
    p = B.plan(vm, {"bind_to": "core"}, 3, 3, False, {}, "vm")
    assert p.refusal.startswith("A request was made to bind to that would result in "
                                "binding more processes than cpus on a resource")
    for part in ("Bind to:     CORE\n", "Node:        vm\n", "#processes:  2\n",
                 "#cpus:       1\n", '"overload-allowed"'):
        assert part in p.refusal
    p = B.plan(vm, {"bind_to": "core", "overload": True}, 3, 3, False)
    assert p.cpus == [{0}, {1}, {0}]
    # explicit binding holds even when the job oversubscribes
    assert B.plan(vm, {"bind_to": "core"}, 2, 2, True).cpus == [{0}, {1}]


def test_bind_to_each_level(big):
    for bind, first in [("hwthread", {0}), ("core", {0, 8}), ("l2cache", {0, 8}),
                        ("l1cache", {0, 8}), ("l3cache", big.objects(
            "package")[0].cpus), ("socket", big.objects("package")[0].cpus),
                        ("numa", big.objects("numa")[0].cpus)]:
        assert B.plan(big, {"bind_to": bind}, 1, 1, False).cpus == [first], bind
    assert B.plan(big, {"bind_to": "none"}, 2, 2, False).cpus == [None, None]


def test_least_loaded_first_and_overload_counts_this_job_only(vm):
    load = B.CpuLoad()
    first = B.plan(vm, {}, 1, 1, False, load.counts)
    load.add(first.cpus[0])
    second = B.plan(vm, {}, 1, 1, False, load.counts)
    assert first.cpus == [{0}] and second.cpus == [{1}]
    load.add(second.cpus[0])
    # both cores taken by other jobs: a third still binds (its own count is 1)
    assert B.plan(vm, {"bind_to": "core"}, 1, 1, False, load.counts).cpus == [{0}]
    load.remove({0})
    assert load.counts == {1: 1}
    assert B.plan(vm, {}, 1, 1, False, load.counts).cpus == [{0}]


def test_other_jobs_load_spreads_a_job_but_never_unbinds_one_that_fits(vm, big):
    """Two ranks on two cores with other jobs' processes piled on core 0: the
    least-loaded rule must not put both ranks on core 1 and then drop the
    default binding as overloaded -- the job fits, so each rank gets a core
    of its own, as under a lone mpirun."""
    for policy in ({}, {"bind_to": "core"}):
        p = B.plan(vm, policy, 2, 2, False, {0: 2})
        assert p.cpus == [{1}, {0}] and not p.refusal, (policy, p)
        p = B.plan(vm, policy, 2, 2, False, {1: 5})
        assert p.cpus == [{0}, {1}] and not p.refusal, (policy, p)
    # the same on the big machine: eight cores on socket 0 loaded unevenly
    load = {c: 3 for c in range(0, 7)}
    p = B.plan(big, {}, 2, 2, False, load)
    assert len({min(c) for c in p.cpus}) == 2 and None not in p.cpus, p
    # a job that does not fit still overloads as before (own count only)
    assert B.plan(vm, {}, 3, 3, False, {0: 2}).cpus == [None] * 3


def test_cpu_set_binds_every_rank_to_it_whatever_bind_to_says(big):
    for extra in ({}, {"bind_to": "core"}, {"bind_to": "none"}):
        p = B.plan(big, {"cpu_set": [1, 9], **extra}, 2, 2, True)
        assert p.cpus == [{1, 9}, {1, 9}] and p.policy == "cpuset"
    p = B.plan(big, {"cpu_set": [3, 40]}, 1, 1, False, node="n")
    assert "40" in p.refusal and "cannot use" in p.refusal


def test_pe_takes_consecutive_cores_and_map_by_core_with_pe_is_refused(big, vm):
    p = B.plan(big, {"map_by": "slot", "pe": 2}, 2, 2, False)
    assert p.cpus == [{0, 8, 1, 9}, {2, 10, 3, 11}]
    p = B.plan(vm, {"map_by": "slot", "pe": 2}, 2, 2, False, node="vm")
    assert "Bind to:     CORE:IF-SUPPORTED" in p.refusal  # as mpirun: PE implies core
    assert "cpus-per-proc" in B.plan(vm, {"map_by": "core", "pe": 2}, 1, 1, False).refusal


def test_map_by_socket_binds_round_robin_over_sockets(big):
    p = B.plan(big, {"map_by": "socket", "bind_to": "core"}, 3, 3, False)
    assert p.cpus == [{0, 8}, {4, 12}, {1, 9}]
    assert B.plan(big, {"map_by": "socket"}, 2, 2, False).cpus == [
        big.objects("package")[0].cpus, big.objects("package")[1].cpus]
    p = B.plan(big, {"map_by": "ppr", "ppr": [2, "socket"], "bind_to": "core"}, 4, 4, False)
    assert p.cpus == [{0, 8}, {1, 9}, {4, 12}, {5, 13}]


def test_oversubscribes_reads_the_layout():
    assert B.oversubscribes({"nodes": {"a": [0, 1, 2]}, "slots": {"a": 2}})
    assert not B.oversubscribes({"nodes": {"a": [0, 1]}, "slots": {"a": 2}})
    assert not B.oversubscribes({"nodes": {"a": [0, 1]}, "slots": {"a": 0}})
    assert not B.oversubscribes(None)


# ----------------------------------------------------------------------
# what mpirun prints, what Open MPI is told
# ----------------------------------------------------------------------


def test_report_lines_in_mpiruns_shape(big, vm):
    p = B.plan(vm, {}, 2, 2, False)
    assert B.report_lines(vm, p, [0, 1], "vm", 7513) == [
        "[vm:07513] MCW rank 0 bound to socket 0[core 0[hwt 0]]: [B/.]",
        "[vm:07513] MCW rank 1 bound to socket 0[core 1[hwt 0]]: [./B]"]
    p = B.plan(big, {"bind_to": "core"}, 1, 1, False, {0: 1, 8: 1, 1: 1, 9: 1, 2: 1, 3: 1})
    assert B.report_lines(big, p, [5], "n1", 123456) == [
        "[n1:123456] MCW rank 5 bound to socket 1[core 4[hwt 0-1]]: "
        "[../../../..][BB/../../..]"]
    two = frozenset({0, 8, 1})
    assert B.describe(big, two) == "socket 0[core 0[hwt 0-1]], socket 0[core 1[hwt 0]]"
    assert B.map_string(big, two) == "[BB/B./../..][../../../..]"
    every = B.plan(vm, {"bind_to": "socket"}, 1, 1, False)
    assert B.report_lines(vm, every, [0], "vm", 1) == [
        "[vm:00001] MCW rank 0 is not bound (or bound to all available processors)"]
    assert B.report_lines(vm, B.plan(vm, {"bind_to": "none"}, 1, 1, False), [0], "vm", 1) == []


def test_locality_strings_as_open_mpi_4_1_registers_them(big, vm):
    # what mpirun registered on this VM's shape (PMIx_Get of PMIX_LOCALITY_STRING)
    assert B.locality_string(vm, frozenset({0})) == "SK0:L30:L20:L10:CR0:HT0:NM0"
    assert B.locality_string(vm, frozenset({1})) == "SK0:L30:L21:L11:CR1:HT1:NM0"
    assert B.locality_string(vm, frozenset({0, 1})) == "SK0:L30:L20-1:L10-1:CR0-1:HT0-1:NM0"
    assert B.locality_string(big, frozenset({4, 12})) == "SK1:L31:L24:L14:CR4:HT8-9:NM1"
    assert B.proc_environment() == {"OMPI_MCA_orte_bound_at_launch": "1"}
