"""Several threads' requests on one blocking connection, answers matched by id.

:class:`pydvm.Client` is shared by the threads of a process (a training
loop and an elastic agent's keep-alive thread, say).  Holding one lock
across a whole exchange would make a waiting lookup in one thread stall
every other thread's request behind it, so a :class:`Mux` lets each thread
send its request at once (sends are serialised by a lock; each frame goes
whole) and then wait for its own answer:

* no thread is dedicated to reading.  A thread that needs an answer and
  finds nobody reading becomes the *reader*: it reads frames and hands each
  answer to the thread waiting for it (a slot per request id, and a
  condition variable), until its own answer arrives; then it steps down
  and wakes the others, one of which takes over if it still waits.  A
  single-threaded caller is thus always its own reader, and pays only a few
  uncontended lock operations over the plain exchange;
* a request sent without waiting for its answer (:meth:`Mux.post`, as
  ``publish(..., ack=False)``) is remembered until its answer comes --
  read by whichever thread reads next, or drained without blocking right
  after the next such post -- and if that answer is a refusal, it is kept
  and raised, once, by the next call made on the connection: at its start
  (:meth:`Mux.check`) if it is known by then, else when that call's own
  answer (which comes after it) is in; or by :meth:`Mux.flush`, which
  waits for every one of them;
* a lost connection (end of file, an ``error`` frame, a frame that cannot
  be read) fails every call waiting on it, and every later one, with the
  error the client builds for it.

Answers to requests nobody waits for any more (a call interrupted by
Ctrl-C, which withdraws its request with ``cancel``) are dropped.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

from ..errors import PMIxError, Status, error_for
from ..channel import BlockingChannel
from ..protocol import FrameError, Message

#: Requests sent without waiting (:meth:`Mux.post`) that may be unanswered
#: at once; a post beyond it first waits for the oldest answers.  Keeps
#: what the peer holds for a caller who never reads bounded, well under the
#: cap of outstanding requests per connection (``pydvm_max_outstanding``).
MAX_UNACKED = 256


class Mux:
    """Requests of many threads over one :class:`BlockingChannel`.

    ``lost(text)`` builds the exception raised when the connection is gone
    (the client's :class:`~pydvm.errors.UnreachableError`, naming which
    connection); it is called once, when the loss is first seen.
    """

    def __init__(self, ch: BlockingChannel, lost: Callable[[str], PMIxError]) -> None:
        self.ch = ch
        self._lost = lost
        self._ids = itertools.count(1)
        self._send_lock = threading.Lock()
        #: guards what follows; ``_cond`` (on the same lock) wakes waiters,
        #: and is notified only when some thread sleeps on it (``_sleepers``):
        #: a lone caller takes nothing but a few uncontended C-level locks.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._sleepers = 0
        #: a thread is reading the connection (the reader).
        self._reading = False
        #: request id -> [answer]: requests whose caller waits for the answer.
        self._waiting: dict[int, list] = {}
        #: request id -> its type: requests sent without waiting, unanswered.
        self._unacked: dict[int, str] = {}
        #: (id, error) of the first such request that was refused, until raised.
        self._failed: tuple[int, PMIxError] | None = None
        #: the error every call gets once the connection is lost.
        self._broken: PMIxError | None = None

    # -- the calls ------------------------------------------------------------

    def call(self, msg: Message, *, withdrawable: bool = False) -> Message:
        """Send ``msg`` with a fresh id and return its answer.

        If a request posted before it (:meth:`post`) turns out refused, that
        refusal is raised instead, once this request's own answer is in --
        requests are served in order, so this one has been served too (an
        ``add`` has been applied).  ``withdrawable``: the request only reads
        (a waiting lookup); it is then withdrawn and the refusal raised as
        soon as it is known, rather than after its own answer.
        Interrupted (KeyboardInterrupt, SystemExit), it is withdrawn too.
        """
        rid = next(self._ids)
        msg["id"] = rid
        lock = self._lock
        lock.acquire()
        if self._broken is not None:
            lock.release()
            raise self._broken
        if not self._reading and not self._waiting:
            # Alone (the usual case): read for ourselves, no slot to fill.
            self._reading = True
            lock.release()
            return self._call_alone(msg, rid, withdrawable)
        slot: list = [None]
        self._waiting[rid] = slot
        lock.release()
        try:
            self._send(msg)
        except BaseException:
            with self._lock:
                self._waiting.pop(rid, None)
            raise
        try:
            answer = self._wait(rid, slot, withdrawable)
        except (KeyboardInterrupt, SystemExit):
            self._withdraw(rid)
            raise
        except _Abandoned as exc:
            self._withdraw(rid)
            raise exc.error from None
        if self._failed is not None:  # a request posted before this one was refused
            with self._lock:
                failed = self._failed
                if failed is not None and failed[0] < rid:
                    self._failed = None
                    raise failed[1]
        return answer

    def _call_alone(self, msg: Message, rid: int, withdrawable: bool) -> Message:
        """:meth:`call` as the reader from the start: send, then read until our
        own answer, handing any other answer to whoever waits for it (a thread
        that came meanwhile, or a post)."""
        ch = self.ch
        try:
            try:
                self._send(msg)
                while True:
                    try:
                        answer = ch.recv()
                    except (OSError, ConnectionError, ValueError, FrameError) as exc:
                        self._break(f"connection lost: {exc}")
                        raise self._broken from None
                    if answer.get("id") == rid and answer.get("t") == "reply":
                        break
                    self._dispatch(answer)
                    if self._broken is not None:
                        raise self._broken
                    failed = self._failed
                    if withdrawable and failed is not None and failed[0] < rid:
                        with self._lock:
                            self._failed = None
                        raise _Abandoned(failed[1])
            finally:
                with self._lock:
                    self._reading = False
                    if self._sleepers:
                        self._cond.notify_all()
        except (KeyboardInterrupt, SystemExit):
            self._withdraw(rid)
            raise
        except _Abandoned as exc:
            self._withdraw(rid)
            raise exc.error from None
        if self._failed is not None:  # a request posted before this one was refused
            with self._lock:
                failed = self._failed
                if failed is not None and failed[0] < rid:
                    self._failed = None
                    raise failed[1]
        return answer

    def post(self, msg: Message) -> None:
        """Send ``msg`` with a fresh id and return at once; its answer is
        read later, and a refusal raised by a later :meth:`check`."""
        with self._lock:
            if self._broken is not None:
                raise self._broken
            backlog = len(self._unacked) >= MAX_UNACKED
        if backlog:
            self._settle(lambda: len(self._unacked) < MAX_UNACKED // 2)
        rid = next(self._ids)
        msg["id"] = rid
        with self._lock:
            self._unacked[rid] = str(msg.get("t"))
        try:
            self._send(msg)
        except BaseException:
            with self._lock:
                self._unacked.pop(rid, None)
            raise
        self._drain()

    def check(self) -> None:
        """Raise (once) the refusal of a request sent without waiting."""
        failed = self._failed
        if failed is None:
            return
        with self._lock:
            failed, self._failed = self._failed, None
        if failed is not None:
            raise failed[1]

    def flush(self) -> None:
        """Wait until every request sent without waiting is answered; raise
        the first refusal among them (or the connection's loss, if it was
        lost with some unanswered)."""
        self._settle(lambda: not self._unacked)
        self.check()

    @property
    def unacked(self) -> int:
        """Requests sent without waiting whose answer has not come yet."""
        return len(self._unacked)

    # -- plumbing -------------------------------------------------------------

    def _send(self, msg: Message) -> None:
        """Send one frame whole; a connection that fails here is lost
        (raises its error).  TypeError: a value msgpack cannot encode."""
        try:
            with self._send_lock:
                self.ch.send(msg)
        except OSError as exc:
            self._break(f"connection lost: {exc}")
            raise self._broken from None

    def _withdraw(self, rid: int) -> None:
        """Forget request ``rid`` here and ask the peer to drop it."""
        with self._lock:
            self._waiting.pop(rid, None)
        try:
            self._send({"t": "cancel", "ref": rid})
        except PMIxError:
            pass

    def _wait(self, rid: int, slot: list, withdrawable: bool) -> Message:
        while True:
            with self._lock:
                while True:
                    if slot[0] is not None:
                        del self._waiting[rid]
                        return slot[0]
                    if self._broken is not None:
                        del self._waiting[rid]
                        raise self._broken
                    if withdrawable and self._failed is not None and self._failed[0] < rid:
                        failed, self._failed = self._failed, None
                        raise _Abandoned(failed[1])
                    if not self._reading:
                        self._reading = True
                        break
                    self._sleep()
            try:
                self._read(lambda: slot[0] is not None or (
                    withdrawable and self._failed is not None and self._failed[0] < rid))
            finally:
                with self._lock:
                    self._reading = False
                    self._notify()

    def _settle(self, done: Callable[[], bool]) -> None:
        """Read (or wait for the reader) until ``done()`` holds, under the lock."""
        while True:
            with self._lock:
                while True:
                    if done():
                        return
                    if self._broken is not None:
                        if self._unacked:
                            self._unacked.clear()
                            raise self._broken
                        return
                    if not self._reading:
                        self._reading = True
                        break
                    self._sleep()
            try:
                self._read(done)
            finally:
                with self._lock:
                    self._reading = False
                    self._notify()

    def _read(self, done: Callable[[], bool]) -> None:
        """As the reader: dispatch answers until ``done()`` or the connection ends."""
        while True:
            if done() or self._broken is not None:  # plain reads: no lock needed
                return
            try:
                msg = self.ch.recv()
            except (OSError, ConnectionError, ValueError, FrameError) as exc:
                self._break(f"connection lost: {exc}")
                return
            self._dispatch(msg)

    def _drain(self) -> None:
        """Dispatch the answers already here, without blocking (after a
        post: keeps the backlog small and reports refusals early)."""
        with self._lock:
            if self._reading:
                return
            self._reading = True
        try:
            try:
                msgs = self.ch.recv_ready()
            except (OSError, ConnectionError, ValueError, FrameError) as exc:
                self._break(f"connection lost: {exc}")
                return
            for msg in msgs:
                self._dispatch(msg)
        finally:
            with self._lock:
                self._reading = False
                self._notify()

    def _dispatch(self, msg: Message) -> None:
        t = msg.get("t")
        if t == "error":
            self._break(f"dropped the connection: {msg.get('msg')}")
            return
        if t != "reply":
            return
        rid = msg.get("id")
        with self._lock:
            slot = self._waiting.get(rid)
            if slot is not None:
                slot[0] = msg
                self._notify()
                return
            what = self._unacked.pop(rid, None)
            if what is None:
                return  # the late answer of a withdrawn call
            status = msg.get("status")
            if status != 0 and self._failed is None:
                try:
                    st = Status(status)
                except ValueError:
                    st = Status.ERR_BAD_PARAM
                self._failed = (rid, error_for(
                    st, f"an earlier {what}, sent without waiting for its answer, failed: "
                        f"{msg.get('msg') or st.pmix_name}"))
                self._notify()

    def _sleep(self) -> None:
        """Wait for a notification (the lock held)."""
        self._sleepers += 1
        try:
            self._cond.wait()
        finally:
            self._sleepers -= 1

    def _notify(self) -> None:
        """Wake every sleeping thread (the lock held)."""
        if self._sleepers:
            self._cond.notify_all()

    def _break(self, text: str) -> None:
        with self._lock:
            if self._broken is None:
                self._broken = self._lost(text)
            self._notify()


class _Abandoned(Exception):
    """A withdrawable call gives way to an earlier request's refusal."""

    def __init__(self, error: PMIxError) -> None:
        super().__init__(str(error))
        self.error = error
