"""Units of pydvm.pmix.tools: the kernel's owner of a loopback TCP socket, the
sockaddr libpmix records, and a refusal that never calls libpmix back."""

from __future__ import annotations

import ctypes
import os
import socket
import struct

from pydvm.pmix import constants as C
from pydvm.pmix import tools as T


def _pair():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    cli = socket.create_connection(srv.getsockname())
    acc, _ = srv.accept()
    srv.close()
    return cli, acc


def test_the_owner_of_a_loopback_connection_is_read_from_the_kernel():
    cli, acc = _pair()
    try:
        assert T.tcp_owner(acc.getpeername(), acc.getsockname()) == os.geteuid()
        # the server's end seen from the other side is ours too
        assert T.tcp_owner(cli.getpeername(), cli.getsockname()) == os.geteuid()
        # a pair nobody holds
        assert T.tcp_owner(("127.0.0.1", 1), acc.getsockname()) is None
        # both ways of asking agree
        assert T.proc_net_owner(acc.getpeername(), acc.getsockname()) == os.geteuid()
        from pydvm.pmix import sockdiag
        if sockdiag.available():
            assert sockdiag.owner(acc.getpeername(), acc.getsockname()) == os.geteuid()
            assert sockdiag.owner(("127.0.0.1", 1), acc.getsockname()) is None
    finally:
        cli.close()
        acc.close()


def test_hex_addresses_as_proc_net_tcp_writes_them():
    assert T._hex_addr("127.0.0.1", 0x1F90) == "0100007F:1F90"
    assert T._hex_addr("::1", 80) == "00000000000000000000000001000000:0050"


def test_a_recorded_sockaddr_is_read():
    raw = struct.pack("<H", socket.AF_INET) + struct.pack(">H", 4242) + \
        socket.inet_aton("127.0.0.1") + bytes(120)
    assert T._sockaddr(raw) == ("127.0.0.1", 4242)
    raw6 = struct.pack("<H", socket.AF_INET6) + struct.pack(">H", 7) + bytes(4) + \
        socket.inet_pton(socket.AF_INET6, "::1") + bytes(100)
    assert T._sockaddr(raw6) == ("::1", 7)
    assert T._sockaddr(bytes(128)) is None


class _Server:
    running = True


def test_a_refusal_cuts_the_connection_and_never_calls_libpmix_back():
    calls = []
    cb = T.tool_cbfunc_t(lambda status, proc, data: calls.append(status))
    cli, acc = _pair()
    sd = os.dup(acc.fileno())
    acc.close()
    reply = T.ToolReply(_Server(), ctypes.cast(cb, ctypes.c_void_p).value, 0)
    reply.sd = sd
    assert reply(C.ERR_NO_PERMISSIONS) is True     # a refusal, whatever the status says
    assert calls == [] and reply.done
    cli.settimeout(5)
    assert cli.recv(1) == b""                       # the tool sees its connection end
    try:
        os.fstat(sd)
        raise AssertionError("libpmix's descriptor was not closed")
    except OSError:
        pass
    assert reply(C.SUCCESS) is False                # answered once
    cli.close()


def test_an_event_a_tool_sent_just_before_it_left_is_still_that_tools(monkeypatch):
    """A debugger sends its release and exits at once: the event's upcall can
    reach the loop after the tool's hang-up was seen.  It is still that tool's
    (uid and namespace) for a while; a nameless tool's never (ambiguous)."""
    from types import SimpleNamespace

    from pydvm.runtime.pmixhost import tools as pmixtools
    from pydvm.runtime.pmixhost.tools import ToolConn, ToolHost

    closed = []
    session = SimpleNamespace(channel=SimpleNamespace(close=closed.append))
    host = ToolHost(SimpleNamespace(node=SimpleNamespace(name="n0")))
    for ns, nameless in (("dvm-tool.3", False), ("dvm-tool.4", True)):
        host.tools[ns] = ToolConn(ns, 1234, 1234, 99, "pevent", session, None, nameless)
    now = [1000.0]
    monkeypatch.setattr(pmixtools.time, "monotonic", lambda: now[0])
    host._gone("dvm-tool.3", "the tool disconnected", purge=False)
    host._gone("dvm-tool.4", "the tool disconnected", purge=False)
    assert host.event_source("dvm-tool.3") == (1234, "dvm-tool.3")
    assert host.event_source("dvm-tool.4") is None
    # a nameless event ("" is libpmix's name for such a tool): the one that
    # just left, while no other user's did and none is connected
    assert host.event_source("") == (1234, "dvm-tool.4")
    host.tools["dvm-tool.5"] = ToolConn("dvm-tool.5", 77, 77, 98, "pevent", session, None, True)
    assert host.event_source("") == (77, "dvm-tool.5")       # the connected one first
    host._gone("dvm-tool.5", "the tool disconnected", purge=False)
    assert host.event_source("") is None                      # two users' left: unknown
    now[0] += pmixtools.NAMELESS_LINGER
    assert host.event_source("") is None
    now[0] += pmixtools.RECENT_SECONDS + 1
    assert host.event_source("dvm-tool.3") is None
    for i in range(pmixtools.RECENT_MAX + 10):   # bounded
        host.tools[f"t.{i}"] = ToolConn(f"t.{i}", 1, 1, 1, "x", session, None)
        host._gone(f"t.{i}", "gone", purge=False)
    assert len(host._recent) == pmixtools.RECENT_MAX
