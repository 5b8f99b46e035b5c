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
