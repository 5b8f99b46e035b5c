"""The master's tool service: ``pydvm run``, ``kill``, ``ps``, ``stop``, sessions, ``store``...

Each handler answers its request exactly once -- at once, or from a task
started with the request named, so that a failing task still answers.
The master's dispatch (:mod:`pydvm.runtime.master.server`) sends a tool's data
requests (publish, lookup, unpublish, ...), ``purge`` and ``cancel`` to the
data service, ``stdin`` to the job streams and everything else here; it
refuses what the DVM's owner alone may ask (:data:`ADMIN_ONLY`) from other
users, and all but ``stop``, ``ping`` and ``cancel`` while the DVM stops.

:class:`ToolService` owns no state: it asks the process table, the node
table and the data service through their interfaces.  Here a *tool* is the
connection's peer (:class:`~pydvm.runtime.shared.peers.ToolSession`); a *session*
is always a DVM session (``pydvm session new``).
"""

from __future__ import annotations

import asyncio
import os
import pwd
import signal as _signal
from typing import Any, Awaitable, Callable

from ... import _trace
from ...errors import Status
from ...wire import Message, reply
from ..shared.jobs import DEFAULT_SESSION
from ..shared.jobs import HostSpec, JobRecord, ProcState
from ..shared.peers import ToolSession
from .dataservice import DataService
from .jobqueue import QUEUED_KILL_EXIT, JobQueue, pmix_refusal
from .nodes import NodeTable
from .processes import ProcessTable
from .tasks import Tasks

#: Requests only root or the DVM's owner may make.
ADMIN_ONLY = frozenset({"stop", "session_end"})

#: The most jobs one ``run_many`` may carry.
MAX_BATCH = 10_000
#: SO_SNDBUF of a tool connection that jobs' output goes to (the kernel
#: doubles it).  TCP's autotuning lets a slow reader's backlog grow to
#: 4 MiB there, on top of the output windows; this keeps what is in flight
#: to about the windows (``pydvm run`` caps its receive buffer too:
#: client/connect.py, RECV_BUFFER), and output still flows at loopback's pace.
OUTPUT_SEND_BUFFER = 128 * 1024


class ToolService:
    """Handlers for the tools' non-data requests (see the module docstring).

    ``stop()`` stops the DVM; ``describe()`` is the master's ``info`` reply.
    """

    def __init__(self, processes: ProcessTable, nodes: NodeTable, data: DataService,
                 tasks: Tasks, queue: JobQueue, *, stop: Callable[[], Awaitable[None]],
                 describe: Callable[[], dict[str, Any]]) -> None:
        self._processes = processes
        self._queue = queue
        self._nodes = nodes
        self._data = data
        self._tasks = tasks
        self._stop = stop
        self._describe = describe

    def run(self, tool: ToolSession, msg: Message) -> None:
        """``pydvm run``: answered ``started`` at once (or ``queued``, then
        ``started``: :mod:`~pydvm.runtime.master.jobqueue`), then with the job's report."""
        if _trace.PATH:
            _trace.mark("master.run")
        rid = msg.get("id")
        status, text = self._submit(tool, msg)
        if status != Status.SUCCESS:
            tool.send(reply(rid, status, text))

    def run_many(self, tool: ToolSession, msg: Message) -> None:
        """``run_many``: many ``run`` requests in one (``jobs``: each a run's
        body with its own ``id``, no ``t``).  Answered at once with
        ``results``, ``[id, status, nspace or error]`` per job in order; each
        job accepted then goes on as a single ``run`` of its id does.  Jobs
        that start together are launched with one message per node."""
        rid, specs = msg.get("id"), msg.get("jobs")
        if not isinstance(specs, list) or not specs:
            tool.send(reply(rid, Status.ERR_BAD_PARAM, "run_many needs a non-empty list 'jobs'"))
            return
        if len(specs) > MAX_BATCH:
            tool.send(reply(rid, Status.ERR_BAD_PARAM, f"run_many takes at most {MAX_BATCH} "
                                                       f"jobs, not {len(specs)}"))
            return
        results: list[list] = []
        accepted: list[tuple[dict, Any]] = []
        seen: set = set()
        for i, spec in enumerate(specs):
            sid = spec.get("id") if isinstance(spec, dict) else None
            if sid is None or isinstance(sid, (bool, dict, list, bytes)) or sid == rid:
                results.append([sid if not isinstance(sid, (dict, list)) else None,
                                int(Status.ERR_BAD_PARAM),
                                f"job {i}: needs its own id (a number or string)"])
                continue
            if sid in seen:
                results.append([sid, int(Status.ERR_BAD_PARAM), f"job {i}: id {sid!r} repeated"])
                continue
            seen.add(sid)
            spec = {**spec, "t": "run"}
            status, text = self._plan(tool, spec)
            results.append([sid, int(status), text])
            if status == Status.SUCCESS:
                accepted.append((spec, sid))
        tool.send(reply(rid, Status.SUCCESS, results=results))
        for spec, sid in accepted:
            self._start(tool, sid, spec)

    def _submit(self, tool: ToolSession, msg: Message) -> tuple[Status, str]:
        status, text = self._plan(tool, msg)
        if status == Status.SUCCESS:
            self._start(tool, msg.get("id"), msg)
        return status, text

    def _plan(self, tool: ToolSession, msg: Message) -> tuple[Status, str]:
        """Plan a ``run`` (kept in ``msg["_planned"]``): SUCCESS and its
        namespace, or the refusal."""
        # Jobs run as the submitting user (only a multi-user DVM, run by root,
        # can start them as anyone but itself).
        msg["_uid"], msg["_gid"] = tool.uid, tool.gid
        try:
            job, per_node = self._processes.plan(msg)
        except ValueError as exc:
            return Status.ERR_BAD_PARAM, str(exc)
        why = pmix_refusal(self._nodes, msg, job)
        if why:
            return Status.ERR_BAD_PARAM, why
        if self._queue.wanted(msg):
            why = self._queue.refusal(job)
            if why:
                return Status.ERR_OUT_OF_RESOURCE, why
        msg["_planned"] = (job, per_node)
        return Status.SUCCESS, job.nspace

    def _start(self, tool: ToolSession, rid: Any, msg: Message) -> None:
        job, per_node = msg.pop("_planned")
        if msg.get("output") != "discard":
            # its output comes here: no more of it in flight than the windows
            # allow, or a signalled `pydvm run` would still have megabytes to
            # write when the job has ended
            tool.channel.cap_send_buffer(OUTPUT_SEND_BUFFER)
        if self._queue.wanted(msg):
            self._queue.submit(tool, rid, job, per_node, msg)
        else:
            self._tasks.start(self._processes.run(tool, rid, job, per_node), (tool.channel, rid))

    def kill_job(self, tool: ToolSession, msg: Message) -> None:
        """End a job: the submitter's own, or any for root and the DVM's owner.

        Sent by ``pydvm kill NSPACE`` (with ``wait: true``: answered once the
        job has ended -- its processes reaped, its purges applied -- with
        ``exit``), by a ``pydvm run`` interrupted by a signal (``signal``:
        its number; answered at once) and by the job API on the connection
        that submitted the job (no ``signal``: "killed by its submitter").
        The job's ``pydvm run`` is told who ended it.
        """
        rid, ns = msg.get("id"), msg.get("nspace")
        job = self._running_target(tool, msg, _own_kill(msg.get("signal")), "")
        if job is None:
            return
        if self._processes.tool_of(ns) is tool:
            self._processes.kill(ns, _own_kill(msg.get("signal")))
        else:
            self._processes.kill(ns, f"killed by 'pydvm kill' from {_user(tool.uid)}")
        self._answer_kill(tool, rid, ns, msg.get("wait") is True)

    def _answer_kill(self, tool: ToolSession, rid: Any, ns: str, wait: bool) -> None:
        """Answer a kill: at once, or (``wait``) once the job is over, with ``exit``."""
        over = self._processes.when_over(ns)
        if not wait or over is None:
            tool.send(reply(rid, Status.SUCCESS))
            return

        async def run() -> None:
            job = await asyncio.shield(over)
            tool.send(reply(rid, Status.SUCCESS, exit=job.exit_status))
        self._tasks.start(run(), (tool.channel, rid))

    def _running_target(self, tool: ToolSession, msg: Message, own: str,
                        sig: str) -> JobRecord | None:
        """The running job ``msg`` names, if ``tool`` may end it; else None,
        ``msg`` answered: a queued job taken off the queue (:meth:`_off_queue`
        with ``own`` and ``sig``), an unknown one NOT_FOUND, another's refused."""
        rid, ns = msg.get("id"), msg.get("nspace")
        job = self._processes.jobs.get(ns) if isinstance(ns, str) else None
        queued = self._queue.get(ns) if job is None else None
        if queued is not None:
            if not _refused_kill(tool, rid, queued):
                self._off_queue(tool, msg, ns, own, sig)
            return None
        if job is None:
            tool.send(reply(rid, Status.ERR_NOT_FOUND,
                            f"no running job {ns!r} ('pydvm ps' lists the jobs)"))
            return None
        return None if _refused_kill(tool, rid, job) else job

    def _off_queue(self, tool: ToolSession, msg: Message, ns: str, own: str,
                   sig: str) -> None:
        """Take queued job ``ns`` off the queue for ``tool``'s ``msg`` (a kill
        it may make): its reason ``own`` if ``tool`` submitted it, else who
        killed it (``sig``: the signal's words, or ''); answered at once
        (``exit`` with ``wait``)."""
        if self._queue.tool_of(ns) is tool:
            why = f"killed while queued: {own}"
        else:
            why = f"killed while queued by 'pydvm kill'{sig} from {_user(tool.uid)}"
        self._queue.remove(ns, why)
        extra = {"exit": QUEUED_KILL_EXIT} if msg.get("wait") is True else {}
        tool.send(reply(msg.get("id"), Status.SUCCESS, **extra))

    def release_job(self, tool: ToolSession, msg: Message) -> None:
        """Release a job started stopped in ``PMIx_Init`` (``pydvm release
        NSPACE``, ``Job.release()``): ``PMIX_DEBUGGER_RELEASE`` to its
        processes (runtime/master/debugging.py); answered once every node of the job
        has passed it on, with ``waiting``: the nodes where its processes
        had said they wait.
        Who may: as ``kill_job``.  A job not started stopped is refused
        ``ERR_BAD_PARAM``; releasing one twice is harmless."""
        from . import debugging
        rid, ns = msg.get("id"), msg.get("nspace")
        job = self._processes.jobs.get(ns) if isinstance(ns, str) else None
        if job is None:
            what = "is queued: release it once it runs" if isinstance(ns, str) and \
                self._queue.get(ns) is not None else "is not running ('pydvm ps' lists the jobs)"
            tool.send(reply(rid, Status.ERR_NOT_FOUND, f"job {ns!r} {what}"))
            return
        if _refused_kill(tool, rid, job, "release"):
            return
        if not job.stop_in_init:
            tool.send(reply(rid, Status.ERR_BAD_PARAM,
                            f"{ns} was not started stopped (pydvm run --stop-in-init)"))
            return
        waiting = sorted(job.debug_ready)

        async def deliver() -> None:
            await debugging.release(self._nodes, job, (self._processes.dvm_nspace, 0),
                                    f"'pydvm release' from {_user(tool.uid)}")
            tool.send(reply(rid, Status.SUCCESS, waiting=waiting))
        self._tasks.start(deliver(), (tool.channel, rid))

    def signal_job(self, tool: ToolSession, msg: Message) -> None:
        """Send one signal (``signal``: its number) to every process of a job
        (each process's group, as a kill does); who may: as ``kill_job``.

        SIGTERM and SIGKILL end the job as ``pydvm kill`` does -- SIGTERM is
        ``kill_job`` itself (SIGKILL after the grace), SIGKILL goes first
        (no grace) -- and its report names the signal and who sent it; with
        ``wait: true`` answered once the job has ended, with ``exit``.  Any
        other signal is only delivered: answered once every node of the job
        has (``signalled``: how many processes got it); the job goes on, and
        a process the signal ends counts as failed on its own.  A queued job
        is taken off the queue, whatever the signal.
        """
        rid, ns, sig = msg.get("id"), msg.get("nspace"), msg.get("signal")
        if (not isinstance(sig, int) or isinstance(sig, bool) or sig <= 0
                or sig not in _signal.valid_signals()):
            tool.send(reply(rid, Status.ERR_BAD_PARAM,
                            f"signal must be a signal number (1 to {int(_signal.SIGRTMAX)}), "
                            f"not {sig!r}"))
            return
        name = _sig_name(sig)
        job = self._running_target(tool, msg, f"killed by its submitter ({name})", f" ({name})")
        if job is None:
            return
        if sig in (_signal.SIGTERM, _signal.SIGKILL):
            if sig == _signal.SIGKILL:  # ahead of the kill on each link: no SIGTERM first
                for node in job.nodes():
                    self._nodes.send(node, {"t": "signal", "nspace": ns, "signal": sig})
            if self._processes.tool_of(ns) is tool:
                why = f"killed by its submitter ({name})"
            else:
                why = f"killed by 'pydvm kill' ({name}) from {_user(tool.uid)}"
            self._processes.kill(ns, why)
            self._answer_kill(tool, rid, ns, msg.get("wait") is True)
            return

        async def deliver() -> None:
            answers = await self._nodes.broadcast({"t": "signal", "nspace": ns, "signal": sig},
                                                  job.nodes(), what=f"{name} to {ns}")
            n = sum(r.get("signalled") or 0 for _, r in answers if r.get("status") == 0)
            tool.send(reply(rid, Status.SUCCESS, signalled=n))
        self._tasks.start(deliver(), (tool.channel, rid))

    def job_procs(self, tool: ToolSession, msg: Message) -> None:
        """A running job's processes, for its owner (and the DVM's owner,
        root): ``procs``, one ``[rank, node, pid, state, status, signal]``
        per rank -- ``state`` ``pending`` (not started yet), ``running`` or
        ``ended`` (then ``status``: 128+N for signal N, and ``signal``);
        ``pid`` as its node reports it (0 if it has none).  A queued job is
        answered with ``queued: true`` and no processes."""
        rid, ns = msg.get("id"), msg.get("nspace")
        job = self._processes.jobs.get(ns) if isinstance(ns, str) else None
        queued = self._queue.get(ns) if job is None else None
        if job is None and queued is None:
            tool.send(reply(rid, Status.ERR_NOT_FOUND,
                            f"no running or queued job {ns!r} ('pydvm ps' lists them)"))
            return
        if not (tool.privileged or (job or queued).uid == tool.uid):
            tool.send(reply(rid, Status.ERR_NO_PERMISSIONS,
                            f"{ns} is not your job: only its owner, the DVM's owner and root "
                            "see its processes"))
            return
        if job is None:
            tool.send(reply(rid, Status.SUCCESS, queued=True, procs=[]))
            return

        async def run() -> None:
            pids: dict[int, int] = {}
            live = {p.node for p in job.procs.values() if p.state is ProcState.RUNNING}
            for _, r in await self._nodes.broadcast({"t": "pids", "nspace": ns}, live,
                                                    what="pids"):
                for rank, pid in r.get("pids") or ():
                    pids[int(rank)] = int(pid)
            rows = []
            for rank in sorted(job.procs):
                p = job.procs[rank]
                rows.append([rank, p.node, pids.get(rank, 0), p.state.value, p.exit_status,
                             p.signal])
            tool.send(reply(rid, Status.SUCCESS, procs=rows))
        self._tasks.start(run(), (tool.channel, rid))

    def ps(self, tool: ToolSession, msg: Message) -> None:
        """The DVM's jobs, every user's (as ``ps`` shows every process), then
        the queued ones in the order they will start: see :func:`job_row`
        for the fields."""
        rows = [job_row(j) for j in self._processes.jobs.values()]
        rows += [job_row(j, "queued") for j in self._queue.queued()]
        tool.send(reply(msg.get("id"), Status.SUCCESS, jobs=rows))

    def stop(self, tool: ToolSession, msg: Message) -> None:
        """``pydvm stop``: every job killed, the DVM stopped; answered then."""
        self._queue.clear("killed while queued because the DVM was stopped ('pydvm stop')")
        self._processes.kill_all("killed because the DVM was stopped ('pydvm stop')")

        async def run() -> None:
            await self._stop()
            tool.send(reply(msg.get("id"), Status.SUCCESS, pid=os.getpid()))
        self._tasks.start(run(), (tool.channel, msg.get("id")))

    def session_new(self, tool: ToolSession, msg: Message) -> None:
        """``pydvm session new``: a DVM session over the hosts named (default: every up node)."""
        hosts = msg.get("hosts")
        specs: list[HostSpec] | None = None
        try:
            if hosts:
                specs = []
                for entry in hosts:
                    name, slots = entry
                    node = self._nodes.get(name)
                    if node is None:
                        raise ValueError(f"host {name!r} is not in this DVM")
                    if not isinstance(slots, int) or isinstance(slots, bool) or slots < 0:
                        raise ValueError(f"bad slot count {slots!r} for host {name!r}")
                    specs.append(HostSpec(name, slots if slots else node.slots))
                down = [h.name for h in specs if not self._nodes.is_up(h.name)]
                if down:
                    raise ValueError(f"node(s) not available: {', '.join(down)}")
            sid = self._processes.new_session(specs)
        except (TypeError, ValueError) as exc:
            tool.send(reply(msg.get("id"), Status.ERR_BAD_PARAM, str(exc)))
            return
        tool.send(reply(msg.get("id"), Status.SUCCESS, session=sid))

    def session_end(self, tool: ToolSession, msg: Message) -> None:
        """``pydvm session end``: answered once the session's purges are applied everywhere."""
        sid = msg.get("session")
        rid = msg.get("id")
        if sid == DEFAULT_SESSION:
            tool.send(reply(rid, Status.ERR_BAD_PARAM, "the default session ends with the DVM"))
            return
        rec = self._processes.sessions.get(sid) if isinstance(sid, int) else None
        if rec is None or rec.ending:
            tool.send(reply(rid, Status.ERR_NOT_FOUND, f"no session {sid!r}"))
            return

        async def run() -> None:
            await self._processes.end_session(sid)
            tool.send(reply(rid, Status.SUCCESS))
        self._tasks.start(run(), (tool.channel, rid))

    def store(self, tool: ToolSession, msg: Message) -> None:
        """``pydvm store``: every store's figures (the tool's own keys listed)."""
        uid = tool.uid
        prefix = msg.get("prefix")
        if prefix is not None and not isinstance(prefix, str):
            tool.send(reply(msg.get("id"), Status.ERR_BAD_PARAM,
                            f"prefix must be a str, not {type(prefix).__name__}"))
            return
        ask = {"t": "stats", "uid": uid}
        if prefix is not None:
            ask["prefix"] = prefix

        async def run() -> None:
            stores = [self._data.stats_row(uid, prefix)]
            answers = await self._nodes.broadcast(ask, set(self._nodes.up_names()),
                                                  what="stats")
            for name, r in answers:
                if r.get("status") == 0:
                    stores.append(r["store"])
                else:
                    stores.append({"store": name, "error": r.get("msg", "")})
            tool.send(reply(msg.get("id"), Status.SUCCESS, stores=stores))
        self._tasks.start(run(), (tool.channel, msg.get("id")))

    def ping(self, tool: ToolSession, msg: Message) -> None:
        """A relay's heartbeat (or any tool's liveness probe): always answered."""
        tool.send(reply(msg.get("id"), Status.SUCCESS))

    def info(self, tool: ToolSession, msg: Message) -> None:
        """``pydvm info``: parameters, nodes, sessions, jobs, records, ..."""
        tool.send(reply(msg.get("id"), Status.SUCCESS, **self._describe()))


def job_row(job: JobRecord, state: str | None = None) -> dict:
    """One job as ``pydvm ps`` shows it.

    ``nspace``, ``uid``, ``session``, ``state`` (:attr:`JobRecord.state`, or
    ``queued``), ``started`` (wall-clock seconds since the epoch: when it
    was submitted, for a queued job), ``apps``
    (``[{"argv", "n"}]`` in app order), ``ranks_per_node`` (``{node: n}``),
    ``procs`` (how many), ``ended`` (how many have ended) and ``failed`` (how
    many of those failed on their own).
    """
    return {
        "nspace": job.nspace,
        "uid": job.uid,
        "session": job.session_id,
        "state": state or job.state,
        "started": job.started,
        "apps": [{"argv": list(a.argv), "n": len(a.ranks)} for a in job.apps],
        "ranks_per_node": job.ranks_per_node(),
        "procs": job.size,
        "ended": job.terminated,
        "failed": len(job.failures),
        # started stopped in PMIx_Init: the nodes where its processes wait there
        **({"waiting_in_init": sorted(job.debug_ready)} if job.stop_in_init else {}),
    }


def _own_kill(sig: Any) -> str:
    """Why a job ended that its own tool killed: a ``pydvm run`` sends the
    signal that interrupted it; a program's job API (:mod:`pydvm.jobs`)
    sends none."""
    if isinstance(sig, int) and not isinstance(sig, bool):
        return f"its pydvm run was interrupted (signal {sig})"
    return "killed by its submitter"


def _refused_kill(tool: ToolSession, rid: Any, job: JobRecord, what: str = "kill") -> bool:
    """Refuse (answer NO_PERMISSIONS, return True) a kill (or ``what``) of
    ``job`` by a tool that is neither its owner nor privileged (the DVM's
    owner, root)."""
    if tool.privileged or job.uid == tool.uid:
        return False
    tool.send(reply(rid, Status.ERR_NO_PERMISSIONS,
                    f"{job.nspace} is not your job (uid {job.uid}); only its owner, the "
                    f"DVM's owner and root may {what} it"))
    return True


def _sig_name(sig: int) -> str:
    """``SIGUSR1``; ``signal 40`` for one without a name."""
    try:
        return _signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _user(uid: int) -> str:
    """``name (uid N)``, or ``uid N`` when the name is unknown."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (KeyError, OverflowError):
        return f"uid {uid}"
