"""The user's PMIx agent's side of its link to the node (runtime/pmixhost/agent.py):
frames written from another thread (libpmix's, in the agent) and from the
loop share one socket without ever interleaving, in the order they were
written, and nothing is written once the link is closed.  Real sockets,
threads and an event loop; no libpmix (tests/multiuser/test_pmix_users.py
runs the real agent)."""

from __future__ import annotations

import asyncio
import socket
import threading

from pydvm.errors import Status
from pydvm.runtime.pmixhost.agent import LinkChannel, UpcallLink
from pydvm.wire import FrameDecoder


def _frames(sock: socket.socket, n: int, chunk: int = 1 << 16, dec=None) -> list[dict]:
    """Read ``n`` frames from the blocking ``sock``, ``chunk`` bytes at a time
    (into ``dec``, a FrameDecoder, if given)."""
    sock.settimeout(60)
    dec, out = dec or FrameDecoder(1 << 24), []
    while len(out) < n:
        data = sock.recv(chunk)
        assert data, f"the link ended after {len(out)} of {n} frames"
        out += dec.feed(data)
    return out


async def _linked():
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    link = UpcallLink(loop, ours)
    got: list[dict] = []
    closed: list[str] = []

    def channel():
        ch = LinkChannel(lambda ch, m: got.append(m), lambda ch, why: closed.append(why),
                         name="node")
        ch.link = link
        return ch
    _, ch = await loop.create_unix_connection(channel, sock=ours)
    return link, ch, theirs, got, closed


class _Req:
    """What the link keeps of an upcall waiting for its answer."""


def test_frames_from_libpmixs_thread_and_the_loop_keep_their_order_and_never_interleave():
    """A thread writes 400 frames of 4 KiB while the loop writes its own
    between them, and the peer reads slowly (small reads) once the thread's
    first 100 frames -- more than the socket holds -- are written: the socket
    is full now and then, so the thread's writes are sometimes sent straight,
    sometimes in part, sometimes queued for the loop.  Every frame arrives
    whole, each writer's in its order."""
    async def main():
        link, ch, peer, _, _ = await _linked()
        link.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 16)
        loop = asyncio.get_running_loop()
        pad = "x" * 4096
        done, hundred = threading.Event(), threading.Event()
        n_loop = 300

        def thread():
            for i in range(400):
                assert link.send_upcall({"t": "up", "n": i, "pad": pad}, _Req(), True)
                if i == 99:
                    hundred.set()
            done.set()

        def read():
            assert hundred.wait(60)
            return _frames(peer, 400 + n_loop, 1500)
        reader = loop.run_in_executor(None, read)
        threading.Thread(target=thread).start()
        for k in range(n_loop):  # the loop writes too, meanwhile
            ch.send({"t": "reply", "id": 10_000 + k, "status": 0, "pad": pad[:k]})
            await asyncio.sleep(0)
        frames = await asyncio.wait_for(reader, 60)
        assert done.is_set()
        ups = [f for f in frames if f["t"] == "up"]
        mine = [f["id"] for f in frames if f["t"] == "reply"]
        assert [f["n"] for f in ups] == list(range(400))
        assert [f["id"] for f in ups] == list(range(1, 401))  # the link's own ids, in order
        assert all(f["pad"] == pad for f in ups)
        assert mine == list(range(10_000, 10_000 + n_loop))
        assert link.stats["direct"] > 0 and link.stats["queued"] > 0, link.stats
        ch.close("test over")
        peer.close()
    asyncio.run(main())


def test_the_rest_of_a_frame_the_socket_took_in_part_goes_before_any_later_frame():
    """Step by step, the loop held up meanwhile (so it flushes nothing): a
    frame larger than the socket's buffer is taken in part from the thread,
    the rest queued; the peer makes room; the thread's next frame must not
    take it -- it waits behind the rest, and so does the loop's own write."""
    async def main():
        link, ch, peer, _, _ = await _linked()
        big = "y" * (1 << 20)

        def from_thread(i: int) -> None:
            t = threading.Thread(target=link.send_upcall,
                                 args=({"t": "up", "n": i, "pad": big}, _Req(), True))
            t.start()
            t.join()
        from_thread(0)
        assert link.stats == {"direct": 0, "queued": 1}
        peer.settimeout(10)
        head = peer.recv(1 << 16)  # room in the socket again
        from_thread(1)
        assert link.stats == {"direct": 0, "queued": 2}
        ch.send({"t": "reply", "id": 5, "status": 0})
        dec = FrameDecoder(1 << 24)
        first = dec.feed(head)
        rest = await asyncio.get_running_loop().run_in_executor(
            None, _frames, peer, 3 - len(first), 1 << 16, dec)
        frames = first + rest
        assert [f.get("n") for f in frames] == [0, 1, None]
        assert frames[0]["pad"] == big and frames[1]["pad"] == big and frames[2]["id"] == 5
        ch.close("test over")
        peer.close()
    asyncio.run(main())


def test_a_frame_from_the_thread_waits_behind_what_the_loops_transport_still_holds():
    """The loop's own large write is taken in part, the rest held by its
    transport; the peer makes room (the loop held up, so it sends nothing
    more); a frame from the thread must not take that room."""
    async def main():
        link, ch, peer, _, _ = await _linked()
        big = "z" * (1 << 20)
        ch.send({"t": "reply", "id": 4, "status": 0, "pad": big})
        assert ch.transport.get_write_buffer_size() > 0
        peer.settimeout(10)
        dec = FrameDecoder(1 << 24)
        first = dec.feed(peer.recv(1 << 16))
        t = threading.Thread(target=link.send_upcall, args=({"t": "up", "n": 0}, _Req(), True))
        t.start()
        t.join()
        assert link.stats == {"direct": 0, "queued": 1}
        rest = await asyncio.get_running_loop().run_in_executor(
            None, _frames, peer, 2 - len(first), 1 << 16, dec)
        frames = first + rest
        assert [f.get("id") for f in frames] == [4, 1] and frames[0]["pad"] == big
        ch.close("test over")
        peer.close()
    asyncio.run(main())


def test_an_answer_is_matched_to_its_upcall_once_and_a_closed_link_writes_nothing():
    async def main():
        link, ch, peer, got, closed = await _linked()
        a, b = _Req(), _Req()
        assert link.send_upcall({"t": "up"}, a, True)
        assert link.send_upcall({"t": "up"}, None, False)  # a notification: no id, nothing kept
        assert link.send_upcall({"t": "data"}, b, True)
        f1, f2, f3 = await asyncio.get_running_loop().run_in_executor(None, _frames, peer, 3)
        assert "id" not in f2 and f1["id"] != f3["id"]
        assert link.take(f1["id"]) is a and link.take(f1["id"]) is None
        assert link.take(["not", "hashable"]) is None
        waiting = link.close()
        assert waiting == [b]  # the agent answers these UNREACH
        assert link.sock.fileno() == -1  # the other threads' descriptor is gone with it
        assert not link.send_upcall({"t": "up"}, _Req(), True)
        assert not link.write(b"\0\0\0\1\x80")
        assert link.close() == []
        ch.close("test over")
        peer.close()
    asyncio.run(main())


def test_when_the_node_goes_the_agent_answers_every_waiting_upcall_unreach():
    """The agent's loop side (pmixagent.Agent.main): the node's end closes,
    every upcall still waiting gets PMIX_ERR_UNREACH and the agent ends."""
    from pydvm.runtime.pmixhost.agent import Agent

    class Reply:
        notification = False
        done = False

        def __init__(self):
            self.got = []

        def fail(self, status):
            self.got.append(status)

    async def main():
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        agent = Agent()
        task = asyncio.ensure_future(agent.main(theirs.detach()))
        while agent.channel is None:
            await asyncio.sleep(0.001)
        req = _Req()
        req.kind, req.reply = "fence", Reply()
        assert agent.link.send_upcall({"t": "up"}, req, True)
        ours.close()
        await asyncio.wait_for(task, 30)
        assert req.reply.got == [Status.ERR_UNREACH]
        assert not agent.link.send_upcall({"t": "up"}, _Req(), True)
    asyncio.run(main())


class _Sent:
    closed = False

    def __init__(self):
        self.sent = []

    def send(self, msg):
        self.sent.append(msg)


def test_an_unknown_command_from_the_node_is_answered_not_supported():
    from pydvm.pmix import constants as C
    from pydvm.runtime.pmixhost.agent import Agent
    ch = _Sent()
    Agent().on_message(ch, {"t": "no-such-command", "id": 3})
    assert [(m.get("id"), m.get("status")) for m in ch.sent] == [(3, C.ERR_NOT_SUPPORTED)]


def test_a_node_without_pmix_answers_an_event_not_supported():
    from types import SimpleNamespace
    from pydvm.pmix import constants as C
    from pydvm.runtime.pmixhost.host import PmixHost
    host = PmixHost(SimpleNamespace(name="n"))
    assert asyncio.run(host.deliver_event({"source": ["ns", 0], "code": -1, "range": 0})) \
        == C.ERR_NOT_SUPPORTED


def test_an_event_reaches_the_tool_server_only_while_a_tool_is_connected_to_it():
    """Every job's end is an event to each server on its nodes; the tool
    server has no client but its tools, so it is passed over while none is
    connected (0.15 ms of its CPU per job in a bulk of one-rank jobs)."""
    from types import SimpleNamespace
    from pydvm.runtime.pmixhost.host import PmixHost
    from pydvm.runtime.pmixhost.tools import ToolConn

    class Server:
        def __init__(self, tools):
            self.tools, self.got = tools, []

        async def notify_event(self, code, source, rng, info, timeout):
            self.got.append(code)
            return Status.SUCCESS
    host = PmixHost(SimpleNamespace(name="n"))
    host.server, tool_server = Server(False), Server(True)
    host.users.tool_server = tool_server
    msg = {"source": ["ns", 0], "code": -7, "range": 0}
    assert asyncio.run(host.deliver_event(msg)) == Status.SUCCESS
    assert host.server.got == [-7] and tool_server.got == []
    host.tools.tools["dvm-tool.1"] = ToolConn("dvm-tool.1", 0, 0, 1, "pps", None, None,
                                              server=tool_server)
    asyncio.run(host.deliver_event(msg))
    assert host.server.got == [-7, -7] and tool_server.got == [-7]


def test_a_job_end_reaches_a_server_process_only_while_one_of_its_processes_is_connected():
    """A job's end (an event libpmix keeps for nobody: PMIX_EVENT_DO_NOT_CACHE)
    is a request to each server process of the node; one with no process
    connected to it now (one-rank jobs that never called PMIx_Init, all
    reaped) has nobody to tell and is passed over.  An event libpmix caches
    for later clients still goes to every server."""
    from types import SimpleNamespace
    from pydvm.pmix import constants as C
    from pydvm.runtime.pmixhost.host import PmixHost, PmixSession
    from pydvm.store import Caller

    class Server:
        tools, uid = False, 0

        def __init__(self):
            self.got = []

        async def notify_event(self, code, source, rng, info, timeout):
            self.got.append(code)
            return Status.SUCCESS
    host = PmixHost(SimpleNamespace(name="n"))
    host.server, agent = Server(), Server()
    host.users.running = lambda: [agent]
    end = {"source": ["job-2", C.RANK_WILDCARD], "code": C.EVENT_JOB_END, "range": 0,
           "info": [[C.EVENT_DO_NOT_CACHE, C.BOOL, True]]}
    cached = {"source": ["job-2", 0], "code": -7, "range": 0, "info": []}
    assert asyncio.run(host.deliver_event(end)) == Status.SUCCESS
    assert agent.got == [] and host.server.got == [C.EVENT_JOB_END]
    asyncio.run(host.deliver_event(cached))
    assert agent.got == [-7]
    # a process of a job this agent serves connects: it may be waiting for that end
    host.local_nspaces["job-1"] = agent
    session = PmixSession(host, Caller(uid=0, gid=0, nspace="job-1", rank=0), None)
    host.sessions[("job-1", 0)] = session
    host.mark_connected(("job-1", 0))
    asyncio.run(host.deliver_event(end))
    assert agent.got == [-7, C.EVENT_JOB_END]
    # ... finalized (or reaped): nobody again
    host.connected.discard(("job-1", 0))
    asyncio.run(host.deliver_event(end))
    assert agent.got == [-7, C.EVENT_JOB_END]
    # an isolated node (no libpmix server in the node process) asks its agents only
    from pydvm.runtime.pmixhost.host import NoServerHere
    host.server = NoServerHere("/nonexistent", "dvm-n")
    assert asyncio.run(host.deliver_event(end)) == Status.SUCCESS
    host.mark_connected(("job-1", 0))
    assert asyncio.run(host.deliver_event(end)) == Status.SUCCESS
    assert agent.got == [-7, C.EVENT_JOB_END, C.EVENT_JOB_END]
