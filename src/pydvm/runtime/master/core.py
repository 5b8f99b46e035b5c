"""The runtime's pure core: jobs, applications, processes and sessions as
state that changes only through :meth:`LifetimeCore.handle`.

The master's process table (:mod:`pydvm.runtime.master.processes`) turns what
happens -- a daemon reports an exit, a launch fails, a node is lost, a tool
kills a job or ends a session -- into an :class:`Event`, hands it to
:meth:`LifetimeCore.handle`, and carries out the :class:`Effect` objects it
gets back: purge the master store, broadcast a purge to nodes and wait for
their acknowledgements, kill a job's processes, announce a failure to a
job's PMIx processes.  Effects that wait (a broadcast, an announcement)
name the event the shell feeds back once they are done (``then``).  The
core opens no socket, starts no process, reads no clock and awaits nothing:
every rule of SPEC section 5 about *when* a lifetime ends, and what each
end removes, lives here and is checked without processes
(``tests/runtime/test_core.py``: unit tests, and a Hypothesis state machine
that runs random launches, exits, kills, node losses and session ends
against a model of every store and checks SPEC's lifetime table after
every step).

Who acts on what (SPEC 5)::

    process ended           -> PROC purge of the master store (the node
                               purged its own at the reap)
    last process of an app  -> APP purge of the master store, then the
                               application notice to the nodes that ran it
                               (unless the job ended with it)
    last process of the job -> NSPACE purge of the master store, then the
                               namespace purge to every node, acknowledged;
                               only then is the job over (JobEnded)
    session end             -> its jobs killed; once they are over, the
                               SESSION purge of the master store, then the
                               session purge to every node; then SessionEnded

A node's share of a job finishing is not a lifetime: nothing but the
namespace's end (every process, on every node) purges NSPACE items.

Failures (which processes "failed on their own", and whether a failure ends
the job) are :class:`~pydvm.runtime.shared.jobs.JobRecord`'s to classify; this
core decides what follows: an announcement to the job's PMIx processes
(``AnnounceFailure``) and, if the failure ends the job, the kill once the
announcement is done.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...enums import Persistence
from ..shared.jobs import DEFAULT_SESSION, JobRecord, ProcState, SessionRecord

#: The status of a process whose node was lost (or never started it).
LOST_STATUS = 255


# ----------------------------------------------------------------------
# events
# ----------------------------------------------------------------------


class Event:
    """Something that happened, as the shell tells the core."""


@dataclass(frozen=True)
class JobSubmitted(Event):
    """A planned job (``JobRecord`` from ``build_job``) is about to be launched."""

    job: JobRecord


@dataclass(frozen=True)
class LaunchAnswered(Event):
    """A node answered a job's launch: started its share (``ok``), or not --
    with the exit status a shell would give (127 not found, 126 not runnable)
    and the message to show."""

    nspace: str
    node: str
    ok: bool
    exit: int | None = None
    msg: str = ""


@dataclass(frozen=True)
class ProcExited(Event):
    """A node reaped a process: ``status`` (128+N for signal N), ``signal``,
    and what it did with PMIx (None, "connected", "finalized")."""

    nspace: str
    rank: int
    node: str
    status: int
    signal: int = 0
    pmix: str | None = None


@dataclass(frozen=True)
class KillRequested(Event):
    """End a job (``pydvm kill``, an interrupted ``pydvm run``, an abort, the DVM
    stopping...); ``why`` is what the job's ``pydvm run`` prints."""

    nspace: str
    why: str


@dataclass(frozen=True)
class AbortRequested(Event):
    """A process called ``PMIx_Abort(status)`` (``MPI_Abort``): the job ends with
    that status (1 for 0), and ``why`` is what its ``pydvm run`` says."""

    nspace: str
    rank: int
    status: int
    why: str


@dataclass(frozen=True)
class EndRequested(Event):
    """Running ``ranks`` of a job are being ended on request (``PMIx_Job_control``
    from a process of the job's uid; the shell signals them): ``why`` names
    who asked.  Their ends are then no failures -- under ``mpirun`` and
    PRRTE a process killed on request does not abort its job either -- and
    its ``pydvm run`` reports them with ``why``."""

    nspace: str
    ranks: tuple[int, ...]
    why: str


@dataclass(frozen=True)
class NodeLost(Event):
    node: str
    reason: str


@dataclass(frozen=True)
class FailureAnnounced(Event):
    """The shell has told the job's PMIx processes that ``rank`` failed."""

    nspace: str
    rank: int


@dataclass(frozen=True)
class NamespacePurged(Event):
    """Every node has acknowledged the job's namespace purge."""

    nspace: str


@dataclass(frozen=True)
class AppPurged(Event):
    """The nodes that ran an application acknowledged its purge (nothing follows)."""

    nspace: str
    app_idx: int


@dataclass(frozen=True)
class SessionEndRequested(Event):
    sid: int


@dataclass(frozen=True)
class SessionPurged(Event):
    """Every node has acknowledged the session purge."""

    sid: int


# ----------------------------------------------------------------------
# effects
# ----------------------------------------------------------------------


class Effect:
    """Something the shell must do."""


@dataclass(frozen=True)
class PurgeStore(Effect):
    """Purge the master store (and the relayed data server's, if any) at
    ``horizon`` for the target named (SPEC 5's purge targets)."""

    horizon: Persistence
    nspace: str | None = None
    rank: int | None = None
    app_idx: int | None = None
    session_id: int | None = None


@dataclass(frozen=True)
class PurgeNodes(Effect):
    """Send a purge to ``nodes`` (None: every node that is up), wait for each
    to acknowledge, then feed ``then`` back.  ``job_end``: the job-end event
    the nodes' PMIx servers deliver first (a namespace purge)."""

    horizon: Persistence
    nodes: frozenset[str] | None
    then: Event | None
    nspace: str | None = None
    app_idx: int | None = None
    session_id: int | None = None
    job_end: JobRecord | None = None


@dataclass(frozen=True)
class SendKill(Effect):
    """Tell each of ``nodes`` to end its processes of ``nspace``."""

    nspace: str
    nodes: frozenset[str]


@dataclass(frozen=True)
class AnnounceFailure(Effect):
    """Tell the PMIx processes of the job, on ``nodes``, that ``rank`` failed
    (``PMIX_ERR_PROC_ABORTED``); then feed :class:`FailureAnnounced` back."""

    job: JobRecord
    rank: int
    nodes: frozenset[str]


@dataclass(frozen=True)
class ProcGone(Event, Effect):
    """``rank`` has ended: nothing may act for it any more (its direct-data
    connections, cached callers and collectives are the shell's to drop)."""

    nspace: str
    rank: int


@dataclass(frozen=True)
class JobEnded(Effect):
    """The job is over -- every process ended, every purge applied -- and out
    of the core: its ``pydvm run`` gets its final report."""

    job: JobRecord


@dataclass(frozen=True)
class SessionEnded(Effect):
    sid: int


# ----------------------------------------------------------------------
# the core
# ----------------------------------------------------------------------


@dataclass
class LifetimeCore:
    """Jobs and sessions, and what their ends remove (see the module docstring).

    Fields depend on one another and change only through :meth:`handle`:

    * ``jobs`` holds every job submitted and not yet over (``JobEnded`` not
      yet returned); a job is in ``sessions[job.session_id].jobs`` exactly
      while it is in ``jobs``;
    * ``sessions`` holds the default session and every session created and
      not yet ended (``SessionEnded`` not yet returned);
    * ``ending`` holds the jobs whose every process has ended and whose
      namespace purge is in flight;
    * ``announcing`` holds ``(nspace, rank)`` of failures being announced.

    :meth:`validate` checks all of it.
    """

    sessions: dict[int, SessionRecord] = field(default_factory=dict)
    jobs: dict[str, JobRecord] = field(default_factory=dict)
    #: namespaces whose namespace purge is in flight.
    ending: set[str] = field(default_factory=set)
    #: (nspace, rank) of failures being announced before a possible kill.
    announcing: set[tuple[str, int]] = field(default_factory=set)
    #: sessions being ended: waiting for their jobs, then for their purge.
    ending_sessions: set[int] = field(default_factory=set)

    # -- queries -------------------------------------------------------

    def session_jobs(self, sid: int) -> list[JobRecord]:
        return [self.jobs[ns] for ns in sorted(self.sessions[sid].jobs)]

    # -- the one entry point -------------------------------------------

    def handle(self, event: Event) -> list[Effect]:
        """Apply ``event``; return what the shell must do, in order."""
        handler = getattr(self, "_on_" + type(event).__name__, None)
        if handler is None:
            raise TypeError(f"the lifetime core does not handle {type(event).__name__}")
        return handler(event)

    # -- jobs ----------------------------------------------------------

    def _on_JobSubmitted(self, ev: JobSubmitted) -> list[Effect]:
        job = ev.job
        session = self.sessions.get(job.session_id)
        if session is None or job.session_id in self.ending_sessions:
            raise ValueError(f"no session {job.session_id!r} to run {job.nspace} in")
        if job.nspace in self.jobs:
            raise ValueError(f"{job.nspace} is already running")
        self.jobs[job.nspace] = job
        session.jobs.add(job.nspace)
        if job.session_id != DEFAULT_SESSION:
            # relayed SESSION purges name each namespace; the default
            # session never ends, so it keeps no history (it would only grow)
            session.history.add(job.nspace)
        return []

    def _on_LaunchAnswered(self, ev: LaunchAnswered) -> list[Effect]:
        job = self.jobs.get(ev.nspace)
        if job is None:
            return []
        ranks = job.ranks_on(ev.node)
        if ev.ok:
            for r in ranks:
                if job.procs[r].state is ProcState.PENDING:
                    job.procs[r].state = ProcState.RUNNING
            if job.killed and not job.done:
                # killed while its launch was in flight: this node may have
                # had nothing to kill then, so tell it again now it has
                return [SendKill(job.nspace, frozenset({ev.node}))]
            return []
        job.error = job.error or ev.msg or f"launch failed on {ev.node}"
        if ev.exit is not None and job.first_failure is None:
            job.first_failure = ev.exit
        out = self._kill(job, job.error)
        for r in ranks:
            if job.procs[r].state is not ProcState.ENDED:
                out += self._proc_ended(job, r, ev.exit or LOST_STATUS, launched=False)
        return out

    def _on_ProcExited(self, ev: ProcExited) -> list[Effect]:
        job = self.jobs.get(ev.nspace)
        if job is None or ev.rank not in job.procs or job.procs[ev.rank].node != ev.node:
            return []
        return self._proc_ended(job, ev.rank, ev.status, ev.signal, pmix=ev.pmix)

    def _on_KillRequested(self, ev: KillRequested) -> list[Effect]:
        job = self.jobs.get(ev.nspace)
        return self._kill(job, ev.why) if job is not None else []

    def _on_AbortRequested(self, ev: AbortRequested) -> list[Effect]:
        job = self.jobs.get(ev.nspace)
        if job is None:
            return []
        if job.first_failure is None:
            # the job's exit status is the abort's (a signal's would follow otherwise)
            job.first_failure = ev.status if ev.status else 1
        job.error = job.error or ev.why
        return self._kill(job, ev.why)

    def _on_EndRequested(self, ev: EndRequested) -> list[Effect]:
        job = self.jobs.get(ev.nspace)
        for rank in ev.ranks if job is not None else ():
            p = job.procs.get(rank)
            if p is not None and p.state is ProcState.RUNNING and not p.ended_by:
                p.ended_by = ev.why
                job.ended_on_request.append(rank)
        return []

    def _on_NodeLost(self, ev: NodeLost) -> list[Effect]:
        out: list[Effect] = []
        for job in list(self.jobs.values()):
            lost = [r for r in job.ranks_on(ev.node) if job.procs[r].state is not ProcState.ENDED]
            if lost:
                job.error = job.error or f"node {ev.node} was lost ({ev.reason})"
                out += self._kill(job, job.error)
                for rank in lost:
                    out += self._proc_ended(job, rank, LOST_STATUS)
        return out

    def _on_FailureAnnounced(self, ev: FailureAnnounced) -> list[Effect]:
        self.announcing.discard((ev.nspace, ev.rank))
        job = self.jobs.get(ev.nspace)
        if job is None or job.done or not job.ends_at_failure(ev.rank):
            return []
        how = "(--abort-on-failure)" if job.abort_on_failure else \
            "(an MPI/PMIx job ends at its first failure, as under mpirun; " \
            "--no-abort-on-failure keeps the others running)"
        return self._kill(job, f"aborted because process [{job.nspace},{ev.rank}] failed {how}")

    def _on_AppPurged(self, ev: AppPurged) -> list[Effect]:
        return []

    def _on_NamespacePurged(self, ev: NamespacePurged) -> list[Effect]:
        job = self.jobs.pop(ev.nspace, None)
        if job is None:
            return []
        self.ending.discard(ev.nspace)
        self.announcing = {a for a in self.announcing if a[0] != ev.nspace}
        session = self.sessions.get(job.session_id)
        if session is not None:
            session.jobs.discard(ev.nspace)
        out: list[Effect] = [JobEnded(job)]
        if job.session_id in self.ending_sessions and session is not None and not session.jobs:
            out += self._session_jobs_over(job.session_id)
        return out

    # -- sessions ------------------------------------------------------

    def new_session(self, sid: int, hosts) -> SessionRecord:
        """A new session (the shell chose its id and checked its hosts)."""
        if sid in self.sessions:
            raise ValueError(f"session {sid} exists")
        rec = self.sessions[sid] = SessionRecord(sid, list(hosts))
        return rec

    def _on_SessionEndRequested(self, ev: SessionEndRequested) -> list[Effect]:
        sid = ev.sid
        if sid == DEFAULT_SESSION or sid not in self.sessions or sid in self.ending_sessions:
            raise ValueError(f"no session {sid!r} to end")
        self.ending_sessions.add(sid)
        session = self.sessions[sid]
        session.ending = True
        out: list[Effect] = []
        for job in self.session_jobs(sid):
            out += self._kill(job, f"killed because session {sid} was ended "
                                   "('pydvm session end')")
        if not session.jobs:
            out += self._session_jobs_over(sid)
        return out

    def _session_jobs_over(self, sid: int) -> list[Effect]:
        return [PurgeStore(Persistence.SESSION, session_id=sid),
                PurgeNodes(Persistence.SESSION, None, SessionPurged(sid), session_id=sid)]

    def _on_SessionPurged(self, ev: SessionPurged) -> list[Effect]:
        if ev.sid not in self.ending_sessions:
            return []
        self.ending_sessions.discard(ev.sid)
        del self.sessions[ev.sid]
        return [SessionEnded(ev.sid)]

    # -- the rules -------------------------------------------------------

    def _kill(self, job: JobRecord, why: str) -> list[Effect]:
        """Kill ``job`` (the first reason given is the one reported)."""
        if job.killed:
            return []
        job.killed = True
        job.kill_reason = why
        if job.done:
            return []
        return [SendKill(job.nspace, frozenset(job.nodes()))]

    def _proc_ended(self, job: JobRecord, rank: int, status: int, signal: int = 0,
                    launched: bool = True, pmix: str | None = None) -> list[Effect]:
        if job.procs[rank].state is ProcState.ENDED:
            return []  # a duplicate report
        app_done, job_done = job.proc_ended(rank, status, signal, launched, pmix)
        out: list[Effect] = [ProcGone(job.nspace, rank),
                             PurgeStore(Persistence.PROC, nspace=job.nspace, rank=rank)]
        if not job_done and job.failures and job.failures[-1] == rank and not job.killed:
            # failed on its own while the rest runs: its job hears of it first
            self.announcing.add((job.nspace, rank))
            out.append(AnnounceFailure(job, rank, frozenset(job.nodes())))
        app_idx = job.procs[rank].app_idx
        if app_done:
            out.append(PurgeStore(Persistence.APP, nspace=job.nspace, app_idx=app_idx))
            if not job_done:  # the job's end purges APP items everywhere anyway
                nodes = frozenset(job.procs[r].node for r in job.apps[app_idx].ranks)
                out.append(PurgeNodes(Persistence.APP, nodes, AppPurged(job.nspace, app_idx),
                                      nspace=job.nspace, app_idx=app_idx))
        if job_done:
            self.ending.add(job.nspace)
            out += [PurgeStore(Persistence.NSPACE, nspace=job.nspace),
                    PurgeNodes(Persistence.NSPACE, None, NamespacePurged(job.nspace),
                               nspace=job.nspace, job_end=job)]
        return out

    # -- checking --------------------------------------------------------

    def validate(self) -> None:
        """Assert every invariant that spans the core's records (the class docstring)."""
        assert DEFAULT_SESSION in self.sessions, "the default session is gone"
        for ns, job in self.jobs.items():
            assert job.nspace == ns
            assert job.session_id in self.sessions, f"{ns} runs in a removed session"
            assert ns in self.sessions[job.session_id].jobs, f"{ns} not in its session"
            ended = [p for p in job.procs.values() if p.state is ProcState.ENDED]
            assert job.terminated == len(ended), f"{ns}: terminated count is off"
            for app in job.apps:
                n = sum(1 for r in app.ranks if job.procs[r].state is ProcState.ENDED)
                assert app.terminated == n, f"{ns} app {app.idx}: terminated count is off"
            assert (ns in self.ending) == job.done, f"{ns}: ending iff every process ended"
            for r in job.failures:
                p = job.procs[r]
                assert p.state is ProcState.ENDED and (p.exit_status or p.unfinalized), \
                    f"{ns}:{r} listed as failed"
            if job.first_failure is not None:
                assert job.first_failure != 0
        for sid, s in self.sessions.items():
            for ns in s.jobs:
                assert ns in self.jobs and self.jobs[ns].session_id == sid, \
                    f"session {sid} lists {ns}"
            if sid == DEFAULT_SESSION:
                assert not s.history, "the default session keeps no history"
        assert self.ending <= set(self.jobs)
        assert self.ending_sessions <= set(self.sessions)
        assert {ns for ns, _ in self.announcing} <= set(self.jobs), \
            "an announcement outlived its job"
