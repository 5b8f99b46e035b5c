"""The master's answers to tool requests (``pydvm run``, ``stop``, ``store``, ...).

Each handler answers its request exactly once -- at once, or from a task
spawned with the request named, so that a failing task still answers.
Data requests from tools (publish, lookup, unpublish) are routed in
:mod:`pydvm.runtime.routing`; everything else is here.

This is one concern of :class:`~pydvm.runtime.master.Master`, written as a
mixin.
"""

from __future__ import annotations

import asyncio
import os
import pwd
from typing import TYPE_CHECKING, Callable

from .. import params as P
from ..enums import Persistence
from ..errors import Status
from ..store import Caller
from ..wire import Message, refuse, reply
from . import dataops
from .jobs import HostSpec, JobRecord
from .peers import ToolSession
from .pmixhost import pmix_status

if TYPE_CHECKING:
    from .master import Master

DEFAULT_SESSION = 0

#: Requests only root or the DVM's owner may make.
ADMIN_ONLY = frozenset({"stop", "session_end"})


class ToolRequestsMixin:
    """Handlers for every non-data tool request."""

    def _on_tool(self: "Master", ch, msg: Message) -> None:
        session: ToolSession = ch.session
        t = msg["t"]
        rid = msg.get("id")
        if t in dataops.DATA_OPS:
            self._tool_data_op(session, msg)
            return
        handler = TOOL_HANDLERS.get(t)
        if handler is None:
            refuse(ch, msg, Status.ERR_BAD_PARAM, f"unknown message type {t!r}")
            return
        if self._stopping and t not in ("stop", "ping", "cancel"):
            ch.send(reply(rid, Status.ERR_UNREACH, "the DVM is stopping"))
            return
        if t in ADMIN_ONLY and not session.privileged:
            ch.send(reply(rid, Status.ERR_NO_PERMISSIONS,
                          f"only the DVM's owner or root may {t.replace('_', ' ')}"))
            return
        handler(self, session, msg)

    def _tool_run(self: "Master", session: ToolSession, msg: Message) -> None:
        rid = msg.get("id")
        # Jobs run as the submitting user (only a multi-user DVM, run by root,
        # can start them as anyone but itself).
        msg["_uid"], msg["_gid"] = session.uid, session.gid
        try:
            job, per_node = self._plan_job(msg)
        except ValueError as exc:
            session.send(reply(rid, Status.ERR_BAD_PARAM, str(exc)))
            return
        problem = self._pmix_check(job, bool(msg.get("pmix")))  # collectives.py
        if problem:
            session.send(reply(rid, Status.ERR_BAD_PARAM, problem))
            return
        self._spawn(self._run_job(session, rid, job, per_node), (session.channel, rid))

    def _tool_kill_job(self: "Master", session: ToolSession, msg: Message) -> None:
        """End a job: the submitter's own, or any for root and the DVM's owner.

        Sent by ``pydvm kill NSPACE`` (with ``wait: true``: answered once the
        job has ended -- its processes reaped, its purges applied -- with
        ``exit``) and by a ``pydvm run`` interrupted by a signal (``signal``:
        its number; answered at once).  The job's ``pydvm run`` is told who
        ended it.
        """
        rid = msg.get("id")
        ns = msg.get("nspace")
        job = self.jobs.get(ns) if isinstance(ns, str) else None
        if job is None:
            session.send(reply(rid, Status.ERR_NOT_FOUND,
                               f"no running job {ns!r} ('pydvm ps' lists the jobs)"))
            return
        if not session.privileged and job.uid != session.uid:
            session.send(reply(rid, Status.ERR_NO_PERMISSIONS,
                               f"{ns} is not your job (uid {job.uid}); only its owner, the "
                               "DVM's owner and root may kill it"))
            return
        sig = msg.get("signal")
        if self._job_tool.get(ns) is session:
            how = f" (signal {sig})" if isinstance(sig, int) and not isinstance(sig, bool) else ""
            self._kill_job(ns, f"its pydvm run was interrupted{how}")
        else:
            self._kill_job(ns, f"killed by 'pydvm kill' from {_user(session.uid)}")
        done = self._job_done.get(ns)
        if msg.get("wait") is not True or done is None:
            session.send(reply(rid, Status.SUCCESS))
            return

        async def run() -> None:
            job = await asyncio.shield(done)
            session.send(reply(rid, Status.SUCCESS, exit=job.exit_status))
        self._spawn(run(), (session.channel, rid))

    def _tool_stdin(self: "Master", session: ToolSession, msg: Message) -> None:
        """A piece of a ``pydvm run``'s stdin for its job's rank 0 (a notice;
        see lifetimes.py)."""
        self._on_tool_stdin(session, msg)

    def _tool_ps(self: "Master", session: ToolSession, msg: Message) -> None:
        """The DVM's jobs, every user's (as ``ps`` shows every process): see
        :func:`job_row` for the fields."""
        session.send(reply(msg.get("id"), Status.SUCCESS,
                           jobs=[job_row(j) for j in self.jobs.values()]))

    def _tool_stop(self: "Master", session: ToolSession, msg: Message) -> None:
        for ns in list(self.jobs):
            self._kill_job(ns, "killed because the DVM was stopped ('pydvm stop')")

        async def run() -> None:
            await self.stop()
            session.send(reply(msg.get("id"), Status.SUCCESS, pid=os.getpid()))
        self._spawn(run(), (session.channel, msg.get("id")))

    def _tool_session_new(self: "Master", session: ToolSession, msg: Message) -> None:
        hosts = msg.get("hosts")
        specs: list[HostSpec] | None = None
        try:
            if hosts:
                specs = []
                for entry in hosts:
                    name, slots = entry
                    node = self.nodes.get(name) if isinstance(name, str) else None
                    if node is None:
                        raise ValueError(f"host {name!r} is not in this DVM")
                    if not isinstance(slots, int) or isinstance(slots, bool) or slots < 0:
                        raise ValueError(f"bad slot count {slots!r} for host {name!r}")
                    specs.append(HostSpec(name, slots if slots else node.slots))
                down = [h.name for h in specs if not self.nodes[h.name].up]
                if down:
                    raise ValueError(f"node(s) not available: {', '.join(down)}")
            sid = self._new_session(specs)
        except (TypeError, ValueError) as exc:
            session.send(reply(msg.get("id"), Status.ERR_BAD_PARAM, str(exc)))
            return
        session.send(reply(msg.get("id"), Status.SUCCESS, session=sid))

    def _tool_session_end(self: "Master", session: ToolSession, msg: Message) -> None:
        sid = msg.get("session")
        rid = msg.get("id")
        if sid == DEFAULT_SESSION:
            session.send(reply(rid, Status.ERR_BAD_PARAM, "the default session ends with the DVM"))
            return
        rec = self.sessions.get(sid) if isinstance(sid, int) else None
        if rec is None or rec.ending:
            session.send(reply(rid, Status.ERR_NOT_FOUND, f"no session {sid!r}"))
            return

        async def run() -> None:
            await self._end_session(sid)
            session.send(reply(rid, Status.SUCCESS))
        self._spawn(run(), (session.channel, rid))

    def _tool_store(self: "Master", session: ToolSession, msg: Message) -> None:
        uid = session.uid
        prefix = msg.get("prefix")
        if prefix is not None and not isinstance(prefix, str):
            session.send(reply(msg.get("id"), Status.ERR_BAD_PARAM,
                               f"prefix must be a str, not {type(prefix).__name__}"))
            return
        ask = {"t": "stats", "uid": uid}
        if prefix is not None:
            ask["prefix"] = prefix

        async def run() -> None:
            stores = [dataops.stats_row(self.store, uid, prefix)]
            up = [n.name for n in self.nodes.values() if n.up]
            replies = await self._broadcast(ask, set(up), what="stats")
            targets = [n for n in self.nodes.values() if n.up and n.name in up]
            for node, r in zip(targets, replies):
                if r.get("status") == 0:
                    stores.append(r["store"])
                else:
                    stores.append({"store": node.name, "error": r.get("msg", "")})
            session.send(reply(msg.get("id"), Status.SUCCESS, stores=stores))
        self._spawn(run(), (session.channel, msg.get("id")))

    def _tool_purge(self: "Master", session: ToolSession, msg: Message) -> None:
        """A relaying DVM applies one of its lifetimes to this store.

        From root or the owner it applies to every matching item; from any
        other user only to that user's own items (ownership, as for
        ``unpublish``), so a purge can never remove more than its sender could.
        """
        rid = msg.get("id")
        ns, rank, app = msg.get("nspace"), msg.get("rank"), msg.get("app_idx")
        try:
            horizon = Persistence(msg.get("horizon"))
            if horizon not in (Persistence.PROC, Persistence.APP, Persistence.NSPACE,
                               Persistence.SESSION):
                raise ValueError(f"{horizon.name} is not a lifetime horizon")
            if not isinstance(ns, str):
                raise ValueError("a relayed purge names its namespace")
            if horizon is Persistence.PROC and not isinstance(rank, int):
                raise ValueError("a PROC purge names its rank")
            if horizon is not Persistence.PROC:
                rank = None
            if horizon is not Persistence.APP:
                app = None
            owner = None if session.privileged else Caller(
                self.dvm_nspace, -session.seq, session.uid, session.gid)
            n = self.store.purge(horizon, nspace=ns, rank=rank, app_idx=app, owner=owner)
        except (ValueError, TypeError) as exc:
            session.send(reply(rid, Status.ERR_BAD_PARAM, str(exc)))
            return
        session.send(reply(rid, Status.SUCCESS, removed=n))

    def _tool_cancel(self: "Master", session: ToolSession, msg: Message) -> None:
        self._cancel(session, msg.get("ref"))

    def _tool_ping(self: "Master", session: ToolSession, msg: Message) -> None:
        """A relay's heartbeat (or any tool's liveness probe): always answered."""
        session.send(reply(msg.get("id"), Status.SUCCESS))

    def _tool_info(self: "Master", session: ToolSession, msg: Message) -> None:
        session.send(reply(
            msg.get("id"), Status.SUCCESS,
            params={k: [r.value, r.source, P.REGISTRY[k].help] for k, r in self.resolved.items()},
            nodes=[[n.name, n.slots, n.state] for n in self.nodes.values()],
            node_reasons={n.name: n.lost_reason for n in self.nodes.values() if n.lost_reason},
            sessions=sorted(self.sessions), jobs=sorted(self.jobs),
            dvm=self.dvmid, uri=str(self.uri), pid=os.getpid(),
            daemon_pids={n.name: n.process.pid for n in self.nodes.values() if n.process},
            launcher=self.launcher.name, hosts_from=self.launcher.source, log_dir=self.log_dir,
            records=self.record_counts(),
            direct=self.direct_stats(),
            direct_unix=self.direct_socket_info(),
            head_node=self.head_node,
            metrics=self.metrics.url if self.metrics is not None else None,
            pmix={"master": list(pmix_status()), "nodes": self._pmix_nodes},
        ))


def job_row(job: JobRecord) -> dict:
    """One job as ``pydvm ps`` shows it.

    ``nspace``, ``uid``, ``session``, ``state`` (:attr:`JobRecord.state`),
    ``started`` (wall-clock seconds since the epoch), ``apps``
    (``[{"argv", "n"}]`` in app order), ``ranks_per_node`` (``{node: n}``),
    ``procs`` (how many), ``ended`` (how many have ended) and ``failed`` (how
    many of those failed on their own).
    """
    return {
        "nspace": job.nspace,
        "uid": job.uid,
        "session": job.session_id,
        "state": job.state,
        "started": job.started,
        "apps": [{"argv": list(a.argv), "n": len(a.ranks)} for a in job.apps],
        "ranks_per_node": job.ranks_per_node(),
        "procs": job.size,
        "ended": job.terminated,
        "failed": len(job.failures),
    }


def _user(uid: int) -> str:
    """``name (uid N)``, or ``uid N`` when the name is unknown."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (KeyError, OverflowError):
        return f"uid {uid}"


TOOL_HANDLERS: dict[str, Callable] = {
    "run": ToolRequestsMixin._tool_run,
    "kill_job": ToolRequestsMixin._tool_kill_job,
    "stdin": ToolRequestsMixin._tool_stdin,
    "ps": ToolRequestsMixin._tool_ps,
    "stop": ToolRequestsMixin._tool_stop,
    "session_new": ToolRequestsMixin._tool_session_new,
    "session_end": ToolRequestsMixin._tool_session_end,
    "store": ToolRequestsMixin._tool_store,
    "info": ToolRequestsMixin._tool_info,
    "purge": ToolRequestsMixin._tool_purge,
    "cancel": ToolRequestsMixin._tool_cancel,
    "ping": ToolRequestsMixin._tool_ping,
}
