"""A master's components, wired as the master wires them, with stand-in links instead of sockets.

:func:`master_with` builds a real :class:`~pydvm.runtime.master.server.Master`
(its constructor opens nothing), makes its store, and marks nodes up with
:class:`StandIn` links: no daemon, no socket, no process.  A stand-in
records what it is sent and answers every call with success (or what the
test sets), so the components' interfaces can be driven and checked
synchronously, on a running loop.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from pydvm.runtime.shared.jobs import HostSpec
from pydvm.runtime.master.server import Master
from pydvm.runtime.shared.peers import DaemonSession, ToolSession


class StandIn:
    """The Channel interface the master uses, recording instead of sending."""

    local = False

    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = False
        self.close_reason = ""
        self.session = None
        self.on_message = None
        self.sent: list[dict] = []
        self.calls: list[dict] = []
        self.requests: list[tuple[dict, Callable]] = []
        #: what each call is answered (a function of the message).
        self.answer: Callable[[dict], dict] = lambda msg: {"t": "reply", "status": 0}
        #: the send-buffer cap asked for (Channel.cap_send_buffer), if any.
        self.send_cap: int | None = None
        #: a clear link (Channel.box, .sealed, .seal_failed, .address)
        self.box = None
        self.sealed = False
        self.seal_failed = False
        self.address = ""

    def send(self, msg: dict) -> None:
        self.sent.append(msg)

    async def call(self, msg: dict, timeout: float | None = None) -> dict:
        self.calls.append(msg)
        return self.answer(msg)

    def request(self, msg: dict, callback: Callable[[dict], None]) -> None:
        self.requests.append((msg, callback))

    def close(self, reason: str = "", error: bool = False) -> None:
        self.closed = True
        self.close_reason = reason

    def on_drain(self, callback: Callable[[], None]) -> None:
        callback()

    def cap_send_buffer(self, nbytes: int) -> None:
        if self.send_cap is None:
            self.send_cap = nbytes

    def of_type(self, t: str) -> list[dict]:
        return [m for m in self.sent if m.get("t") == t]


def master_with(*nodes: str, **values: Any) -> tuple[Master, dict[str, DaemonSession]]:
    """A master over ``nodes`` (all up, each with a stand-in daemon link);
    must be called on a running loop.  ``values`` override parameters."""
    m = Master([HostSpec(n, 4) for n in nodes], launcher="local")
    m.values.update(values)
    m.data.open(asyncio.get_running_loop())
    daemons = {}
    for n in nodes:
        rec = m.nodes.records[n]
        ch = StandIn(f"daemon {n}")
        daemons[n] = DaemonSession(ch, n)
        rec.channel = ch
        rec.state = "up"
        rec.pmix = [True, "4.2.2", "/tmp"]
    return m, daemons


def tool(uid: int = 1000, *, owner: bool = True, seq: int = 1) -> ToolSession:
    return ToolSession(StandIn(f"tool#{seq}"), uid, uid, owner=owner, seq=seq)


async def run_job(m: Master, t: ToolSession, apps: list[dict], **fields: Any) -> str:
    """Submit a ``run`` as tool ``t`` and let its launch complete; returns the nspace."""
    m._on_tool(t.channel, {"t": "run", "id": 1, "apps": apps, **fields})
    await settle()
    started = [x for x in t.channel.sent if x.get("t") == "started"]
    assert started, t.channel.sent
    return started[-1]["nspace"]


async def settle(rounds: int = 10) -> None:
    """Let tasks the components started run to their next wait."""
    for _ in range(rounds):
        await asyncio.sleep(0)


def exited(m: Master, d: DaemonSession, ns: str, rank: int, status: int = 0) -> None:
    m._on_daemon(d.channel, {"t": "exited", "nspace": ns, "rank": rank, "status": status})
