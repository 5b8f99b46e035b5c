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
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Optional

from psij import (InvalidJobException, Job, JobExecutor, JobExecutorConfig, JobState,
                  JobStatus, SubmitException)

from . import spec as S

logger = logging.getLogger(__name__)


def _jobs_api():
    """The job API module (:mod:`pydvm.jobs`)."""
    from .. import jobs

    return jobs


class PydvmJobExecutorConfig(JobExecutorConfig):
    """The ``pydvm`` executor's configuration.

    ``hosts``: the nodes of the DVM the executor starts when it has no URI
    (``url``, ``PYDVM_URI``): as ``pydvm start --hosts`` (``"a,b"``: local
    daemons named a and b); None: this machine alone.  ``work_directory``
    (PSI/J's): where ``PSIJ_NODEFILE`` files are written -- on a DVM over
    several machines, a directory they all see.
    """

    def __init__(self, launcher_log_file: Optional[Path] = None,
                 work_directory: Optional[Path] = None, hosts: Optional[str] = None) -> None:
        super().__init__(launcher_log_file=launcher_log_file, work_directory=work_directory)
        self.hosts = hosts


# ----------------------------------------------------------------------
# the DVM an executor without a URI uses: one per process, started on first use
# ----------------------------------------------------------------------

_private_lock = threading.Lock()
_private: dict[Optional[str], Any] = {}  # hosts -> (context manager, Dvm)


def _private_dvm(hosts: Optional[str]) -> Any:
    """The DVM of this process for ``hosts``, started on first use and
    stopped at exit."""
    with _private_lock:
        got = _private.get(hosts)
        if got is None:
            jobs = _jobs_api()
            cm = jobs.start(hosts=hosts) if hosts else jobs.start()
            dvm = cm.__enter__()
            got = _private[hosts] = (cm, dvm)
            if len(_private) == 1:
                atexit.register(_stop_private)
        return got[1]


def _stop_private() -> None:
    with _private_lock:
        items = list(_private.values())
        _private.clear()
    for cm, _ in items:
        try:
            cm.__exit__(None, None, None)
        except Exception as exc:  # at exit: say it, do not raise
            logger.warning("stopping the pydvm executor's DVM: %s", exc)


# ----------------------------------------------------------------------
# one job
# ----------------------------------------------------------------------


class _Entry:
    """What the executor keeps of one PSI/J job it runs or watches."""

    __slots__ = ("job", "handle", "nspace", "canceled", "nodefile", "post_launch", "env",
                 "cwd", "active")

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
        self._dvm: Any = None
        self._entries: dict[str, _Entry] = {}  # nspace -> entry (submitted or attached)
        self._early: dict[str, list] = {}  # nspace -> events seen before its entry
        self._subscribed = False

    # -- the DVM -------------------------------------------------------

    def _connect(self) -> Any:
        with self._lock:
            if self._dvm is not None:
                return self._dvm
            try:
                if self._uri is not None:
                    self._dvm = _jobs_api().connect(self._uri)
                else:
                    self._dvm = _private_dvm(getattr(self.config, "hosts", None))
            except Exception as exc:
                where = self._uri or "a DVM of this machine"
                raise SubmitException(f"cannot reach the DVM ({where}): {exc}") from exc
            return self._dvm

    def _nodes(self, dvm: Any) -> list[tuple[str, int]]:
        """The DVM's up nodes: ``(name, slots)`` in its order."""
        return [(n.name, n.slots) for n in dvm.nodes() if n.state == "up"]

    def _subscribe(self, dvm: Any) -> None:
        with self._lock:
            if not self._subscribed:
                dvm.on_event(self._on_event)
                self._subscribed = True

    # -- PSI/J's interface ---------------------------------------------

    def submit(self, job: Job) -> None:
        """Submit ``job`` to the DVM.  On return the job is QUEUED and its
        ``native_id`` is the DVM job's namespace; InvalidJobException for a
        specification no DVM runs (the job stays NEW), SubmitException when
        the DVM cannot be reached or refuses it."""
        spec = self._check_job(job)
        try:
            self._submit(job, spec)
        except BaseException:
            job.executor = None  # not submitted: the job may be submitted again
            raise

    def _submit(self, job: Job, spec: Any) -> None:
        dvm = self._connect()
        try:
            nodes = self._nodes(dvm)
        except Exception as exc:
            raise SubmitException(f"cannot read the DVM's nodes: {exc}") from exc
        plan = S.plan_job(spec, nodes=nodes, environ=os.environ, cwd=os.getcwd())
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
        if plan.queue is not None:
            kw["queue"] = plan.queue
        self._subscribe(dvm)
        try:
            handle = dvm.submit(
                plan.argv, plan.n, env=env, inherit_env=False, cwd=plan.cwd,
                stdin=None if plan.stdin == os.devnull else plan.stdin,
                stdout=None if plan.stdout == os.devnull else plan.stdout,
                stderr=None if plan.stderr == os.devnull else plan.stderr,
                timeout=plan.timeout, **kw)
            nspace = handle.nspace
        except (TypeError, ValueError) as exc:
            self._drop_nodefile(entry)
            raise InvalidJobException(str(exc)) from exc
        except Exception as exc:
            self._drop_nodefile(entry)
            raise SubmitException(f"the DVM did not take the job: {exc}", exception=exc) \
                from exc
        entry.handle, entry.nspace = handle, nspace
        job._native_id = nspace
        with self._lock:
            self._entries[nspace] = entry
            early = self._early.pop(nspace, [])
        self._set_job_status(job, JobStatus(JobState.QUEUED, time=time.time(),
                                            metadata={"nativeId": nspace}))
        for ev in early:
            self._on_event(ev)
        handle.add_done_callback(lambda h, e=entry: self._ended(e, h))

    def cancel(self, job: Job) -> None:
        """Ask the DVM to end ``job``: it reaches CANCELED once its
        processes are gone (or COMPLETED, had it already exited 0)."""
        if job.status.final:
            return
        entry = self._entry_of(job)
        if entry is None:
            raise SubmitException(f"job {job.id} is not one of this executor's")
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
        """The namespaces of the DVM's jobs (every user's, as ``pydvm ps``)."""
        try:
            return [j.nspace for j in self._connect().ps()]
        except SubmitException:
            raise
        except Exception as exc:
            raise SubmitException(f"cannot list the DVM's jobs: {exc}") from exc

    def attach(self, job: Job, native_id: str) -> None:
        """Follow the DVM job ``native_id`` (a namespace, as :meth:`list`
        gives) with ``job``, which must be NEW.  Its exit status is the
        DVM's; a job the DVM no longer has ends FAILED at once, saying its
        status is unknown."""
        if job.status.state != JobState.NEW:
            raise InvalidJobException("Job must be in the NEW state")
        dvm = self._connect()
        entry = _Entry(job)
        entry.nspace = native_id
        job.executor = self
        job._native_id = native_id
        self._subscribe(dvm)
        with self._lock:
            self._entries[native_id] = entry
        try:
            rows = [j for j in dvm.ps() if j.nspace == native_id]
        except Exception as exc:
            raise SubmitException(f"cannot list the DVM's jobs: {exc}") from exc
        if not rows:
            with self._lock:
                self._entries.pop(native_id, None)
            self._set_job_status(job, JobStatus(
                JobState.FAILED, time=time.time(),
                message=f"the DVM has no job {native_id} (it ended, or never was): "
                        "its exit status is unknown"))
            return
        self._set_job_status(job, JobStatus(JobState.QUEUED, time=time.time(),
                                            metadata={"nativeId": native_id}))
        if rows[0].state in ("running", "killing", "ending"):
            self._activate(entry)
        with self._lock:
            early = self._early.pop(native_id, [])
        for ev in early:
            self._on_event(ev)

    # -- what the DVM reports --------------------------------------------

    def _entry_of(self, job: Job) -> Optional[_Entry]:
        with self._lock:
            ns = job.native_id
            return self._entries.get(ns) if ns is not None else None

    def _activate(self, entry: _Entry) -> None:
        if not entry.active:
            entry.active = True
            self._set_job_status(entry.job, JobStatus(JobState.ACTIVE, time=time.time()))

    def _on_event(self, ev: Any) -> None:
        """A job event of the DVM (any job's: ours are picked by namespace)."""
        with self._lock:
            entry = self._entries.get(ev.nspace)
            if entry is None:
                if ev.kind in ("started", "ended"):
                    early = self._early.setdefault(ev.nspace, [])
                    if len(early) < 4:
                        early.append(ev)
                    if len(self._early) > 1000:  # not ours after all: forget the oldest
                        self._early.pop(next(iter(self._early)))
                return
        if ev.kind == "started":
            self._activate(entry)
        elif ev.kind == "ended" and entry.handle is None:
            # an attached job: the event is all we have
            self._finish(entry, ev.fields.get("exit"), ev.fields.get("reason"),
                         started=bool(ev.fields.get("size", 1)))

    def _ended(self, entry: _Entry, handle: Any) -> None:
        """The job API's Future of ``entry`` resolved."""
        try:
            result = handle.result()
        except Exception as exc:  # the DVM refused it, or the connection was lost
            self._finish(entry, None, f"{type(exc).__name__}: {exc}", started=False)
            return
        started = getattr(handle, "started", None)
        self._finish(entry, result.returncode, result.reason,
                     started=entry.active or bool(started) or result.size is None
                     or not _launch_failure(result), result=result)

    def _finish(self, entry: _Entry, code: Optional[int], reason: Optional[str],
                started: bool, result: Any = None) -> None:
        self._drop_nodefile(entry)
        with self._lock:
            if entry.nspace is not None:
                self._entries.pop(entry.nspace, None)
        message = reason
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
        if state != JobState.CANCELED and started and code is not None:
            self._activate(entry)  # it ran: ACTIVE before its end, as PSI/J's model has it
        meta = {"nativeId": entry.nspace}
        if result is not None:
            meta.update(failed=result.failed, killed=result.killed,
                        failures=[(f.rank, f.node, f.status, f.signal)
                                  for f in result.failures])
        self._set_job_status(entry.job, JobStatus(
            state, time=time.time(), exit_code=code, message=message if code else None,
            metadata=meta))

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


def _launch_failure(result: Any) -> bool:
    """Whether a job ended without its processes having run (the DVM could
    not launch them)."""
    reason = (result.reason or "").lower()
    return "launch" in reason or "not found" in reason or "cannot run" in reason


__all__ = ["PydvmJobExecutor", "PydvmJobExecutorConfig"]
