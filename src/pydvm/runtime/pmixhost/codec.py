"""PMIx objects as pydvm's wires carry them.

Two encodings, both plain msgpack data:

* between a node and its PMIx server processes (runtime/pmixhost/users.py,
  runtime/pmixhost/agent.py): any PMIx value, process, data array or upcall
  request as tagged maps (:func:`encode` / :func:`decode`,
  :func:`encode_request`, and a tool's connection: :func:`encode_tool`);
* between a node and the master: an event's info (:func:`info_to_wire`),
  the processes a collective names (:func:`procs_to_wire`), and a job's layout
  as the master sends it, turned into the ``JobLayout`` libpmix is
  registered with (:func:`job_layout`).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from ...pmix import DataArray, Proc, Value

log = logging.getLogger("pydvm.pmix")


#: Types msgpack carries as they are (exactly these: a subclass takes the long way).
_PLAIN = frozenset((type(None), bool, int, float, str, bytes))


def encode(x: Any) -> Any:
    """``x`` (Proc, Value, DataArray, a request dataclass, dicts, lists,
    tuples, scalars) as plain msgpack data; :func:`decode` is its inverse.
    Raises TypeError for anything else.  (A job's registration is thousands
    of these a second: the common types are told by ``type`` first.)"""
    t = type(x)
    if t in _PLAIN:
        return x
    if t is Value:
        v = x.value
        return {"V": [x.type, v if type(v) in _PLAIN else encode(v)]}
    if t is list:
        return [encode(i) for i in x]
    if t is tuple:
        return {"T": [encode(i) for i in x]}
    if t is DataArray:
        return {"A": [x.type, [encode(i) for i in x.items]]}
    if t is Proc:
        return {"P": [x.nspace, x.rank]}
    if x is None or isinstance(x, (bool, int, float, str, bytes)):
        return x
    if isinstance(x, Value):
        return {"V": [x.type, encode(x.value)]}
    if isinstance(x, Proc):
        return {"P": [x.nspace, x.rank]}
    if isinstance(x, DataArray):
        return {"A": [x.type, [encode(i) for i in x.items]]}
    if isinstance(x, tuple):
        return {"T": [encode(i) for i in x]}
    if isinstance(x, list):
        return [encode(i) for i in x]
    if isinstance(x, dict):
        return {"M": [[k, encode(v)] for k, v in x.items()]}
    if dataclasses.is_dataclass(x) and type(x).__name__ in _classes():
        return {"C": [type(x).__name__, {f.name: encode(getattr(x, f.name))
                                         for f in dataclasses.fields(x) if f.name != "reply"}]}
    if isinstance(x, bytearray):
        return bytes(x)
    raise TypeError(f"cannot carry a {type(x).__name__} to or from a PMIx agent")


def decode(x: Any) -> Any:
    """The inverse of :func:`encode`.  Raises ValueError on what it never makes."""
    if isinstance(x, list):
        return [decode(i) for i in x]
    if not isinstance(x, dict):
        return x
    if len(x) != 1:
        raise ValueError("a tagged value has exactly one tag")
    (tag, body), = x.items()
    if tag == "V":
        return Value(decode(body[1]), int(body[0]))
    if tag == "P":
        return Proc(str(body[0]), int(body[1]))
    if tag == "A":
        return DataArray(int(body[0]), tuple(decode(i) for i in body[1]))
    if tag == "T":
        return tuple(decode(i) for i in body)
    if tag == "M":
        return {str(k): decode(v) for k, v in body}
    if tag == "C":
        cls = _classes().get(body[0])
        if cls is None:
            raise ValueError(f"not a PMIx request: {body[0]!r}")
        return cls(**{str(k): decode(v) for k, v in body[1].items()})
    raise ValueError(f"unknown tag {tag!r}")


_CLASSES: dict[str, type] = {}


def _classes() -> dict[str, type]:
    if not _CLASSES:
        from ...pmix import requests as R
        for name in dir(R):
            obj = getattr(R, name)
            if isinstance(obj, type) and dataclasses.is_dataclass(obj):
                _CLASSES[name] = obj
    return _CLASSES


def encode_request(req) -> Any:
    """An upcall's request, without its reply object."""
    return encode(req)


def decode_request(data: Any):
    """A request built from :func:`encode_request`'s output (``reply`` unset)."""
    req = decode(data)
    from ...pmix.requests import Request
    if not isinstance(req, Request) or type(req) is Request:
        raise ValueError("not a PMIx upcall")
    return req


#: What of a ``tool_connected`` request crosses from the tool server
#: process (its reply, descriptors and libpmix's socket stay there).
_TOOL_FIELDS = ("uid", "why", "claimed_uid", "claimed_gid", "pid", "cmd", "keeps_id")


def encode_tool(req) -> dict:
    """A :class:`~pydvm.pmix.tools.ToolConnected` as the tool server sends it."""
    out = {f: getattr(req, f) for f in _TOOL_FIELDS}
    out["info"] = encode(req.info)
    return out


def decode_tool(data: Any):
    """The inverse of :func:`encode_tool` (``fd``, ``sd`` and ``reply`` unset).
    Raises ValueError or TypeError on anything else."""
    from ...pmix.tools import ToolConnected
    if not isinstance(data, dict) or set(data) != {*_TOOL_FIELDS, "info"}:
        raise ValueError("not a tool connection")
    info = decode(data["info"])
    if not isinstance(info, dict):
        raise ValueError("a tool connection's info is a map")
    for f in ("uid", "claimed_uid", "claimed_gid", "pid"):
        v = data[f]
        if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
            raise TypeError(f"{f}: not an integer")
    if not isinstance(data["why"], str) or not isinstance(data["cmd"], str) \
            or not isinstance(data["keeps_id"], bool):
        raise TypeError("why, cmd: strings; keeps_id: a bool")
    return ToolConnected(data["uid"], data["why"], data["claimed_uid"], data["claimed_gid"],
                         data["pid"], data["cmd"], None, info, None, data["keeps_id"])


# -- node and master ----------------------------------------------------

def info_to_wire(items) -> list[list]:
    """An event's info as msgpack can carry it: ``[key, type, value]`` each,
    a proc as ``[nspace, rank]``, a data array as ``[type, [items]]``."""
    return [[k, v.type, _plain(v.type, v.value)] for k, v in items]


def info_from_wire(rows) -> list[tuple[str, Any]]:
    """The inverse of :func:`info_to_wire` (entries it cannot read are dropped)."""
    from ...pmix import Value
    out = []
    for row in rows:
        try:
            k, t, x = row
            out.append((str(k), Value(_unplain(int(t), x), int(t))))
        except (TypeError, ValueError):
            log.warning("dropping a malformed event info entry %r", row)
    return out


def _plain(t: int, x):
    from ...pmix import constants as C
    if t == C.PROC:
        return [x.nspace, x.rank]
    if t == C.DATA_ARRAY:
        if x is None:
            return None
        if x.type == C.INFO:
            return [x.type, [[k, v.type, _plain(v.type, v.value)] for k, v in x.items]]
        return [x.type, [_plain(x.type, i) for i in x.items]]
    return x


def _unplain(t: int, x):
    from ...pmix import DataArray, Proc, Value
    from ...pmix import constants as C
    if t == C.PROC:
        return Proc(str(x[0]), int(x[1]))
    if t == C.DATA_ARRAY:
        if x is None:
            return None
        et, items = int(x[0]), x[1]
        if et == C.INFO:
            return DataArray(et, tuple((str(k), Value(_unplain(int(vt), v), int(vt)))
                                       for k, vt, v in items))
        return DataArray(et, tuple(_unplain(et, i) for i in items))
    return x


def procs_to_wire(procs) -> list[list]:
    return [[p.nspace, p.rank] for p in procs]


def job_layout(nspace: str, layout: dict, session_id: int | None):
    """The master's layout message as a JobLayout: ``nodes`` (node -> ranks),
    ``apps`` (sizes), ``parent``, and when given ``node_ids``, ``univ_size``,
    ``argv`` and ``wdir`` (per application)."""
    from ...pmix.jobinfo import JobLayout, debug_target, stop_in_init
    parent, target = layout.get("parent"), layout.get("debug_target")
    return JobLayout(nspace, {n: list(r) for n, r in layout["nodes"].items()},
                     apps=list(layout.get("apps") or []) or None,
                     session_id=session_id,
                     universe_size=layout.get("univ_size"),
                     node_ids=layout.get("node_ids"),
                     app_argv=layout.get("argv"), app_wdir=layout.get("wdir"),
                     parent=(str(parent[0]), int(parent[1])) if parent else None,
                     extra=(stop_in_init() if layout.get("stop_in_init") else []) +
                     (debug_target(str(target[0]), int(target[1])) if target else []))
