"""A Parsl executor whose apps are each one job of a persistent DVM.

::

    import parsl
    from parsl.config import Config
    from pydvm.parsl import PydvmExecutor

    parsl.load(Config(executors=[PydvmExecutor()]))     # the DVM of $PYDVM_URI

No worker pools, no interchange: as Parsl's ``FluxExecutor`` does with
Flux, each app is submitted to the DVM as a job (:mod:`pydvm.jobs`, one
connection for all of them), queued there while the DVM's slots are
taken, and its Parsl future completes when the DVM pushes the job's end.

* A ``@bash_app`` is the job of its command line, as ``pydvm run`` would
  run it: the app's function is called here to get the command, which runs
  on each of the job's ranks -- the program itself when the command is
  one plain program and its arguments (so the DVM reads the MPI off it),
  else under ``/bin/bash -c``.  Its ``stdout``/``stderr`` files are written
  as Parsl's bash apps write them; ``walltime`` is the job's time limit.
  An exit status other than 0 is Parsl's ``BashExitFailure``.
* A ``@python_app`` is a job running :mod:`pydvm.parsl.task` (by its
  path), which calls the function Parsl packed (its serializer) and sends
  back its value or exception in a file under
  :attr:`PydvmExecutor.task_dir`.  (A bash app wrapped further, by a
  wrapper of Parsl's or a user's, is run this way too: Parsl's own bash
  code then runs its command in the job.  Parsl's resource monitoring has
  no radio here: a config that turns it on cannot launch apps.)

The ranks of an app come from its ``parsl_resource_specification``
(:func:`job_shape`): ``num_ranks``, ``ranks_per_node``, ``num_nodes``;
the DVM places them, and gives them the MPI interface ``mpi`` says
(``"auto"``: read off the program, PMIx for Open MPI, PMI-1 for the MPICH
family).  Any other key is refused (Parsl's ``InvalidResourceSpecification``,
as HTEX refuses what it cannot honour).  ``$PARSL_MPI_PREFIX`` is empty in
the job -- the job *is* the
ranks -- so an app written for ``MPIExecutor`` (``"$PARSL_MPI_PREFIX
./prog"``) runs unchanged.

:meth:`_TaskFuture.cancel` on an app's executor future kills its job
(Parsl's ``AppFuture.cancel`` is not implemented: see
:func:`cancel_app`).  :meth:`PydvmExecutor.shutdown` kills what is still
running and closes the connection (stopping a DVM the executor started).
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import queue
import re
import shutil
import sys
import threading
from concurrent.futures import Future, InvalidStateError
from typing import Any

from parsl.executors.base import ParslExecutor
from parsl.executors.errors import InvalidResourceSpecification
from parsl.utils import RepresentationMixin

from . import task as _task

logger = logging.getLogger(__name__)

#: The exit status of a job its time limit ended (``pydvm run --timeout``).
TIMEOUT_STATUS = 110
#: What a resource specification may hold (Parsl's MPI keys).
SPEC_KEYS = frozenset({"num_ranks", "ranks_per_node", "num_nodes"})
#: MPI interfaces a job may be given (``pydvm run --mpi``).
MPI_INTERFACES = ("auto", "pmix", "pmi1", "none")

_PREFIX = re.compile(r"^\s*(\$PARSL_MPI_PREFIX|\$\{PARSL_MPI_PREFIX\})(?=\s|$)")
#: A word the shell would leave as it is: no quotes, expansions, redirections...
_PLAIN_WORD = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")
#: bash's builtins and keywords: a command naming one needs bash even when a
#: program of that name exists (``echo``, ``true``, ``test``, ``kill``...).
BASH_WORDS = frozenset(
    ". : [ alias bg bind break builtin caller cd command compgen complete compopt continue "
    "declare dirs disown echo enable eval exec exit export false fc fg getopts hash help "
    "history jobs kill let local logout mapfile popd printf pushd pwd read readarray readonly "
    "return set shift shopt source suspend test time times trap true type typeset ulimit "
    "umask unalias unset wait if then else elif fi case esac for select while until do done "
    "in function coproc".split())


# ----------------------------------------------------------------------
# pure parts: the job of an app
# ----------------------------------------------------------------------


def _count(key: str, value: Any) -> int:
    """A whole number >= 1 as Parsl users write it (``2``, ``"2"``, ``"1.0"``)."""
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise InvalidResourceSpecification({key}, f"{key} is a number, not {value!r}") from None
    if f != int(f) or f < 1:
        raise InvalidResourceSpecification({key}, f"{key} must be a whole number >= 1, "
                                                   f"not {value!r}")
    return int(f)


def job_shape(spec: "dict[str, Any] | None") -> tuple[int, int | None]:
    """``(n, npernode)`` of the job for a ``parsl_resource_specification``
    (pure; npernode None: the DVM places the ranks where its slots are).

    =========================================  =======================
    given                                      the job
    =========================================  =======================
    nothing                                    1 rank
    ``num_ranks`` N                            N ranks, placed by slot
    ``ranks_per_node`` P (and ``num_nodes`` K)  K*P ranks, P a node (K=1)
    ``num_ranks`` N, ``ranks_per_node`` P      N ranks, P a node
    ``num_nodes`` K (and ``num_ranks`` N)      N ranks, N/K a node (N=K)
    =========================================  =======================

    :class:`InvalidResourceSpecification` for another key (Parsl's
    ``launcher_options`` included: the DVM launches the ranks itself), a
    count that is not a whole number >= 1, or counts that disagree."""
    spec = dict(spec or {})
    unknown = set(spec) - SPEC_KEYS
    if unknown:
        why = (" launcher_options are mpiexec's: a PydvmExecutor app's ranks are the DVM "
               "job itself." if "launcher_options" in unknown else "")
        raise InvalidResourceSpecification(
            unknown, f"PydvmExecutor takes {', '.join(sorted(SPEC_KEYS))}.{why}")
    n = _count("num_ranks", spec["num_ranks"]) if spec.get("num_ranks") is not None else None
    p = (_count("ranks_per_node", spec["ranks_per_node"])
         if spec.get("ranks_per_node") is not None else None)
    k = _count("num_nodes", spec["num_nodes"]) if spec.get("num_nodes") is not None else None
    if k is not None:
        if p is None:
            total = n if n is not None else k
            if total % k:
                raise InvalidResourceSpecification(
                    {"num_ranks", "num_nodes"},
                    f"{total} ranks cannot be spread evenly over {k} nodes")
            p = total // k
        if n is None:
            n = k * p
        if n != k * p:
            raise InvalidResourceSpecification(
                {"num_ranks", "ranks_per_node", "num_nodes"},
                f"num_ranks {n} is not num_nodes {k} x ranks_per_node {p}")
        return n, p
    if p is not None:
        return (n if n is not None else p), p
    return (n if n is not None else 1), None


def job_env(n: int, npernode: int | None) -> dict[str, str]:
    """What an app's job adds to the environment: ``PARSL_MPI_PREFIX`` empty
    (the job is the ranks), and the counts as HTEX's MPI mode sets them."""
    env = {"PARSL_MPI_PREFIX": "", "PARSL_NUM_RANKS": str(n)}
    if npernode is not None:
        env["PARSL_RANKS_PER_NODE"] = str(npernode)
        env["PARSL_NUM_NODES"] = str(n // npernode)
    return env


def plain_argv(command: str, path: str | None = None, cwd: str | None = None
               ) -> list[str] | None:
    """``command`` as a program and its arguments, when the shell would run
    it so: plain words only (no quotes, variables, globs, redirections,
    ``;``...; a leading ``$PARSL_MPI_PREFIX``, empty in the job, is
    dropped), the first an executable that is not one of bash's own
    commands.  None: it needs ``/bin/bash -c``."""
    words = _PREFIX.sub("", command, count=1).split()
    if not words or not all(_PLAIN_WORD.match(w) for w in words):
        return None
    prog = words[0]
    if "=" in prog or prog in BASH_WORDS:
        return None
    if "/" in prog:
        full = os.path.join(cwd or os.getcwd(), prog)
        return words if os.path.isfile(full) and os.access(full, os.X_OK) else None
    return words if shutil.which(prog, path=path) else None


def shell_mpi(command: str, mpi: str, path: str | None = None, cwd: str | None = None,
              env: dict[str, str] | None = None) -> str:
    """The MPI interface for ``command`` run under ``bash -c``: the DVM cannot
    read it off ``bash``, so with ``mpi="auto"`` it is read here off the
    program the command starts with (after ``$PARSL_MPI_PREFIX``); what
    cannot be told stays ``auto`` (the DVM offers PMIx and watches for PMI-1)."""
    if mpi != "auto":
        return mpi
    words = _PREFIX.sub("", command, count=1).split()
    if not words or not _PLAIN_WORD.match(words[0]) or "=" in words[0]:
        return mpi
    prog = words[0]
    full = (os.path.join(cwd or os.getcwd(), prog) if "/" in prog
            else shutil.which(prog, path=path))
    if not full:
        return mpi
    from pydvm.pmi1 import detect

    return detect.interface_of(full, env if env is not None else dict(os.environ)) or mpi


def bash_function(func: Any) -> Any:
    """The user's function of a ``@bash_app`` when ``func`` is what Parsl
    submits for one (its ``remote_side_bash_executor``, wrapped by
    ``wrap_error``); None for anything else (a ``python_app``, or a bash
    app wrapped further, by monitoring: that one runs as Python)."""
    from parsl.app.bash import remote_side_bash_executor

    inner = getattr(func, "__wrapped__", None)
    if isinstance(inner, functools.partial) and inner.func is remote_side_bash_executor \
            and len(inner.args) == 1:
        return inner.args[0]
    return None


# ----------------------------------------------------------------------
# futures
# ----------------------------------------------------------------------


class _TaskFuture(Future):
    """The executor future of one app: completed from its job's end;
    :meth:`cancel` kills the job."""

    def __init__(self, task_id: int) -> None:
        super().__init__()
        self.parsl_executor_task_id = task_id
        self.job: Any = None  # the pydvm.jobs.Job, once submitted

    def cancel(self) -> bool:
        """Kill the app's job (queued or running) and cancel this future:
        True, unless the app has already completed."""
        with self._condition:  # one cancel notifies (and kills) once
            if self.cancelled():
                return True
            if not super().cancel():
                return False
            self.set_running_or_notify_cancel()
        if self.job is not None:
            self.job.kill()
        return True

    def running(self) -> bool:
        """The app's job has started and not ended."""
        return self.job is not None and self.job.running()

    def _settle(self, value: Any = None, exc: BaseException | None = None) -> None:
        try:
            if exc is not None:
                self.set_exception(exc)
            else:
                self.set_result(value)
        except InvalidStateError:
            pass  # cancelled meanwhile


def cancel_app(app_future: Any) -> bool:
    """Cancel a Parsl app (an ``AppFuture``) that runs on a PydvmExecutor:
    kill its job.  Parsl's ``AppFuture.cancel`` raises NotImplementedError;
    this cancels the app's current try's executor future, and the app
    then fails with ``CancelledError`` (retried if ``retries`` allow).
    False if the app has not been launched yet or has completed."""
    exec_fu = app_future.task_record.get("exec_fu")
    return bool(exec_fu is not None and exec_fu.cancel())


class _Task:
    """What the executor keeps of one app until its future is completed."""

    __slots__ = ("future", "job", "name", "kind", "files", "outputs", "walltime", "inp",
                 "out")

    def __init__(self, future: _TaskFuture, name: str, kind: str) -> None:
        self.future = future
        self.job: Any = None
        self.name = name
        self.kind = kind  # "bash" or "python"
        self.files: list[Any] = []
        self.outputs: list[Any] = []
        self.walltime: float | None = None
        self.inp: str | None = None
        self.out: str | None = None


# ----------------------------------------------------------------------
# the executor
# ----------------------------------------------------------------------


class PydvmExecutor(ParslExecutor, RepresentationMixin):
    """Each Parsl app one job of a persistent DVM (see the module docstring).

    ``uri``: the DVM (a URI or a connected :class:`pydvm.jobs.Dvm`, left
    open at shutdown), default ``$PYDVM_URI``; neither: a DVM of the
    executor's own, started at :meth:`start` on ``hosts`` with ``params``
    (``pydvm start --hosts``, ``--mca``) and stopped at :meth:`shutdown`.
    ``mpi``: the MPI interface the apps' ranks get (``"auto"``, ``"pmix"``,
    ``"pmi1"``, ``"none"``, as ``pydvm run --mpi``).  ``task_dir``: where
    python_apps' packed calls and results are kept while they run, and
    their output (``N.out``, ``N.err``) when they print any -- default
    ``RUN_DIR/LABEL`` (a directory the DVM's nodes must see, as Parsl's
    run directory).  ``label``, ``storage_access``, ``working_dir``: as
    Parsl's other executors.
    """

    def __init__(self, label: str = "pydvm", uri: Any = None, *,
                 hosts: "str | list[str] | None" = None, params: dict | None = None,
                 mpi: str = "auto", task_dir: str | None = None,
                 storage_access: list | None = None, working_dir: str | None = None) -> None:
        super().__init__()
        if mpi not in MPI_INTERFACES:
            raise ValueError(f"mpi must be one of {', '.join(MPI_INTERFACES)}, not {mpi!r}")
        self.label = label
        self.uri = uri
        self.hosts = hosts
        self.params = params
        self.mpi = mpi
        self.task_dir = task_dir
        self.storage_access = storage_access
        self.working_dir = working_dir
        self.dvm: Any = None
        self._own_conn = False
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._tasks: dict[int, _Task] = {}
        self._ended: queue.SimpleQueue = queue.SimpleQueue()
        self._finisher: threading.Thread | None = None
        self._closing = False

    # -- life --------------------------------------------------------------------

    def start(self) -> None:
        """Connect to the DVM (or start one); start the thread that completes
        the apps' futures as their jobs' ends are pushed."""
        import pydvm.jobs

        super().start()
        if self.task_dir is None:
            self.task_dir = os.path.join(self.run_dir, self.label)
        os.makedirs(self.task_dir, exist_ok=True)
        if isinstance(self.uri, pydvm.jobs.Dvm):
            self.dvm, self._own_conn = self.uri, False
        elif self.uri or os.environ.get("PYDVM_URI"):
            self.dvm, self._own_conn = pydvm.jobs.connect(self.uri or None), True
        else:
            self.dvm = pydvm.jobs.start(self.hosts, mca=self.params or {})
            self._own_conn = True
        self._finisher = threading.Thread(target=self._finish_loop, daemon=True,
                                          name=f"pydvm-parsl {self.label}")
        self._finisher.start()
        logger.info("PydvmExecutor %s: apps go to the DVM %s", self.label, self.dvm.uri)

    def shutdown(self) -> None:
        """Take no more apps; kill the jobs of those still queued or running
        (their futures cancelled); close the connection -- which stops the
        DVM if the executor started it."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            tasks = list(self._tasks.values())
        for t in tasks:
            t.future.cancel()
        jobs = [t.job for t in tasks if t.job is not None]
        if jobs:
            from concurrent.futures import wait

            wait(jobs, timeout=60)
        if self._finisher is not None:
            self._ended.put(None)
            self._finisher.join(60)
        if self.dvm is not None and self._own_conn:
            self.dvm.close()
        super().shutdown()

    def monitor_resources(self) -> bool:
        """False: an app's processes are a DVM job's, on its nodes."""
        return False

    # -- apps ---------------------------------------------------------------------

    def submit(self, func: Any, resource_specification: dict, *args: Any, **kwargs: Any
               ) -> Future:
        """Submit one app as a DVM job; its executor future at once (the job
        may wait in the DVM's queue).  InvalidResourceSpecification for a
        specification :func:`job_shape` refuses; what goes wrong after that
        (the command cannot be made, the DVM refuses the job) fails the future."""
        n, npernode = job_shape(resource_specification)
        env = job_env(n, npernode)
        with self._lock:
            if self._closing or self.dvm is None:
                raise RuntimeError(f"PydvmExecutor {self.label} is not running "
                                   "(shut down, or not started)")
            tid = next(self._ids)
        fut = _TaskFuture(tid)
        user = bash_function(func)
        name = getattr(user if user is not None else func, "__name__", "app")
        task = _Task(fut, name, "bash" if user is not None else "python")
        opts: dict[str, Any] = {"queue": True, "env": env}
        if npernode is not None:
            opts["npernode"] = npernode
        try:
            if user is not None:
                argv, stdout, stderr, mpi = self._bash_job(task, user, args, kwargs, env)
            else:
                argv, stdout, stderr, mpi = self._python_job(task, tid, func, args, kwargs)
            opts["mpi"] = mpi
            if task.walltime is not None:
                opts["timeout"] = task.walltime
            job = self.dvm.submit(argv, n, stdout=stdout, stderr=stderr, **opts)
        except Exception as exc:
            self._release(task)
            fut._settle(exc=exc)
            return fut
        task.job = fut.job = job
        with self._lock:
            self._tasks[tid] = task
        # on the connection's reader thread: hand the end over, never block it
        job.add_done_callback(lambda _j, tid=tid: self._ended.put(tid))
        return fut

    def _bash_job(self, task: _Task, user: Any, args: tuple, kwargs: dict,
                  env: dict[str, str]) -> tuple[list[str], Any, Any, str]:
        """The job of a bash app: its command (made here, by the app's
        function), its stdout and stderr files; Parsl's errors as its own
        bash apps raise them."""
        import parsl.app.errors as pe
        from parsl.data_provider.files import File
        from parsl.utils import get_std_fname_mode

        try:
            command = user(*args, **kwargs)
        except AttributeError as e:
            raise pe.BashAppNoReturn(f"Bash app '{task.name}' did not return a value, or "
                                     f"returned None - with this exception: {e}") from e
        except IndexError as e:
            raise pe.AppBadFormatting(f"App formatting failed for app '{task.name}' with "
                                      f"IndexError: {e}") from e
        if not isinstance(command, str):
            raise ValueError(f"Expected a str for bash_app commandline, got {type(command)}")

        def open_std(which: str) -> Any:
            spec = kwargs.get(which)
            if spec is None:
                return None
            if isinstance(spec, File):
                fname, mode = spec.filepath, "w"
            else:
                fname, mode = get_std_fname_mode(which, spec)
            key = (os.path.abspath(fname), mode)
            for f, k in task.files:
                if k == key:  # stdout and stderr to one file: one file object
                    return f
            try:
                if os.path.dirname(fname):
                    os.makedirs(os.path.dirname(fname), exist_ok=True)
                f = open(fname, mode)  # as Parsl opens it: its mode, a bad one refused
            except Exception as e:
                raise pe.BadStdStreamFile(str(fname)) from e
            task.files.append((f, key))
            return f

        stdout = open_std("stdout")
        stderr = open_std("stderr")
        if stderr is not None:
            header = f"--> executable follows <--\n{command}\n--> end executable <--\n"
            stderr.write(header if hasattr(stderr, "encoding") else header.encode())
            stderr.flush()
        task.walltime = kwargs.get("walltime")
        task.outputs = list(kwargs.get("outputs") or [])
        path = os.environ.get("PATH")
        argv = plain_argv(command, path)
        if argv is not None:
            return argv, stdout, stderr, self.mpi
        env_now = {**os.environ, **env}
        return (["/bin/bash", "-c", command], stdout, stderr,
                shell_mpi(command, self.mpi, path, env=env_now))

    def _python_job(self, task: _Task, tid: int, func: Any, args: tuple, kwargs: dict
                    ) -> tuple[list[str], Any, Any, str]:
        """The job of a python app: :mod:`pydvm.parsl.task` on the packed call."""
        from parsl.serialize import pack_apply_message
        from parsl.serialize.errors import SerializationError

        try:
            packed = pack_apply_message(func, args, kwargs, buffer_threshold=1 << 20)
        except TypeError:
            raise SerializationError(task.name) from None
        assert self.task_dir is not None
        task.inp = os.path.join(self.task_dir, f"{tid}.in.pkl")
        task.out = os.path.join(self.task_dir, f"{tid}.out.pkl")
        with open(task.inp, "wb") as f:
            f.write(packed)
        # its output is written by the runner, on the node (see pydvm.parsl.task)
        return ([sys.executable, _task.__file__, task.inp, task.out,
                 os.path.join(self.task_dir, str(tid))], None, None, self.mpi)

    # -- ends ---------------------------------------------------------------------

    def _finish_loop(self) -> None:
        while True:
            tid = self._ended.get()
            if tid is None:
                return
            with self._lock:
                task = self._tasks.pop(tid, None)
            if task is None:
                continue
            try:
                self._finish(task)
            except Exception as exc:  # ours: the app must still complete
                logger.exception("PydvmExecutor %s: completing app %s failed", self.label,
                                 task.future.parsl_executor_task_id)
                task.future._settle(exc=exc)
            finally:
                self._release(task)

    def _finish(self, task: _Task) -> None:
        """Complete an app's future from its job's end."""
        job, fut = task.job, task.future
        if job.cancelled() or fut.cancelled():
            return
        err = job.exception()
        if err is not None:  # refused by the DVM, or the connection lost
            fut._settle(exc=err)
            return
        r = job.result()
        if task.kind == "bash":
            for f, _ in task.files:
                f.flush()
            fut._settle(*self._bash_outcome(task, r))
        else:
            fut._settle(*self._python_outcome(task, r))

    def _bash_outcome(self, task: _Task, r: Any) -> tuple[Any, BaseException | None]:
        import parsl.app.errors as pe

        if r.returncode == TIMEOUT_STATUS and task.walltime is not None:
            return None, pe.AppTimeout(f"App {task.name} exceeded walltime: "
                                       f"{task.walltime} seconds")
        if r.returncode != 0:
            return None, pe.BashExitFailure(task.name, r.returncode)
        missing = [f for f in task.outputs if not os.path.exists(f.filepath)]
        if missing:
            return None, pe.MissingOutputs(f"Missing outputs from app {task.name}", missing)
        return 0, None

    def _python_outcome(self, task: _Task, r: Any) -> tuple[Any, BaseException | None]:
        from parsl.app.errors import AppException
        from parsl.serialize import deserialize

        base = os.path.join(self.task_dir or ".", str(task.future.parsl_executor_task_id))
        err = b""
        for ext in ("out", "err"):  # kept if the app printed anything
            try:
                if os.path.getsize(f"{base}.{ext}") == 0:
                    os.unlink(f"{base}.{ext}")
                elif ext == "err":
                    with open(f"{base}.err", "rb") as f:
                        f.seek(max(0, os.path.getsize(f"{base}.err") - 2000))
                        err = f.read()
            except OSError:
                pass
        outcome = None
        if r.returncode == 0 and task.out is not None:
            try:
                with open(task.out, "rb") as f:
                    outcome = deserialize(f.read())
            except FileNotFoundError:
                pass
        if outcome is None:
            tail = err.decode("utf-8", "replace").strip()
            why = r.reason or (f"exit status {r.returncode}" if r.returncode else
                               "no result written")
            return None, AppException(f"app {task.name} (DVM job {r.nspace}) ended without "
                                      f"a result: {why}" + (f"; its stderr:\n{tail}"
                                                            if tail else ""))
        ok, value = outcome
        return (value, None) if ok else (None, value)

    def _release(self, task: _Task) -> None:
        """Close the app's files; remove its packed call and result."""
        for f, _ in task.files:
            try:
                f.close()
            except OSError:
                pass
        task.files = []
        for p in (task.inp, task.out):
            if p is not None:
                try:
                    os.unlink(p)
                except OSError:
                    pass
