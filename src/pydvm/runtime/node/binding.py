"""Binding a job's processes to CPUs as ``mpirun`` (Open MPI 4.1) does: the pure policy.

:func:`plan` takes a node's :class:`~pydvm.runtime.node.topology.Topology`, the
job's placement (the run request's ``placement``: ``bind_to``, ``overload``,
``pe``, ``cpu_set``, ``use_hwthread_cpus``, ``map_by``, ``ppr``), how many of
its ranks run on this node, the job's size, whether the job oversubscribes
any of its nodes, and how many processes of *other* jobs are bound to each
CPU of the node; it returns each local rank's CPU set, or a refusal worded
as ``mpirun``'s.  No I/O: the node (:mod:`pydvm.runtime.node.server`) applies the
sets between fork and exec without Python (the calling thread's affinity,
inherited by the child) and tells Open MPI what it did.

``mpirun``'s rules, as pydvm applies them (each checked against ``mpirun``
4.1.4 on the machine running ``tests/e2e/test_binding_e2e.py``):

* **Default policy** (no ``--bind-to``): ``core`` when the job has at most
  two processes (``hwthread`` with ``--use-hwthread-cpus``), else ``numa``
  (hwloc 2 always has a NUMA node; ``socket`` only where there is none);
  with ``--map-by`` an object level (``core``, ``socket``...) the binding is
  that level; with ``:PE=n``, ``core`` as if given.  A default binding that
  would put more processes on an object than it has cores is dropped for
  the node (the ranks float, nothing reported); a job that oversubscribes
  any node (more ranks than slots, the layout's ``slots``) is not bound by
  default at all.
* **Explicit** ``--bind-to X``: bound even when oversubscribed; more
  processes on an object than it has cores is refused (the message says
  how to allow it) unless ``:overload-allowed``.  ``--bind-to none``:
  nothing bound, nothing reported.
* ``--cpu-set``/``--cpu-list``: every rank bound to the whole set, whatever
  ``--bind-to`` says (``mpirun`` 4.1 does so too); a CPU of the set the node
  cannot use is refused (``mpirun`` silently launches nothing).
* ``:PE=n``: ``n`` consecutive objects per rank (cores, or hardware threads
  with ``--use-hwthread-cpus``); ``--map-by core|hwthread:PE=n`` is refused
  as ``mpirun`` refuses it.
* Which object: each rank takes the **least-loaded** object of the level
  (ties: the lowest index) within its mapping locale (``--map-by socket``:
  rank i's round-robin socket; ``ppr:N:socket``: N per socket; otherwise the
  whole node).  The load of an object counts this job's ranks already
  placed on it plus the most processes of other running jobs bound to any
  of its CPUs -- so two 1-rank jobs on a persistent DVM take core 0 and core
  1, where two ``mpirun``\\ s would both take core 0.  The overload check
  counts this job's ranks only, as a lone ``mpirun`` job would, and the
  choice prefers objects with room for another rank of this job: a job that
  fits the node is bound as a lone ``mpirun`` job would be, however unevenly
  other jobs loaded it.

**Plain (non-MPI) jobs are bound as MPI jobs are**: ``mpirun`` binds every
process it starts, and a node cannot tell an MPI program from another
before it runs; a job script moved from ``mpirun`` keeps its placement.
``--bind-to none`` lets a multithreaded program (numpy, PyTorch's
intra-op threads) use every CPU of the node, as it would under ``mpirun``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from .topology import HwObject, Topology, format_cpu_list

#: --bind-to / --map-by names -> topology level.
LEVEL_OF = {"hwthread": "hwthread", "core": "core", "l1cache": "l1cache", "l2cache": "l2cache",
            "l3cache": "l3cache", "socket": "package", "package": "package", "numa": "numa"}
#: how mpirun names a binding policy in its messages.
SHOUT = {"hwthread": "HWTHREAD", "core": "CORE", "l1cache": "L1CACHE", "l2cache": "L2CACHE",
         "l3cache": "L3CACHE", "socket": "SOCKET",
         "package": "SOCKET", "numa": "NUMA", "none": "NONE"}
#: the locality-string tag of each level, in Open MPI's order (NUMA last).
LOCALITY_TAGS = (("package", "SK"), ("l3cache", "L3"), ("l2cache", "L2"), ("l1cache", "L1"),
                 ("core", "CR"), ("hwthread", "HT"), ("numa", "NM"))


@dataclass
class Plan:
    """The bindings of a job's ranks on one node.

    ``cpus``: per local rank (in the order given), its CPU set or None
    (unbound); ``policy``: what was applied -- ``"none"`` or a ``--bind-to``
    name, or ``"cpuset"``; ``available``: the CPUs the job may use here (a
    rank bound to all of them is reported "not bound", as by ``mpirun``);
    ``refusal``: non-empty when the job must not start here."""

    cpus: list[frozenset[int] | None]
    policy: str = "none"
    available: frozenset[int] = frozenset()
    refusal: str = ""

    @property
    def bound(self) -> bool:
        return any(c is not None for c in self.cpus)


@dataclass
class CpuLoad:
    """How many live processes are bound to each CPU (the node's count for
    the least-loaded rule): :meth:`add` when a bound process starts,
    :meth:`remove` when it is reaped."""

    counts: dict[int, int] = field(default_factory=dict)

    def add(self, cpus) -> None:
        for c in cpus:
            self.counts[c] = self.counts.get(c, 0) + 1

    def remove(self, cpus) -> None:
        for c in cpus:
            n = self.counts.get(c, 0) - 1
            if n > 0:
                self.counts[c] = n
            else:
                self.counts.pop(c, None)


def oversubscribes(layout: Mapping | None) -> bool:
    """Whether a job layout (``ProcessTable.layout``: ``nodes``, ``slots``)
    puts more ranks on some node than its slots (0: unknown, never counted)."""
    if not layout:
        return False
    slots = layout.get("slots") or {}
    for node, ranks in (layout.get("nodes") or {}).items():
        s = slots.get(node) or 0
        if isinstance(s, int) and s > 0 and len(ranks) > s:
            return True
    return False


def _overload_text(policy: str, node: str, nprocs: int, ncpus: int) -> str:
    return (f"A request was made to bind to that would result in binding more processes "
            f"than cpus on a resource:\n\n   Bind to:     {policy}\n   Node:        {node}\n"
            f"   #processes:  {nprocs}\n   #cpus:       {ncpus}\n\n"
            "You can override this protection by adding the \"overload-allowed\" option to "
            "your binding directive (--bind-to core:overload-allowed), or bind to none "
            "(--bind-to none).")


def _policy(placement: Mapping, job_size: int, topo: Topology) -> tuple[str, bool]:
    """(binding level name or "none", whether it counts as requested)."""
    bind_to = placement.get("bind_to")
    if bind_to:
        return str(bind_to), True
    hwt = bool(placement.get("use_hwthread_cpus"))
    pe = placement.get("pe") or 1
    if isinstance(pe, int) and pe > 1:
        return ("hwthread" if hwt else "core"), True
    map_by = placement.get("map_by")
    if map_by in LEVEL_OF:
        return str(map_by), False
    if job_size <= 2:
        return ("hwthread" if hwt else "core"), False
    if topo.numa:
        return "numa", False
    return ("socket" if topo.objects("package") else "none"), False


def _ncpus(obj: HwObject, topo: Topology, hwt: bool) -> int:
    """What the overload check counts in ``obj``: its cores (hardware
    threads with ``--use-hwthread-cpus``; a hardware thread counts one)."""
    if hwt or obj.level == "hwthread":
        return len(obj.cpus)
    return sum(1 for c in topo.objects("core") if c.cpus & obj.cpus) or 1


def plan(topo: Topology, placement: Mapping | None, nlocal: int, job_size: int,
         oversubscribed: bool, load: Mapping[int, int] | None = None,
         node: str = "") -> Plan:
    """The bindings of ``nlocal`` ranks of a job of ``job_size`` on this node
    (see the module docstring for the rules).  ``load``: CPU -> processes of
    other jobs bound to it; ``node``: the node's name, for the messages."""
    placement = placement or {}
    load = load or {}
    unbound = [None] * nlocal
    cpu_set = placement.get("cpu_set")
    if cpu_set:
        wanted = {int(c) for c in cpu_set}
        missing = wanted - topo.cpus
        if missing:
            return Plan(unbound, refusal=(
                f"{node}: --cpu-set names cpus {format_cpu_list(missing)} which this node "
                f"cannot use (it may use {format_cpu_list(topo.cpus)})"))
        avail = frozenset(wanted)
        return Plan([avail] * nlocal, "cpuset", avail)
    avail = topo.cpus
    policy, requested = _policy(placement, job_size, topo)
    if policy == "none" or nlocal == 0:
        return Plan(unbound, "none", avail)
    if not requested and oversubscribed:
        return Plan(unbound, "none", avail)
    if policy not in LEVEL_OF:
        return Plan(unbound, refusal=f"{node}: unknown binding {policy!r}")
    hwt = bool(placement.get("use_hwthread_cpus"))
    pe = placement.get("pe") or 1
    map_by = placement.get("map_by")
    if pe > 1 and map_by in ("core", "hwthread"):
        return Plan(unbound, refusal=(
            f"A request for multiple cpus-per-proc (:PE={pe}) was given, but a directive was "
            f"also given to map to an object level that cannot support that directive "
            f"(--map-by {map_by}): map by slot, socket or numa, or let pydvm choose."))
    objs = topo.objects(LEVEL_OF[policy])
    if not objs:
        if not requested:
            return Plan(unbound, "none", avail)
        return Plan(unbound, refusal=(f"{node}: no objects of the type to bind to "
                                      f"({policy}) were found on this node"))
    locales = _locales(topo, placement, nlocal)
    own = [0] * len(objs)
    caps = [_ncpus(o, topo, hwt) for o in objs]
    other = [max((load.get(c, 0) for c in o.cpus), default=0) for o in objs]
    overload = bool(placement.get("overload"))
    shout = SHOUT[policy] + ("" if placement.get("bind_to") else ":IF-SUPPORTED")
    cpus: list[frozenset[int] | None] = []
    for i in range(nlocal):
        locale = locales[i] if locales else None
        choices = [k for k, o in enumerate(objs) if locale is None or o.cpus & locale]
        if not choices:
            return Plan(unbound, refusal=f"{node}: no cpus available to bind rank {i} to")
        # other jobs' load only orders the objects: one with room for another
        # of this job's ranks comes first, so a job that fits is never
        # dropped (or refused) as overloaded because others piled up elsewhere
        roomy = [k for k in choices if own[k] < caps[k]] or choices
        k = min(roomy, key=lambda k: (own[k] + other[k], k))
        got: set[int] = set()
        total = 0
        while True:
            own[k] += 1
            n = caps[k]
            if n < own[k] and not overload:
                if requested:
                    return Plan(unbound, refusal=_overload_text(shout, node, own[k], n))
                return Plan(unbound, "none", avail)  # mpirun's default: just don't bind
            got |= objs[k].cpus
            total += n
            if total >= pe:
                break
            k += 1
            if k >= len(objs):
                return Plan(unbound, refusal=(
                    f"{node}: not enough cpus to give each process {pe} (:PE={pe})"))
        cpus.append(frozenset(got))
    return Plan(cpus, policy, avail)


def _locales(topo: Topology, placement: Mapping, nlocal: int) -> list[frozenset[int]] | None:
    """Each local rank's mapping locale (the CPUs of the object ``--map-by``
    put it on), or None: the whole node."""
    map_by = placement.get("map_by")
    per = 1
    if map_by == "ppr":
        ppr = placement.get("ppr") or [1, "node"]
        per, map_by = int(ppr[0]) or 1, ppr[1]
    if map_by not in LEVEL_OF:
        return None
    objs = topo.objects(LEVEL_OF[map_by])
    if not objs:
        return None
    return [objs[(i // per) % len(objs)].cpus for i in range(nlocal)]


# ----------------------------------------------------------------------
# what mpirun prints, and what Open MPI is told
# ----------------------------------------------------------------------


def _ranges(bits: list[int]) -> str:
    return format_cpu_list(bits)


def describe(topo: Topology, cpus: frozenset[int]) -> str:
    """``socket 0[core 1[hwt 0-1]], socket 0[core 2[hwt 0]]`` (Open MPI's
    ``cset2str``): per core holding one of ``cpus``, its package's and its
    own logical index and which of its hardware threads (by rank in the core)."""
    parts = []
    for core in topo.objects("core"):
        if not core.cpus & cpus:
            continue
        pkg = topo.containing("package", core.first)
        threads = [o for o in topo.objects("hwthread") if o.cpus <= core.cpus]
        ranks = [j for j, t in enumerate(threads) if t.cpus & cpus]
        parts.append(f"socket {pkg.index if pkg else 0}[core {core.index}[hwt {_ranges(ranks)}]]")
    return ", ".join(parts)


def map_string(topo: Topology, cpus: frozenset[int]) -> str:
    """``[B./..][../..]`` (Open MPI's ``cset2mapstr``): per package, its cores
    separated by ``/``, each hardware thread ``B`` if in ``cpus`` else ``.``."""
    out = []
    cores = topo.objects("core")
    threads = topo.objects("hwthread")
    for pkg in topo.objects("package"):
        inner = []
        for core in (c for c in cores if c.cpus <= pkg.cpus):
            inner.append("".join("B" if t.cpus & cpus else "." for t in threads
                                 if t.cpus <= core.cpus))
        out.append("[" + "/".join(inner) + "]")
    return "".join(out)


def report_lines(topo: Topology, plan_: Plan, ranks: list[int], host: str,
                 pid: int) -> list[str]:
    """``mpirun --report-bindings``'s lines for these ranks (``plan_.cpus``
    order), prefixed ``[host:pid]`` -- the pid of the process that launched
    them, zero-padded to 5 digits, as ``mpirun``'s daemon prints its own.
    Nothing for a job not bound here (``--bind-to none``, or mpirun's default
    dropped); a rank bound to every CPU it may use is "not bound"."""
    if plan_.policy == "none":
        return []
    out = []
    for rank, cpus in zip(ranks, plan_.cpus):
        head = f"[{host}:{pid:05d}] MCW rank {rank}"
        if cpus is None or plan_.available <= cpus:
            out.append(f"{head} is not bound (or bound to all available processors)")
        else:
            out.append(f"{head} bound to {describe(topo, cpus)}: {map_string(topo, cpus)}")
    return out


def locality_string(topo: Topology, cpus: frozenset[int]) -> str:
    """``SK0:L30:L20:L10:CR0:HT0:NM0``: for each level Open MPI 4.1 names, the
    logical indexes of the objects ``cpus`` touches (as ``mpirun`` registers
    ``PMIX_LOCALITY_STRING``; Open MPI computes peers' locality from it)."""
    parts = []
    for level, tag in LOCALITY_TAGS:
        hit = [o.index for o in topo.objects(level) if o.cpus & cpus]
        if hit:
            parts.append(f"{tag}{format_cpu_list(hit)}")
    return ":".join(parts)


def proc_environment() -> dict[str, str]:
    """What a bound rank's environment gets (as under ``mpirun``): Open MPI
    then takes its binding as done and reads its locality from PMIx."""
    return {"OMPI_MCA_orte_bound_at_launch": "1"}
