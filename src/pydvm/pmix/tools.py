"""PMIx tools connecting to the server (``PMIx_tool_init`` from outside any job).

With ``PMIX_SERVER_TOOL_SUPPORT`` given at ``PMIx_server_init``, libpmix 4.2
accepts tool connections on its TCP listener (loopback only) and writes
rendezvous files into the server's directory (``pmix.<host>.tool.<pid>``,
``pmix.<host>.tool.<nspace>``).  A connecting tool that needs an identity
is handed to the host's ``tool_connected`` upcall (slot 16 of
``pmix_server_module_t``), which answers -- through libpmix's callback --
with a status and the namespace and rank the tool is to have.

Who the tool is
---------------
libpmix 4.2 passes the host the uid and gid **the tool wrote into its own
handshake** (``PMIX_USERID`` / ``PMIX_GRPID``), and its TCP "credential"
check compares that claim with another copy of the same claim
(``psec/native``'s ``validate_cred`` for the TCP protocol): nothing the
kernel vouches for.  So the binding asks the kernel.  The upcall's callback
data is libpmix's pending-connection record, which holds the accepted
socket; the binding finds the socket's descriptor in it (the descriptor
whose peer address is the one recorded beside it -- a match of both, or
nothing), and asks the kernel who owns the tool's end of that loopback
connection (:func:`tcp_owner`: a sock_diag query, else ``/proc/net/tcp``).  :class:`ToolConnected` carries that uid (None
when it could not be established, with ``why``), the claims, and a
duplicate of the socket's descriptor, which the host may watch for the
tool's end and must close.

Refusing a tool
---------------
libpmix 4.2.2 cannot be told "no": its error path for a refused tool
(``process_cbfunc`` in ptl_base_connection_hdlr.c) frees the tool's
namespace record with the peer and then unlinks it from a list -- a use
after free that took the server's process (the master) down.  Nor can it
be answered SUCCESS with a harmless identity: a tool that gives itself one
(a "client tool", ``PMIX_NAMESPACE``/``PMIX_RANK`` in its environment)
keeps it whatever the host answers.  So :meth:`ToolReply.abandon` refuses
without libpmix: it shuts down and closes the connection's descriptor --
libpmix's own, which nothing of libpmix touches again until the callback
it waits for, and that never comes -- so the tool sees its connection end
during the handshake (``PMIx_tool_init`` fails), and libpmix keeps one
small pending-connection record per refused tool.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import select
import socket
import struct
from dataclasses import dataclass, field
from typing import Any, Callable

from . import _lib as L
from . import constants as C
from . import sockdiag
from .requests import Request
from .values import PmixValueError, Proc, Value, info_at, proc_to_c

log = logging.getLogger("pydvm.pmix")

#: ``void (*)(pmix_status_t, pmix_proc_t *, void *)``
tool_cbfunc_t = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)

#: What the tool's handshake says (libpmix's ``process_tool_request``).
PROC_PID = "pmix.ppid"
CMD_LINE = "pmix.cmd.line"
VERSION_INFO = "pmix.version"


@dataclass(eq=False)
class ToolConnected(Request):
    """A tool asks to connect (``tool_connected``).

    ``uid``: the kernel's owner of the tool's socket, None when it could not
    be found (``why`` says so); ``claimed_uid`` / ``claimed_gid``: what the
    tool wrote in its handshake; ``pid``, ``cmd``: its claims too; ``fd``:
    a duplicate of the connection's descriptor (None with ``uid``) that the
    host owns from now on; ``info``: every entry of the request.
    Answer with ``reply(SUCCESS, Proc)``; refuse with ``reply.abandon()``."""

    uid: int | None
    why: str
    claimed_uid: int | None
    claimed_gid: int | None
    pid: int | None
    cmd: str
    fd: int | None
    info: dict[str, Value]
    #: libpmix's own descriptor of the connection (what abandon closes)
    sd: int | None = None
    #: a "client tool" (handshake flag PMIX_TOOL_CLIENT / LAUNCHER_CLIENT):
    #: libpmix keeps the namespace and rank it gave itself (``info``'s
    #: ``pmix.nspace`` / ``pmix.rank``), whatever the host answers; any
    #: other tool is known by the host's answer.  True when unknown.
    keeps_id: bool = True
    reply: "ToolReply" = field(repr=False, default=None)
    kind = "tool_connected"


class ToolReply:
    """``reply(status, proc)``: the tool's identity (on SUCCESS), once, from
    any thread.  libpmix moves the answer to its own thread itself."""

    __slots__ = ("_cb", "_cbdata", "done", "kind", "_server", "sd", "__weakref__")

    def __init__(self, server, cbfunc: int, cbdata: int) -> None:
        self._server = server
        self._cb = tool_cbfunc_t(cbfunc)
        self._cbdata = cbdata
        self.done = False
        self.kind = "tool_connected"
        #: libpmix's descriptor of the connection, when found
        self.sd: int | None = None

    def _track(self) -> None:
        pass

    def _disarm(self) -> None:
        self.done = True

    def __call__(self, status: int = C.SUCCESS, proc: Proc | None = None) -> bool:
        if status != C.SUCCESS:
            return self.abandon()   # never libpmix's refusal path (module docstring)
        if self.done:
            return False
        self.done = True
        if not self._server.running:
            return False
        p = L.pmix_proc_t()
        proc_to_c(proc, p)
        self._cb(int(status), ctypes.addressof(p), self._cbdata)
        return True

    def fail(self, status: int) -> bool:
        """Refuse: :meth:`abandon` (libpmix 4.2.2 cannot take a refusal, above)."""
        return self.abandon()

    def abandon(self) -> bool:
        """Refuse the tool without calling libpmix back: its connection is
        shut down and libpmix's descriptor closed.  False when the
        descriptor is not known (the tool then waits until it gives up)."""
        if self.done:
            return False
        self.done = True
        if self.sd is None:
            return False
        try:
            socket.socket(fileno=os.dup(self.sd)).shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            os.close(self.sd)
        except OSError:
            pass
        return True

    def __del__(self):
        try:
            if not self.done and self._server.running:
                log.error("pmix tool_connected reply dropped without an answer: refusing")
                self.abandon()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


def upcall(server):
    """The ``tool_connected`` upcall for ``server`` (libpmix's thread)."""

    def tool_connected(info, ninfo, cbfunc, cbdata):
        reply = ToolReply(server, cbfunc, cbdata)
        try:
            req = _request(info, ninfo, cbdata)
            req.reply = reply
            reply.sd = req.sd
        except Exception:
            log.exception("pmix tool_connected: cannot read the request")
            reply.abandon()
            return
        server.stats["requests"] += 1
        if not server.tool_support:
            _without_tools(req)
            return
        try:
            server._loop.call_soon_threadsafe(server._dispatch, req)
        except RuntimeError:                  # loop closed
            if req.fd is not None:
                os.close(req.fd)
            reply.abandon()

    proto = L.UPCALL_TYPES["tool_connected"][1]
    return proto(tool_connected)


def _without_tools(req: ToolConnected) -> None:
    """A server that serves no tools still hears of "client tools" -- a job's
    process started as a tool (``pydvm run -n 1 pps``): libpmix would let
    one in under the identity it gives itself, checking only its claimed
    uid against that process's.  Let in only one whose claim is the
    kernel's word (so it is that process's user); cut every other."""
    if req.fd is not None:
        os.close(req.fd)
    ns = req.info.get(C.NSPACE)
    rank = req.info.get(C.RANK)
    if (req.keeps_id and req.uid is not None and req.claimed_uid == req.uid
            and ns is not None and isinstance(ns.value, str) and ns.value
            and rank is not None and isinstance(rank.value, int)):
        req.reply(C.SUCCESS, Proc(ns.value, int(rank.value)))
    else:
        log.warning("pmix: a tool connection refused (this server serves no tools; "
                    "uid %s, claims uid %s)", req.uid, req.claimed_uid)
        req.reply.abandon()


def _request(info, ninfo, cbdata) -> ToolConnected:
    items = {k: v for k, v in info_at(info, ninfo) if not isinstance(v, PmixValueError)}

    def num(key):
        v = items.get(key)
        return int(v.value) if v is not None and isinstance(v.value, int) \
            and not isinstance(v.value, bool) else None
    cmd = items.get(CMD_LINE)
    uid, fd, sd, flag, why = None, None, None, None, ""
    try:
        uid, fd, sd, flag = peer_of_pending(cbdata)
    except LookupError as e:
        why = str(e.args[0])
        sd = e.args[1] if len(e.args) > 1 else None
    return ToolConnected(uid, why, num(C.USERID), num(C.GRPID), num(PROC_PID),
                         cmd.value if cmd is not None and isinstance(cmd.value, str) else "",
                         fd, items, sd, flag not in _NAMED_BY_HOST)


# --------------------------------------------------------------------------
# the kernel's word on who connected

class _Tail(ctypes.Structure):
    """``pmix_pending_connection_t`` (ptl_types.h, 4.2) from ``protocol`` on:
    what follows the libevent event, whose size is libevent's."""
    _fields_ = [("protocol", ctypes.c_uint16), ("sd", ctypes.c_int),
                ("need_id", ctypes.c_bool), ("flag", ctypes.c_uint8),
                ("proc", L.pmix_proc_t), ("info", ctypes.c_void_p),
                ("ninfo", ctypes.c_size_t), ("status", ctypes.c_int),
                ("addr", ctypes.c_uint64 * 16)]


_PROTOCOL_TCP = 2
#: handshake flags whose tool libpmix knows by the host's answer (legacy tool
#: and launcher, tool and launcher that need or were given an identity)
_NAMED_BY_HOST = frozenset((1, 2, 3, 4, 6, 7))
#: where ``protocol`` may sit: after pmix_object_t and a libevent event
_SCAN = range(0, 640, 8)
#: where it was last found (tried first); 240 in Debian's 4.2.2 build (an
#: offset is only believed when the descriptor's peer is the address beside it)
_offset: list[int] = [240]


def peer_of_pending(pnd: int) -> tuple[int, int, int, int]:
    """``(uid, fd, sd, flag)``: the kernel's owner of the tool's end of the
    pending connection ``pnd`` (libpmix's record), a duplicate of the
    server's descriptor for it, that descriptor, and the handshake's flag.
    Raises LookupError (with the descriptor as its second argument when it
    was found) when the uid cannot be established."""
    if not pnd:
        raise LookupError("no connection record")
    offsets = _offset + [o for o in _SCAN if o not in _offset]
    for off in offsets:
        tail = _Tail.from_buffer_copy(ctypes.string_at(pnd + off, ctypes.sizeof(_Tail)))
        if tail.protocol != _PROTOCOL_TCP or tail.sd < 3:
            continue
        recorded = _sockaddr(bytes(tail.addr))
        if recorded is None:
            continue
        try:
            fd = os.dup(tail.sd)
        except OSError:
            continue
        try:
            s = socket.socket(fileno=os.dup(fd))
            try:
                if s.type != socket.SOCK_STREAM or s.getpeername()[:2] != recorded:
                    raise OSError
                local = s.getsockname()[:2]
            finally:
                s.close()
        except OSError:
            os.close(fd)
            continue
        if off not in _offset:
            _offset[:] = [off]
        uid = tcp_owner(recorded, local)
        if uid is None:
            os.close(fd)
            raise LookupError(f"no kernel record of the tool's socket {recorded}", tail.sd)
        return uid, fd, tail.sd, tail.flag
    raise LookupError("the connection's socket was not found in libpmix's record")


def _sockaddr(raw: bytes) -> tuple[str, int] | None:
    family, = struct.unpack_from("<H", raw, 0)
    if family == socket.AF_INET:
        port, = struct.unpack_from(">H", raw, 2)
        return socket.inet_ntop(socket.AF_INET, raw[4:8]), port
    if family == socket.AF_INET6:
        port, = struct.unpack_from(">H", raw, 2)
        return socket.inet_ntop(socket.AF_INET6, raw[8:24]), port
    return None


def _hex_addr(host: str, port: int) -> str:
    """An address as /proc/net/tcp{,6} writes it."""
    if ":" in host:
        packed = socket.inet_pton(socket.AF_INET6, host)
        words = struct.unpack("<4I", packed)
        return "".join(f"{w:08X}" for w in words) + f":{port:04X}"
    packed = socket.inet_pton(socket.AF_INET, host)
    return f"{struct.unpack('<I', packed)[0]:08X}:{port:04X}"


def tcp_owner(peer: tuple[str, int], local: tuple[str, int]) -> int | None:
    """The uid that owns the TCP socket at ``peer`` connected to ``local``
    (this machine's, same network namespace): the kernel's sock_diag answer
    for that one socket (pmix/sockdiag.py), else /proc/net/tcp{,6}."""
    uid = sockdiag.owner(peer, local)
    if uid is not None:
        return uid
    return proc_net_owner(peer, local)


def proc_net_owner(peer: tuple[str, int], local: tuple[str, int]) -> int | None:
    """:func:`tcp_owner` from /proc/net/tcp{,6} (every socket listed: slow)."""
    want_local, want_remote = _hex_addr(*peer), _hex_addr(*local)
    path = "/proc/net/tcp6" if ":" in peer[0] else "/proc/net/tcp"
    try:
        with open(path) as f:
            next(f, None)
            for line in f:
                parts = line.split()
                if len(parts) > 7 and parts[1] == want_local and parts[2] == want_remote:
                    return int(parts[7])
    except OSError:
        return None
    return None


class HangupWatch:
    """Tools' connections watched for the tool's end, on an asyncio loop.

    Each watched descriptor is a duplicate of libpmix's socket to a tool
    (:attr:`ToolConnected.fd`): the watch waits for the peer's hang-up
    only (``EPOLLRDHUP``), never for data, so it takes nothing libpmix is to
    read.  On a hang-up the descriptor is closed and ``gone(key)`` called,
    on the loop, once; :meth:`forget` stops watching one and closes it."""

    def __init__(self, gone: Callable[[Any], None]) -> None:
        self._gone = gone
        self._keys: dict[int, Any] = {}
        self._ep: select.epoll | None = select.epoll()
        asyncio.get_running_loop().add_reader(self._ep.fileno(), self._ready)

    def watch(self, fd: int, key: Any) -> None:
        """Watch ``fd`` (owned by the watch from now on) for ``key``'s tool."""
        if self._ep is None:
            os.close(fd)
            return
        self._keys[fd] = key
        self._ep.register(fd, select.EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR)

    def forget(self, fd: int) -> None:
        """Stop watching ``fd`` and close it (nothing if it is not watched:
        one that hung up is closed already)."""
        if self._keys.pop(fd, None) is None:
            return
        if self._ep is not None:
            try:
                self._ep.unregister(fd)
            except (OSError, ValueError):  # (not registered any more)
                pass
        try:
            os.close(fd)
        except OSError:
            pass

    def _ready(self) -> None:
        if self._ep is None:
            return
        for fd, _ev in self._ep.poll(0):
            key = self._keys.get(fd)
            if key is None:
                self._ep.unregister(fd)
            else:
                self.forget(fd)
                self._gone(key)

    def close(self) -> None:
        for fd in list(self._keys):
            self.forget(fd)
        if self._ep is not None:
            try:
                asyncio.get_running_loop().remove_reader(self._ep.fileno())
            except RuntimeError:
                pass
            self._ep.close()
            self._ep = None


def read_uri_file(path: str) -> str:
    """The URI in a libpmix rendezvous file (its first line)."""
    with open(path) as f:
        return f.readline().strip()


def describe(req: ToolConnected) -> dict[str, Any]:
    """What a log line says of a tool."""
    return {"uid": req.uid, "claimed_uid": req.claimed_uid, "pid": req.pid, "cmd": req.cmd}
