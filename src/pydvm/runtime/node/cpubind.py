"""A node's binding shell: its topology, its live bindings, and applying one at a spawn.

:class:`NodeBinding` belongs to a :class:`~pydvm.runtime.node.server.NodeServer`.
It notes the node process's CPU affinity when the node starts (inside a
Slurm step: the step's CPUs), reads the topology from sysfs once, on the
first launch (:mod:`pydvm.runtime.node.topology`), and for each launch asks the
pure policy (:func:`pydvm.runtime.node.binding.plan`) for the ranks' CPU sets.

Applying a set needs no Python between fork and exec: :meth:`applied` sets
the *calling thread's* affinity (``sched_setaffinity(0)`` is per thread on
Linux) right before ``jobproc.start`` and restores it right after; the
child inherits it through ``vfork``/``exec`` and ``setpriv``.  Other threads
of the node process (libpmix's) are untouched, and nothing else runs on the
loop's thread in between.

What Open MPI is told, as ``mpirun`` tells it: a bound rank's environment
gets ``OMPI_MCA_orte_bound_at_launch=1`` and PMIx gets its ``PMIX_CPUSET``
(the CPU list) and ``PMIX_LOCALITY_STRING`` (Open MPI 4.1's
``SK0:L30:L20:L10:CR0:HT0:NM0`` form) -- so ``MPI_Init`` takes the binding
as done, skips the hardware topology and computes its peers' locality from
the strings.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..shared.guard import pid_alive
from . import binding
from .topology import Topology, format_cpu_list, read


@dataclass
class LaunchBinding:
    """One launch's bindings on a node: ``cpus`` per rank (None: unbound),
    ``refusal`` (non-empty: do not start), ``report`` (the
    ``--report-bindings`` lines, when asked for), ``pmix`` (rank -> its
    PMIX_CPUSET and PMIX_LOCALITY_STRING items)."""

    cpus: dict[int, frozenset[int] | None] = field(default_factory=dict)
    refusal: str = ""
    report: list[str] = field(default_factory=list)
    pmix: dict[int, list[tuple[str, str]]] = field(default_factory=dict)

    def environment(self, rank: int) -> dict[str, str]:
        """What rank ``rank``'s environment gets for its binding."""
        return binding.proc_environment() if self.cpus.get(rank) is not None else {}


class SharedLoad:
    """The bound-CPU counts of every pydvm node process of this user on this
    machine, one small file each in a directory of /dev/shm: co-located
    nodes (local daemons, network-namespace hosts) and other DVMs on the
    machine each see what the others bound, and spread their ranks instead
    of all taking core 0.  Best effort: any error leaves only this node's
    own counts; the file of a process that died is removed by the next
    reader.  ``PYDVM_CPULOAD_DIR`` in the node process's environment names
    another directory: node processes sharing it see each other (tests give
    each DVM its own, so that what other tests bound does not move its ranks).

    Every read and write happens under the directory's lock, so an entry is
    rewritten in place (one descriptor kept open: a write and a truncate per
    change) and the list of entries is read again only when the directory
    changed (an entry came or went) or a second has passed: a node alone on
    its machine pays a ``stat`` per launch, not a listing and a rename.
    """

    #: seconds after which the entries are listed again even if the
    #: directory did not change (an entry's process may have died)
    RELIST = 1.0

    def __init__(self, tag: str) -> None:
        base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        self.dir = (os.environ.get("PYDVM_CPULOAD_DIR")
                    or os.path.join(base, f"pydvm-cpuload-{os.geteuid()}"))
        safe = "".join(ch if ch.isalnum() or ch in "._" else "_" for ch in tag)
        self.name = f"{os.getpid()}-{safe}"
        self._lock_fd = -1   # the lock file, opened on first use and kept
        self._fd = -1        # this process's entry, once it has one
        #: the other entries' names, the directory's mtime when they were
        #: listed, and when
        self._peers: list[str] = []
        self._listed: tuple[int, float] | None = None

    @contextmanager
    def locked(self):
        """Hold the machine-wide lock (read, decide, publish: one step)."""
        held = False
        try:
            if self._lock_fd < 0:
                os.makedirs(self.dir, mode=0o700, exist_ok=True)
                self._lock_fd = os.open(os.path.join(self.dir, ".lock"),
                                        os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            held = True
        except OSError:
            pass
        try:
            yield
        finally:
            if held:
                try:
                    fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
                except OSError:
                    pass

    def close(self) -> None:
        """Close the kept lock file and remove this process's entry."""
        if self._fd >= 0:
            _unlink(os.path.join(self.dir, self.name))
            os.close(self._fd)
            self._fd = -1
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _peer_names(self) -> list[str]:
        """The other live entries (listed again when the directory changed,
        or after :data:`RELIST`; a dead process's entry is removed)."""
        try:
            st = os.stat(self.dir)
        except OSError:
            return []
        now = time.monotonic()
        # a directory's mtime moves in clock ticks: one that changed in the
        # last 50 ms may change again without moving it -- list then anyway
        if self._listed is not None and self._listed[0] == (st.st_mtime_ns, st.st_size) \
                and now - self._listed[1] < self.RELIST \
                and time.time_ns() - st.st_mtime_ns > 50_000_000:
            return self._peers
        try:
            names = os.listdir(self.dir)
        except OSError:
            return []
        peers = []
        for name in names:
            if name == self.name or name.startswith(".") or name.endswith(".tmp"):
                continue
            pid = name.split("-", 1)[0]
            if not pid.isdigit() or not pid_alive(int(pid)):
                _unlink(os.path.join(self.dir, name))
                continue
            peers.append(name)
        try:
            st = os.stat(self.dir)  # after the removals
        except OSError:
            pass
        self._peers, self._listed = peers, ((st.st_mtime_ns, st.st_size), now)
        return peers

    def others(self) -> dict[int, int]:
        """CPU -> processes bound to it by the other live node processes."""
        total: dict[int, int] = {}
        for name in self._peer_names():
            try:
                with open(os.path.join(self.dir, name), "rb") as f:
                    counts = json.loads(f.read() or b"{}")
                for cpu, n in counts.items():
                    total[int(cpu)] = total.get(int(cpu), 0) + int(n)
            except (OSError, ValueError, AttributeError):
                continue
        return total

    def publish(self, counts: dict[int, int]) -> None:
        """Make ``counts`` this process's entry (under the lock: rewritten in place)."""
        if self._fd < 0 and not counts:
            return
        try:
            if self._fd < 0:
                os.makedirs(self.dir, mode=0o700, exist_ok=True)
                self._fd = os.open(os.path.join(self.dir, self.name),
                                   os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            # json.dumps (the C encoder) and one write
            data = json.dumps({str(c): n for c, n in counts.items()}).encode()
            os.pwrite(self._fd, data, 0)
            os.ftruncate(self._fd, len(data))
        except OSError:
            pass


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class NodeBinding:
    """Topology, live bound-CPU counts and the affinity switch of one node.

    A launch's bindings are counted from the moment they are planned (so a
    co-located node planning meanwhile sees them) until the process is
    reaped (:meth:`release`) or its job is cleaned up (:meth:`release_job`:
    ranks that never started).  Each publishes this node's counts at once,
    under the machine-wide lock: a job started on a co-located node right
    after another ended sees its CPUs free."""

    def __init__(self, node: str) -> None:
        self.node = node
        #: the CPUs this node process may use (its affinity at start).
        self.allowed = frozenset(os.sched_getaffinity(0))
        self._topology: Topology | None = None
        #: CPU -> live (or about to start) processes this node bound to it.
        self.load = binding.CpuLoad()
        #: nspace -> rank -> its CPUs, while counted in :attr:`load`.
        self._held: dict[str, dict[int, frozenset[int]]] = {}
        self.shared = SharedLoad(node)
        #: CPU set -> its PMIX_CPUSET and PMIX_LOCALITY_STRING items (the
        #: topology never changes: a node binds to a few sets over and over)
        self._pmix_items: dict[frozenset[int], list[tuple[str, str]]] = {}

    @property
    def topology(self) -> Topology:
        """The node's topology (read on first use, within :attr:`allowed`)."""
        if self._topology is None:
            self._topology = read(allowed=set(self.allowed))
        return self._topology

    def plan(self, msg: dict, procs: list[dict]) -> LaunchBinding:
        """The bindings of a ``launch`` message's processes on this node,
        counted in the load at once."""
        from ...pmix import constants as C

        placement = msg.get("placement") or {}
        layout = msg.get("pmix") or {}
        ns = msg.get("nspace")
        ranks = [p["rank"] for p in procs]
        size = msg.get("job_size") if isinstance(msg.get("job_size"), int) else len(ranks)
        topo = self.topology
        with self.shared.locked():
            load = self.shared.others()
            for cpu, n in self.load.counts.items():
                load[cpu] = load.get(cpu, 0) + n
            p = binding.plan(topo, placement, len(ranks), size, binding.oversubscribes(layout),
                             load, self.node)
            out = LaunchBinding(dict(zip(ranks, p.cpus)), p.refusal)
            if p.refusal:
                return out
            for rank, cpus in out.cpus.items():
                if cpus is not None:
                    self.load.add(cpus)
                    self._held.setdefault(ns, {})[rank] = cpus
            if p.bound:
                self.shared.publish(self.load.counts)
        if placement.get("report_bindings"):
            out.report = binding.report_lines(topo, p, ranks, self.node, os.getpid())
        for rank, cpus in out.cpus.items():
            if cpus is not None:
                items = self._pmix_items.get(cpus)
                if items is None:
                    if len(self._pmix_items) >= 4096:
                        self._pmix_items.clear()
                    items = self._pmix_items[cpus] = [
                        (C.CPUSET, format_cpu_list(cpus)),
                        (C.LOCALITY_STRING, binding.locality_string(topo, cpus))]
                out.pmix[rank] = items
        return out

    def release(self, nspace: str, rank: int) -> None:
        """``nspace:rank`` was reaped: its CPUs count no more."""
        held = self._held.get(nspace)
        cpus = held.pop(rank, None) if held is not None else None
        if held is not None and not held:
            del self._held[nspace]
        if cpus is not None:
            self.load.remove(cpus)
            with self.shared.locked():
                self.shared.publish(self.load.counts)

    def close(self) -> None:
        """The node is stopping: it binds nothing any more (its entry goes)."""
        self.shared.close()

    def release_job(self, nspace: str) -> None:
        """Job ``nspace`` is over here: what its ranks still held (ranks that
        never started) counts no more."""
        for rank in list(self._held.get(nspace, ())):
            self.release(nspace, rank)

    @contextmanager
    def applied(self, cpus: frozenset[int] | None):
        """While inside, this thread runs on ``cpus`` (nothing if None):
        wrap the spawn of a process that is to be bound to them."""
        if cpus is None:
            yield
            return
        os.sched_setaffinity(0, cpus)
        try:
            yield
        finally:
            os.sched_setaffinity(0, self.allowed)
