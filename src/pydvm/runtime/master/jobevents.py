"""The master's job events: what happens to jobs, pushed to the tools that subscribed.

A tool sends ``{"t": "subscribe", "id": rid, "nspace": ns?, "session": sid?}``
(neither: every job of the DVM it may see), answered ``{"t": "reply", "id":
rid, "status": 0}`` at once; from then on it is pushed::

    {"t": "job_event", "ref": rid, "kind": K, "nspace": ns, "session": sid,
     "time": unix_time, ...}

with, per kind:

* ``queued``: ``position`` (1: next to start) -- the job waits for slots
  (:mod:`pydvm.runtime.master.jobqueue`);
* ``started``: ``size``, ``nodes`` (``{node: [ranks]}``) -- it is being
  launched;
* ``proc_exit``: ``rank``, ``node``, ``status`` (128+N for signal N; 255 for a
  process of a lost node or one never started), ``signal``;
* ``ended``: ``exit`` (the job's status), ``failed`` (processes that failed
  on their own), ``killed`` (started processes a kill ended), ``reason``
  (who or what ended it, '' for a normal end) -- after every purge, as the
  job's ``pydvm run`` hears it; a job ended while queued has no
  ``started`` and no ``proc_exit``;
* ``dropped``: ``reason`` -- the subscription ended because the tool did
  not read (see below); nothing follows.

A job's events come in that order.  ``{"t": "unsubscribe", "id": rid2, "ref":
rid}`` ends a subscription (answered; a subscription already gone is not an
error).  A subscription to one job ends by itself after its ``ended``.

**Who sees what**: a tool sees its own uid's jobs; root and the DVM's owner
(:attr:`~pydvm.runtime.shared.peers.ToolSession.privileged`) see every job.
Subscribing to another user's job is refused (``PMIX_ERR_NO_PERMISSIONS``).

**Bounded**: before each event the tool connection's unsent bytes are
checked; past ``pydvm_event_backlog`` every subscription of that
connection is dropped (a ``dropped`` event, a warning in the log), so a
subscriber that stops reading cannot grow the master's memory; the
connection and its jobs are left alone.  Subscriptions end with their
connection; at most :data:`MAX_SUBSCRIPTIONS` per connection.

:class:`JobEvents` owns the subscriptions; it hears jobs through the process
table's and the queue's listeners.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ...errors import Status
from ...wire import Message, reply
from ..shared.jobs import JobRecord
from ..shared.peers import PeerSession, ToolSession
from .jobqueue import JobQueue, QueueListener
from .processes import ProcessListener, ProcessTable

log = logging.getLogger("pydvm.master")

#: Subscriptions one connection may hold at once.
MAX_SUBSCRIPTIONS = 256

#: Event kinds, as the metrics list them.
KINDS = ("queued", "started", "proc_exit", "ended", "dropped")
#: How a started job ended, as the metrics count them: every process
#: exited 0; it failed (a non-zero status); it was killed (``pydvm kill``,
#: its time limit, a lost node, ``--abort-on-failure``...).
RESULTS = ("ok", "failed", "killed")


@dataclass
class Subscription:
    """What one ``subscribe`` asked for (None: any)."""

    nspace: str | None
    session: int | None


class JobEvents(ProcessListener, QueueListener):
    """Subscriptions and the events sent to them (see the module docstring)."""

    def __init__(self, processes: ProcessTable, queue: JobQueue, values: dict[str, Any]) -> None:
        self._processes = processes
        self._queue = queue
        self.values = values
        #: tool -> {subscribe request id -> what it asked for}.
        self._subs: dict[ToolSession, dict[Any, Subscription]] = {}
        #: figures for the metrics (:meth:`stats`): events sent by kind (one
        #: per subscription told), subscriptions dropped for their backlog,
        #: jobs started (spawned ones too; not those that left the queue
        #: without starting), started jobs ended by result (:data:`RESULTS`).
        self.sent: Counter = Counter()
        self.dropped = 0
        self.started = 0
        self.ended: Counter = Counter()

    def count(self) -> int:
        """Subscriptions held (``pydvm info``'s records)."""
        return sum(len(s) for s in self._subs.values())

    def stats(self) -> dict[str, Any]:
        """Figures for the metrics endpoint: ``subscriptions`` (now),
        ``sent`` (``{kind: events}``), ``dropped`` (subscriptions dropped for
        not reading), ``started`` (jobs), ``ended`` (``{result: started jobs}``)."""
        return {"subscriptions": self.count(), "sent": dict(self.sent),
                "dropped": self.dropped, "started": self.started, "ended": dict(self.ended)}

    # ------------------------------------------------------------------
    # requests
    # ------------------------------------------------------------------

    def subscribe(self, tool: ToolSession, msg: Message) -> None:
        """``subscribe``: to one job (``nspace``), a session's jobs
        (``session``), or every job the tool may see."""
        rid, ns, sid = msg.get("id"), msg.get("nspace"), msg.get("session")
        if rid is None or isinstance(rid, (dict, list)):
            tool.send(reply(rid, Status.ERR_BAD_PARAM, "subscribe needs an id"))
            return
        mine = self._subs.get(tool, {})
        if rid in mine:
            tool.send(reply(rid, Status.ERR_BAD_PARAM, f"subscription {rid!r} exists"))
            return
        if len(mine) >= MAX_SUBSCRIPTIONS:
            tool.send(reply(rid, Status.ERR_OUT_OF_RESOURCE,
                            f"this connection already has {MAX_SUBSCRIPTIONS} subscriptions"))
            return
        if sid is not None and (not isinstance(sid, int) or isinstance(sid, bool)
                                or sid not in self._processes.sessions):
            tool.send(reply(rid, Status.ERR_NOT_FOUND, f"no session {sid!r} in this DVM"))
            return
        if ns is not None:
            job = self._processes.jobs.get(ns) if isinstance(ns, str) else None
            job = job or self._queue.get(ns)
            if job is None:
                tool.send(reply(rid, Status.ERR_NOT_FOUND,
                                f"no running or queued job {ns!r} ('pydvm ps' lists them)"))
                return
            if not self._visible(tool, job):
                tool.send(reply(rid, Status.ERR_NO_PERMISSIONS,
                                f"{ns} is not your job (uid {job.uid}): only its owner, the "
                                "DVM's owner and root see its events"))
                return
        self._subs.setdefault(tool, {})[rid] = Subscription(ns, sid)
        tool.send(reply(rid, Status.SUCCESS))

    def unsubscribe(self, tool: ToolSession, msg: Message) -> None:
        """``unsubscribe``: end the subscription ``ref`` of this connection."""
        ref = msg.get("ref")
        mine = self._subs.get(tool)
        if mine is not None and not isinstance(ref, (dict, list)):
            mine.pop(ref, None)
            if not mine:
                del self._subs[tool]
        tool.send(reply(msg.get("id"), Status.SUCCESS))

    def tool_gone(self, tool: PeerSession) -> None:
        self._subs.pop(tool, None)  # type: ignore[call-overload]

    # ------------------------------------------------------------------
    # what happens to jobs
    # ------------------------------------------------------------------

    def job_queued(self, job: JobRecord, position: int) -> None:
        self._emit(job, "queued", position=position)

    def job_started(self, job: JobRecord) -> None:
        self.started += 1
        if self._subs:
            self._emit(job, "started", size=job.size, nodes=job.by_node())

    def proc_ended(self, nspace: str, rank: int) -> None:
        if not self._subs:
            return
        job = self._processes.jobs.get(nspace)
        p = job.procs.get(rank) if job is not None else None
        if p is not None:
            self._emit(job, "proc_exit", rank=rank, node=p.node, status=p.exit_status,
                       signal=p.signal)

    def job_ended(self, job: JobRecord) -> None:
        self.ended["killed" if job.killed else "failed" if job.exit_status else "ok"] += 1
        self._ended(job, job.exit_status, len(job.failures), job.killed_procs,
                    job.error or job.kill_reason)

    def queued_job_ended(self, job: JobRecord, exit: int, reason: str) -> None:
        self._ended(job, exit, 0, 0, reason)

    def _ended(self, job: JobRecord, exit: int, failed: int, killed: int, reason: str) -> None:
        if not self._subs:
            return
        self._emit(job, "ended", exit=exit, failed=failed, killed=killed, reason=reason)
        for tool, subs in list(self._subs.items()):  # nothing more to say to these
            for rid in [r for r, s in subs.items() if s.nspace == job.nspace]:
                del subs[rid]
            if not subs:
                del self._subs[tool]

    # ------------------------------------------------------------------
    # sending
    # ------------------------------------------------------------------

    @staticmethod
    def _visible(tool: ToolSession, job: JobRecord) -> bool:
        return tool.privileged or job.uid == tool.uid

    def _emit(self, job: JobRecord, kind: str, **fields: Any) -> None:
        if not self._subs:
            return
        base = {"t": "job_event", "kind": kind, "nspace": job.nspace,
                "session": job.session_id, "time": time.time(), **fields}
        cap = self.values["pydvm_event_backlog"]
        for tool, subs in list(self._subs.items()):
            refs = [rid for rid, s in subs.items()
                    if (s.nspace is None or s.nspace == job.nspace)
                    and (s.session is None or s.session == job.session_id)]
            if not refs or not self._visible(tool, job):
                continue
            transport = getattr(tool.channel, "transport", None)
            backlog = transport.get_write_buffer_size() if transport is not None else 0
            if backlog > cap:
                self._drop(tool, f"the connection has {backlog} bytes unread, more than "
                                 f"pydvm_event_backlog ({cap})")
                continue
            for rid in refs:
                tool.send({**base, "ref": rid})
            self.sent[kind] += len(refs)

    def _drop(self, tool: ToolSession, why: str) -> None:
        subs = self._subs.pop(tool, {})
        self.dropped += len(subs)
        self.sent["dropped"] += len(subs)
        log.warning("%s: %d job-event subscription(s) dropped: %s", tool.name, len(subs), why)
        for rid in subs:
            tool.send({"t": "job_event", "ref": rid, "kind": "dropped", "time": time.time(),
                       "reason": f"subscription dropped: {why}"})
