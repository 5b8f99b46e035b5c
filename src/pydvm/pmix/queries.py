"""``PMIx_Query_info`` on the server side: the queries as libpmix hands them
over, the attribute queries answered here, and libpmix 4.2.2's crash avoided.

What reaches the host
---------------------
A client's or tool's query arrives at the server, which runs it through its
own ``PMIx_Query_info_nb``: keys libpmix finds in its own store are answered
there; otherwise the whole list goes to the host's ``query`` upcall
(:class:`~pydvm.pmix.requests.Query`) -- with the *server's* identity, not
the requester's (libpmix 4.2 passes ``pmix_globals.myid``).  Two keys never
reach the host: ``PMIX_QUERY_AVAIL_SERVERS`` (libpmix scans its rendezvous
directory) and ``PMIX_QUERY_ATTRIBUTE_SUPPORT`` (libpmix's attribute lists).

The attribute query (libpmix 4.2.0 - 4.2.4)
-------------------------------------------
``pmix_attrs_query_support`` (src/common/pmix_attributes.c) finishes by
calling its caller's callback with its *own* caddy as the callback data
instead of the caller's (``cd`` for ``cd->cbdata``; fixed in 4.2.5).  On a
server the caller is the query handler of ``pmix_server.c``, which reads that
caddy as its own request record and follows a pointer that is not one: a
segfault on the progress thread -- any ``pattrs --host-fns`` took down the
process hosting the server, every job of that node with it.

The host cannot answer before libpmix: the server calls the exported
``PMIx_Query_info_nb`` for the query, and only its non-attribute path
reaches the host.  That call goes through libpmix's procedure linkage table
(``R_X86_64_JUMP_SLOT``; Debian's build has no ``-Bsymbolic`` and binds lazily, so
the slot is writable), so :func:`install_attribute_fix` points the slot at a
function of ours: an attribute query is answered here from the host's own
list (:data:`HOST_FUNCTIONS`, the same list :func:`register_host_attributes`
gives libpmix), with the server's callback and *its* data; every other
query goes on to libpmix's function unchanged.  Only for the affected
versions; with 4.2.5 and later libpmix answers from the registered list.
"""

from __future__ import annotations

import ctypes
import logging
import os
import struct
from typing import Callable

from . import _lib as L
from . import constants as C
from .replies import InfoReply
from .requests import QueryItem
from .values import DataArray, RegAttr, Value, argv_at, build_info, cstr, info_at

log = logging.getLogger("pydvm.pmix")

# query keys (pmix_common.h, 4.2)
NAMESPACES = "pmix.qry.ns"
NAMESPACE_INFO = "pmix.qry.nsinfo"
JOB_STATUS = "pmix.qry.jst"
PROC_TABLE = "pmix.qry.ptable"
LOCAL_PROC_TABLE = "pmix.qry.lptable"
SPAWN_SUPPORT = "pmix.qry.spawn"
DEBUG_SUPPORT = "pmix.qry.debug"
NUM_PSETS = "pmix.qry.psetnum"
PSET_NAMES = "pmix.qry.psets"
PSET_MEMBERSHIP = "pmix.qry.pmems"
SUPPORTED_KEYS = "pmix.qry.keys"
ATTRIBUTE_SUPPORT = "pmix.qry.attrs"
AVAIL_SERVERS = "pmix.qry.asrvrs"
REFRESH_CACHE = "pmix.qry.rfsh"
PARTIAL_SUCCESS = -104
JOB_SIZE = "pmix.job.size"
NODE_LIST = "pmix.nlist"
NUM_NODES = "pmix.num.nodes"
CMD_LINE = "pmix.cmd.line"
PSET_NAME = "pmix.pset.nm"
HOST_FUNCTIONS = "pmix.host.fns"
HOST_ATTRIBUTES = "pmix.host.attrs"

#: What the pydvm host does for each PMIx function, by attribute name: the
#: answer to ``PMIX_QUERY_ATTRIBUTE_SUPPORT`` with ``PMIX_HOST_FUNCTIONS`` /
#: ``PMIX_HOST_ATTRIBUTES`` (``pattrs --host-fns``, ``--host FN``).
HOST_FUNCTIONS_TABLE: dict[str, tuple[str, ...]] = {
    "PMIx_Abort": (),
    "PMIx_Fence": ("PMIX_COLLECT_DATA", "PMIX_TIMEOUT"),
    "PMIx_Get": (),
    "PMIx_Publish": ("PMIX_RANGE", "PMIX_PERSISTENCE", "PMIX_ACCESS_USERIDS",
                     "PMIX_ACCESS_GRPIDS"),
    "PMIx_Lookup": ("PMIX_RANGE", "PMIX_WAIT", "PMIX_TIMEOUT"),
    "PMIx_Unpublish": ("PMIX_RANGE",),
    "PMIx_Spawn": (),
    "PMIx_Connect": (),
    "PMIx_Disconnect": (),
    "PMIx_Register_event_handler": (),
    "PMIx_Notify_event": (),
    "PMIx_Job_control": ("PMIX_JOB_CTRL_KILL", "PMIX_JOB_CTRL_TERMINATE", "PMIX_JOB_CTRL_SIGNAL",
                         "PMIX_JOB_CTRL_PAUSE", "PMIX_JOB_CTRL_RESUME",
                         "PMIX_JOB_CTRL_PREEMPTIBLE", "PMIX_JOB_CTRL_CHECKPOINT_METHOD",
                         "PMIX_JOB_CTRL_ID"),
    "PMIx_Group_construct": ("PMIX_GROUP_ASSIGN_CONTEXT_ID", "PMIX_TIMEOUT"),
    "PMIx_Group_destruct": ("PMIX_TIMEOUT",),
    "PMIx_Query_info": ("PMIX_QUERY_NAMESPACES", "PMIX_QUERY_NAMESPACE_INFO",
                        "PMIX_QUERY_JOB_STATUS", "PMIX_QUERY_PROC_TABLE",
                        "PMIX_QUERY_LOCAL_PROC_TABLE", "PMIX_QUERY_SPAWN_SUPPORT",
                        "PMIX_QUERY_DEBUG_SUPPORT", "PMIX_QUERY_NUM_PSETS",
                        "PMIX_QUERY_PSET_NAMES", "PMIX_QUERY_PSET_MEMBERSHIP",
                        "PMIX_QUERY_SUPPORTED_KEYS", "PMIX_QUERY_ATTRIBUTE_SUPPORT",
                        "PMIX_JOB_SIZE", "PMIX_NODE_LIST", "PMIX_NUM_NODES", "PMIX_NSPACE"),
}

#: libpmix versions whose ``pmix_attrs_query_support`` answers with the wrong
#: callback data (4.2.0 to 4.2.4).
BROKEN_ATTRS = ((4, 2, 0), (4, 2, 4))


def queries_at(addr: int, n: int) -> list[QueryItem]:
    """A ``pmix_query_t`` array as :class:`QueryItem` objects (a qualifier whose
    value the binding cannot read is left out)."""
    out: list[QueryItem] = []
    if not addr or not n:
        return out
    for q in (L.pmix_query_t * n).from_address(addr):
        quals = {k: v for k, v in info_at(q.qualifiers, q.nqual)
                 if isinstance(v, Value)}
        out.append(QueryItem(argv_at(q.keys) or [], quals))
    return out


# --------------------------------------------------------------------------
# the host's attributes


def _regattr(lib: L.Lib, name: str) -> RegAttr:
    """``name`` as libpmix's dictionary describes it."""
    entry = lib.lookup_term(name.encode()) if lib.lookup_term is not None else None
    if entry:
        e = L.regattr_input_t.from_address(entry)
        return RegAttr(name, cstr(e.string) or "", int(e.type),
                       tuple(argv_at(e.description) or ()))
    s = lib.attribute_string(name.encode())
    return RegAttr(name, s.decode() if s else name, C.UNDEF, ("",))


def host_functions() -> str:
    return ",".join(HOST_FUNCTIONS_TABLE)


def host_attributes(lib: L.Lib, functions: str) -> list[tuple[str, Value]]:
    """``(function, array of its RegAttr)`` for each function named (``all``: every one)."""
    wanted = {f.strip() for f in (functions or "").split(",") if f.strip()}
    out = []
    for fn, attrs in HOST_FUNCTIONS_TABLE.items():
        if "all" not in wanted and fn not in wanted:
            continue
        regs = tuple(_regattr(lib, a) for a in attrs) or \
            (RegAttr("NONE", "", C.UNDEF, ("no attributes",)),)
        out.append((fn, Value(DataArray(C.REGATTR, regs), C.DATA_ARRAY)))
    return out


def attribute_answer(lib: L.Lib, queries: list[QueryItem]) -> tuple[int, list]:
    """The answer to the ``PMIX_QUERY_ATTRIBUTE_SUPPORT`` queries among
    ``queries``: what the host supports; the library's own lists (client,
    server, tool) are the asking process's library's to give."""
    items: list[tuple[str, Value]] = []
    for q in queries:
        if not q.keys or q.keys[0] != ATTRIBUTE_SUPPORT:
            continue
        for key, val in q.qualifiers.items():
            if key == HOST_FUNCTIONS:
                items.append((HOST_FUNCTIONS, Value(host_functions(), C.STRING)))
            elif key == HOST_ATTRIBUTES:
                fns = host_attributes(lib, val.value if isinstance(val.value, str) else "all")
                if fns:
                    items.append((HOST_ATTRIBUTES,
                                  Value(DataArray(C.INFO, tuple(fns)), C.DATA_ARRAY)))
    return (C.SUCCESS if items else C.ERR_NOT_FOUND), items


def register_host_attributes(lib: L.Lib) -> None:
    """Give libpmix the host's list (what 4.2.5 and later answer from)."""
    for fn, attrs in HOST_FUNCTIONS_TABLE.items():
        keep = [ctypes.create_string_buffer(a.encode()) for a in attrs or ("NONE",)]
        argv = (ctypes.c_void_p * (len(keep) + 1))(*[ctypes.addressof(b) for b in keep])
        rc = lib.register_attributes(fn.encode(), ctypes.addressof(argv))
        if rc not in (C.SUCCESS, -171):  # PMIX_ERR_REPEAT_ATTR_REGISTRATION (a second server)
            log.info("PMIx_Register_attributes(%s): %s", fn, C.status_name(rc))


# --------------------------------------------------------------------------
# the attribute-query fix: libpmix's PLT slot of PMIx_Query_info_nb

_R_X86_64_JUMP_SLOT = 7
_installed: dict[str, object] = {}


def affected(version: tuple[int, int, int]) -> bool:
    return BROKEN_ATTRS[0] <= version <= BROKEN_ATTRS[1]


def _plt_slot(path: str, symbol: str) -> int | None:
    """The offset (from the load address) of ``symbol``'s PLT slot in the
    ELF shared object ``path`` (x86_64), or None."""
    with open(path, "rb") as f:
        elf = f.read()
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        return None
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize)
                for i in range(shnum)]
    names_off = sections[shstrndx][4]

    def name_of(sec):
        start = names_off + sec[0]
        return elf[start:elf.index(b"\0", start)].decode()
    by_name = {name_of(s): s for s in sections}
    rela, dynsym, dynstr = by_name.get(".rela.plt"), by_name.get(".dynsym"), \
        by_name.get(".dynstr")
    if not (rela and dynsym and dynstr):
        return None
    want = symbol.encode()
    for off in range(rela[4], rela[4] + rela[5], 24):
        r_offset, r_info, _ = struct.unpack_from("<QQq", elf, off)
        if r_info & 0xFFFFFFFF != _R_X86_64_JUMP_SLOT:
            continue
        st_name, = struct.unpack_from("<I", elf, dynsym[4] + (r_info >> 32) * 24)
        start = dynstr[4] + st_name
        if elf[start:elf.index(b"\0", start)] == want:
            return r_offset
    return None


def _mapping(path: str) -> tuple[int, list[tuple[int, int, str]]] | None:
    """(load address, [(start, end, perms)...]) of ``path`` in this process."""
    real = os.path.realpath(path)
    base, maps = None, []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) < 6 or os.path.realpath(parts[5].strip()) != real:
                continue
            start, end = (int(x, 16) for x in parts[0].split("-"))
            maps.append((start, end, parts[1]))
            if int(parts[2], 16) == 0 and base is None:
                base = start
    return (base, maps) if base is not None else None


def install_attribute_fix(lib: L.Lib, answer: Callable[[int, int, int, int], int | None]
                          ) -> str:
    """Route libpmix's own calls of ``PMIx_Query_info_nb`` through ``answer(
    queries, nqueries, cbfunc, cbdata)``, which returns a status once it
    has answered, or None to have libpmix's function run.  Returns what was
    done, in words (once per process)."""
    if "hook" in _installed:
        _installed["answer"] = answer
        return "installed"
    real = ctypes.cast(lib.query_info_nb, ctypes.c_void_p).value
    try:
        slot_off = _plt_slot(lib.path, "PMIx_Query_info_nb")
        mapped = _mapping(lib.path)
    except (OSError, ValueError, struct.error, IndexError) as e:
        return f"not installed: cannot read {lib.path}: {e}"
    if slot_off is None or mapped is None:
        return f"not installed: no PLT slot for PMIx_Query_info_nb in {lib.path}"
    base, maps = mapped
    slot = base + slot_off
    page = next((m for m in maps if m[0] <= slot < m[1]), None)
    current = ctypes.c_void_p.from_address(slot).value if page else None
    lo, hi = min(m[0] for m in maps), max(m[1] for m in maps)
    # the slot holds the function (bound) or a PLT stub of the library (lazy)
    if page is None or not (current == real or lo <= (current or 0) < hi):
        return "not installed: the PLT slot does not hold what was expected"
    _installed["answer"] = answer
    _installed["real"] = lib.query_info_nb

    def hook(queries, nqueries, cbfunc, cbdata):
        try:
            rc = _installed["answer"](queries, nqueries, cbfunc, cbdata)
        except Exception:
            # never on to libpmix's broken path: the server answers the error
            log.exception("pmix query: answering an attribute query failed")
            return C.ERROR
        if rc is not None:
            return rc
        return _installed["real"](queries, nqueries, cbfunc, cbdata)

    proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                             ctypes.c_void_p)
    cf = proto(hook)
    _installed["hook"] = cf                       # kept for the process's life
    writable = "w" in page[2]
    if not writable and not _protect(page[0], page[1] - page[0], 3):
        _installed.pop("hook")
        return "not installed: the PLT slot is read-only"
    ctypes.c_void_p.from_address(slot).value = ctypes.cast(cf, ctypes.c_void_p).value
    if not writable:
        _protect(page[0], page[1] - page[0], 1)
    return "installed"


def _protect(addr: int, size: int, prot: int) -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc.mprotect(addr, size, prot) == 0


def has_attribute_query(queries: int, n: int) -> bool:
    """Does the ``pmix_query_t`` array hold a ``PMIX_QUERY_ATTRIBUTE_SUPPORT``
    query (what libpmix checks: each query's first key)?"""
    if not queries or not n:
        return False
    for q in (L.pmix_query_t * n).from_address(queries):
        keys = argv_at(q.keys) or []
        if keys and keys[0] == ATTRIBUTE_SUPPORT:
            return True
    return False


def start(server, fix: bool = True) -> str:
    """At a server's start: the host's attributes registered with libpmix, and
    for the affected versions the attribute-query fix installed (unless
    ``fix`` is False: the crash left in, to test what a libpmix crash does),
    answering through ``server``'s replies.  Returns what was done about the fix."""
    lib = server.lib
    register_host_attributes(lib)
    if not affected(L.parse_version(lib.version)):
        return "not needed"
    if not fix:
        log.warning("libpmix %s answers attribute queries (pattrs) with a crash, and the "
                    "fix is off (pydvm_pmix_attribute_fix=off)", lib.version)
        return "off"

    def answer(queries, n, cbfunc, cbdata):
        # libpmix's progress thread, inside the server's query handler
        if not server.running or not has_attribute_query(queries, n):
            return None
        status, items = attribute_answer(lib, queries_at(queries, n))
        build_info(items, [])           # what cannot be carried raises before answering
        server.stats["requests"] += 1
        server.stats["answered_now"] += 1
        InfoReply(server, cbfunc, cbdata, L.info_cbfunc_t, "query")(status, items)
        return C.SUCCESS
    how = install_attribute_fix(lib, answer)
    if how != "installed":
        log.warning("libpmix %s answers attribute queries (pattrs) with a crash, and the "
                    "fix is %s", lib.version, how)
    return how
