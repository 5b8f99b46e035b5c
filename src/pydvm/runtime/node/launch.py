"""A node's share of a job: its processes started, and each watched until reaped.

:func:`start_share` starts the ranks a ``launch`` gives this node, all or
none: every executable is resolved first, as a shell would in the process's
working directory; the binding is planned (:mod:`pydvm.runtime.node.cpubind`);
a PMIx job's ranks are registered with libpmix at once, before the first
starts; then each rank gets its environment -- what the request carries,
cleaned of a foreign launcher's state (:mod:`pydvm.runtime.node.ompienv`), plus
pydvm's ``PYDVM_*``, PMIx's, what ``mpirun`` gives its ranks
(:mod:`pydvm.runtime.node.jobdirs`) and its binding -- and is started with its
streams (:mod:`pydvm.runtime.node.jobio`), listed with the guardian.  If one
cannot start, the share fails and the master kills the ranks already
started.

:func:`watch` pumps a process's output to the master within the job's
window, waits for its end, drains what it wrote, and reports ``exited``
(with what the process did with PMIx) once the node has reaped it
(:meth:`NodeServer.reaped <pydvm.runtime.node.server.NodeServer.reaped>`).

:class:`LocalJob` and :class:`LocalProc` are what a node keeps of a job's
share and of each of its processes (``NodeServer.jobs``).
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ... import _trace
from ...errors import Status
from ...pmi1 import detect
from ...wire import Message, reply
from ..pmixhost import FOREIGN_LAUNCH_PREFIXES, OMPI_JOB_DIRS
from ..shared import jobproc
from ..shared.credential import ENV as credential_env
from ..shared.peers import ClientSession
from . import jobdirs
from . import jobio
from . import ompienv
from .jobio import PumpState, drain_output, pump_output

if TYPE_CHECKING:
    from .server import NodeServer


@dataclass
class LocalProc:
    """One process of a job on this node, from its launch until it is reaped."""

    nspace: str
    rank: int
    app_idx: int
    process: jobproc.ChildProcess | None = None
    ended: bool = False
    #: connections acting for this process (closed when it is reaped).
    sessions: set[ClientSession] = field(default_factory=set)

    @property
    def pgid(self) -> int | None:
        return self.process.pid if self.process is not None else None


@dataclass
class LocalJob:
    """This node's share of a job, from its first launch until the master's
    NSPACE purge says the job has ended everywhere."""

    nspace: str
    session_id: int
    procs: dict[int, LocalProc] = field(default_factory=dict)
    #: the job's owner in a multi-user DVM (its processes run as them).
    uid: int | None = None
    gid: int | None = None
    #: output this node may still send before an ``output_ack``, in
    #: :func:`~pydvm.runtime.node.jobio.output_cost` units (bytes plus a per-message charge).
    credit: int = 0
    credit_ok: asyncio.Event = field(default_factory=asyncio.Event)
    #: output pumps still running (cancelled at the job's cleanup).
    pumps: set[asyncio.Task] = field(default_factory=set)
    #: the job's per-node directory (:func:`.jobdirs.job_dir`), if it has one.
    work_dir: Path | None = None


def node_environment(uid: int | None = None) -> dict[str, str]:
    """This node's environment, for a process of a job that asked for it
    instead of ``pydvm run``'s (``mpiexec``'s ``-genvnone``,
    ``-genvlist``): the daemon's own, as Hydra's processes get their
    proxy's -- less pydvm's variables -- or, for a job of another user
    ``uid``, only ``PATH`` and that user's ``HOME``, ``USER``,
    ``LOGNAME`` and ``SHELL``."""
    if uid is None:
        return {k: v for k, v in os.environ.items() if not k.startswith("PYDVM_")}
    import pwd

    env = {"PATH": os.environ["PATH"]} if "PATH" in os.environ else {}
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        return env
    env.update({"HOME": pw.pw_dir, "USER": pw.pw_name, "LOGNAME": pw.pw_name,
                "SHELL": pw.pw_shell or "/bin/sh"})
    return env


async def start_share(node: "NodeServer", msg: Message) -> Message:
    """Start this node's share of a job; its answer (a reply without an id)."""
    rid = None
    ns = msg.get("nspace")
    if _trace.PATH:
        _trace.mark("node.launch", ns)
    procs = msg.get("procs") or []
    job = node.jobs.get(ns)
    if job is None:
        job = node.jobs[ns] = LocalJob(ns, msg.get("session_id", 0),
                                       credit=node.values["pydvm_output_window"])
        job.credit_ok.set()
    switch = None
    if node.multi_user and msg.get("uid") is not None:
        job.uid, job.gid = msg["uid"], msg["gid"]
        if job.uid != os.getuid():
            switch = jobproc.credentials(job.uid, job.gid)
    if any(p.get("node_env") for p in procs):  # mpiexec's -genvnone/-genvlist
        base = node_environment(job.uid if switch else None)
        procs = [dict(p, env={**base, **p["env"]}) if p.get("node_env") else p for p in procs]
    # Resolve every executable first, as a shell would in the process's
    # working directory: a job either starts here or fails whole.
    programs: dict[int, str | None] = {}
    for p in procs:
        exe, path, cwd = p["argv"][0], p["env"].get("PATH", os.defpath), \
            jobproc.workdir(p.get("cwd"))
        why, code = jobproc.find_program(exe, path, cwd)
        if why:
            return reply(rid, Status.ERR_NOT_FOUND, f"{node.name}: {why}", exit=code)
        programs[p["rank"]] = jobproc.resolved(exe, path, cwd)
    bind = node.binding.plan(msg, procs)
    if _trace.PATH:
        _trace.mark("node.bound", ns)
    if bind.refusal:
        return reply(rid, Status.ERR_OUT_OF_RESOURCE, bind.refusal, exit=1)
    layout = msg.get("pmix")
    uid = msg["uid"] if isinstance(msg.get("uid"), int) else os.getuid()
    gid = msg["gid"] if isinstance(msg.get("gid"), int) else os.getgid()
    pmix_envs: list[dict[str, str]] = [{} for _ in procs]
    iface = interface(node, msg, procs, programs)
    pmix = bool(layout) and node.pmix.running and iface in ("pmix", "watch")
    if pmix:
        # Every rank here is registered with libpmix before the first one
        # starts, all at once: one wait on libpmix's thread, not one per rank.
        for p in procs:
            job.procs[p["rank"]] = LocalProc(ns, p["rank"], p["app_idx"])
        pmix_envs = await node.pmix.register_job(
            job, layout, uid, gid, bind.pmix, [(p["rank"], p["app_idx"]) for p in procs])
        if _trace.PATH:
            _trace.mark("node.registered", ns)
    pmi1: list = [None] * len(procs)  # (environment, the process's socket) each
    if iface in ("pmi1", "watch"):
        pmi1 = node.pmi1.prepare(job, msg, procs, watch=iface == "watch")
    started = 0
    # what mpirun tells every rank (OMPI_COMM_WORLD_RANK...), PMIx or not
    ompi_envs = jobdirs.ompi_envs(node, job, layout, procs)
    for p, pmix_env, ompi_env, pmi in zip(procs, pmix_envs, ompi_envs, pmi1):
        env = ompienv.without_stale(
            p["env"], FOREIGN_LAUNCH_PREFIXES if pmix or pmi else ())
        env.update({
            "PYDVM_SERVER": node.socket_path,
            "PYDVM_NSPACE": ns,
            "PYDVM_RANK": str(p["rank"]),
            "PYDVM_APP_IDX": str(p["app_idx"]),
            "PYDVM_JOB_SIZE": str(msg.get("job_size")),
            "PYDVM_NODE": node.name,
            "PYDVM_SESSION": str(job.session_id),
        })
        if pmix:
            # (never beside PMI-1's: MPICH >= 4.1 aborts when offered both)
            env["PMIX_NAMESPACE"] = ns
            env["PMIX_RANK"] = str(p["rank"])
        env.pop(credential_env, None)  # never one inherited from elsewhere
        if node.voucher is not None:
            run_uid, run_gid = (switch[0], switch[1]) if switch else (os.getuid(),
                                                                     os.getgid())
            env.update(node.voucher.environment(ns, p["rank"], run_uid, run_gid,
                                                p["app_idx"], job.session_id))
        lp = job.procs.get(p["rank"])
        if lp is None:
            lp = job.procs[p["rank"]] = LocalProc(ns, p["rank"], p["app_idx"])
        if pmix:
            env.update(pmix_env)
            spawned = dict(p.get("pmix_env") or {})  # MPI_Comm_spawn passes on the
            ompienv.drop_stale(spawned)  # parent's OMPI_MCA_*: its launch state goes
            env.update(spawned)
            ompienv.own_job_dirs(env, OMPI_JOB_DIRS, str(jobdirs.job_dir(node, job)))
        env.update(ompi_env)
        keep: tuple[int, ...] = ()
        if pmi is not None:
            env.update(pmi[0])
            keep = (pmi[1].fileno(),) if pmi[1] is not None else ()
        if pmix and "I_MPI_PMI_LIBRARY" not in env and node.pmix.library:
            # Intel MPI speaks PMI-1 unless told where libpmix is (a user's value wins)
            env["I_MPI_PMI_LIBRARY"] = node.pmix.library
        env.update(bind.environment(p["rank"]))  # after drop_stale: pydvm's binding
        cwd = jobproc.workdir(p.get("cwd"))
        try:
            with node.binding.applied(bind.cpus.get(p["rank"])):
                lp.process, ours = jobio.start_with_streams(
                    p["argv"], env=env, cwd=cwd, stdin=p.get("stdin") is True,
                    switch=switch, output=msg.get("output") != "discard",
                    death_signal=node.values["pydvm_death_signal"] == "on",
                    program=programs.get(p["rank"]), pass_fds=keep)
        except OSError as exc:
            for q, x in zip(procs[started:], pmi1[started:]):
                node.pmi1.forget(ns, q["rank"])
                if x is not None and x[1] is not None:
                    x[1].close()
            # Already started ranks of this job are killed by the master.
            job.procs.pop(p["rank"], None)
            for q in procs[started:]:
                job.procs.pop(q["rank"], None)
            return reply(rid, Status.ERR_NOT_FOUND,
                         f"{node.name}: cannot start {p['argv'][0]}: {exc}",
                         exit=126 if isinstance(exc, PermissionError) else 127)
        finally:
            if pmi is not None and pmi[1] is not None:
                pmi[1].close()  # the process has its own copy (or never will)
        node.guardian.track(lp.process.pid)
        started += 1
        if len(ours) == 3:
            node.stdin_feed(ns).attach(p["rank"], ours[2])
        node.spawn(watch(node, job, lp, ours[0], ours[1]))
    if _trace.PATH:
        _trace.mark("node.started", ns)
    return reply(rid, Status.SUCCESS, **({"report": bind.report} if bind.report else {}))

def interface(node: "NodeServer", msg: Message, procs: list[dict],
              programs: dict[int, str | None]) -> str:
    """The interface this node offers the job's processes: ``pmix``,
    ``pmi1``, ``none``, or ``watch`` -- PMIx, plus a PMI-1 socket that ends
    the job with advice if a process speaks PMI-1 on it: ``--mpi auto`` and
    a program whose MPI cannot be told (:mod:`pydvm.pmi1.detect`), or
    ``--mpi pmix`` (``--pmix``) and one not known to be a PMIx program.
    Every node of a job decides alike: from every application's program,
    not only its own share's."""
    asked = msg.get("mpi") or "auto"
    if asked in ("pmi1", "none"):
        return asked
    env = procs[0]["env"] if procs else {}
    cwd = jobproc.workdir(procs[0].get("cwd")) if procs else None
    here = {p["argv"][0]: programs.get(p["rank"]) for p in procs}
    seen = []
    for argv in (msg.get("pmix") or {}).get("argv") or [p["argv"] for p in procs]:
        exe = argv[0] if argv else ""
        if "/" in exe:
            path = os.path.join(cwd or os.getcwd(), exe)
        else:
            path = here.get(exe) or jobproc.resolved(exe, env.get("PATH", os.defpath), cwd)
            if path and "/" not in path:
                path = None
            elif path and not os.path.isabs(path):
                path = os.path.join(cwd or os.getcwd(), path)
        if path:
            seen.append((path, env))
        else:
            seen.append(("", env))  # cannot be told here
    found = detect.job_interface(seen)
    if asked == "pmix":  # as asked -- but an MPICH-family program would run as singletons
        return "pmix" if found == "pmix" else "watch"
    return "watch" if found is None else found


async def watch(node: "NodeServer", job: LocalJob, lp: LocalProc, out_fd: int | None,
                err_fd: int | None) -> None:
    proc = lp.process
    states = [PumpState(), PumpState()]
    window = node.values["pydvm_output_window"]
    pumps = [node.spawn(pump_output(job, lp.nspace, lp.rank, fd, which, state, window,
                                     node.uplink))
             for fd, which, state in ((out_fd, 1, states[0]), (err_fd, 2, states[1]))
             if fd is not None]  # None: its output goes to /dev/null
    job.pumps.update(pumps)
    for t, fd in zip(pumps, (out_fd, err_fd)):
        t.add_done_callback(job.pumps.discard)
        # Closed once its pump is over, however it ended (even cancelled unstarted).
        t.add_done_callback(lambda _t, fd=fd: os.close(fd))
    rc = await proc.wait()
    if _trace.PATH:
        _trace.mark("node.exit", lp.nspace)
    feed = node.stdin_feeds.get(lp.nspace)
    if feed is not None:
        feed.gone(lp.rank)  # a reader that ended holds nobody back
    await drain_output(pumps, states)
    status = 128 - rc if rc < 0 else rc  # -N means killed by signal N
    # what it did with PMIx (None, "connected", "finalized"): one that
    # connected and never finalized ended abnormally whatever its status
    pmix = node.pmix.client_state(lp.nspace, lp.rank) or \
        node.pmi1.client_state(lp.nspace, lp.rank)
    if pmix == "connected" and status:
        # ended on its own because its PMIx server died? that is said first
        node.pmix.check_server(lp.nspace)
    node.reaped(job, lp)
    if not node.uplink.closed:
        msg = {"t": "exited", "nspace": lp.nspace, "rank": lp.rank,
               "status": status, "signal": -rc if rc < 0 else 0}
        if pmix:
            msg["pmix"] = pmix
        node.uplink.send(msg)
        if _trace.PATH:
            _trace.mark("node.exited", lp.nspace)
