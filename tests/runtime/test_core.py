"""The runtime's pure core (:mod:`pydvm.runtime.master.core`) without processes.

Unit tests feed it the events a real run produces and compare the effects
it returns.  The state machine drives it through random job submissions
(MPMD, over three nodes, in the default or a new session), launch answers
(some failing), exits (statuses, signals, PMIx processes that never
finalized), kills, lost nodes and session ends, while a simulated shell
carries out the effects against a model of every store: each process has
published an item of every lifetime persistence in the master store and a
LOCAL one in its node's store.  Broadcasts and failure announcements are
delivered later, in an order the machine chooses (they wait on daemons in
the real runtime).  After every step:

* SPEC 5's lifetime table holds: an item is gone from the master store
  exactly when its lifetime has ended (PROC: its process; APP: every
  process of its application; NSPACE: every process of its job; SESSION:
  its session) -- never earlier, never later than the step that ended it;
* a node store never loses an item before its lifetime ended (a node's own
  share of a job ending is not a lifetime: the multi-node bug);
* once every broadcast is delivered, node stores hold nothing whose
  lifetime ended (but PROC items, which only the node's reap removes);
* :meth:`LifetimeCore.validate` holds;
* when nothing runs and nothing is in flight, the core holds no job.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pydvm.enums import Persistence as P
from pydvm.runtime.master.core import (
    DEFAULT_SESSION, LOST_STATUS, AnnounceFailure, AppPurged, EndRequested, FailureAnnounced,
    JobEnded,
    JobSubmitted, KillRequested, LaunchAnswered, LifetimeCore, NamespacePurged, NodeLost,
    ProcExited, ProcGone, PurgeNodes, PurgeStore, SendKill, SessionEnded, SessionEndRequested,
    SessionPurged,
)
from pydvm.runtime.shared.jobs import HostSpec, ProcState, build_job

NODES = ("a", "b", "c")
LIFETIMES = (P.PROC, P.APP, P.NSPACE, P.SESSION)


def core_with(*sids: int) -> LifetimeCore:
    c = LifetimeCore()
    c.new_session(DEFAULT_SESSION, [HostSpec(n) for n in NODES])
    for sid in sids:
        c.new_session(sid, [HostSpec(n) for n in NODES])
    return c


def job(ns: str, apps, sid: int = DEFAULT_SESSION, **kw):
    """apps: [(n, [node, ...])]"""
    j = build_job(ns, sid, [(["prog"], n, [HostSpec(h) for h in hosts]) for n, hosts in apps])
    for k, v in kw.items():
        setattr(j, k, v)
    return j


def launched(c: LifetimeCore, j) -> None:
    c.handle(JobSubmitted(j))
    for node in sorted(j.nodes()):
        assert c.handle(LaunchAnswered(j.nspace, node, True)) == []


def kinds(effects) -> list[str]:
    return [type(e).__name__ for e in effects]


# ----------------------------------------------------------------------
# unit tests: the sequences a real run produces
# ----------------------------------------------------------------------


def test_a_process_end_purges_its_proc_items_and_nothing_more_while_its_job_runs():
    c = core_with()
    j = job("ns@1", [(2, ["a", "b"])])
    launched(c, j)
    out = c.handle(ProcExited("ns@1", 0, "a", 0))
    assert out == [ProcGone("ns@1", 0), PurgeStore(P.PROC, nspace="ns@1", rank=0)]
    c.validate()


def test_the_last_process_of_an_app_purges_app_items_and_notifies_only_its_nodes():
    c = core_with()
    j = job("ns@1", [(1, ["a"]), (2, ["b", "c"])])
    launched(c, j)
    out = c.handle(ProcExited("ns@1", 0, "a", 0))
    assert PurgeStore(P.APP, nspace="ns@1", app_idx=0) in out
    notice = [e for e in out if isinstance(e, PurgeNodes)]
    assert notice == [PurgeNodes(P.APP, frozenset({"a"}), AppPurged("ns@1", 0), nspace="ns@1",
                                 app_idx=0)]


def test_a_job_ends_only_when_its_last_process_on_any_node_has_ended_and_nodes_acked():
    """The multi-node rule: node a's share ending purges nothing of the namespace."""
    c = core_with()
    j = job("ns@1", [(2, ["a", "b"])])
    launched(c, j)
    assert not any(isinstance(e, PurgeStore) and e.horizon is P.NSPACE
                   for e in c.handle(ProcExited("ns@1", 0, "a", 0)))
    out = c.handle(ProcExited("ns@1", 1, "b", 0))
    assert kinds(out)[-2:] == ["PurgeStore", "PurgeNodes"]
    assert out[-2] == PurgeStore(P.NSPACE, nspace="ns@1")
    assert out[-1].nodes is None and out[-1].then == NamespacePurged("ns@1")
    assert "ns@1" in c.jobs  # not over until every node has purged
    assert c.handle(NamespacePurged("ns@1")) == [JobEnded(j)]
    assert not c.jobs and not c.sessions[DEFAULT_SESSION].jobs
    c.validate()


def test_a_failure_is_announced_first_and_ends_an_mpi_job_afterwards():
    c = core_with()
    j = job("ns@1", [(3, ["a", "b"])], pmix_required=True)
    launched(c, j)
    out = c.handle(ProcExited("ns@1", 1, "b", 3))
    assert AnnounceFailure(j, 1, frozenset({"a", "b"})) in out
    assert not any(isinstance(e, SendKill) for e in out)  # not before the announcement
    out = c.handle(FailureAnnounced("ns@1", 1))
    assert out == [SendKill("ns@1", frozenset({"a", "b"}))]
    assert j.killed and "aborted because process [ns@1,1] failed" in j.kill_reason
    assert j.exit_status == 3


def test_a_plain_jobs_failure_is_announced_but_ends_nothing():
    c = core_with()
    j = job("ns@1", [(2, ["a"])])
    launched(c, j)
    c.handle(ProcExited("ns@1", 0, "a", 2))
    assert c.handle(FailureAnnounced("ns@1", 0)) == []
    assert not j.killed


def test_a_pmix_process_that_never_finalized_fails_with_status_one_and_ends_the_job():
    c = core_with()
    j = job("ns@1", [(2, ["a"])])
    launched(c, j)
    out = c.handle(ProcExited("ns@1", 0, "a", 0, pmix="connected"))
    assert any(isinstance(e, AnnounceFailure) for e in out)
    assert j.failures == [0] and j.exit_status == 1
    assert c.handle(FailureAnnounced("ns@1", 0)) == [SendKill("ns@1", frozenset({"a"}))]


def test_a_process_ended_on_request_is_no_failure_and_its_job_runs_on():
    """PMIx_Job_control killing rank 1 of an MPI job: as under mpirun and PRRTE,
    no announcement, no kill, and the job's status is its other processes'."""
    c = core_with()
    j = job("ns@1", [(2, ["a", "b"])], pmix_required=True)
    launched(c, j)
    assert c.handle(EndRequested("ns@1", (1, 7), "PMIx_Job_control from ns@1:0")) == []
    out = c.handle(ProcExited("ns@1", 1, "b", 137, signal=9, pmix="connected"))
    assert not any(isinstance(e, (AnnounceFailure, SendKill)) for e in out)
    assert j.failures == [] and not j.killed and j.ended_on_request == [1]
    assert j.procs[1].ended_by == "PMIx_Job_control from ns@1:0"
    c.handle(ProcExited("ns@1", 0, "a", 0, pmix="finalized"))
    assert j.exit_status == 0
    c.validate()


def test_no_abort_on_failure_keeps_an_mpi_job_running():
    c = core_with()
    j = job("ns@1", [(2, ["a"])], pmix_required=True, abort_on_failure=False)
    launched(c, j)
    c.handle(ProcExited("ns@1", 0, "a", 9, signal=9))
    assert c.handle(FailureAnnounced("ns@1", 0)) == []


def test_a_failed_launch_kills_the_job_and_ends_that_nodes_ranks_with_the_shells_status():
    c = core_with()
    j = job("ns@1", [(2, ["a", "b"])])
    c.handle(JobSubmitted(j))
    assert c.handle(LaunchAnswered("ns@1", "a", True)) == []
    out = c.handle(LaunchAnswered("ns@1", "b", False, 127, "b: executable not found: prog"))
    assert out[0] == SendKill("ns@1", frozenset({"a", "b"}))
    assert j.procs[1].state is ProcState.ENDED and j.procs[1].exit_status == 127
    assert j.exit_status == 127 and j.error == "b: executable not found: prog"
    assert j.killed_procs == 0  # rank 1 never started: not counted as killed


def test_a_kill_during_the_launch_is_sent_again_to_a_node_that_answers_later():
    c = core_with()
    j = job("ns@1", [(2, ["a", "b"])])
    c.handle(JobSubmitted(j))
    assert c.handle(KillRequested("ns@1", "killed by 'pydvm kill'")) == \
        [SendKill("ns@1", frozenset({"a", "b"}))]
    assert c.handle(LaunchAnswered("ns@1", "b", True)) == [SendKill("ns@1", frozenset({"b"}))]


def test_a_lost_node_ends_its_processes_with_255_and_kills_the_job():
    c = core_with()
    j = job("ns@1", [(2, ["a", "b"])])
    launched(c, j)
    out = c.handle(NodeLost("b", "peer closed"))
    assert out[0] == SendKill("ns@1", frozenset({"a", "b"}))
    assert j.procs[1].exit_status == LOST_STATUS and j.error == "node b was lost (peer closed)"


def test_ending_a_session_kills_its_jobs_and_purges_the_session_once_they_are_over():
    c = core_with(5)
    j = job("ns@1", [(1, ["a"])], sid=5)
    launched(c, j)
    out = c.handle(SessionEndRequested(5))
    assert out == [SendKill("ns@1", frozenset({"a"}))]
    out = c.handle(ProcExited("ns@1", 0, "a", 143, signal=15))
    assert not any(isinstance(e, PurgeStore) and e.horizon is P.SESSION for e in out)
    out = c.handle(NamespacePurged("ns@1"))
    assert out[1:] == [PurgeStore(P.SESSION, session_id=5),
                       PurgeNodes(P.SESSION, None, SessionPurged(5), session_id=5)]
    assert c.handle(SessionPurged(5)) == [SessionEnded(5)]
    assert 5 not in c.sessions
    with pytest.raises(ValueError):
        c.handle(JobSubmitted(job("ns@2", [(1, ["a"])], sid=5)))


def test_the_default_session_cannot_be_ended_and_keeps_no_history():
    c = core_with()
    with pytest.raises(ValueError):
        c.handle(SessionEndRequested(DEFAULT_SESSION))
    launched(c, job("ns@1", [(1, ["a"])]))
    assert not c.sessions[DEFAULT_SESSION].history


def test_a_duplicate_exit_report_changes_nothing():
    c = core_with()
    j = job("ns@1", [(2, ["a"])])
    launched(c, j)
    c.handle(ProcExited("ns@1", 0, "a", 1))
    assert c.handle(ProcExited("ns@1", 0, "a", 1)) == []
    assert j.failures == [0] and j.terminated == 1


def test_an_exit_reported_by_another_node_than_the_processs_is_ignored():
    c = core_with()
    j = job("ns@1", [(1, ["a"])])
    launched(c, j)
    assert c.handle(ProcExited("ns@1", 0, "b", 0)) == []
    assert j.terminated == 0


# ----------------------------------------------------------------------
# the state machine
# ----------------------------------------------------------------------


@dataclass(frozen=True)
class Item:
    nspace: str
    rank: int
    app_idx: int
    session_id: int
    persistence: P
    node: str | None = None  # None: the master store


class CoreMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.core = core_with()
        self.up = set(NODES)
        self.next_job = 1
        self.next_session = 1
        self.master: set[Item] = set()
        self.node_store: dict[str, set[Item]] = {n: set() for n in NODES}
        self.pending: list = []        # PurgeNodes and AnnounceFailure not yet delivered
        self.ended_jobs: set[str] = set()
        self.ended_sessions: set[int] = set()
        self.all_items: set[Item] = set()

    # -- the shell ------------------------------------------------------

    def feed(self, event) -> None:
        effects = self.core.handle(event)
        for e in effects:
            if isinstance(e, PurgeStore):
                self._purge(self.master, e.horizon, e.nspace, e.rank, e.app_idx, e.session_id)
            elif isinstance(e, (PurgeNodes, AnnounceFailure)):
                self.pending.append(e)
            elif isinstance(e, JobEnded):
                assert e.job.done, "a job reported over with a process still running"
                self.ended_jobs.add(e.job.nspace)
            elif isinstance(e, SessionEnded):
                self.ended_sessions.add(e.sid)
            else:
                assert isinstance(e, (SendKill, ProcGone)), e

    @staticmethod
    def _purge(store: set[Item], horizon: P, ns, rank, app_idx, sid) -> None:
        """What a store's purge removes (SPEC 5's horizon table)."""
        takes = {P.PROC: {P.PROC}, P.APP: {P.PROC, P.APP},
                 P.NSPACE: {P.PROC, P.APP, P.NSPACE},
                 P.SESSION: {P.PROC, P.APP, P.NSPACE, P.SESSION}}[horizon]
        for it in list(store):
            if it.persistence not in takes:
                continue
            if horizon is P.SESSION:
                hit = it.session_id == sid
            elif horizon is P.NSPACE:
                hit = it.nspace == ns
            elif horizon is P.APP:
                hit = it.nspace == ns and it.app_idx == app_idx
            else:
                hit = it.nspace == ns and it.rank == rank
            if hit:
                store.discard(it)

    # -- rules ----------------------------------------------------------

    @rule(apps=st.lists(st.tuples(st.integers(1, 3), st.lists(st.sampled_from(NODES),
                                                               min_size=1, max_size=3)),
                        min_size=1, max_size=3),
          use_session=st.booleans(), fail_node=st.none() | st.sampled_from(NODES))
    def submit(self, apps, use_session, fail_node):
        sids = [s for s in self.core.sessions if s not in self.core.ending_sessions]
        sid = max(sids) if use_session else DEFAULT_SESSION
        if any(h not in self.up for _, hosts in apps for h in hosts):
            return
        ns = f"ns@{self.next_job}"
        self.next_job += 1
        j = job(ns, apps, sid=sid)
        self.feed(JobSubmitted(j))
        for p in j.procs.values():
            for pers in LIFETIMES:
                it = Item(ns, p.rank, p.app_idx, sid, pers)
                self.master.add(it)
                self.all_items.add(it)
                local = Item(ns, p.rank, p.app_idx, sid, pers, node=p.node)
                self.node_store[p.node].add(local)
                self.all_items.add(local)
        for node in sorted(j.nodes()):
            if node == fail_node:
                self.feed(LaunchAnswered(ns, node, False, 127, f"{node}: not found"))
                # the node never started them: their local items were never published
                for it in list(self.node_store[node]):
                    if it.nspace == ns:
                        self.node_store[node].discard(it)
                        self.all_items.discard(it)
            else:
                self.feed(LaunchAnswered(ns, node, True))

    def _running(self):
        return [(j, p) for j in self.core.jobs.values() for p in j.procs.values()
                if p.state is not ProcState.ENDED]

    @precondition(lambda self: self._running())
    @rule(data=st.data(), status=st.sampled_from([0, 0, 1, 3, 137, 143]),
          pmix=st.sampled_from([None, None, "connected", "finalized"]))
    def exit(self, data, status, pmix):
        j, p = data.draw(st.sampled_from(self._running()))
        if p.node not in self.up:
            return
        # the node purges its own store's PROC items at the reap
        self._purge(self.node_store[p.node], P.PROC, j.nspace, p.rank, None, None)
        self.feed(ProcExited(j.nspace, p.rank, p.node, status,
                             signal=status - 128 if status > 128 else 0, pmix=pmix))

    @precondition(lambda self: self.core.jobs)
    @rule(data=st.data())
    def kill(self, data):
        ns = data.draw(st.sampled_from(sorted(self.core.jobs)))
        self.feed(KillRequested(ns, "killed by 'pydvm kill'"))

    @precondition(lambda self: len(self.up) > 1)
    @rule(data=st.data())
    def lose_node(self, data):
        node = data.draw(st.sampled_from(sorted(self.up)))
        self.up.discard(node)
        self.node_store[node].clear()  # the daemon is gone, and its store with it
        self.pending = [e for e in self.pending if not isinstance(e, PurgeNodes)
                        or e.nodes is None or e.nodes != frozenset({node})]
        self.feed(NodeLost(node, "peer closed"))

    @rule()
    def new_session(self):
        self.core.new_session(self.next_session, [HostSpec(n) for n in sorted(self.up)])
        self.next_session += 1

    @precondition(lambda self: any(s != DEFAULT_SESSION and s not in self.core.ending_sessions
                                   for s in self.core.sessions))
    @rule(data=st.data())
    def end_session(self, data):
        sid = data.draw(st.sampled_from(sorted(
            s for s in self.core.sessions
            if s != DEFAULT_SESSION and s not in self.core.ending_sessions)))
        self.feed(SessionEndRequested(sid))

    @precondition(lambda self: self.pending)
    @rule(data=st.data())
    def deliver(self, data):
        """A broadcast acknowledged by every node it went to, or an announcement made."""
        e = self.pending.pop(data.draw(st.integers(0, len(self.pending) - 1)))
        if isinstance(e, AnnounceFailure):
            self.feed(FailureAnnounced(e.job.nspace, e.rank))
            return
        for node in (e.nodes or frozenset(NODES)) & self.up:
            self._purge(self.node_store[node], e.horizon, e.nspace, None, e.app_idx,
                        e.session_id)
        if e.then is not None:
            self.feed(e.then)

    # -- invariants -----------------------------------------------------

    def _ended(self, it: Item) -> bool:
        """Whether ``it``'s lifetime has ended (SPEC 5), from the core's records
        and the jobs and sessions already over."""
        if it.persistence is P.SESSION:
            # a session ends when its end was asked for and its last job is over
            sid = it.session_id
            return sid in self.ended_sessions or (
                sid in self.core.ending_sessions and not self.core.sessions[sid].jobs)
        j = self.core.jobs.get(it.nspace)
        if j is None:
            return True  # the job is over
        if it.persistence is P.NSPACE:
            return j.done
        if it.persistence is P.APP:
            return j.apps[it.app_idx].done
        return j.procs[it.rank].state is ProcState.ENDED

    @invariant()
    def lifetimes_hold(self):
        self.core.validate()
        for it in self.all_items:
            if it.node is None:
                assert (it in self.master) == (not self._ended(it)), \
                    f"master store: {it} present={it in self.master} ended={self._ended(it)}"
            elif it.node in self.up and not self._ended(it):
                assert it in self.node_store[it.node], f"{it} left its node before its end"
        if not self.pending:
            for node in self.up:
                for it in self.node_store[node]:
                    if it.persistence is not P.PROC:
                        assert not self._ended(it), f"{it} outlived its lifetime on {node}"

    @invariant()
    def nothing_kept_when_all_is_over(self):
        if not self.pending and not self._running():
            assert not self.core.jobs, sorted(self.core.jobs)
            assert not self.core.ending_sessions


CoreMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=60,
                                         deadline=None)
test_the_lifetime_core_keeps_spec_5_under_random_runs = CoreMachine.TestCase
