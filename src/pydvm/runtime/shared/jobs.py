"""Jobs, applications, processes and sessions as the master tracks them.

Pure bookkeeping, no I/O: the master feeds it process terminations and asks
it which lifetimes ended as a result.  :meth:`JobRecord.proc_ended` is the
one place where the per-application termination count lives -- the piece of
accounting the data store's APP horizon depends on -- and where a job's
failures are recorded for its ``pydvm run`` to report:

* a process that ends non-zero (or by a signal) while its job has not been
  killed **failed on its own**: its rank goes into ``failures``, in the
  order the master learned of them, so the first entry is the process
  whose status the job exits with;
* a process that had been started and ends after its job was killed
  (``pydvm kill``, ``session end``, ``stop``, ``--abort-on-failure``, a
  lost node, a launch error) counts in ``killed_procs`` only: the one line
  naming who ended the job (``kill_reason``) explains all of them;
* a process that called ``PMIx_Init`` and ended without ``PMIx_Finalize``
  ended abnormally whatever its status: with status 0 it fails, and the
  job's status is 1 (as under ``mpirun``);
* a process ended on request while it ran (``PMIx_Job_control``: its
  ``ended_by``) did not fail, whatever its status (as under ``mpirun`` and
  PRRTE); its rank goes into ``ended_on_request`` for the report.

Whether a failure ends the whole job is :meth:`JobRecord.ends_at_failure`:
always with ``--abort-on-failure``, never with ``--no-abort-on-failure``,
and by default when the job was run with ``--pmix`` or ``--mpi pmi1`` or
the process that failed had connected to PMIx or PMI-1 (``pmix`` then says
``connected``) -- an MPI job, which ``mpirun`` would end.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ... import placement as PL
from ...protocol import parse_host_list


#: What a job its time limit ended exits with: ``mpirun --timeout``'s status
#: (ETIMEDOUT), which scripts written for it test.
TIMEOUT_STATUS = 110


@dataclass(frozen=True)
class HostSpec:
    name: str
    slots: int = 1
    #: a hostfile's ``max_slots``: never more of a job's ranks here (None: no limit).
    max_slots: int | None = None


def parse_hosts(text: str) -> list[HostSpec]:
    """Parse ``h1,h2:4,...`` into host specs (one slot unless given); the
    syntax is :func:`pydvm.protocol.parse_host_list`'s (``pydvm run`` reads
    it without loading the runtime)."""
    return [HostSpec(name, slots) for name, slots in parse_host_list(text)]


def map_app(n: int, hosts: list[HostSpec]) -> list[str]:
    """Node of each of an app's ``n`` ranks (in rank order), mapped as a job
    without placement options is (SPEC 9): ranks fill the hosts in the
    order listed, one slot at a time (all of a host's slots before the
    next), wrapping around to the first host when every slot is used --
    oversubscription is allowed.  :func:`pydvm.placement.map_job` has the
    rest of ``mpirun``'s policies."""
    return PL.map_job([(n, [PL.Host(h.name, h.slots, h.max_slots) for h in hosts])], {})[0]


class ProcState(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    ENDED = "ended"


@dataclass
class ProcRecord:
    rank: int
    app_idx: int
    node: str
    state: ProcState = ProcState.PENDING
    #: the status the job accounts for it: the exit code, 128+N for signal N.
    exit_status: int | None = None
    #: the signal that ended it (0: it exited, or we do not know).
    signal: int = 0
    #: what it did with PMIx, as its node saw it: None, "connected"
    #: (PMIx_Init) or "finalized" (PMIx_Finalize too).
    pmix: str | None = None
    #: who asked for it to be ended while it ran (PMIx_Job_control), in
    #: words; its end is then no failure.
    ended_by: str = ""

    @property
    def unfinalized(self) -> bool:
        """It connected to PMIx and ended without finalizing."""
        return self.pmix == "connected"


@dataclass
class AppRecord:
    idx: int
    argv: list[str]
    ranks: list[int]
    terminated: int = 0
    #: working directory its processes start in (the submitter's, or a spawn's).
    cwd: str = ""

    @property
    def done(self) -> bool:
        return self.terminated == len(self.ranks)


@dataclass
class JobRecord:
    """One job.  ``procs`` by rank; ranks numbered across the whole job."""

    nspace: str
    session_id: int
    apps: list[AppRecord]
    procs: dict[int, ProcRecord]
    terminated: int = 0
    #: exit status of the first process to end with a non-zero status.
    first_failure: int | None = None
    #: human-readable reason the job failed (launch error, lost node...).
    error: str = ""
    killed: bool = False
    #: who or what killed the job, in words (the first reason given wins).
    kill_reason: str = ""
    #: kill the rest of the job at the first failure: True
    #: (``--abort-on-failure``), False (``--no-abort-on-failure``), None (the
    #: default: see :meth:`ends_at_failure`).
    abort_on_failure: bool | None = None
    #: run with ``--pmix`` (every node hosts PMIx): an MPI job.
    pmix_required: bool = False
    #: the interface its processes get (``--mpi``): ``auto`` (each node reads
    #: it off the programs: pydvm/pmi1/detect.py), ``pmix``, ``pmi1``, ``none``.
    mpi: str = "auto"
    #: a job spawned over PMI-1: the pairs its key-value space starts with.
    preput: dict[str, str] = field(default_factory=dict)
    #: ranks that failed on their own, in the order their ends were learned.
    failures: list[int] = field(default_factory=list)
    #: processes that had started and ended after the job was killed.
    killed_procs: int = 0
    #: ranks ended on request (their ``ended_by``), in the order asked.
    ended_on_request: list[int] = field(default_factory=list)
    #: the submitting user; the job's processes run as them.
    uid: int | None = None
    gid: int | None = None
    #: wall-clock time of submission (display only: ``pydvm ps``).
    started: float = 0.0
    #: the process that spawned it (PMIx_Spawn), if any.
    parent: tuple[str, int] | None = None
    #: its processes stop in PMIx_Init until released (``--stop-in-init``,
    #: ``PMIX_DEBUG_STOP_IN_INIT``: runtime/master/debugging.py); ``released`` once
    #: the release went out; ``debug_ready``: the nodes where its processes
    #: said they wait (libpmix tells no more: runtime/master/debugging.py).
    stop_in_init: bool = False
    released: bool = False
    debug_ready: set[str] = field(default_factory=set)
    #: ranks released one by one (a debugger daemon releases its node's).
    released_ranks: set[int] = field(default_factory=set)
    #: debugger daemons (PMIX_DEBUG_TARGET of their spawn): the process(es)
    #: they debug, (nspace, rank or WILDCARD); in their job-level info.
    debug_target: tuple[str, int] | None = None
    #: its pydvm run forwards its stdin (what is in flight is the master's
    #: job streams' to count: runtime/master/jobstreams.py).
    stdin: bool = False
    #: the rank that reads it (``--stdin N``; 0 as under mpirun) ...
    stdin_rank: int = 0
    #: ... or every rank (``--stdin all``).
    stdin_all: bool = False
    #: how the job was placed and is to be bound, as its ``pydvm run`` asked
    #: (``placement`` of the run request, :mod:`pydvm.placement`); every
    #: node gets it with its share of the launch.
    placement: dict = field(default_factory=dict)
    #: end the job after this many seconds (``--timeout``); None: no limit.
    timeout: float | None = None
    #: its time limit ended it (it exits with :data:`TIMEOUT_STATUS`).
    timed_out: bool = False
    #: node -> the slots the job was given there (its apps' hosts: ``--host
    #: a:2``, a hostfile, else the DVM's); a node running more of its ranks
    #: is oversubscribed.  Empty: the session's (a record built by hand).
    slots: dict[str, int] = field(default_factory=dict)
    #: its processes' stdout and stderr go to /dev/null on their nodes (a
    #: ``run`` with ``output: "discard"``): nothing is forwarded.
    discard_output: bool = False
    #: lines ``--display-allocation`` / ``--display-map`` print before launch.
    display: list[str] = field(default_factory=list)
    #: node -> its ranks, in rank order (made by :func:`build_job`; a record
    #: built by hand gets it on first use).
    _by_node: dict[str, list[int]] | None = field(default=None, repr=False)

    def ranks_on(self, node: str) -> list[int]:
        """The job's ranks on ``node`` (without scanning every process)."""
        return self.by_node().get(node, [])

    def by_node(self) -> dict[str, list[int]]:
        if self._by_node is None:
            by: dict[str, list[int]] = {}
            for r in sorted(self.procs):
                by.setdefault(self.procs[r].node, []).append(r)
            self._by_node = by
        return self._by_node

    @property
    def size(self) -> int:
        return len(self.procs)

    @property
    def done(self) -> bool:
        return self.terminated == self.size

    @property
    def exit_status(self) -> int:
        """The first failure's status; :data:`TIMEOUT_STATUS` for a job its
        time limit ended (as ``mpirun --timeout``)."""
        if self.timed_out:
            return TIMEOUT_STATUS
        return self.first_failure or 0

    @property
    def is_mpi(self) -> bool:
        """Run with ``--pmix`` or ``--mpi pmi1``, or one of its ended processes
        had used PMIx or PMI-1."""
        return self.pmix_required or self.mpi == "pmi1" or any(p.pmix for p in self.procs.values())

    def ends_at_failure(self, rank: int) -> bool:
        """Whether the failure of ``rank`` ends the whole job (module docstring)."""
        if self.abort_on_failure is not None:
            return self.abort_on_failure
        return self.pmix_required or self.mpi == "pmi1" or self.procs[rank].pmix is not None

    def nodes(self) -> set[str]:
        return set(self.by_node())

    @property
    def state(self) -> str:
        """One word for ``pydvm ps``: ``starting`` (some process not yet
        launched), ``running``, ``stopped`` (started stopped in PMIx_Init and
        not yet released), ``killing`` (killed, processes still ending) or
        ``ending`` (every process ended; its purges are being applied)."""
        if self.done:
            return "ending"
        if self.killed:
            return "killing"
        if any(p.state is ProcState.PENDING for p in self.procs.values()):
            return "starting"
        if self.stop_in_init and not self.released:
            return "stopped"
        return "running"

    def ranks_per_node(self) -> dict[str, int]:
        """How many of the job's ranks each node runs, nodes in first-rank order."""
        out: dict[str, int] = {}
        for r in sorted(self.procs):
            node = self.procs[r].node
            out[node] = out.get(node, 0) + 1
        return out

    def proc_ended(self, rank: int, status: int, signal: int = 0,
                   launched: bool = True, pmix: str | None = None) -> tuple[bool, bool]:
        """Record that ``rank`` ended with ``status`` (``signal``: the signal
        that ended it, 0 if none or unknown; ``launched``: False for a
        process its node never started; ``pmix``: what it did with PMIx).
        See the module docstring for how a failure is classified.

        Returns ``(app_done, job_done)``; both False if the rank had
        already ended (a duplicate report is ignored).
        """
        p = self.procs[rank]
        if p.state is ProcState.ENDED:
            return False, False
        p.state = ProcState.ENDED
        p.exit_status = status
        p.signal = signal
        p.pmix = pmix
        # a PMIx process that never finalized failed, even with status 0
        # ... unless it was ended on request (ended_by)
        failed = (status != 0 or p.unfinalized) and not p.ended_by
        if failed and self.first_failure is None:
            self.first_failure = status or 1
        if self.killed:
            if launched:
                self.killed_procs += 1
        elif failed:
            self.failures.append(rank)
        app = self.apps[p.app_idx]
        app.terminated += 1
        self.terminated += 1
        return app.done, self.done


def build_job(
    nspace: str, session_id: int, apps: list[tuple[list[str], int | None, list[HostSpec]]],
    placement: dict | None = None, topo: dict[str, dict] | None = None,
) -> JobRecord:
    """Lay out a job: map each app to its hosts as ``placement`` says
    (:func:`pydvm.placement.map_job`; ``topo``: each node's object counts,
    for ppr and SPAN), ranks numbered across apps.  An app's ``n`` None is
    derived as ``mpirun`` does.  ValueError (words for the user) when the
    job cannot be placed."""
    topo = topo or {}
    names = [a[0][0] if len(apps) == 1 else f"app {i} ({a[0][0]})" for i, a in enumerate(apps)]
    mapped = PL.map_job(
        [(n, [PL.Host(h.name, h.slots, h.max_slots, topo.get(h.name)) for h in hosts])
         for _argv, n, hosts in apps], placement or {}, names)
    app_recs: list[AppRecord] = []
    procs: dict[int, ProcRecord] = {}
    rank = 0
    for idx, ((argv, _n, _hosts), nodes) in enumerate(zip(apps, mapped)):
        ranks = list(range(rank, rank + len(nodes)))
        for r, node in zip(ranks, nodes):
            procs[r] = ProcRecord(r, idx, node)
        app_recs.append(AppRecord(idx, list(argv), ranks))
        rank += len(nodes)
    return JobRecord(nspace, session_id, app_recs, procs)


#: The session every DVM has from start to stop; it never ends, so it needs
#: no purge and keeps no history.
DEFAULT_SESSION = 0


@dataclass
class SessionRecord:
    id: int
    hosts: list[HostSpec]
    jobs: set[str] = field(default_factory=set)
    #: every namespace that ever ran in the session (for relayed purges).
    history: set[str] = field(default_factory=set)
    ending: bool = False
