"""Build ``register_nspace`` job information from a plain description.

>>> lay = JobLayout("pydvm-1@3", {"n0": [0, 1], "n1": [2]}, apps=[2, 1], session_id=4)
>>> info = job_info(lay, "n0")            # list of (key, Value) pairs
>>> await server.register_nspace(lay.nspace, lay.local_count("n0"), info)

Ranks are numbered across the whole job; application ``i`` holds the next
``apps[i]`` ranks (MPMD ``-n 2 a : -n 1 b`` is ``apps=[2, 1]``).  What is
produced is what Open MPI 4.1 reads during ``MPI_Init`` and what libpmix
needs to answer its clients' job-level queries; see docs/pmix.md.

Pure Python: building the list does not need libpmix.  Node and process
maps are plain strings (``"n0,n1"``, ``"0,1;2"``), which libpmix parses
when no regex component claims them; pass ``server=`` to have libpmix
compress them with ``PMIx_generate_regex`` / ``PMIx_generate_ppn`` instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import constants as C
from .values import DataArray, Proc, Value


@dataclass
class JobLayout:
    """A job as plain data: which ranks run on which node, and its applications."""

    nspace: str
    nodes: dict[str, list[int]]                 # node name -> ranks there (in order)
    apps: list[int] | None = None               # procs per application; default: one app
    session_id: int | None = None
    universe_size: int | None = None            # default: job size
    jobid: str | None = None                    # default: the namespace
    extra: list[tuple[str, Any]] = field(default_factory=list)   # appended job-level info
    #: node name -> its node id, the same in every job of the system (PMIX_NODEID);
    #: default: the node's position in ``nodes``.
    node_ids: dict[str, int] | None = None
    #: each application's command line and working directory (PMIX_APP_ARGV, PMIX_WDIR).
    app_argv: list[list[str]] | None = None
    app_wdir: list[str] | None = None
    #: the process that spawned this job (PMIX_SPAWNED, PMIX_PARENT_ID), if any.
    parent: tuple[str, int] | None = None
    #: rank -> more items of its PMIX_PROC_DATA (a bound local rank's
    #: PMIX_CPUSET and PMIX_LOCALITY_STRING), plain values or Values.
    proc_extra: dict[int, list[tuple[str, Any]]] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return sum(len(r) for r in self.nodes.values())

    def app_sizes(self) -> list[int]:
        return list(self.apps) if self.apps else [self.size]

    def local_count(self, node: str) -> int:
        return len(self.nodes.get(node, ()))

    def node_id(self, node: str) -> int:
        if self.node_ids and node in self.node_ids:
            return int(self.node_ids[node])
        return list(self.nodes).index(node)

    def check(self) -> None:
        ranks = sorted(r for rs in self.nodes.values() for r in rs)
        if ranks != list(range(len(ranks))):
            raise ValueError(f"ranks must be 0..{len(ranks) - 1}, each on one node: {ranks}")
        if sum(self.app_sizes()) != len(ranks):
            raise ValueError(f"application sizes {self.app_sizes()} do not add up to "
                             f"the job size {len(ranks)}")


def _u32(v: int) -> Value:
    return Value(int(v), C.UINT32)


def _u16(v: int) -> Value:
    return Value(int(v), C.UINT16)


def _rank(v: int) -> Value:
    return Value(int(v), C.PROC_RANK)


def _arr(items: list[tuple[str, Value]]) -> Value:
    return Value(DataArray(C.INFO, tuple(items)), C.DATA_ARRAY)


def job_info(layout: JobLayout, this_node: str, *, server=None) -> list[tuple[str, Value]]:
    """The info list for ``register_nspace`` on the server of ``this_node``.

    The order matters to libpmix 4.2: its client-side stores (``ds21``,
    ``ds12``) file a job-level key such as ``PMIX_UNIV_SIZE`` under the
    session current when the key is read, so ``PMIX_SESSION_ID`` comes
    first; then the job's identity, one ``PMIX_NODE_INFO_ARRAY`` per node,
    the maps, the sizes, one ``PMIX_APP_INFO_ARRAY`` per application and
    one ``PMIX_PROC_DATA`` per process (rank first) -- the layout PRRTE
    registers a namespace with.
    """
    layout.check()
    size = layout.size
    node_names = list(layout.nodes)
    apps = layout.app_sizes()
    app_of: dict[int, int] = {}
    app_first: list[int] = []
    r = 0
    for i, n in enumerate(apps):
        app_first.append(r)
        for _ in range(n):
            app_of[r] = i
            r += 1
    node_of = {rank: name for name, rs in layout.nodes.items() for rank in rs}

    if server is not None:
        nmap = server.generate_regex(node_names)
        pmap = server.generate_ppn(layout.nodes[n] for n in node_names)
    else:
        nmap = ",".join(node_names)
        pmap = ";".join(",".join(str(x) for x in layout.nodes[n]) for n in node_names)

    univ = max(layout.universe_size or size, size)
    info: list[tuple[str, Value]] = []
    if layout.session_id is not None:
        info.append((C.SESSION_ID, _u32(layout.session_id)))
    info += [
        (C.JOBID, Value(layout.jobid or layout.nspace, C.STRING)),
        (C.NPROC_OFFSET, _rank(0)),
    ]
    for name in node_names:
        rs = layout.nodes[name]
        node_items = [(C.HOSTNAME, Value(name, C.STRING)),
                      (C.NODEID, _u32(layout.node_id(name))),
                      (C.NODE_SIZE, _u32(len(rs))),
                      (C.LOCAL_SIZE, _u32(len(rs)))]
        if rs:
            node_items += [(C.LOCALLDR, _rank(min(rs))),
                           (C.LOCAL_PEERS, Value(",".join(map(str, rs)), C.STRING))]
        info.append((C.NODE_INFO_ARRAY, _arr(node_items)))
    info += [
        (C.NODE_MAP, Value(nmap, C.STRING)),
        (C.PROC_MAP, Value(pmap, C.STRING)),
        (C.NUM_NODES, _u32(len(node_names))),
        (C.UNIV_SIZE, _u32(univ)),
        (C.JOB_SIZE, _u32(size)),
        (C.JOB_NUM_APPS, _u32(len(apps))),
        (C.MAX_PROCS, _u32(univ)),
    ]
    if len(apps) == 1:
        info.append((C.APP_SIZE, _u32(apps[0])))

    local = layout.nodes.get(this_node, [])
    if local:
        info += [
            (C.LOCAL_PEERS, Value(",".join(str(x) for x in local), C.STRING)),
            (C.LOCAL_SIZE, _u32(len(local))),
            (C.LOCALLDR, _rank(min(local))),
            (C.NODE_SIZE, _u32(len(local))),
            (C.NODEID, _u32(layout.node_id(this_node))),
        ]

    for i, n in enumerate(apps):
        items = [(C.APPNUM, _u32(i)), (C.APP_SIZE, _u32(n)), (C.APPLDR, _rank(app_first[i])),
                 (C.MAX_PROCS, _u32(n))]
        if layout.app_wdir and i < len(layout.app_wdir) and layout.app_wdir[i]:
            items.append((C.WDIR, Value(layout.app_wdir[i], C.STRING)))
        if layout.app_argv and i < len(layout.app_argv) and layout.app_argv[i]:
            items.append((C.APP_ARGV, Value(" ".join(layout.app_argv[i]), C.STRING)))
        info.append((C.APP_INFO_ARRAY, _arr(items)))

    for rank in range(size):
        name = node_of[rank]
        lrank = layout.nodes[name].index(rank)
        app = app_of[rank]
        items = [
            (C.RANK, _rank(rank)),
            (C.GLOBAL_RANK, _rank(rank)),
            (C.APPNUM, _u32(app)),
            (C.APP_RANK, _rank(rank - app_first[app])),
            (C.LOCAL_RANK, _u16(lrank)),
            (C.NODE_RANK, _u16(lrank)),
            (C.NODEID, _u32(layout.node_id(name))),
            (C.REINCARNATION, _u32(0)),
            (C.HOSTNAME, Value(name, C.STRING)),
        ]
        if layout.parent is not None:
            items.append((C.PARENT_ID, Value(Proc(*layout.parent), C.PROC)))
        items += [(k, Value.of(v)) for k, v in layout.proc_extra.get(rank, ())]
        info.append((C.PROC_DATA, _arr(items)))

    if layout.parent is not None:
        info.append((C.SPAWNED, Value(True, C.BOOL)))
    info += [(k, Value.of(v)) for k, v in layout.extra]
    return info


def stop_in_init() -> list[tuple[str, Value]]:
    """The job-level item that holds every process of a job in ``PMIx_Init``.

    libpmix 4.2's client reads ``PMIX_DEBUG_STOP_IN_INIT`` for its namespace
    (rank WILDCARD) at the end of ``PMIx_Init``; when it is there -- whatever
    its value -- it registers for ``PMIX_DEBUGGER_RELEASE``, notifies
    ``PMIX_READY_FOR_DEBUG`` (range RM, ``PMIX_BREAKPOINT`` "pmix-init") and
    waits for the release (src/client/pmix_client.c).  So the key is present
    only for a job to stop, and it stops every rank: the rank WILDCARD, as
    PRRTE registers it.
    """
    return [(C.DEBUG_STOP_IN_INIT, Value(C.RANK_WILDCARD, C.PROC_RANK))]


def debug_target(nspace: str, rank: int) -> list[tuple[str, Value]]:
    """The job-level items telling debugger daemons whom they debug
    (``PMIX_DEBUG_TARGET``, a ``pmix_proc_t``: rank WILDCARD for a whole job;
    and the namespace as ``PMIX_DEBUG_JOB``, the deprecated name that
    OpenPMIx 4.2's examples/debuggerd.c reads)."""
    return [(C.DEBUG_TARGET, Value(Proc(nspace, int(rank)), C.PROC)),
            (C.DEBUG_JOB, Value(nspace, C.STRING))]
