"""Job clients are who the kernel says they are (``client_connected2``).

libpmix 4.2 lets a client in as a registered process when the uid and gid
**it writes in its handshake** equal the registered ones: over TCP, its
only transport in 4.x, ``psec/native``'s ``validate_cred`` compares the
registration with that claim, never with the kernel's record of the
socket.  A local user whose ``geteuid`` lies (an ``LD_PRELOAD``) got in as
a rank of another user's job.

Where the check sits
--------------------
``pmix_ptl_base_connection_handler`` (ptl_base_connection_hdlr.c, 4.2.2)
accepts the client, tells it "all is good" and its index, and then calls
the host's ``client_connected2`` -- on libpmix's progress thread, before it
sets the socket non-blocking and starts reading from it.  The upcall gets
the process's name only; the connection's record (``pmix_peer_t``) is the
entry of ``pmix_server_globals.clients`` (an exported symbol) at the index
the handler has just written into the rank's record (``info->peerid``).
:class:`ClientGuard` finds it there at 4.2.2's offsets, believed only when
everything read agrees (the peer's index is its slot, its rank record names
this very process, its descriptor is a TCP socket), takes the socket's
client end to the kernel (pmix/tools.py ``tcp_owner``: sock_diag, else
``/proc/net/tcp{,6}``), and
compares the kernel's owner with the uid registered for the process.

Refusing
--------
Returning an error from ``client_connected2`` is only logged by libpmix,
and its own refusal path (the handler's ``error:``) releases the rank's
record once too often (``PMIX_RELEASE(info)`` beside the peer's destructor
doing the same) and closes the socket twice.  Nor may the connection be
seen to drop: libpmix's lost-connection path counts the rank out of its
job's local collectives, drops that rank's contributions to a fence in
progress and announces ``PMIX_ERR_LOST_CONNECTION`` for it -- the victim's
job would pay.  So the liar's socket is shut down and its descriptor
number given a quiet stand-in: a duplicate of one end of a socket pair
(one pair per namespace) whose two ends the guard holds until the job's
namespace is deregistered -- so a refused connection costs no descriptor
beyond the one libpmix already had.  libpmix then
watches a connection on which nothing ever arrives; the peer is marked
finalized (so even its eventual end is silent), the rank's record points
again at the rank's earlier connection (or at none), and the namespace's
modules that the liar's handshake chose are put back as the last honest
client of the job left them.
"""

from __future__ import annotations

import ctypes
import logging
import os
import socket
import threading

from .tools import tcp_owner
from .values import Proc

log = logging.getLogger("pydvm.pmix")

#: libpmix versions whose layouts below were read and measured
VERIFIED = ((4, 2, 2), (4, 2, 2))

# 4.2.2, x86_64, non-debug build: pmix_object_t is 112 bytes (mutex 40,
# class 8, refcount 4+4, tma 56), pmix_list_item_t 136, pmix_list_t 256.
_CLIENTS = 256                 # pmix_server_globals.clients (after nspaces)
_ARR_SIZE, _ARR_ADDR = 120, 144  # pmix_pointer_array_t size, addr
_PEER_NPTR, _PEER_INFO, _PEER_INDEX, _PEER_SD, _PEER_FIN = 112, 120, 144, 148, 152
_INFO_PEERID, _INFO_NSPACE, _INFO_RANK, _INFO_UID, _INFO_GID, _INFO_CNT = (
    136, 144, 152, 160, 164, 172)
_NS_NAME, _NS_COMPAT, _COMPAT_LEN = 136, 456, 32  # pmix_namespace_t nspace, compat
_MAX_CLIENTS = 1 << 20


def _ptr(addr: int) -> int:
    return ctypes.c_void_p.from_address(addr).value or 0


def _int(addr: int) -> int:
    return ctypes.c_int.from_address(addr).value


def _u32(addr: int) -> int:
    return ctypes.c_uint32.from_address(addr).value


class ClientGuard:
    """The kernel's check of connecting job clients for one server.

    ``state``: ``"on"``, or why the check is off (libpmix version, symbol
    not found); ``refused``: how many connections were cut."""

    def __init__(self, lib, version: tuple[int, int, int]) -> None:
        self.refused = 0
        #: namespace -> (the stand-ins' end, the end that keeps them quiet)
        self._held: dict[str, tuple[socket.socket, socket.socket]] = {}
        self._compat: dict[str, bytes] = {}
        self._ids: dict[str, dict[int, tuple[int, int]]] = {}
        self._lock = threading.Lock()
        self._globals = 0
        if not VERIFIED[0] <= version <= VERIFIED[1]:
            self.state = (f"off: libpmix {'.'.join(map(str, version))} is not a version "
                          "whose connection records were verified")
            return
        try:
            self._globals = ctypes.addressof(ctypes.c_char.in_dll(lib.cdll,
                                                                  "pmix_server_globals"))
        except (ValueError, AttributeError) as e:
            self.state = f"off: pmix_server_globals not found ({e})"
            return
        self.state = "on"

    @property
    def state(self) -> str:
        return self._state

    @state.setter
    def state(self, why: str) -> None:
        self._state = why
        if why != "on":
            log.warning("pmix: connecting clients' uids are not checked against the "
                        "kernel's (%s)", why)

    # -- on libpmix's progress thread, inside its connection handler --------

    def check(self, proc: Proc) -> bool:
        """True to let ``proc``'s new connection on; False when it was cut
        (the claimed identity is not the kernel's)."""
        if not self._globals:
            return True
        try:
            return self._check(proc)
        except Exception:               # never into libpmix's thread: let it in
            log.exception("pmix: checking %s:%s's connection failed; let in", proc.nspace,
                          proc.rank)
            return True

    def _check(self, proc: Proc) -> bool:
        registered = self._ids.get(proc.nspace, {}).get(proc.rank)
        found = self._find(proc)
        if found is None:
            log.warning("pmix: cannot find the connection record of %s:%s; "
                        "the kernel's uid is not checked for it", proc.nspace, proc.rank)
            return True
        peer, info, index = found
        sd = _int(peer + _PEER_SD)
        want_uid = registered[0] if registered is not None else _u32(info + _INFO_UID)
        uid, why = self._owner(sd)
        nptr = _ptr(peer + _PEER_NPTR)
        if uid is not None and uid == want_uid:
            self._remember_compat(proc.nspace, nptr)
            return True
        self.refused += 1
        log.warning("pmix: refused a client connecting as %s:%s: registered to uid %s, %s "
                    "(it claimed the registered ids)", proc.nspace, proc.rank, want_uid,
                    f"its socket is uid {uid}'s" if uid is not None else why)
        self._cut(proc, peer, info, index, sd, nptr)
        return False

    def _find(self, proc: Proc) -> tuple[int, int, int] | None:
        arr = self._globals + _CLIENTS
        size = _int(arr + _ARR_SIZE)
        addr = _ptr(arr + _ARR_ADDR)
        if not addr or not 0 < size <= _MAX_CLIENTS:
            return None
        want = proc.nspace.encode()
        slots = (ctypes.c_void_p * size).from_address(addr)
        for i in range(size - 1, -1, -1):
            peer = slots[i]
            if not peer or _int(peer + _PEER_INDEX) != i:
                continue
            info = _ptr(peer + _PEER_INFO)
            if not info or _int(info + _INFO_PEERID) != i:
                continue
            if _u32(info + _INFO_RANK) != (proc.rank & 0xFFFFFFFF):
                continue
            name = _ptr(info + _INFO_NSPACE)
            if name and ctypes.string_at(name) == want:
                return peer, info, i
        return None

    @staticmethod
    def _owner(sd: int) -> tuple[int | None, str]:
        try:
            s = socket.socket(fileno=os.dup(sd))
        except OSError as e:
            return None, f"its descriptor is unusable ({e})"
        try:
            if s.family not in (socket.AF_INET, socket.AF_INET6) or \
                    s.type != socket.SOCK_STREAM:
                return None, "its connection is not a TCP socket"
            peer, local = s.getpeername()[:2], s.getsockname()[:2]
        except OSError as e:
            return None, f"its socket has no peer ({e})"
        finally:
            s.close()
        uid = tcp_owner(peer, local)
        return uid, ("" if uid is not None else f"no kernel record of its socket {peer}")

    def _remember_compat(self, nspace: str, nptr: int) -> None:
        if nptr and ctypes.string_at(_ptr(nptr + _NS_NAME) or 0) == nspace.encode():
            self._compat[nspace] = ctypes.string_at(nptr + _NS_COMPAT, _COMPAT_LEN)

    def _cut(self, proc: Proc, peer: int, info: int, index: int, sd: int, nptr: int) -> None:
        # the rank's record: its earlier connection again, or none
        earlier = self._earlier(info, index)
        ctypes.c_int.from_address(info + _INFO_PEERID).value = earlier
        cnt = ctypes.c_int.from_address(info + _INFO_CNT)
        if cnt.value > 0:
            cnt.value -= 1
        ctypes.c_bool.from_address(peer + _PEER_FIN).value = True
        saved = self._compat.get(proc.nspace)
        if saved is not None and nptr and \
                ctypes.string_at(_ptr(nptr + _NS_NAME) or 0) == proc.nspace.encode():
            ctypes.memmove(nptr + _NS_COMPAT, saved, _COMPAT_LEN)
        try:
            s = socket.socket(fileno=os.dup(sd))
            s.shutdown(socket.SHUT_RDWR)
            s.close()
        except OSError:
            pass
        with self._lock:
            pair = self._held.get(proc.nspace)
            if pair is None:
                pair = self._held[proc.nspace] = socket.socketpair()
            os.dup2(pair[0].fileno(), sd)    # closes the liar's socket

    def _earlier(self, info: int, index: int) -> int:
        """The slot of another connection of the same rank (one not
        finalized first), or -1."""
        arr = self._globals + _CLIENTS
        size = _int(arr + _ARR_SIZE)
        addr = _ptr(arr + _ARR_ADDR)
        if not addr or not 0 < size <= _MAX_CLIENTS:
            return -1
        slots = (ctypes.c_void_p * size).from_address(addr)
        best = -1
        for i in range(size):
            p = slots[i]
            if i != index and p and _ptr(p + _PEER_INFO) == info and _int(p + _PEER_INDEX) == i:
                if not ctypes.c_bool.from_address(p + _PEER_FIN).value:
                    return i
                best = i
        return best

    # -- the host's thread ---------------------------------------------------

    def registered(self, proc: Proc, uid: int, gid: int) -> None:
        """``proc`` was registered to ``uid``/``gid`` (what it must be)."""
        self._ids.setdefault(proc.nspace, {})[proc.rank] = (uid, gid)

    def release(self, nspace: str) -> None:
        """The namespace was deregistered: forget it, let go of its stand-ins."""
        self._ids.pop(nspace, None)
        self._compat.pop(nspace, None)
        with self._lock:
            pair = self._held.pop(nspace, ())
        for s in pair:
            s.close()

    def close(self) -> None:
        with self._lock:
            held = [s for pair in self._held.values() for s in pair]
            self._held.clear()
        for s in held:
            s.close()

