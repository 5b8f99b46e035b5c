"""PMIx tools from outside any job (``pps``, ``plookup``, ``pevent``, ``pattrs``,
``pquery``, a program's ``PMIx_tool_init``) attached to a server beside the master.

Where
-----
The node server in the master's process takes tool connections: the head
node's, or on a DVM without one the master's *tool side*
(:meth:`NodeTable.tool_host <pydvm.runtime.master.nodes.NodeTable.tool_host>`: a
``tools_only`` node server of no node -- no jobs, no client socket --, so
that every DVM serves tools on the master's machine, as PRRTE's ``prte``
does whatever its hosts).  What either sends the master for a tool is
believed from its in-process link only
(:meth:`~pydvm.runtime.master.nodes.NodeTable.trusts_tools`).  The daemons'
servers do not (their data requests reach the master as a process's, which
a tool is not).  With ``pydvm_pmix_isolate`` on (a ``pydvm start`` DVM's
default) a **tool server process** takes them: the DVM owner's libpmix
server with ``PMIX_SERVER_TOOL_SUPPORT`` and no job, started before the
head node says it is ready (:meth:`UserServers.start_tools
<pydvm.runtime.pmixhost.users.UserServers.start_tools>`), so a tool that crashes
or hangs libpmix ends that process only -- its tools lose their
connections, jobs and the master carry on, and a new tool server is started
(at once, or a second after the last one's start), with new files.  It finds
each tool's uid itself and passes the connection to the node (``tool``),
which decides here as for its own server, and says when a tool's
connection ends (``tool_gone``).  With isolation off the head node's own
server (in the master) takes tools.  Once a server takes tools, the node
writes:

* ``tool.uri`` in the DVM's socket directory for the head node: the URI
  (``NSPACE.RANK;tcp4://127.0.0.1:PORT``) and libpmix's version, a file a
  tool takes as ``--uri file:PATH``; ``pydvm pmix-uri`` prints both;
* copies of libpmix's rendezvous files (``pmix.<node>.tool.<pid>``,
  ``pmix.<node>.tool.<server nspace>``, in the server's directory) named
  after this *machine* -- a tool looks for files named after the machine it
  runs on (``--pid``, ``--namespace``, and the search a tool makes without
  either, under its ``TMPDIR``) -- and, for a tool server process, after the
  master's pid: ``--pid <master pid>`` finds the DVM as it finds PRRTE's --,
  and after the pid of each daemon that runs here (this machine, loopback
  and mount namespace, :func:`~pydvm.runtime.shared.auth.host_identity`; as its
  ``ready`` says): ``--pid <daemon pid>`` finds the head node too
  (:meth:`ToolHost.alias`);
* when this DVM is the machine's system server (``pydvm_pmix_system_server``:
  ``auto``, the default, for a multi-user DVM -- started by root, serving
  every user --; ``on`` for any DVM root starts),
  ``$TMPDIR/pmix.sys.<hostname>`` (mode 0644), what a tool asking for the
  system server reads first (``pps``, ``plookup``, ``pevent`` do, even
  inside a job, before their own server) -- unless another live server's
  is there (then :attr:`ToolHost.system_why` says so);
* on a multi-user DVM, also in that system tmpdir and readable by all, the
  copies named after the master's pid and the daemons' (:meth:`_public`):
  the DVM's own directories are root's, and a user's tool naming a pid
  (``PMIX_SERVER_PIDINFO``) searches only what it can read.

Who
---
A tool's identity is its uid as the kernel knows it (the owner of its end of
the loopback connection, :func:`pydvm.pmix.tools.peer_of_pending`, read in
the process of the server it connected to); a tool
whose handshake claims another uid, or a gid that is not one of that user's
groups, is refused -- its connection cut during the handshake, so its
``PMIx_tool_init`` fails (:meth:`pydvm.pmix.tools.ToolReply.abandon`) --, as
is one whose uid cannot be established, and one naming itself a process
that is not its own user's running process of this server (libpmix keeps
the identity a "client tool" gives itself).  On a single-user DVM only its
owner's and root's tools are accepted; on a multi-user DVM every user's.  The node names each tool
``<dvm nspace>-tool.<n>``, rank 0, and serves its requests as that process
(a :class:`~pydvm.runtime.pmixhost.host.PmixSession` with the tool's uid/gid):
publish, lookup and unpublish under the store's rules for that uid; a query
as that user's (:func:`pydvm.runtime.pmixhost.query.requester_uid`); an event
passed on to the nodes of that user's jobs (root's and a single-user DVM's
tools: every job's).

Lifetime: the tool's connection is its process and its namespace.  When it
closes (``PMIx_tool_finalize``, or the tool dies: the server's process
watches a duplicate of the socket for the peer's hang-up,
:class:`pydvm.pmix.tools.HangupWatch`), the tool's session closes
(its parked lookups go) and what it published with persistence PROC, APP or
NSPACE is purged from the node's and the master's stores; SESSION items
stay with the default session (the DVM's life), FIRST_READ and INDEF ones
with their reads and the idle timeout.
"""

from __future__ import annotations

import logging
import os
import pwd
import secrets
import socket
import time
from typing import TYPE_CHECKING, Any

from ...enums import Persistence
from ...errors import Status
from ..shared.guard import pid_alive
from ..shared.peers import process_caller

if TYPE_CHECKING:
    from .host import PmixHost
    from .session import PmixSession

log = logging.getLogger("pydvm.pmix")

URI_FILE = "tool.uri"


#: How many tools gone lately, and for how long, still own the events they sent.
RECENT_MAX = 64
RECENT_SECONDS = 30.0
#: Seconds a nameless tool gone still owns a nameless event (when no other
#: user's nameless tool left meanwhile and none is connected).
NAMELESS_LINGER = 1.0


class ToolConn:
    """One connected tool: its namespace, uid/gid, pid claim, session, socket,
    and the server it is connected to."""

    __slots__ = ("nspace", "uid", "gid", "pid", "cmd", "session", "fd", "nameless", "server")

    def __init__(self, nspace, uid, gid, pid, cmd, session, fd, nameless=False,
                 server=None) -> None:
        self.nspace, self.uid, self.gid, self.pid, self.cmd = nspace, uid, gid, pid, cmd
        self.session: "PmixSession" = session
        #: the watched duplicate of its socket (None: the tool server process watches it)
        self.fd: int | None = fd
        #: a "client tool" of no namespace (PMIX_SERVER_URI41 in its
        #: environment): libpmix names it "" whatever the host answers
        self.nameless = nameless
        #: the tool server process it is connected to (None: the node's own server)
        self.server = server


class ToolHost:
    """The head node's tool connections (see the module docstring)."""

    def __init__(self, host: "PmixHost") -> None:
        self.host = host
        self.tools: dict[str, ToolConn] = {}
        #: namespace -> (uid, when, server) of tools gone lately: an event a
        #: tool sent just before it left (a debugger's release, then exit) may
        #: reach the loop after its hang-up; it is still that tool's
        #: (namespaces of tools are never reused).  At most RECENT_MAX, for
        #: RECENT_SECONDS.
        self._recent: dict[str, tuple[int, float, Any]] = {}
        #: (uid, namespace, when) of nameless tools gone lately (NAMELESS_LINGER)
        self._recent_nameless: list[tuple[int, str, float]] = []
        self._count = 0
        self._files: set[str] = set()
        self._watch = None
        #: pids of daemons here (this machine, loopback, files) that a tool may
        #: name (``--pid``) as well as the master's (:meth:`alias`)
        self._aliases: set[int] = set()
        #: (server directory, libpmix's file of the server's pid) -- where the
        #: aliases are copies of
        self._source: tuple[str, str] | None = None
        #: the server's URI once tools are served (None: not served here)
        self.uri: str | None = None
        #: the system server's file this DVM wrote, or why it wrote none ("":
        #: not asked) -- ``pydvm info`` shows either
        self.system_file: str | None = None
        self.system_why = ""

    # -- start and stop ---------------------------------------------------

    def wanted(self) -> bool:
        """Tools are served by the head node (the master's process): by its
        own server, or with ``pydvm_pmix_isolate`` by a tool server process."""
        return self.host.node.router.at_master

    def started(self, tmp: str, pid: int, version: str) -> None:
        """A server with tool support runs in directory ``tmp`` in process
        ``pid`` (this one, or the tool server process): write the files tools
        look for.  A new tool server's replace the last one's."""
        self.drop_files()
        node = self.host.node
        mine = [f for f in os.listdir(tmp) if f.startswith("pmix.") and ".tool." in f]
        if not mine:
            log.warning("node %s: libpmix wrote no tool rendezvous file: tools cannot "
                        "find this DVM", node.name)
            return
        from ...pmix.tools import read_uri_file
        src = os.path.join(tmp, sorted(mine)[0])
        self.uri = read_uri_file(src)
        machine = socket.gethostname()
        with open(src) as f:
            body = f.read()
        prefix = f"pmix.{node.name}.tool."
        if machine != node.name:
            for f in mine:
                if f.startswith(prefix):
                    self._write(os.path.join(tmp, f"pmix.{machine}.tool.{f[len(prefix):]}"),
                                body, 0o600)
        self._source = (tmp, body)
        # ``--pid`` may name the master (when the server is a process of its
        # own) or a daemon here, as PRRTE's tools name prte or a prted
        for alias in self._aliases | ({os.getpid()} - {pid}):
            self._write_alias(alias)
        if self._public() and pid == os.getpid():
            # the master's own server: libpmix named its file after our pid,
            # in a directory other users cannot search
            self._write_alias(pid)
        self._write(os.path.join(str(node.socket_dir), URI_FILE),
                    f"{self.uri}\nv{version}\n", 0o644 if node.multi_user else 0o600)
        self._system_server(machine, body)
        if self._watch is None:
            from ...pmix.tools import HangupWatch
            self._watch = HangupWatch(lambda ns: self._gone(ns, "the tool disconnected"))
        log.info("node %s: PMIx tools attach at %s", node.name, self.uri)

    def _public(self) -> bool:
        """Do other users' tools look for this server by themselves?  On a
        multi-user DVM (root's): the server's directories are root's, so the
        files they search for are also written where they can read them --
        the system server's file and one per pid they may name -- in the
        system tmpdir, readable by all (the server checks who connects)."""
        return self.host.node.multi_user and os.geteuid() == 0

    def _system_server(self, machine: str, body: str) -> None:
        """Write ``pmix.sys.<machine>`` when this DVM is the machine's system
        server (``pydvm_pmix_system_server``), or say why not."""
        node = self.host.node
        setting = node.values.get("pydvm_pmix_system_server", "auto")
        self.system_file, self.system_why = None, ""
        if setting == "off" or (setting == "auto" and not node.multi_user):
            if node.multi_user:
                self.system_why = "pydvm_pmix_system_server off"
            return
        if os.geteuid() != 0:
            self.system_why = "the system server is root's: this DVM was not started by root"
            log.warning("pydvm_pmix_system_server on: %s", self.system_why)
            return
        sysfile = os.path.join(_system_tmpdir(), f"pmix.sys.{machine}")
        owner = _alive_owner(sysfile)
        if owner:
            self.system_why = f"{sysfile} is another running server's (pid {owner})"
            log.warning("PMIx tools will not find this DVM by themselves: %s; they name it "
                        "(pydvm info --pmix-uri)", self.system_why)
            return
        self._write(sysfile, body, 0o644)
        if sysfile in self._files:
            node.guardian.remove_on_exit(sysfile)  # however this process ends
            self.system_file = sysfile
        else:
            self.system_why = f"{sysfile} cannot be written"

    def system_info(self) -> dict[str, Any]:
        """``pydvm info``'s word on the system server's file."""
        return {"system_file": self.system_file, "system_why": self.system_why}

    def alias(self, pid: int, on: bool) -> None:
        """A daemon here reported in (``on``) or went: a tool naming its pid
        (``--pid``, as PRRTE's tools name a ``prted``) finds this server too."""
        if on:
            self._aliases.add(pid)
            self._write_alias(pid)
        elif pid in self._aliases:
            self._aliases.discard(pid)
            for path in self._alias_paths(pid):
                self._files.discard(path)
                try:
                    os.unlink(path)
                except OSError:
                    pass

    def _alias_paths(self, pid: int) -> list[str]:
        if self._source is None:
            return []
        names = {self.host.node.name, socket.gethostname()}
        paths = [os.path.join(self._source[0], f"pmix.{n}.tool.{pid}") for n in sorted(names)]
        if self._public():
            paths.append(self._public_path(pid))
        return paths

    @staticmethod
    def _public_path(pid: int) -> str:
        return os.path.join(_system_tmpdir(), f"pmix.{socket.gethostname()}.tool.{pid}")

    def _write_alias(self, pid: int) -> None:
        for path in self._alias_paths(pid):
            public = self._public() and path == self._public_path(pid)
            if public and _alive_owner(path):
                continue   # (another live server's, named after a pid it was given)
            self._write(path, self._source[1], 0o644 if public else 0o600)
            if public and path in self._files:
                self.host.node.guardian.remove_on_exit(path)

    def _write(self, path: str, body: str, mode: int) -> None:
        # a fresh name of our own, never a link someone left there (the
        # system tmpdir is everyone's); the rename replaces what is at path
        tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                os.write(fd, body.encode())
                os.fchmod(fd, mode)
            finally:
                os.close(fd)
            os.rename(tmp, path)
            self._files.add(path)
        except OSError as exc:
            log.warning("cannot write %s: %s", path, exc)
            try:
                os.unlink(tmp)
            except OSError:
                pass

    def drop_files(self) -> None:
        """Remove the files tools look for (no server takes tools now)."""
        for path in self._files:
            try:
                os.unlink(path)
            except OSError:
                pass
        self._files.clear()
        self.uri = None
        self._source = None

    def stop(self) -> None:
        for ns in list(self.tools):
            self._gone(ns, "the node server stops", purge=False)
        self.drop_files()
        if self._watch is not None:
            self._watch.close()
            self._watch = None

    def server_lost(self, server, reason: str) -> None:
        """The tool server process ``server`` ended: its tools are gone (their
        connections went with it) and no file points at it any more."""
        for ns in [ns for ns, t in self.tools.items() if t.server is server]:
            self._gone(ns, f"its PMIx tool server ended ({reason})")
        self.drop_files()

    # -- a tool connects ----------------------------------------------------

    def connected(self, req) -> None:
        """A ``tool_connected`` upcall (loop thread): the tool's identity, or a refusal."""
        from ...pmix import Proc
        node = self.host.node
        self._count += 1
        why = self._refusal(req)
        if why:
            log.warning("node %s: PMIx tool refused (%s): %s", node.name, _who(req), why)
            self._refuse(req)
            return
        given = _given_id(req) if req.keeps_id else None
        origin = getattr(req, "origin", None)
        if given is not None and given[0]:
            # a job's process of this server started as a tool (its own user's,
            # _refusal checked): libpmix keeps that identity, its session serves it
            if req.fd is not None:
                os.close(req.fd)
            self.host.mark_connected((str(given[0]), int(given[1])))
            req.reply(Status.SUCCESS, Proc(*given))
            return
        from .session import PmixSession
        ns = f"{node.dvm_nspace}-tool.{self._count}"
        gid = req.claimed_gid
        caller = process_caller(ns, 0, req.uid, gid, node.name)
        session = PmixSession(self.host, caller, node.values["pydvm_max_outstanding"])
        session.pmix_state = "connected"
        self.host.sessions[(ns, 0)] = session
        self.tools[ns] = ToolConn(ns, req.uid, gid, req.pid, req.cmd, session, req.fd,
                                  nameless=given is not None, server=origin)
        if req.fd is not None:
            if self._watch is not None:
                self._watch.watch(req.fd, ns)
            else:
                os.close(req.fd)
                self.tools[ns].fd = None
        log.info("node %s: PMIx tool %s connected: uid %d (%s)", node.name, ns, req.uid,
                 _who(req))
        if not req.reply(Status.SUCCESS, Proc(ns, 0)):
            self._gone(ns, "the server stopped")

    def _refuse(self, req) -> None:
        """Refuse a tool: its connection is cut during the handshake
        (:meth:`pydvm.pmix.tools.ToolReply.abandon`: libpmix 4.2.2 cannot
        take a refusal), so its ``PMIx_tool_init`` fails."""
        if req.fd is not None:
            os.close(req.fd)
        if not req.reply.abandon():
            log.error("node %s: a refused PMIx tool's connection cannot be cut (its socket "
                      "was not found in libpmix's record): it waits until it gives up",
                      self.host.node.name)

    def _refusal(self, req) -> str:
        if req.uid is None:
            return f"its uid cannot be established: {req.why}"
        if req.claimed_uid is not None and req.claimed_uid != req.uid:
            return f"it claims uid {req.claimed_uid} but is uid {req.uid}"
        if not self.host.node.multi_user and req.uid not in (os.geteuid(), 0):
            return (f"uid {req.uid} is not the DVM's owner (uid {os.geteuid()}) and the "
                    "DVM is not multi-user")
        if req.claimed_gid is None or req.claimed_gid not in _groups(req.uid):
            return f"gid {req.claimed_gid} is not a group of uid {req.uid}"
        given = _given_id(req) if req.keeps_id else None
        if given is not None and given[0]:
            # libpmix will keep the identity a client tool gives itself: only
            # its own user's running process of this server may be named
            s = self.host.sessions.get(given)
            if s is None or s.closed or s.caller.uid != req.uid or given[0] in self.tools:
                return f"it names itself {given[0]}:{given[1]}, not a process of its own here"
        return ""

    # -- a tool leaves ------------------------------------------------------

    def disconnected(self, ns: str, server) -> None:
        """Tool server process ``server`` saw tool ``ns``'s connection end."""
        t = self.tools.get(ns)
        if t is not None and t.server is server:
            self._gone(ns, "the tool disconnected")

    def served_by(self, ns: str) -> Any:
        """The server tool ``ns`` is (or lately was) connected to: its tool
        server process, None for the node's own, False when ``ns`` is no tool's."""
        t = self.tools.get(ns)
        if t is not None:
            return t.server
        gone = self._recent.get(ns)
        if gone is not None and time.monotonic() - gone[1] < RECENT_SECONDS:
            return gone[2]
        return False

    def _gone(self, ns: str, reason: str, *, purge: bool = True) -> None:
        t = self.tools.pop(ns, None)
        if t is None:
            return
        # libpmix may answer a tool's last message (a debugger's release, a
        # pevent) before it passes it up, so the tool can be gone before that
        # upcall reaches the loop: its events stay its own a while
        if t.nameless:
            self._recent_nameless.append((t.uid, t.nspace, time.monotonic()))
            del self._recent_nameless[:-RECENT_MAX]
        else:
            self._recent[ns] = (t.uid, time.monotonic(), t.server)
            while len(self._recent) > RECENT_MAX:
                del self._recent[next(iter(self._recent))]
        if t.fd is not None:
            if self._watch is not None:
                self._watch.forget(t.fd)   # (closed already if it hung up)
            t.fd = None
        t.session.channel.close(reason)
        if purge:
            self._purge(ns)
        log.info("node %s: PMIx tool %s (uid %d) gone: %s", self.host.node.name, ns, t.uid,
                 reason)

    def _purge(self, ns: str) -> None:
        """The tool's namespace ended: its PROC, APP and NSPACE items go."""
        node = self.host.node
        stores = [node.store]
        data = getattr(node.router, "data", None)
        if data is not None and data.relay is None:
            stores.append(data.store)
        for store in stores:
            if store is not None:
                store.purge(Persistence.NSPACE, nspace=ns)

    # -- what others ask ------------------------------------------------------

    def event_source(self, nspace: str) -> tuple[int, str] | None:
        """(uid, namespace) of the tool an event's source names, or None: a
        tool's own namespace; or "" -- what libpmix calls a nameless client
        tool -- when the nameless tools connected are one user's (the
        namespace then is one of theirs)."""
        t = self.tools.get(nspace)
        if t is not None:
            return t.uid, t.nspace
        gone = self._recent.get(nspace)
        if gone is not None and time.monotonic() - gone[1] < RECENT_SECONDS:
            return gone[0], nspace
        if nspace == "":
            nameless = [t for t in self.tools.values() if t.nameless]
            if nameless and len({t.uid for t in nameless}) == 1:
                return nameless[0].uid, nameless[0].nspace
            if not nameless:  # one that just left? only if all those were one user's
                now = time.monotonic()
                left = [(u, ns) for u, ns, when in self._recent_nameless
                        if now - when < NAMELESS_LINGER]
                if left and len({u for u, _ in left}) == 1:
                    return left[-1]
        return None

    def query_uids(self, server) -> set[int]:
        """The users whose tools are connected to ``server`` (None: the
        node's own), as queries see them: on a single-user DVM every job is
        the owner's, so root's tool asks as the owner."""
        mine = [t for t in self.tools.values() if t.server is server]
        if not self.host.node.multi_user:
            return {os.geteuid()} if mine else set()
        return {t.uid for t in mine}

    def serves(self, server) -> bool:
        """Is a tool connected to ``server`` (a tool server process) now?"""
        return any(t.server is server for t in self.tools.values())

    def count(self) -> int:
        return len(self.tools)

    def describe(self) -> list[dict[str, Any]]:
        return [{"nspace": t.nspace, "uid": t.uid, "pid": t.pid, "cmd": t.cmd}
                for t in self.tools.values()]


def _given_id(req) -> tuple[str, int] | None:
    """The namespace and rank a tool gave itself (libpmix then keeps them), or None."""
    ns = req.info.get("pmix.nspace")
    if ns is None or not isinstance(ns.value, str):
        return None
    rank = req.info.get("pmix.rank")
    r = rank.value if rank is not None and isinstance(rank.value, int) else 0
    return ns.value, int(r)


def _who(req) -> str:
    bits = []
    if req.pid:
        bits.append(f"pid {req.pid}")
    if req.cmd:
        bits.append(repr(req.cmd[:80]))
    if req.claimed_uid is not None:
        bits.append(f"claims uid {req.claimed_uid} gid {req.claimed_gid}")
    return ", ".join(bits) or "no details"


def _groups(uid: int) -> set[int]:
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        return set()
    try:
        return set(os.getgrouplist(pw.pw_name, pw.pw_gid))
    except OSError:
        return {pw.pw_gid}


def _system_tmpdir() -> str:
    """Where a tool looks for the system server's file (libpmix: its
    ``PMIX_SYSTEM_TMPDIR``, else ``TMPDIR``, else /tmp)."""
    return os.environ.get("PMIX_SYSTEM_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"


def _alive_owner(path: str) -> int:
    """The pid of the running process (not this one) a rendezvous file at
    ``path`` belongs to (its third line), else 0."""
    try:
        with open(path) as f:
            lines = f.read().split("\n")
        pid = int(lines[2])
    except (OSError, ValueError, IndexError):
        return 0
    return pid if pid != os.getpid() and pid_alive(pid) else 0
