"""The node's hardware topology, read from Linux sysfs, as binding needs it.

:func:`read` builds a :class:`Topology` once per node process from

* ``/sys/devices/system/cpu/online`` and ``cpuN/topology/`` (each CPU's
  package, ``physical_package_id``, and its core, ``thread_siblings_list``);
* ``cpuN/cache/indexK/`` (``level``, ``type``, ``shared_cpu_list``): the
  L1 data, L2 and L3 caches;
* ``/sys/devices/system/node/nodeN/cpulist``: the NUMA nodes (one holding
  every CPU when the kernel has no NUMA directory, as hwloc 2 always has one),

restricted to the CPUs the node process may use -- its affinity when it
starts (``os.sched_getaffinity(0)``): inside a Slurm step that is the step's
CPUs, and pydvm never binds a job process outside them.

Objects carry **logical indexes as hwloc numbers them** in a topology that
holds exactly those CPUs (hwloc drops the CPUs a cgroup disallows, and the
objects left empty, then numbers what is left in tree order): so the
``--report-bindings`` lines and the locality strings Open MPI is given say
``core 3`` where ``lstopo`` (and ``mpirun``) would.  Tree order: packages
by their first CPU, then inside each the caches, cores and hardware threads
in the order of their first CPU (``tests/runtime/test_binding.py`` checks
this against ``hwloc-calc`` on the machine running the tests).

Pure data once read: :mod:`pydvm.runtime.node.binding` computes the bindings
from it; nothing here binds anything.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

#: Object levels, outermost first (NUMA nodes sit apart, as in hwloc 2).
LEVELS = ("package", "l3cache", "l2cache", "l1cache", "core", "hwthread")


@dataclass(frozen=True)
class HwObject:
    """One object of the topology: its level (:data:`LEVELS` or ``"numa"``),
    hwloc logical index at that level and (usable) CPUs, as OS indexes."""

    level: str
    index: int
    cpus: frozenset[int]

    @property
    def first(self) -> int:
        return min(self.cpus)


@dataclass
class Topology:
    """A node's CPUs grouped by level (see the module docstring).

    ``cpus``: the usable CPUs; ``levels``: level -> objects in logical-index
    order (a level the machine lacks, such as an absent L3, is an empty list);
    ``numa``: the NUMA nodes."""

    cpus: frozenset[int]
    levels: dict[str, list[HwObject]] = field(default_factory=dict)
    numa: list[HwObject] = field(default_factory=list)

    def objects(self, level: str) -> list[HwObject]:
        """The objects of ``level`` (a :data:`LEVELS` name or ``"numa"``)."""
        return self.numa if level == "numa" else self.levels.get(level, [])

    def containing(self, level: str, cpu: int) -> HwObject | None:
        """The object of ``level`` that holds ``cpu`` (None if none does)."""
        for o in self.objects(level):
            if cpu in o.cpus:
                return o
        return None

    def counts(self) -> dict[str, int]:
        """How many objects of each kind the mapper counts
        (:data:`pydvm.placement.OBJECTS`: ``socket`` is the package level);
        a kind the machine does not describe counts as one."""
        return {"hwthread": max(1, len(self.objects("hwthread"))),
                "core": max(1, len(self.objects("core"))),
                "socket": max(1, len(self.objects("package"))),
                "numa": max(1, len(self.objects("numa"))),
                "l3cache": max(1, len(self.objects("l3cache")))}

    def summary(self) -> str:
        """``"1 package, 2 cores, 2 hwthreads, 1 numa, 1 l3cache"``-style."""
        parts = [f"{len(self.objects(lv))} {lv}" for lv in ("package", "core", "hwthread",
                                                               "numa", "l3cache")]
        return ", ".join(parts)


def parse_cpu_list(text: str) -> set[int]:
    """A kernel/hwloc CPU list (``"0-3,8,10-11"``) as a set; ``""`` is empty."""
    out: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def format_cpu_list(cpus) -> str:
    """The inverse of :func:`parse_cpu_list`: sorted, ranges collapsed (``"0-1,4"``)."""
    out: list[str] = []
    run: list[int] = []
    for c in sorted(cpus):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [c]
    if run:
        out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(out)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def read(sysfs: str = "/sys", allowed: set[int] | None = None) -> Topology:
    """The topology of this machine (``sysfs`` = the sysfs root, a fake tree
    in tests), restricted to ``allowed`` CPUs (default: this process's
    affinity).  Cost: a few small file reads per CPU, once."""
    if allowed is None:
        allowed = os.sched_getaffinity(0)
    cpu_dir = os.path.join(sysfs, "devices", "system", "cpu")
    online_text = _read(os.path.join(cpu_dir, "online"))
    if online_text is not None:
        online = parse_cpu_list(online_text)
    else:
        online = {int(d[3:]) for d in os.listdir(cpu_dir) if d[3:].isdigit()}
    usable = frozenset(c for c in online & set(allowed)
                       if os.path.isdir(os.path.join(cpu_dir, f"cpu{c}")))
    package_of: dict[int, int] = {}
    groups: dict[str, set[frozenset[int]]] = {lv: set() for lv in LEVELS}
    for c in sorted(usable):
        base = os.path.join(cpu_dir, f"cpu{c}")
        pkg = _read(os.path.join(base, "topology", "physical_package_id"))
        package_of[c] = int(pkg) if pkg not in (None, "") else -1
        sib = _read(os.path.join(base, "topology", "thread_siblings_list"))
        core = parse_cpu_list(sib) if sib else {c}
        groups["core"].add(frozenset((core | {c}) & usable))
        groups["hwthread"].add(frozenset({c}))
        cache_dir = os.path.join(base, "cache")
        try:
            indexes = sorted(d for d in os.listdir(cache_dir) if d.startswith("index"))
        except OSError:
            indexes = []
        for ix in indexes:
            d = os.path.join(cache_dir, ix)
            level, kind = _read(os.path.join(d, "level")), _read(os.path.join(d, "type"))
            if level not in ("1", "2", "3") or kind == "Instruction":
                continue  # hwloc keeps no instruction caches by default
            shared = _read(os.path.join(d, "shared_cpu_list"))
            members = (parse_cpu_list(shared) if shared else {c}) | {c}
            groups[f"l{level}cache"].add(frozenset(members & usable))
    for pkg in set(package_of.values()):
        groups["package"].add(frozenset(c for c, p in package_of.items() if p == pkg))
    return build(usable, groups, _numa_sets(sysfs, usable))


def _numa_sets(sysfs: str, usable: frozenset[int]) -> list[frozenset[int]]:
    node_dir = os.path.join(sysfs, "devices", "system", "node")
    sets = []
    try:
        names = [d for d in os.listdir(node_dir) if d.startswith("node") and d[4:].isdigit()]
    except OSError:
        names = []
    for d in sorted(names, key=lambda d: int(d[4:])):
        text = _read(os.path.join(node_dir, d, "cpulist"))
        cpus = frozenset(parse_cpu_list(text or "") & usable)
        if cpus:
            sets.append(cpus)
    return sets or [usable]


def build(usable: frozenset[int], groups: dict[str, set[frozenset[int]]],
          numa: list[frozenset[int]]) -> Topology:
    """Number the objects of each level in hwloc's tree order (see the module
    docstring): an object sorts after the first CPUs of the objects holding
    it, outermost first, then its own first CPU."""
    sets = {lv: [s for s in groups.get(lv, ()) if s] for lv in LEVELS}

    def key(level: str, s: frozenset[int]) -> tuple:
        k = []
        for outer in LEVELS[:LEVELS.index(level)]:
            holder = next((o for o in sets[outer] if s <= o), None)
            k.append(min(holder) if holder else -1)
        return (*k, min(s))

    levels = {lv: [HwObject(lv, i, s) for i, s in
                   enumerate(sorted(sets[lv], key=lambda s, lv=lv: key(lv, s)))]
              for lv in LEVELS}
    numas = [HwObject("numa", i, s) for i, s in enumerate(sorted(numa, key=min))]
    return Topology(frozenset(usable), levels, numas)
