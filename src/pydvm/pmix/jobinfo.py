"""Build ``register_nspace`` job information from a plain description.

>>> lay = JobLayout("pydvm-1@3", {"n0": [0, 1], "n1": [2]}, apps=[2, 1], session_id=4)
>>> info = job_info(lay, "n0")            # list of (key, Value) pairs
>>> server.register_nspace(lay.nspace, lay.local_count("n0"), info)

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
from .values import DataArray, Value


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

    @property
    def size(self) -> int:
        return sum(len(r) for r in self.nodes.values())

    def app_sizes(self) -> list[int]:
        return list(self.apps) if self.apps else [self.size]

    def local_count(self, node: str) -> int:
        return len(self.nodes.get(node, ()))

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
    """The info list for ``register_nspace`` on the server of ``this_node``."""
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

    univ = layout.universe_size or size
    info: list[tuple[str, Value]] = [
        (C.JOBID, Value(layout.jobid or layout.nspace, C.STRING)),
        (C.NODE_MAP, Value(nmap, C.STRING)),
        (C.PROC_MAP, Value(pmap, C.STRING)),
        (C.JOB_SIZE, _u32(size)),
        (C.UNIV_SIZE, _u32(univ)),
        (C.MAX_PROCS, _u32(univ)),
        (C.NUM_NODES, _u32(len(node_names))),
        (C.JOB_NUM_APPS, _u32(len(apps))),
        (C.NPROC_OFFSET, _rank(0)),
    ]
    if layout.session_id is not None:
        info.append((C.SESSION_ID, _u32(layout.session_id)))
    if len(apps) == 1:
        info.append((C.APP_SIZE, _u32(apps[0])))

    local = layout.nodes.get(this_node, [])
    if local:
        info += [
            (C.LOCAL_PEERS, Value(",".join(str(x) for x in local), C.STRING)),
            (C.LOCAL_SIZE, _u32(len(local))),
            (C.LOCALLDR, _rank(min(local))),
            (C.NODE_SIZE, _u32(len(local))),
        ]

    for i, n in enumerate(apps):
        info.append((C.APP_INFO_ARRAY, _arr([
            (C.APPNUM, _u32(i)), (C.APP_SIZE, _u32(n)), (C.APPLDR, _rank(app_first[i])),
            (C.MAX_PROCS, _u32(n)),
        ])))

    for nid, name in enumerate(node_names):
        rs = layout.nodes[name]
        node_items = [(C.HOSTNAME, Value(name, C.STRING)), (C.NODEID, _u32(nid)),
                      (C.LOCAL_SIZE, _u32(len(rs)))]
        if rs:
            node_items += [(C.LOCAL_PEERS, Value(",".join(map(str, rs)), C.STRING)),
                           (C.LOCALLDR, _rank(min(rs)))]
        info.append((C.NODE_INFO_ARRAY, _arr(node_items)))

    for rank in range(size):
        name = node_of[rank]
        lrank = layout.nodes[name].index(rank)
        app = app_of[rank]
        info.append((C.PROC_DATA, _arr([
            (C.RANK, _rank(rank)),
            (C.GLOBAL_RANK, _rank(rank)),
            (C.APPNUM, _u32(app)),
            (C.APP_RANK, _rank(rank - app_first[app])),
            (C.LOCAL_RANK, _u16(lrank)),
            (C.NODE_RANK, _u16(lrank)),
            (C.NODEID, _u32(node_names.index(name))),
            (C.HOSTNAME, Value(name, C.STRING)),
        ])))

    info += [(k, Value.of(v)) for k, v in layout.extra]
    return info
