"""A user's PMIx agent: the process that hosts that user's libpmix server on a
node and relays its upcalls to the node (why, the trust rule and the wire:
:mod:`pydvm.runtime.pmixhost.users`, which starts it: :func:`main`).

Threads
-------
libpmix's progress thread writes each upcall to the node itself
(:meth:`Agent.take_now`, the binding's ``take_now``, through
:meth:`UpcallLink.send_upcall`), instead of handing it to the agent's
event loop to write -- a thread wake-up per request saved; the loop is
woken by the node's answer only, and gives it to libpmix.  A publish,
lookup or unpublish crosses as the store's own request (``{"t": "data",
"p": [nspace, rank], "m": request}``, made by
:func:`~pydvm.runtime.pmixhost.data.data_request` on libpmix's thread) and is
answered with the store's reply map, which the agent turns into the PMIx
reply (:func:`~pydvm.runtime.pmixhost.data.answer`): the node builds no PMIx
objects for them and serves them from its socket handler when a store can
answer at once.  Every other upcall crosses as the tagged request of
:func:`~pydvm.runtime.pmixhost.codec.encode_request` (``{"t": "up"}``), answered
with the reply call's arguments.  All of them go through the one socket in
the order libpmix made them, so a process's requests reach the node in
order -- except where the node offers a fast lane (the head node:
:mod:`pydvm.runtime.pmixhost.fast`): there a publish, lookup or unpublish is
asked on the lane while libpmix's thread waits, so it still comes after
everything the process sent before it, and is answered before the process
can send the next one.  An upcall that cannot be sent from libpmix's thread (the link is
down, a value the codec cannot carry) goes to the loop, which refuses it.

The agent runs on uvloop when it is installed: asyncio's own loop reads
into a fresh 256 KiB buffer each time, an mmap and munmap per answer in a
process with three threads.

Two threads write one socket, so every write goes through
:meth:`UpcallLink.write`, under one lock:

* on the loop's thread, through the asyncio transport (which buffers what
  the socket does not take at once);
* on any other thread, straight to the socket -- but only while nothing
  waits before it (the transport's buffer empty, nothing queued for the
  loop) and the socket takes all of it at once.  Otherwise the bytes (the
  rest of them) are queued, in order, for the loop to hand to the
  transport (one ``call_soon_threadsafe`` for the lot): such a thread never
  waits for the socket or the loop, and frames are never interleaved.

The lock is held while writing only (a non-blocking ``send`` or a
transport ``write``), never while waiting for anything: libpmix's thread
waits at most for one such write of the loop's to end, never for the
socket, the node or the loop's turn.  (Both threads take the GIL before
the lock, and a thread waiting for the lock lets the GIL go.)  The other threads
write through a descriptor of the link's own (a ``dup`` of the loop's), so
whenever the loop's transport closes its descriptor, theirs is still the
same socket; :meth:`close` closes it under the lock, and nothing is written
after that.

Upcalls that want an answer are numbered here (their own ids: the
channel's request ids are not used for them) and kept until the node's
``reply`` with that id comes back on the loop (:meth:`take`); those still
waiting when the link closes are answered ``PMIX_ERR_UNREACH`` by the agent.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import threading
from typing import Any

from ...errors import Status
from ...pmix import constants as C
from ...wire import Channel, Message, pack, reply
from .codec import decode, encode_request
from .data import DATA_KINDS, answer, data_request

log = logging.getLogger("pydvm.pmix")


class UpcallLink:
    """The shared write side of the agent's socket to its node, and the
    upcalls waiting for the node's answer.  Made on the loop's thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        self.loop = loop
        #: the other threads' descriptor of the socket (closed by close()).
        self.sock = sock.dup()
        self.loop_thread = threading.get_ident()
        self.lock = threading.Lock()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        #: bytes for the loop to write, in order (a write from another thread
        #: that could not go straight to the socket, and every write after it).
        self._queue: list[bytes] = []
        #: id -> the upcall (its request object) waiting for the node's answer.
        self._waiting: dict[int, Any] = {}
        self._ids = itertools.count(1)
        #: writes from another thread: straight to the socket, or queued for the loop.
        self.stats = {"direct": 0, "queued": 0}

    # -- writing ----------------------------------------------------------

    def write(self, data: bytes) -> bool:
        """Write one frame, from any thread; False if the link is closed."""
        with self.lock:
            return self._write_locked(data)

    def _write_locked(self, data: bytes) -> bool:
        if self.closed or self.transport is None or self.transport.is_closing():
            return False
        queue = self._queue
        if threading.get_ident() == self.loop_thread:
            if queue:
                queue.append(data)  # after what another thread queued (a flush is due)
            else:
                self.transport.write(data)
            return True
        if not queue and self.transport.get_write_buffer_size() == 0:
            # The buffer only grows under this lock (every write is here), so
            # empty now means nothing is due before these bytes.
            try:
                n = self.sock.send(data, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError:
                n = 0  # the loop sees the socket's end itself; the rest goes to it
            if n == len(data):
                self.stats["direct"] += 1
                return True
            data = data[n:]
        self.stats["queued"] += 1
        queue.append(data)
        if len(queue) == 1:
            try:
                self.loop.call_soon_threadsafe(self._flush)
            except RuntimeError:  # the loop is closed: the agent is ending anyway
                queue.clear()
                return False
        return True

    def _flush(self) -> None:
        with self.lock:
            queue, self._queue = self._queue, []
            if (queue and not self.closed and self.transport is not None
                    and not self.transport.is_closing()):
                self.transport.writelines(queue)

    # -- upcalls ------------------------------------------------------------

    def send_upcall(self, body: Message, req: Any, wants_answer: bool) -> bool:
        """Send upcall ``body`` (``{"t": "up", "req": ...}``) from any thread;
        with ``wants_answer`` it gets an id and ``req`` waits for the node's
        answer (:meth:`take`).  False, with nothing sent or kept, if the link
        is closed."""
        with self.lock:
            if self.closed:
                return False
            if wants_answer:
                rid = body["id"] = next(self._ids)
                self._waiting[rid] = req
            if self._write_locked(pack(body)):
                return True
            if wants_answer:
                del self._waiting[rid]
            return False

    def take(self, rid: Any) -> Any:
        """The upcall answered by the node's reply ``rid`` (None: no such one)."""
        try:
            return self._waiting.pop(rid, None)
        except TypeError:  # an unhashable id: not ours
            return None

    def close(self) -> list:
        """Nothing is written any more; returns the upcalls still waiting for
        an answer (the caller answers them).  Called on the loop."""
        with self.lock:
            if not self.closed:
                self.closed = True
                self.sock.close()
            self._queue.clear()
            waiting = list(self._waiting.values())
            self._waiting.clear()
        return waiting


class LogToNode(logging.Handler):
    """The agent's log records (warnings and worse) written to its node,
    which logs them as the agent's in the node's own log: an agent has no
    log file of its own, and its stderr is not the node's log."""

    def __init__(self, link: UpcallLink) -> None:
        super().__init__(logging.WARNING)
        self.link = link

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.link.write(pack({"t": "log", "level": record.levelno,
                                  "msg": record.getMessage()[:2000]}))
        except Exception:  # never let logging break the agent
            pass


class LinkChannel(Channel):
    """The agent's :class:`~pydvm.wire.Channel` to its node: every frame it
    sends goes through the link's shared write (see the module docstring)."""

    link: UpcallLink | None = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.link is not None:
            self.link.transport = transport

    def send(self, msg: Message) -> None:
        if self.closed or self.link is None:
            return
        self.link.write(pack(msg))

    def send_raw(self, body) -> None:  # pragma: no cover - the agent never passes bodies on
        raise NotImplementedError


def give_answer(req, r: Message) -> None:
    """Give libpmix the node's answer ``r`` to relayed upcall ``req``."""
    if req.reply.done:
        return
    if "args" in r:
        try:
            req.reply(*decode(r["args"]))
            return
        except Exception as exc:
            log.error("pmix %s: the node's answer cannot be given (%s)", req.kind, exc)
            req.reply.fail(int(C.ERROR))
            return
    status = r.get("fail", r.get("status"))
    req.reply.fail(int(status) if isinstance(status, int) and status != Status.SUCCESS
                   else int(Status.ERR_UNREACH))


class Agent:
    """One user's libpmix server, relaying upcalls to its node."""

    def __init__(self, lane_fd: int | None = None) -> None:
        self.server = None
        self.channel: Channel | None = None
        self.link: UpcallLink | None = None  # once connected
        self.done: asyncio.Future | None = None
        #: the fast lane's asking end (runtime/pmixhost/fast.py), where the node offers one
        self.fast = None
        #: the tool server's watch on its tools' connections (pmix/tools.py)
        self.tool_watch = None
        self._lane_ids = itertools.count(1)
        if lane_fd is not None:
            from .fast import Asker
            self.fast = Asker(socket.socket(fileno=lane_fd))

    def on_message(self, ch: Channel, msg: Message) -> None:
        t = msg.get("t")
        if t == "reply" and self.link is not None:
            req = self.link.take(msg.get("id"))
            if req is not None:
                if req.kind == "tool_connected":
                    self._tool_answered(req, msg)
                elif "args" in msg or "fail" in msg:
                    give_answer(req, msg)
                else:  # the store's reply map, to a data request relayed as the store's
                    answer(req, msg, "pmix agent")
                return
        if t in ("reply", "error", "cancel"):
            return  # a late answer; a call the node gave up on runs to its end
        fn = getattr(self, "_do_" + str(t), None)
        if fn is None:
            ch.send(reply(msg.get("id"), C.ERR_NOT_SUPPORTED, f"unknown command {t!r}"))
            return
        task = asyncio.ensure_future(self._run(fn, msg))
        task.add_done_callback(lambda t: None)

    async def _run(self, fn, msg: Message) -> None:
        try:
            fields = await fn(msg) or {}
            out = reply(msg.get("id"), Status.SUCCESS, **fields)
        except Exception as exc:
            status = getattr(exc, "status", None)
            out = reply(msg.get("id"), status if isinstance(status, int) else C.ERROR,
                        f"{msg.get('t')}: {exc}")
        if self.channel is not None and not self.channel.closed:
            self.channel.send(out)

    async def _do_start(self, msg: Message) -> dict:
        from ...pmix import PmixServer, cleanup_stale
        from ...pmix import constants as C
        cleanup_stale(msg["tmpdir"])
        server = PmixServer(max_value_size=int(msg["max_value_size"]), nspace=str(msg["nspace"]))
        server.tool_support = bool(msg.get("tools"))
        if server.tool_support:
            from ...pmix.tools import HangupWatch
            self.tool_watch = HangupWatch(self._tool_gone)
        if self.fast is not None:
            from .fast import spin_ns
            us = msg.get("spin_us")
            self.fast.spin_ns = spin_ns(float(us)) if isinstance(us, (int, float)) else 0
        server.start(msg["tmpdir"], asyncio.get_running_loop(), self.forward,
                     extra_info=[(C.HOSTNAME, str(msg["host"]))], take_now=self.take_now,
                     answer_now=self.answer_now if self.fast is not None else None,
                     attribute_fix=bool(msg.get("attribute_fix", True)))
        self.server = server
        return {"tmpdir": server.tmpdir}

    async def _do_register_nspace(self, msg: Message) -> None:
        await self.server.register_nspace(str(msg["nspace"]), int(msg["nlocal"]),
                                          [tuple(i) for i in decode(msg["info"])])

    async def _do_register_job(self, msg: Message) -> dict:
        """A job's share of this node in one request: its namespace, built
        here from the layout the master sent (``job_info``), and each of its
        local processes; their environments back (``[[rank, env], ...]``)."""
        from ...pmix import Proc
        from ...pmix.jobinfo import job_info
        from .codec import job_layout
        ns, node = str(msg["nspace"]), str(msg["node"])
        session = msg.get("session")
        jl = job_layout(ns, msg["layout"], session if isinstance(session, int) else None)
        jl.proc_extra = {int(r): [(str(k), v) for k, v in items]
                         for r, items in msg.get("proc_extra") or ()}
        await self.server.register_nspace(ns, jl.local_count(node), job_info(jl, node))
        procs = [(Proc(ns, int(r)), int(u), int(g)) for r, u, g in msg["procs"]]
        await asyncio.gather(*[self.server.register_client(p, u, g) for p, u, g in procs])
        return {"envs": [[p.rank, self.server.setup_fork(p)] for p, _, _ in procs]}

    async def _do_deregister_nspace(self, msg: Message) -> None:
        await self.server.deregister_nspace(str(msg["nspace"]))

    async def _do_register_client(self, msg: Message) -> dict:
        from ...pmix import Proc
        proc = Proc(str(msg["nspace"]), int(msg["rank"]))
        await self.server.register_client(proc, int(msg["uid"]), int(msg["gid"]))
        return {"env": self.server.setup_fork(proc)}

    async def _do_notify(self, msg: Message) -> None:
        from ...pmix import PmixServerError
        status = await self.server.notify_event(
            int(msg["code"]), decode(msg["source"]), int(msg["range"]),
            [tuple(i) for i in decode(msg["info"])], timeout=float(msg["timeout"]))
        if status != Status.SUCCESS:
            raise PmixServerError(status, "notify_event")

    async def _do_dmodex(self, msg: Message) -> dict:
        from ...pmix import PmixServerError, Proc
        status, blob = await self.server.dmodex_request(Proc(str(msg["nspace"]),
                                                             int(msg["rank"])))
        if status != Status.SUCCESS:
            raise PmixServerError(status, "direct modex")
        return {"data": blob}

    async def _do_probe(self, msg: Message) -> None:
        """The node's watchdog asks whether libpmix still serves: refused
        ``PMIX_ERR_TIMEOUT`` when its progress thread did not complete a
        call within ``timeout`` seconds (users.UserServers.watch)."""
        from ...pmix import PmixServerError
        if self.server is None:
            return
        timeout = msg.get("timeout")
        timeout = float(timeout) if isinstance(timeout, (int, float)) else 30.0
        if await self.server.probe(timeout) == Status.ERR_TIMEOUT:
            raise PmixServerError(Status.ERR_TIMEOUT,
                                  f"libpmix did not complete a call in {timeout:g} s")

    async def _do_stop(self, msg: Message) -> None:
        if self.done is not None and not self.done.done():
            asyncio.get_running_loop().call_soon(self.done.set_result, "stopped")

    def take_now(self, req) -> bool:
        """An upcall on libpmix's thread (the binding's ``take_now``): written
        to the node from here (:class:`UpcallLink`); False -- nothing sent -- when it
        cannot be (the link is down, the request cannot be carried): then it
        reaches :meth:`forward` on the loop, which answers it."""
        link = self.link
        if link is None:
            return False
        if req.kind in DATA_KINDS:
            m = data_request(req, 0)
            if m is not None:  # (None: a value the store cannot hold; the node refuses it)
                del m["id"]
                return link.send_upcall({"t": "data", "p": [req.proc.nspace, req.proc.rank],
                                         "m": m}, req, True)
        try:
            body = {"t": "up", "req": encode_request(req)}
        except TypeError:
            return False
        return link.send_upcall(body, req, not req.reply.notification)

    def answer_now(self, req) -> bool:
        """A publish, lookup or unpublish on libpmix's thread, inside its
        upcall (the binding's ``answer_now``): asked on the fast lane and
        answered here when the node answers it at once; False -- nothing
        done -- to have it relayed as usual (:meth:`take_now`).  Unlike the
        binding's rule for ``answer_now`` this waits, for the node to serve
        one request under its store guard: this server's other clients (its
        user's processes on this node) wait as long (runtime/pmixhost/fast.py)."""
        fast = self.fast
        if fast is None or fast.broken or self.link is None:
            return False
        m = data_request(req, 0)
        if m is None:
            return False
        del m["id"]
        try:
            r = fast.ask(next(self._lane_ids), [req.proc.nspace, req.proc.rank], m)
        except OSError as exc:
            log.warning("fast lane to the node lost (%s): requests go on the link", exc)
            return False
        if r is None:
            return False
        answer(req, r, "pmix agent")
        return True

    def forward(self, req) -> None:
        """An upcall on the loop (one :meth:`take_now` did not send): to the
        node if it can go, else refused."""
        if req.kind == "tool_connected":
            self._tool_connected(req)
            return
        try:
            body = {"t": "up", "req": encode_request(req)}
        except TypeError as exc:
            log.error("pmix %s cannot be relayed (%s): refused", req.kind, exc)
            req.reply.fail(int(Status.ERR_BAD_PARAM))
            return
        link = self.link
        if not (link is not None and link.send_upcall(body, req, not req.reply.notification)):
            if not req.reply.notification:
                req.reply.fail(int(Status.ERR_UNREACH))

    # -- tools (the tool server: users.UserServers.start_tools) ---------

    def _tool_connected(self, req) -> None:
        """A tool asks to connect: what this process found of it (the
        kernel's uid of its socket, its claims) goes to the node, which
        answers with the tool's identity or refuses it; the tool's socket
        stays here (watched for its end once it is in)."""
        from .codec import encode_tool
        link = self.link
        try:
            body = {"t": "tool", "req": encode_tool(req)}
        except TypeError as exc:
            log.error("a tool's connection cannot be relayed (%s): refused", exc)
            body = None
        if body is None or link is None or not link.send_upcall(body, req, True):
            if req.fd is not None:
                os.close(req.fd)
            req.reply.abandon()

    def _tool_answered(self, req, r: Message) -> None:
        """The node's answer to a tool's connection: its identity, or a refusal."""
        fd, req.fd = req.fd, None
        ok = False
        if "args" in r:
            try:
                status, proc = decode(r["args"])
                ok = status == Status.SUCCESS and proc is not None and req.reply(status, proc)
            except Exception as exc:
                log.error("a tool's identity cannot be given (%s): refused", exc)
        if not ok:
            req.reply.abandon()
            if fd is not None:
                os.close(fd)
        elif fd is not None:
            if self.tool_watch is not None:
                self.tool_watch.watch(fd, proc.nspace)
            else:
                os.close(fd)

    def _tool_gone(self, nspace: str) -> None:
        link = self.link
        if link is not None:
            link.write(pack({"t": "tool_gone", "ns": nspace}))

    async def main(self, fd: int) -> None:
        loop = asyncio.get_running_loop()
        self.done = loop.create_future()

        def closed(ch: Channel, reason: str) -> None:
            for req in link.close():
                req.reply.fail(int(Status.ERR_UNREACH))
            if not self.done.done():
                self.done.set_result(reason)
        sock = socket.socket(fileno=fd)
        link = UpcallLink(loop, sock)

        def channel() -> LinkChannel:
            ch = LinkChannel(self.on_message, closed, name="node")
            ch.link = link
            return ch
        self.link = link
        _, self.channel = await loop.create_unix_connection(channel, sock=sock)
        logging.getLogger("pydvm").addHandler(LogToNode(link))
        reason = await self.done
        if self.tool_watch is not None:
            self.tool_watch.close()
        if self.server is not None:
            self.server.finalize()
            self.server = None
        if self.fast is not None:
            self.fast.close()
        self.channel.close(str(reason))
        log.debug("PMIx agent of uid %d done: %s", os.getuid(), reason)


def run(fd: int, lane_fd: int | None = None) -> None:
    """Run the agent on its socket pair's end ``fd`` (and its fast lane's,
    ``lane_fd``) until the node stops it."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(Agent(lane_fd).main(fd))
    else:
        uvloop.run(Agent(lane_fd).main(fd))


def main(argv: list[str] | None = None) -> int:
    """``python -m pydvm.runtime.pmixhost.agent FD [LANE_FD]``: what a node starts
    (:meth:`pydvm.runtime.pmixhost.remote.UserServer.start`)."""
    import sys
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) not in (1, 2) or not all(x.isdigit() for x in argv):
        print("usage: python -m pydvm.runtime.pmixhost.agent FD [LANE_FD] (started by a pydvm node)",
              file=sys.stderr)
        return 2
    logging.basicConfig(level=os.environ.get("PYDVM_AGENT_LOG", "WARNING"),
                        format=f"pydvm pmix agent uid {os.getuid()}: %(levelname)s %(message)s")
    run(int(argv[0]), int(argv[1]) if len(argv) > 1 else None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
