"""The ``pydvm`` PSI/J executor: PSI/J jobs run as jobs of a pydvm DVM.

    import psij
    ex = psij.JobExecutor.get_instance("pydvm")          # PYDVM_URI's DVM
    job = psij.Job(psij.JobSpec("/bin/hostname", stdout_path="out.txt",
                                resources=psij.ResourceSpecV1(node_count=2,
                                                              processes_per_node=2)))
    ex.submit(job)
    job.wait()

PSI/J finds the executor through the ``psij-descriptors`` namespace package
(``src/psij-descriptors/pydvm_psij.py``, installed with pydvm).  Which DVM:
the executor's ``url`` (a pydvm URI, ``tcp://HOST:PORT/ID`` as ``pydvm
start`` prints it), else ``PYDVM_URI``, else a DVM of this machine alone
that the executor starts on its first job and that stops when the Python
process exits (one for every executor of the process without a URI).

How a :class:`psij.JobSpec` maps onto a DVM job is :mod:`pydvm.psij.spec`'s
(pure); this module submits it through the job API (:mod:`pydvm.jobs`) and
turns what the DVM reports into PSI/J states: QUEUED once the DVM has the
job (its namespace is the job's ``native_id``), ACTIVE once its processes
run, then COMPLETED (exit 0), FAILED (another status, a launch failure, its
walltime) or CANCELED (after :meth:`cancel`).
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import subprocess
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Optional

from psij import (InvalidJobException, Job, JobExecutor, JobExecutorConfig, JobState,
                  JobStatus, SubmitException)

from ..errors import BadParamError
from . import spec as S

logger = logging.getLogger(__name__)


def _jobs_api():
    """The job API (:mod:`pydvm.jobs`)."""
    from .. import jobs

    return jobs


class PydvmJobExecutorConfig(JobExecutorConfig):
    """The ``pydvm`` executor's configuration.

    ``hosts``: the nodes of the DVM the executor starts when it has no URI
    (``url``, ``PYDVM_URI``): as ``pydvm start --hosts`` (``"a,b"``: local
    daemons named a and b); None: this machine alone.  ``params``: that
    DVM's parameters (``{"pydvm_queue": "on"}``, as ``pydvm start --mca``).
    ``work_directory`` (PSI/J's): where ``PSIJ_NODEFILE`` files are written
    -- on a DVM over several machines, a directory they all see.
    """

    def __init__(self, launcher_log_file: Optional[Path] = None,
                 work_directory: Optional[Path] = None, hosts: Optional[str] = None,
                 params: Optional[dict] = None) -> None:
        super().__init__(launcher_log_file=launcher_log_file, work_directory=work_directory)
        self.hosts = hosts
        self.params = dict(params or {})


# ----------------------------------------------------------------------
# connections: one per DVM per process, shared by its executors
# ----------------------------------------------------------------------

_conn_lock = threading.Lock()
_conns: dict[tuple, Any] = {}  # ("uri", URI) / ("own", hosts, params) -> Dvm


def _dvm_for(uri: Optional[str], hosts: Optional[str], params: dict) -> Any:
    """This process's connection to the DVM at ``uri``; without one, the
    DVM of ``hosts`` (None: this machine) and ``params`` this process
    starts on first use.  Both last until the process exits: closing a
    connection ends its jobs, and a started DVM is stopped then."""
    key = ("uri", uri) if uri is not None else ("own", hosts, tuple(sorted(params.items())))
    with _conn_lock:
        dvm = _conns.get(key)
        if dvm is not None and not dvm.closed:
            return dvm
        if dvm is not None:
            _listeners.pop(id(dvm), None)
        jobs = _jobs_api()
        dvm = jobs.connect(uri) if uri is not None else jobs.start(hosts, **params)
        if not _conns:
            atexit.register(_close_all)
        _conns[key] = dvm
        return dvm


class _Listeners:
    """The executors following one connection's job events: one
    subscription per connection (a DVM bounds them per connection), its
    events handed to every executor registered (on the reader thread)."""

    def __init__(self) -> None:
        self.executors: "weakref.WeakSet[PydvmJobExecutor]" = weakref.WeakSet()
        self.ok: Optional[bool] = None  # events pushed (None: not asked yet)

    def event(self, ev: Any) -> None:
        if ev.kind == "dropped":  # the DVM stopped pushing: look instead
            self.ok = False
        for ex in list(self.executors):
            if ev.kind == "dropped":
                ex._events_lost()
            else:
                ex._on_event(ev)


_listeners: dict[int, _Listeners] = {}  # id(connection) -> its listeners


def _listen(dvm: Any, ex: "PydvmJobExecutor") -> bool:
    """Hand ``dvm``'s job events to ``ex``; whether the DVM pushes them
    (False: an older DVM, or its subscription was dropped)."""
    with _conn_lock:
        ls = _listeners.get(id(dvm))
        if ls is None:
            ls = _listeners[id(dvm)] = _Listeners()
        ls.executors.add(ex)
        if ls.ok is None:
            try:
                dvm.on_event(ls.event)
                ls.ok = True
            except Exception as exc:  # an older DVM: UnsupportedError
                logger.debug("no job events from %s: %s", dvm, exc)
                ls.ok = False
        return ls.ok


def _close_all() -> None:
    with _conn_lock:
        dvms = list(_conns.values())
        _conns.clear()
    for dvm in dvms:
        try:
            dvm.close()
        except Exception as exc:  # at exit: say it, do not raise
            logger.warning("closing %s: %s", dvm, exc)


# ----------------------------------------------------------------------
# status changes: applied on a thread of their own
# ----------------------------------------------------------------------

_todo: "queue.SimpleQueue[Callable[[], None]]" = queue.SimpleQueue()
_dispatcher: Optional[threading.Thread] = None
_dispatcher_lock = threading.Lock()  # not _conn_lock: held while a DVM starts


def _later(fn: Callable[[], None]) -> None:
    """Run ``fn`` on the executors' status thread, in the order posted.

    What the job API reports arrives on its connection's reader thread,
    which must keep reading (it is what lets a job's output through) and
    on which nothing may wait for the DVM; a PSI/J status callback may well
    submit the next job (PSI/J's own examples do), which waits for the DVM
    to name it.  So job ends and post-launch scripts run here instead."""
    global _dispatcher
    _todo.put(fn)
    with _dispatcher_lock:
        if _dispatcher is None or not _dispatcher.is_alive():
            _dispatcher = threading.Thread(target=_dispatch, daemon=True,
                                           name="pydvm-psij status")
            _dispatcher.start()


def _dispatch() -> None:
    while True:
        fn = _todo.get()
        try:
            fn()
        except Exception:  # a bug of ours must not stop every job's updates
            logger.exception("pydvm executor: a status update failed")


# ----------------------------------------------------------------------
# one job
# ----------------------------------------------------------------------


class _Entry:
    """What the executor keeps of one PSI/J job it runs or watches."""

    __slots__ = ("job", "handle", "nspace", "canceled", "nodefile", "post_launch", "env",
                 "cwd", "active", "done")

    def __init__(self, job: Job) -> None:
        self.job = job
        self.handle: Any = None  # the job API's Job (None: attached by events alone)
        self.nspace: Optional[str] = None
        self.canceled = False
        self.nodefile: Optional[str] = None
        self.post_launch: Optional[str] = None
        self.env: Optional[dict] = None
        self.cwd: Optional[str] = None
        self.active = False
        self.done = False


def _source_env(script: str, env: dict[str, str], cwd: str) -> dict[str, str]:
    """The environment after ``source SCRIPT`` in bash (a pre-launch
    script, run where the executor runs, as PSI/J's launchers run it on the
    job's service node); SubmitException with its output if it fails."""
    p = subprocess.run(["/bin/bash", "-c", 'set -e; source "$1" 1>&2; env -0', "pre-launch",
                        script], env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=600)
    if p.returncode != 0:
        raise SubmitException(f"pre-launch script {script} failed (exit {p.returncode}): "
                              + p.stderr.decode("utf-8", "replace").strip()[-2000:])
    out: dict[str, str] = {}
    for item in p.stdout.split(b"\0"):
        k, sep, v = item.decode("utf-8", "surrogateescape").partition("=")
        if sep and k:
            out[k] = v
    return out


class PydvmJobExecutor(JobExecutor):
    """A :class:`psij.JobExecutor` that runs jobs on a pydvm DVM (see the
    module docstring; ``docs/workflows.md``, "The PSI/J executor")."""

    #: seconds :meth:`submit` waits for the DVM to name a job
    NAME_TIMEOUT = 60.0
    #: seconds between looks at attached jobs when the DVM does not push job
    #: events (jobs submitted here are told of by the job API itself)
    WATCH_INTERVAL = 0.2

    def __init__(self, url: Optional[str] = None,
                 config: Optional[JobExecutorConfig] = None) -> None:
        """
        :param url: the DVM's URI (``tcp://HOST:PORT/ID``); None:
            ``PYDVM_URI``, else a DVM of this process's own.
        :param config: a :class:`PydvmJobExecutorConfig` (or PSI/J's plain
            configuration).
        """
        super().__init__(url=url, config=config if config else PydvmJobExecutorConfig())
        self._uri = url or os.environ.get("PYDVM_URI") or None
        self._lock = threading.RLock()
        self._named = threading.Condition(self._lock)
        self._dvm: Any = None
        # nspace -> its entries: the job submitted, and any following it (attach)
        self._entries: dict[str, list[_Entry]] = {}
        self._early: dict[str, list] = {}  # nspace -> events seen before its entry
        self._events: Optional[bool] = None  # the DVM pushes job events (None: not asked)
        self._watcher: Optional[threading.Thread] = None

    # -- the DVM -------------------------------------------------------

    def _connect(self) -> Any:
        dvm = self._dvm
        if dvm is not None and not dvm.closed:
            return dvm
        try:  # not under our lock: starting a DVM takes seconds
            dvm = _dvm_for(self._uri, getattr(self.config, "hosts", None),
                           getattr(self.config, "params", {}))
        except Exception as exc:
            where = self._uri or "a DVM of this machine"
            raise SubmitException(f"cannot reach the DVM ({where}): {exc}") from exc
        with self._lock:
            if dvm is not self._dvm:
                self._dvm, self._events = dvm, None
        self._subscribe(dvm)
        return dvm

    def _subscribe(self, dvm: Any) -> None:
        """Follow every job's events (queued -> started -> ended), where the
        DVM pushes them; else :meth:`_watch` looks."""
        with self._lock:
            if self._events is not None:
                return
            self._events = False
        ok = _listen(dvm, self)
        with self._lock:
            self._events = ok

    def _events_lost(self) -> None:
        """The DVM dropped our subscription (we read too slowly): look at
        attached jobs instead."""
        with self._lock:
            self._events = False
        self._ensure_watcher()

    @staticmethod
    def _nodes(dvm: Any) -> list[tuple[str, int]]:
        """The DVM's up nodes: ``(name, slots)`` in its order."""
        try:
            nodes = dvm.nodes()
        except Exception as exc:
            raise SubmitException(f"cannot read the DVM's nodes: {exc}") from exc
        return [(n.name, int(n.slots)) for n in nodes if n.up]

    # -- PSI/J's interface ---------------------------------------------

    def submit(self, job: Job) -> None:
        """Submit ``job`` to the DVM.  On return the job is QUEUED (ACTIVE if
        the DVM started it at once) and its ``native_id`` is the DVM job's
        namespace.  InvalidJobException for a specification no DVM runs,
        SubmitException when the DVM cannot be reached or refuses the job;
        either way the job stays NEW."""
        spec = self._check_job(job)
        try:
            self._submit(job, spec)
        except BaseException:
            job.executor = None  # not submitted: the job may be submitted again
            raise

    def _submit(self, job: Job, spec: Any) -> None:
        dvm = self._connect()
        plan = S.plan_job(spec, nodes=lambda: self._nodes(dvm), environ=os.environ,
                          cwd=os.getcwd())
        entry = _Entry(job)
        env = plan.env
        if plan.pre_launch:
            env = _source_env(plan.pre_launch, env, plan.cwd)
        text = S.nodefile_text(plan)
        if text is not None:
            entry.nodefile = self._write_nodefile(job, text)
            env = {**env, "PSIJ_NODEFILE": entry.nodefile}
        entry.post_launch, entry.env, entry.cwd = plan.post_launch, env, plan.cwd
        kw: dict[str, Any] = dict(plan.options)
        if plan.hosts is not None:
            kw["hosts"] = list(plan.hosts)
        if plan.npernode is not None:
            kw["npernode"] = plan.npernode
        try:
            handle = dvm.submit(
                plan.argv, plan.n, env=env, inherit_env=False, cwd=plan.cwd,
                stdin=None if plan.stdin == os.devnull else plan.stdin,
                stdout=None if plan.stdout == os.devnull else plan.stdout,
                stderr=None if plan.stderr == os.devnull else plan.stderr,
                timeout=plan.timeout, queue=plan.queue, **kw)
        except (TypeError, ValueError, OSError) as exc:
            self._drop_nodefile(entry)
            raise InvalidJobException(f"the DVM cannot run this job: {exc}") from exc
        except Exception as exc:
            self._drop_nodefile(entry)
            raise SubmitException(f"cannot submit to the DVM: {exc}", exception=exc) from exc
        entry.handle = handle
        handle.add_state_callback(lambda h: self._wake())  # named (queued, running) or ended
        nspace = self._wait_named(handle)
        if nspace is None:  # refused before it was named
            self._drop_nodefile(entry)
            try:
                exc = handle.exception(0)
            except Exception as e:  # cancelled, or still pending after our wait
                exc = e
            if handle.done():
                if isinstance(exc, BadParamError):  # what it asks cannot be run
                    raise InvalidJobException(f"the DVM refused the job: {exc}")
                raise SubmitException(f"the DVM refused the job: {exc}", exception=exc)
            handle.kill()
            raise SubmitException(f"the DVM did not take the job in {self.NAME_TIMEOUT} s")
        entry.nspace = nspace
        job._native_id = nspace
        with self._lock:
            self._entries.setdefault(nspace, []).append(entry)
            early = self._early.pop(nspace, [])
        self._set_job_status(job, JobStatus(JobState.QUEUED, time=time.time(),
                                            metadata={"nativeId": nspace}))
        self._follow(entry)
        for ev in early:
            self._on_event(ev)
        handle.add_done_callback(lambda h, e=entry: _later(lambda: self._ended(e, h)))

    def _follow(self, entry: _Entry) -> None:
        """ACTIVE when the job API says the job started (its state callback:
        no events needed, nothing polled), or at once if it has."""
        handle = entry.handle
        handle.add_state_callback(lambda h, e=entry: h.state == "running" and _later(
            lambda: self._activate(e)))
        if handle.state == "running" or handle.done():
            self._activate(entry)

    def _wake(self) -> None:
        with self._named:
            self._named.notify_all()

    def _wait_named(self, handle: Any) -> Optional[str]:
        """Wait until the DVM names the job (queued or started: ``nspace``
        set), or refuses it; its namespace, or None.  Woken by the job's
        state callback (its first answer names it; its end), not by polling."""
        deadline = time.monotonic() + self.NAME_TIMEOUT
        with self._named:
            while handle.nspace is None and not handle.done():
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._named.wait(left)
        if handle.nspace is None:
            return None
        if handle.done() and handle.exception(0) is not None:
            return None
        return handle.nspace

    def cancel(self, job: Job) -> None:
        """Ask the DVM to end ``job``: it reaches CANCELED once its
        processes are gone (or COMPLETED / FAILED, had it ended first)."""
        if job.status.final:
            return
        entry = self._entry_of(job)
        if entry is None:
            raise SubmitException(f"job {job.id} is not one this executor runs")
        entry.canceled = True
        try:
            if entry.handle is not None:
                entry.handle.kill()
            else:
                self._connect().kill(entry.nspace)
        except Exception as exc:
            if not job.status.final:
                raise SubmitException(f"cannot cancel {entry.nspace}: {exc}") from exc

    def list(self) -> list[str]:
        """The namespaces of our user's jobs on the DVM (``pydvm ps``'s, however
        they were submitted): those :meth:`attach` may follow and
        :meth:`cancel` may end."""
        dvm = self._connect()
        uid = os.getuid()
        try:
            return [j.nspace for j in dvm.jobs() if j.uid in (None, uid)]
        except Exception as exc:
            raise SubmitException(f"cannot list the DVM's jobs: {exc}") from exc

    def attach(self, job: Job, native_id: str) -> None:
        """Follow the DVM job ``native_id`` (a namespace, as :meth:`list`
        gives) with ``job``, which must be NEW.  Where the DVM pushes job
        events the job ends with the DVM's exit status; else, as PSI/J's
        ``local`` executor does, it COMPLETES once the DVM no longer lists
        it (exit status unknown).  A namespace the DVM does not have is
        InvalidJobException."""
        if job.status.state != JobState.NEW:
            raise InvalidJobException("Job must be in the NEW state")
        dvm = self._connect()
        entry = _Entry(job)
        entry.nspace = native_id
        with self._lock:
            ours = [e.handle for e in self._entries.get(native_id, ()) if e.handle is not None]
            self._entries.setdefault(native_id, []).append(entry)
        try:
            info = dvm.job(native_id)
        except Exception as exc:
            self._forget(entry)
            raise SubmitException(f"cannot list the DVM's jobs: {exc}") from exc
        if info is None:
            self._forget(entry)
            raise InvalidJobException(f"the DVM has no job {native_id!r} (it ended, or "
                                      "never was; 'pydvm ps' lists its jobs)")
        if ours:  # a job this executor submitted: its own report is the end
            entry.handle = ours[0]
        job.executor = self
        job._native_id = native_id
        self._set_job_status(job, JobStatus(JobState.QUEUED, time=time.time(),
                                            metadata={"nativeId": native_id}))
        if info.state != "queued":
            self._activate(entry)
        with self._lock:
            early = self._early.pop(native_id, [])
        for ev in early:
            self._on_event(ev)
        if entry.handle is not None:
            self._follow(entry)
            entry.handle.add_done_callback(lambda h, e=entry: _later(lambda: self._ended(e, h)))
        else:
            self._ensure_watcher()

    def _forget(self, entry: _Entry) -> None:
        with self._lock:
            entries = self._entries.get(entry.nspace or "", [])
            if entry in entries:
                entries.remove(entry)
            if not entries:
                self._entries.pop(entry.nspace or "", None)

    # -- what the DVM reports --------------------------------------------

    def _entry_of(self, job: Job) -> Optional[_Entry]:
        with self._lock:
            for entry in self._entries.get(job.native_id or "", ()):
                if entry.job is job:
                    return entry
            return None

    def _activate(self, entry: _Entry) -> None:
        with self._lock:
            if entry.active:
                return
            entry.active = True
        self._set_job_status(entry.job, JobStatus(JobState.ACTIVE, time=time.time()))

    def _on_event(self, ev: Any) -> None:
        """A job event of the DVM (any job's: ours are picked by namespace).
        On the connection's reader thread: nothing here waits."""
        with self._lock:
            self._named.notify_all()
            entries = list(self._entries.get(ev.nspace, ()))
            if not entries:
                if ev.kind in ("started", "ended") and isinstance(ev.nspace, str):
                    early = self._early.setdefault(ev.nspace, [])
                    early.append(ev)
                    while len(self._early) > 1000:  # not ours after all: forget the oldest
                        self._early.pop(next(iter(self._early)))
                return
        for entry in entries:
            if ev.kind == "started":
                _later(lambda e=entry: self._activate(e))
            elif ev.kind == "ended" and entry.handle is None:
                # an attached job: the event is all we hear of its end
                _later(lambda e=entry: self._finish(e, ev.fields.get("exit"),
                                                    ev.fields.get("reason"), started=True))

    def _ensure_watcher(self) -> None:
        """Without job events, a thread looks at attached jobs every
        :data:`WATCH_INTERVAL` seconds (it ends when none is left)."""
        with self._lock:
            if self._events or (self._watcher is not None and self._watcher.is_alive()):
                return
            self._watcher = threading.Thread(target=self._watch, daemon=True,
                                             name="pydvm-psij watcher")
            self._watcher.start()

    def _watch(self) -> None:
        while True:
            with self._lock:
                watched = [e for es in self._entries.values() for e in es
                           if not e.job.status.final and e.handle is None]
                if not watched:
                    self._watcher = None
                    return
            listed: Optional[dict] = None
            for entry in watched:
                if listed is None:
                    try:
                        listed = {j.nspace: j for j in self._connect().jobs()}
                    except Exception as exc:
                        logger.warning("pydvm executor: cannot list the DVM's jobs: %s", exc)
                        listed = {}
                        self._finish(entry, None, f"lost the DVM: {exc}", started=False)
                        continue
                info = listed.get(entry.nspace)
                if info is None:
                    self._finish(entry, 0, None, started=True)
                elif info.state != "queued":
                    self._activate(entry)
            time.sleep(self.WATCH_INTERVAL)

    def _ended(self, entry: _Entry, handle: Any) -> None:
        """The job API's Future of ``entry`` resolved (on the status thread)."""
        if handle.cancelled():
            self._finish(entry, None, "canceled", started=entry.active)
            return
        exc = handle.exception(0)
        if exc is not None:  # the DVM refused it, or the connection was lost
            self._finish(entry, None, f"{type(exc).__name__}: {exc}", started=entry.active)
            return
        result = handle.result(0)
        self._finish(entry, result.returncode, result.reason,
                     started=handle.size is not None or entry.active, result=result)

    def _finish(self, entry: _Entry, code: Optional[int], reason: Optional[str],
                started: bool, result: Any = None) -> None:
        with self._lock:
            if entry.done:
                return
            entry.done = True
        self._forget(entry)
        self._drop_nodefile(entry)
        message = reason or None
        if entry.post_launch and entry.env is not None:
            p = subprocess.run(["/bin/bash", "-c", 'set -e; source "$1"', "post-launch",
                                entry.post_launch], env=entry.env, cwd=entry.cwd,
                               stdin=subprocess.DEVNULL, capture_output=True)
            if p.returncode != 0 and code == 0:
                code = p.returncode
                message = (f"post-launch script {entry.post_launch} failed (exit "
                           f"{p.returncode}): "
                           + p.stderr.decode("utf-8", "replace").strip()[-2000:])
        state = JobState[S.exit_state(code, entry.canceled)]
        if state != JobState.CANCELED and started:
            self._activate(entry)  # it ran: ACTIVE before its end, as PSI/J's model has it
        if state == JobState.CANCELED:
            message = "canceled" + (f" (the DVM: {reason})" if reason else "")
        meta: dict[str, Any] = {"nativeId": entry.nspace}
        if result is not None:
            meta.update(failed=result.failed, killed=result.killed,
                        failures=[{"rank": f.rank, "node": f.node, "status": f.status,
                                   "signal": f.signal} for f in result.failures])
        self._set_job_status(entry.job, JobStatus(
            state, time=time.time(), exit_code=code,
            message=message if state != JobState.COMPLETED else None, metadata=meta))

    # -- PSIJ_NODEFILE ---------------------------------------------------

    def _write_nodefile(self, job: Job, text: str) -> str:
        d = Path(self.config.work_directory) / "pydvm"
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"{job.id}.nodefile"
        path.write_text(text)
        return str(path)

    @staticmethod
    def _drop_nodefile(entry: _Entry) -> None:
        if entry.nodefile:
            try:
                os.unlink(entry.nodefile)
            except OSError:
                pass
            entry.nodefile = None


__all__ = ["PydvmJobExecutor", "PydvmJobExecutorConfig"]
