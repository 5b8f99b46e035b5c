"""Jobs from Python: submit to a persistent DVM, get Futures back (blocking API).

::

    import pydvm.jobs

    with pydvm.jobs.connect() as dvm:              # $PYDVM_URI, or connect(uri)
        job = dvm.submit("hostname", n=2, stdout="capture")
        r = job.result()                           # a JobResult
        print(r.returncode, r.stdout.decode())

One :class:`Dvm` is one connection to the DVM's master, as a tool (the
DVM's secret, or a multi-user DVM's tool socket: jobs run as the user who
connects, as with ``pydvm run``), and carries any number of jobs: each
``submit`` sends one ``run`` request and returns a :class:`Job` -- a
:class:`concurrent.futures.Future` -- at once.  One reader thread per
connection reads everything the master pushes (a job's start, its output,
its end) as it comes: the master acknowledges a node's output only once
this connection has read it, so reading promptly keeps the jobs running.
A job's end is pushed, never polled.  Output callbacks and the Futures'
done callbacks run on that thread: keep them short, and never wait there
for another job (``result()`` there raises instead of hanging).

Closing the connection (:meth:`Dvm.close`, the end of a ``with`` block)
ends the jobs still running on it -- the master kills the jobs of a tool
that goes away -- and a lost connection fails every job still pending with
:class:`~pydvm.errors.UnreachableError`.

:class:`pydvm.jobs.Executor` (:mod:`pydvm.client.executor`) is the
:class:`concurrent.futures.Executor` over a :class:`Dvm`;
:mod:`pydvm.client.aiojobs` the asyncio twin.
"""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import Future

from ..errors import PMIxError, Status, UnreachableError, error_for
from ..protocol import HANDSHAKE_TIMEOUT, DvmUri, FrameDecoder, FrameError, pack
from .jobconn import open_tool, start_dvm, stop_dvm
from .jobspec import (ENDED, QUEUED, RUNNING, SUBMITTED, App, JobEvent, JobFailedError,  # noqa: F401
                      JobInfo, JobResult, JobSpec, NodeInfo, ProcessFailure, ProcessInfo,
                      StdinFeed, UnsupportedError, output_sinks, run_request, signal_number,
                      unknown_request)
from .subscription import Subscription

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Iterator

__all__ = ["App", "Dvm", "Job", "JobEvent", "JobFailedError", "JobInfo", "JobResult",
           "JobSpec", "NodeInfo", "ProcessFailure", "ProcessInfo", "Subscription",
           "UnsupportedError", "connect", "start"]


def connect(uri: "str | None" = None, *, timeout: float = HANDSHAKE_TIMEOUT) -> "Dvm":
    """Connect to the persistent DVM at ``uri`` (default ``$PYDVM_URI``).

    With this user's copy of the DVM's secret (``$PYDVM_STATE_DIR``) the
    connection proves it; without one, a multi-user DVM's tool socket on
    this machine is used, and the DVM reads who we are from it -- jobs run
    as that user.  Raises :class:`~pydvm.errors.UnreachableError` when no
    DVM answers (or it refuses us), ValueError for a malformed URI.
    """
    return Dvm(*open_tool(uri, timeout))


def start(hosts: "str | list[str] | None" = None, *, mca: dict[str, Any] | None = None,
          args: "list[str] | tuple[str, ...]" = (), timeout: float = 120.0,
          **params: Any) -> "Dvm":
    """Start a persistent DVM (``pydvm start --daemonize``) and connect to it.

    ``hosts``: ``pydvm start --hosts`` (a string ``"a,b:2"`` or a list;
    default: this machine); ``params`` (and ``mca``, the same as a dict):
    its parameters (``--mca NAME VALUE``: ``pydvm_queue="on"``); ``args``:
    any other ``pydvm start`` options (``["--launcher", "ssh"]``; paths in
    them absolute: the DVM starts from ``/``).  The
    :class:`Dvm` returned owns the DVM: :meth:`Dvm.close` (the end of a
    ``with`` block) stops it.  Raises RuntimeError with ``pydvm start``'s
    message if it cannot start.
    """
    uri = start_dvm(hosts, {**(mca or {}), **params}, args, timeout)
    try:
        dvm = connect(uri)
    except PMIxError:
        stop_dvm(uri, timeout)
        raise
    dvm.owned = True
    return dvm


class Job(Future):
    """A job submitted to a DVM: a :class:`concurrent.futures.Future` whose
    result is its :class:`JobResult` (whatever its exit status: see
    :meth:`JobResult.check`).  It fails with
    :class:`~pydvm.errors.BadParamError` (or another
    :class:`~pydvm.errors.PMIxError`) when the DVM refuses the job, with
    :class:`~pydvm.errors.UnreachableError` when the connection is lost
    before its end.

    ``state``: ``"submitted"``, ``"queued"`` (waiting for free slots),
    ``"running"`` (started: its processes are launched or running),
    ``"ended"``; ``nspace`` (known once queued or started), ``size`` (its
    process count, once started), ``nodes`` (the names of the nodes it
    runs on, in the order of their first rank: filled when it starts --
    ``state`` ``"running"``, the ``started`` event -- and kept after its
    end; None before), ``position`` (its place in the DVM's queue, while
    queued).  Output of the jobs it spawns (``PMIx_Spawn``,
    ``MPI_Comm_spawn``) goes where its own goes, under the children's ranks,
    as ``pydvm run`` prints it.  :meth:`processes` asks the DVM for its processes (rank,
    node, pid, state) while it runs.  :meth:`add_state_callback` is told
    each change of ``state``.

    :meth:`cancel` kills a job that has not ended and returns True: the
    Future is cancelled at once (``result()`` raises CancelledError), and
    the DVM ends the processes right after (``state`` becomes ``"ended"``
    when it has).  :meth:`kill` kills it too but lets the Future resolve
    with the report (``reason`` says who ended it); ``kill(signal=...)``
    sends its processes a signal of your choice.  The Future is never
    ``running()`` in the Executor sense before it ends -- ``running()``
    says whether the job's processes have started.
    """

    def __init__(self, dvm: "Dvm", rid: int, out: Any, err: Any, stdin: StdinFeed | None
                 ) -> None:
        super().__init__()
        self.dvm = dvm
        self.id = rid
        self.state = SUBMITTED
        self.nspace: str | None = None
        self.size: int | None = None
        self.nodes: list[str] | None = None
        self.position: int | None = None
        self._out = out
        self._err = err
        self._stdin = stdin
        self._kill_asked = False
        self._signals: list[int] = []  # asked for before the DVM named the job
        self._state_callbacks: list[Callable[[Job], Any]] = []
        #: namespaces of the jobs it spawned (PMIx_Spawn), whose output is its own
        self._spawned: list[str] = []

    def __repr__(self) -> str:
        return f"<Job {self.nspace or '#' + str(self.id)} {self.state}>"

    def running(self) -> bool:
        """Whether the job has started and not ended."""
        return self.state == RUNNING

    def kill(self, signal: "int | str | None" = None) -> None:
        """Kill the job, queued or running, as ``pydvm kill`` does (SIGTERM to
        its processes, SIGKILL after the DVM's kill grace); its Future
        resolves with the report.  Nothing happens if it has ended.  A job
        not yet queued or started is killed as soon as the DVM names it.

        ``signal`` (a number, :class:`signal.Signals` or name: ``"USR1"``)
        sends that signal to every process of the job instead -- to each
        process's group, as a kill does -- and the job goes on: a process
        that handles it carries on, one that it ends counts as failed on
        its own.  ``SIGTERM`` is the plain kill; ``SIGKILL`` ends the job at
        once, with no SIGTERM before it; either way the report's ``reason``
        names the signal and who sent it.  A queued job is taken off the
        queue whatever the signal (its Future resolves with ``returncode``
        143).  ValueError for what is not a signal; like the kill, this
        returns at once (:meth:`Dvm.kill` waits for the DVM's answer)."""
        if signal is not None:
            sig = signal_number(signal)
            if self.state == ENDED:
                return
            if self.nspace is None:
                self._signals.append(sig)
            else:
                self.dvm._signal(self.nspace, sig)
            return
        if self.state == ENDED or self._kill_asked:
            return
        self._kill_asked = True
        if self.nspace is not None:
            self.dvm._kill(self.nspace)

    def processes(self) -> "dict[int, ProcessInfo] | None":
        """The job's processes now, by rank (:class:`ProcessInfo`: ``node``,
        ``pid``, ``state``, ``status``), as the DVM knows them -- asked each
        time; None while the job is queued or not named yet, and once it
        has ended (the DVM forgets it then: its :class:`JobResult` has the
        failures).  Not from an output or done callback (the reader thread)."""
        if self.nspace is None or self.state in (SUBMITTED, QUEUED, ENDED):
            return None
        return self.dvm.processes(self.nspace)

    def add_state_callback(self, fn: "Callable[[Job], Any]") -> None:
        """Call ``fn(job)`` at each change of :attr:`state` (``queued``,
        ``running``, ``ended`` -- then the Future is already resolved;
        ``nspace`` is set from ``queued`` or ``running`` on), on the
        connection's reader thread -- keep it short.  Changes from this
        call on (look at ``state`` after adding it: it may have changed
        before); a job already ended is reported at once."""
        self._state_callbacks.append(fn)
        if self.state == ENDED:
            self._tell_state()

    def _tell_state(self) -> None:
        for fn in list(self._state_callbacks):
            try:
                fn(self)
            except Exception:  # a callback's error must not stop the connection
                pass

    def cancel(self) -> bool:
        """Kill the job if it has not ended and cancel the Future (True);
        False if it has ended."""
        if self.state == ENDED or not super().cancel():
            return False
        self.set_running_or_notify_cancel()  # wakes concurrent.futures.wait()
        self.kill()
        return True

    def result(self, timeout: float | None = None) -> JobResult:
        """Wait for the job's end (at most ``timeout`` seconds: TimeoutError)
        and return its :class:`JobResult`."""
        if not self.done() and self.dvm._on_reader_thread():
            raise RuntimeError("waiting for a job on the connection's reader thread (an "
                               "output or done callback) would wait for ever")
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Wait for the job's end; the exception it failed with (None if it
        has a :class:`JobResult`, whatever its exit status)."""
        if not self.done() and self.dvm._on_reader_thread():
            raise RuntimeError("waiting for a job on the connection's reader thread would "
                               "wait for ever")
        return super().exception(timeout)

    def info(self) -> JobInfo | None:
        """The DVM's view of the job now (``pydvm ps``: its state, nodes,
        ranks per node, processes ended); None once it has ended."""
        return self.dvm.job(self.nspace) if self.nspace else None

    # -- what the reader thread hears ---------------------------------------

    def _named(self, nspace: Any, state: str) -> None:
        if isinstance(nspace, str):
            self.nspace = nspace
        self.state = state
        if self.nspace is not None:
            for sig in self._signals:
                self.dvm._signal(self.nspace, sig)
            self._signals.clear()
            if self._kill_asked:
                self.dvm._kill(self.nspace)
        self._tell_state()

    def _output(self, rank: int, fd: Any, data: bytes) -> None:
        sink = self._err if fd == 2 else self._out
        if sink is not None:
            sink.write(rank, data)

    def _release(self) -> None:
        """Close what the job's output and stdin hold (once it is over)."""
        for sink in (self._out, self._err):
            if sink is not None:
                try:
                    sink.close()
                except Exception:  # a line callback's error: the result still comes
                    pass
        if self._stdin is not None:
            self._stdin.stop()

    def _ended(self, reply: dict) -> None:
        out, err = self._out, self._err
        self._release()
        self.state = ENDED
        if reply.get("status") != 0:
            exc = error_for(Status.coerce(reply.get("status")), reply.get("msg") or "")
            self._settle(exc=exc)
        else:
            if self.nspace is None:
                self.nspace = reply.get("nspace")
            self._settle(JobResult(reply, self.size, out.value() if out is not None else None,
                                   err.value() if err is not None else None))
        self._tell_state()  # once the Future is resolved

    def _settle(self, result: Any = None, exc: BaseException | None = None) -> None:
        """Resolve the Future, unless it was cancelled meanwhile."""
        from concurrent.futures import InvalidStateError

        try:
            if exc is not None:
                self.set_exception(exc)
            else:
                self.set_result(result)
        except InvalidStateError:
            pass  # cancelled


class Dvm:
    """One connection to a persistent DVM's master, carrying any number of
    jobs (see the module docstring).  Make one with :func:`connect` or
    :func:`start` (or ``Dvm.connect``, ``Dvm.start``); use it from any
    number of threads.  ``uri`` names the DVM."""

    connect = staticmethod(connect)
    start = staticmethod(start)

    def __init__(self, sock: Any, uri: DvmUri, name: str, decoder: FrameDecoder,
                 early: list, box: Any = None) -> None:
        self.uri = uri
        self.name = name
        #: this connection started the DVM (:func:`start`): close() stops it
        self.owned = False
        self._sock = sock
        #: the link's keys on a sealed link (pydvm.seal): every frame is
        #: sealed under the send lock, so in the order it is written.
        self._box = box
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._runs: dict[int, Job] = {}  # run id -> job, until its end
        self._by_ns: dict[str, Job] = {}  # nspace -> job, from queued/started to its end
        self._calls: dict[int, Future] = {}  # other requests' ids -> their answer
        self._subs: dict[int, Subscription] = {}
        self._lost: BaseException | None = None
        #: whether the master knows run_many (None: not asked yet)
        self._run_many: bool | None = None
        self._decoder, self._early = decoder, early
        self._reader = threading.Thread(target=self._read_loop, daemon=True,
                                         name=f"pydvm-jobs {uri.dvmid}")
        self._reader.start()

    def __repr__(self) -> str:
        return f"<Dvm {self.uri} {len(self._runs)} jobs{' closed' if self._lost else ''}>"

    def __enter__(self) -> "Dvm":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        """The connection is closed or lost: no more jobs can be submitted."""
        return self._lost is not None

    # -- jobs ------------------------------------------------------------------

    def submit(self, command: Any, n: int | None = 1, *, stdout: Any = None,
               stderr: Any = None, stdin: Any = None, queue: bool | None = None,
               **options: Any) -> Job:
        """Submit a job; return its :class:`Job` (a Future) at once.

        ``command``: a string (split as a shell splits it), a list of
        arguments, a :class:`JobSpec`, or a list of :class:`App` (an MPMD
        job, ``pydvm run``'s ``:``); run ``n`` times (None: as ``npernode``
        or ``ppr`` derive it).

        Output: ``stdout``/``stderr`` None (discarded: the DVM is asked not
        to forward it), ``"capture"`` (:attr:`JobResult.stdout`),
        ``"inherit"`` (our own), a path (written there), a binary file, or
        a callable ``fn(rank, line)`` called per line on the reader thread.
        ``stdin``: bytes, a path or a binary file, read by rank 0 (None:
        /dev/null).  ``queue``: wait for free slots instead of
        oversubscribing (DVMs that do not queue run the job at once).

        ``options``: ``hosts`` (``"a,b:2"`` or a list), ``env`` (added to
        our environment as it is now; a value of None removes a variable),
        ``inherit_env`` (False: ``env`` is the whole environment), ``cwd``
        (default: ours), ``path``, ``session``, ``pmix``, ``mpi`` (the
        interface its processes get: ``"auto"``, ``"pmix"``, ``"pmi1"``,
        ``"none"``, as ``pydvm run --mpi``),
        ``abort_on_failure``, ``timeout`` (seconds), ``mca`` (Open MPI's
        parameters), ``stop_in_init`` (its processes wait in ``PMIx_Init``
        until :meth:`release`) and ``pydvm run``'s placement options by their long
        names: ``map_by``, ``rank_by``, ``bind_to``, ``npernode``,
        ``pernode``, ``ppr``, ``npersocket``, ``cpus_per_proc``,
        ``oversubscribe``, ``cpu_set``, ``use_hwthread_cpus``,
        ``hostfile``, ``report_bindings``, ``display_map``,
        ``display_allocation``.  What can be told wrong here raises
        ValueError or TypeError; what only the DVM can tell fails the Job.
        """
        if isinstance(command, JobSpec):
            return self.submit(command.command, command.n, stdout=stdout, stderr=stderr,
                               stdin=stdin, queue=queue, **{**command.options, **options})
        job, req = self._prepare(command, n, stdout, stderr, stdin, queue, options)
        self._send_run(job, pack(req))
        return job

    def submit_many(self, specs: "list[JobSpec | str | list[str]]") -> list[Job]:
        """Submit several jobs at once (each a :class:`JobSpec`, or a
        command); their Jobs, in order.  One ``run_many`` request where the
        DVM knows it, else one write of pipelined ``run`` requests.  A spec
        that cannot be built raises before anything is sent."""
        built: list[tuple[Job, dict]] = []
        try:
            for spec in specs:
                if not isinstance(spec, JobSpec):
                    spec = JobSpec(spec)
                o = dict(spec.options)
                built.append(self._prepare(spec.command, spec.n, o.pop("stdout", None),
                                           o.pop("stderr", None), o.pop("stdin", None),
                                           o.pop("queue", None), o))
            jobs = [job for job, _ in built]
            if not built:
                return jobs
            self._register(jobs)
        except BaseException:
            for job, _ in built:
                job._release()
            raise
        pipelined = b"".join(pack(req) for _, req in built)
        if self._run_many is False:
            self._send(pipelined)
            return jobs
        rid = self._new_id()
        answer = self._call_future(rid)
        answer.add_done_callback(lambda f: self._run_many_answer(jobs, pipelined, f.result()))
        self._send(pack({"t": "run_many", "id": rid, "jobs": [req for _, req in built]}))
        return jobs

    def _run_many_answer(self, jobs: list[Job], pipelined: bytes, r: dict) -> None:
        """The answer to a ``run_many`` (on the reader thread): the jobs it
        refused fail; a master that does not know it gets the runs one by one."""
        if r.get("status") == 0:
            self._run_many = True
            for row in r.get("results") or ():
                sub, st, msg = (list(row) + [None, None, None])[:3]
                job = self._runs.pop(sub, None) if st != 0 else None
                if job is not None:
                    job._ended({"status": st, "msg": msg})
        elif unknown_request(r):
            self._run_many = False
            self._post_frames(pipelined)
        else:
            for job in jobs:
                if self._runs.pop(job.id, None) is not None:
                    job._ended(r)

    def _prepare(self, command: Any, n: Any, stdout: Any, stderr: Any, stdin: Any,
                 queue: Any, options: dict) -> tuple[Job, dict]:
        req = run_request(command, n, **options)
        feed = StdinFeed(stdin) if stdin is not None else None
        try:
            out, err = output_sinks(stdout, stderr)
        except BaseException:
            if feed is not None:
                feed.stop()
            raise
        rid = self._new_id()
        req["id"] = rid
        if feed is not None:
            req["stdin"] = True
        if out is None and err is None:
            req["output"] = "discard"
        if queue is not None:
            req["queue"] = bool(queue)
        return Job(self, rid, out, err, feed), req

    def _register(self, jobs: list[Job]) -> None:
        with self._lock:
            if self._lost is not None:
                raise self._lost_error()
            for job in jobs:
                self._runs[job.id] = job

    def _send_run(self, job: Job, frame: bytes) -> None:
        try:
            self._register([job])
        except BaseException:
            job._release()  # never sent: give back the files it opened
            raise
        self._send(frame)

    def jobs(self) -> list[JobInfo]:
        """Every job of the DVM, every user's (``pydvm ps``)."""
        r = self._call({"t": "ps"})
        return [JobInfo(row) for row in r.get("jobs") or ()]

    def job(self, nspace: str) -> JobInfo | None:
        """The job ``nspace`` as ``pydvm ps`` lists it; None if not there."""
        for info in self.jobs():
            if info.nspace == nspace:
                return info
        return None

    def kill(self, nspace: str, wait: bool = False,
             signal: "int | str | None" = None) -> int | None:
        """Kill any job the DVM runs or queues that we may kill (our own;
        any for the DVM's owner and root), as ``pydvm kill`` does; with
        ``wait``, return its exit status once it has ended (143 for a
        queued one).  ``signal``: send that signal to every process of the
        job instead (``pydvm kill --signal``; see :meth:`Job.kill`): for any
        signal but SIGTERM and SIGKILL this returns once every node of the
        job has delivered it, and the job goes on.
        :class:`~pydvm.errors.NotFoundError` if there is no such job,
        :class:`~pydvm.errors.NoPermissionsError` if it is not ours,
        ValueError for what is not a signal."""
        msg: dict = {"t": "kill_job", "nspace": nspace}
        if signal is not None:
            msg = {"t": "signal_job", "nspace": nspace, "signal": signal_number(signal)}
        if wait:
            msg["wait"] = True
        return self._call(msg).get("exit")

    def release(self, nspace: str) -> list[str]:
        """Release a job started stopped in ``PMIx_Init`` (``stop_in_init=True``,
        ``pydvm run --stop-in-init``), as ``pydvm release`` does: its processes
        waiting there go on, and those that reach it later do not stop.
        Returns the nodes where its processes had begun to wait.
        :class:`~pydvm.errors.NotFoundError`
        if no such job runs, :class:`~pydvm.errors.NoPermissionsError` if it is
        not ours, :class:`~pydvm.errors.BadParamError` if it was not started
        stopped."""
        return list(self._call({"t": "release_job", "nspace": nspace}).get("waiting") or [])

    def nodes(self) -> list[NodeInfo]:
        """The DVM's nodes, in its order (:class:`NodeInfo`: ``name``,
        ``slots``, ``state``, a lost node's ``reason``), as ``pydvm info``
        lists them."""
        r = self._call({"t": "info"})
        reasons = r.get("node_reasons") or {}
        return [NodeInfo(row, reasons.get(row[0]) if row else None)
                for row in r.get("nodes") or ()]

    def processes(self, nspace: str) -> "dict[int, ProcessInfo] | None":
        """The processes of the running job ``nspace`` by rank
        (:class:`ProcessInfo`; see :meth:`Job.processes`); None if it is
        queued or the DVM has no such job.
        :class:`~pydvm.errors.NoPermissionsError` for another user's job
        (root and the DVM's owner see every job's)."""
        from ..errors import NotFoundError

        try:
            r = self._call({"t": "job_procs", "nspace": nspace})
        except NotFoundError:
            return None
        if r.get("queued"):
            return None
        return {p.rank: p for p in (ProcessInfo(row) for row in r.get("procs") or ())}

    # -- events ------------------------------------------------------------------

    def events(self, nspace: str | None = None, session: int | None = None) -> Subscription:
        """Subscribe to job events (of job ``nspace``, of session
        ``session``, else of every job we may see): iterate over the
        :class:`Subscription` returned.  :class:`UnsupportedError` if the
        DVM does not push events."""
        return self._subscribe(None, nspace, session)

    def on_event(self, callback: Callable[[JobEvent], Any], nspace: str | None = None,
                 session: int | None = None, *, on_end: Callable[[], Any] | None = None
                 ) -> Subscription:
        """Call ``callback(event)`` (on the reader thread) for each job event;
        close the :class:`Subscription` returned to stop.  ``on_end()`` is
        called once when it stops (closed, the job ``nspace`` ended, or the
        connection lost: then its ``error`` says so)."""
        return self._subscribe(callback, nspace, session, on_end)

    def _subscribe(self, callback: Any, nspace: str | None, session: int | None,
                   on_end: Any = None) -> Subscription:
        rid = self._new_id()
        sub = Subscription(self, rid, callback, nspace, on_end)
        self._subs[rid] = sub
        msg: dict = {"t": "subscribe", "id": rid}
        if nspace is not None:
            msg["nspace"] = nspace
        if session is not None:
            msg["session"] = session
        try:
            self._call(msg, rid)
        except BaseException:
            self._subs.pop(rid, None)
            raise
        return sub

    # -- closing ------------------------------------------------------------------

    def wait(self, timeout: float | None = None) -> None:
        """Wait until every job submitted on this connection has ended."""
        from concurrent.futures import wait

        pending = list(self._runs.values())
        if pending:
            wait(pending, timeout)

    def close(self, wait: bool = False) -> None:
        """Close the connection: jobs still running on it are killed (with
        ``wait``, first wait for them to end).  A DVM this connection
        started (:func:`start`) is stopped.  Jobs not ended fail with
        :class:`~pydvm.errors.UnreachableError`."""
        if wait and self._lost is None:
            self.wait()
        if self.owned and self._lost is None:
            self.owned = False
            try:
                self._call({"t": "stop"})
            except PMIxError:
                pass
        self._fail_all(UnreachableError(f"connection to {self.name} closed"))
        try:
            import socket

            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        if not self._on_reader_thread():
            self._reader.join(10)
        try:
            self._sock.close()
        except OSError:
            pass

    # -- the connection ------------------------------------------------------------

    def _new_id(self) -> int:
        return next(self._ids)

    def _on_reader_thread(self) -> bool:
        return threading.current_thread() is self._reader

    def _lost_error(self) -> BaseException:
        lost = self._lost
        return UnreachableError(lost.message if isinstance(lost, PMIxError) else str(lost))

    def _send(self, frame: bytes) -> None:
        try:
            with self._send_lock:
                if self._box is not None:
                    frame = self._box.sealer.frames(frame)
                self._sock.sendall(frame)
        except OSError as exc:
            self._fail_all(UnreachableError(f"connection to {self.name} lost: {exc}"))
            raise self._lost_error() from None

    def _post(self, msg: dict) -> None:
        """Send, and forget a failure (the reader reports the loss)."""
        try:
            self._send(pack(msg))
        except PMIxError:
            pass

    def _kill(self, nspace: str) -> None:
        self._post({"t": "kill_job", "id": self._new_id(), "nspace": nspace})

    def _signal(self, nspace: str, sig: int) -> None:
        self._post({"t": "signal_job", "id": self._new_id(), "nspace": nspace, "signal": sig})

    def _call_future(self, rid: int) -> Future:
        f: Future = Future()
        with self._lock:
            if self._lost is not None:
                raise self._lost_error()
            self._calls[rid] = f
        return f

    def _call(self, msg: dict, rid: int | None = None, timeout: float | None = None) -> dict:
        """Send a request and wait for its answer; raise its refusal."""
        if rid is None:
            rid = self._new_id()
        if self._on_reader_thread():
            raise RuntimeError("a request from the connection's reader thread would wait "
                               "for ever: make it from another thread")
        f = self._call_future(rid)
        self._send(pack({**msg, "id": rid}))
        r = f.result(timeout)
        if r.get("status") != 0:
            if unknown_request(r):
                raise UnsupportedError(f"this DVM does not know {msg['t']!r} requests (its "
                                       "pydvm is older)")
            raise error_for(Status.coerce(r.get("status")), r.get("msg") or "")
        return r

    def _read_loop(self) -> None:
        dec = self._decoder
        sock = self._sock
        why = "the master closed the connection"
        try:
            for msg in self._early:
                self._dispatch(msg)
            while True:
                data = sock.recv(1 << 18)
                if not data:
                    break
                for msg in dec.feed(data):
                    self._dispatch(msg)
        except OSError as exc:
            why = f"connection lost: {exc}"
        except FrameError as exc:
            why = f"protocol error: {exc}"
        except BaseException as exc:  # a bug of ours: fail loudly, not by hanging
            why = f"job API reader failed: {exc!r}"
        self._fail_all(UnreachableError(f"{self.name}: {why}"))

    def _dispatch(self, msg: dict) -> None:
        t = msg.get("t")
        if t == "output":
            job = self._by_ns.get(msg.get("nspace"))
            if job is not None:
                data = msg.get("data")
                if isinstance(data, bytes):
                    try:
                        job._output(msg.get("rank"), msg.get("fd"), data)
                    except Exception:
                        pass  # a callback's error must not stop the connection
        elif t == "reply":
            rid = msg.get("id")
            job = self._runs.pop(rid, None)
            if job is not None:
                if job.nspace is not None:
                    self._by_ns.pop(job.nspace, None)
                for ns in job._spawned:
                    self._by_ns.pop(ns, None)
                job._ended(msg)
                return
            f = self._calls.pop(rid, None)
            if f is not None:
                f.set_result(msg)
        elif t == "started" or t == "queued":
            job = self._runs.get(msg.get("ref"))
            if job is None:
                return
            ns = msg.get("nspace")
            if isinstance(ns, str):
                self._by_ns[ns] = job
            if t == "started":
                size, nodes = msg.get("size"), msg.get("nodes")
                job.size = size if isinstance(size, int) else None
                job.nodes = list(nodes) if isinstance(nodes, list) else None
                job.position = None
                job._named(ns, RUNNING)
                feed = job._stdin
                if feed is not None and isinstance(ns, str):
                    self._feed(feed, ns)
            else:
                pos = msg.get("position")
                job.position = pos if isinstance(pos, int) else None
                job._named(ns, QUEUED)
        elif t == "spawned":
            # a job this one spawned (PMIx_Spawn): its output is the parent's
            job = self._by_ns.get(msg.get("parent"))
            ns = msg.get("nspace")
            if job is not None and isinstance(ns, str):
                self._by_ns[ns] = job
                job._spawned.append(ns)
        elif t == "job_event":
            sub = self._subs.get(msg.get("ref"))
            if sub is not None:
                try:
                    sub._event(msg)
                except Exception:
                    pass
        elif t == "stdin_ack":
            job = self._by_ns.get(msg.get("nspace"))
            if job is not None and job._stdin is not None:
                job._stdin.ack(msg.get("bytes"), msg.get("closed") is True)
                self._feed(job._stdin, msg["nspace"])

    def _feed(self, feed: StdinFeed, nspace: str) -> None:
        pieces = feed.pieces(nspace)
        if pieces:
            self._post_frames(b"".join(pack(p) for p in pieces))

    def _post_frames(self, frames: bytes) -> None:
        try:
            self._send(frames)
        except PMIxError:
            pass

    def _fail_all(self, exc: PMIxError) -> None:
        """The connection is gone: every job and request still waiting fails."""
        with self._lock:
            if self._lost is None:
                self._lost = exc
            runs, self._runs = self._runs, {}
            calls, self._calls = self._calls, {}
            subs, self._subs = self._subs, {}
            self._by_ns = {}
        for job in runs.values():
            job._release()
            job.state = ENDED
            job._settle(exc=UnreachableError(exc.message))
            job._tell_state()
        for f in calls.values():
            f.set_result({"status": int(Status.ERR_UNREACH), "msg": exc.message})
        for sub in subs.values():
            sub._end(UnreachableError(exc.message))

