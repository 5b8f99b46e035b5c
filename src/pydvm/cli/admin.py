"""The commands that ask a running DVM: ``stop``, ``session``, ``ps``, ``kill``, ``store``, ``info``.

Each is one request through the asyncio tool (:func:`pydvm.tool.call`);
what they print is formatted in :mod:`pydvm.cli.formatting`.
"""

from __future__ import annotations

import json
import os
import socket
import time

from . import formatting as F
from .. import params as P
from .common import fail
from .dvms import tool_failed


def _tool(a, msg: dict, timeout: float | None = None) -> dict:
    from .start import run_async
    from .tool import call, resolve_uri

    return run_async(call(resolve_uri(a.dvm), msg, timeout))


def cmd_stop(a) -> int:
    from .tool import ToolError

    try:
        r = _tool(a, {"t": "stop"})
    except (ToolError, ValueError) as exc:
        return tool_failed(exc, a.dvm)
    pid = r.get("pid")
    uri = a.dvm or os.environ.get("PYDVM_URI", "")
    local = any(h in uri for h in ("127.0.0.1", "localhost", "[::1]", socket.gethostname()))
    if isinstance(pid, int) and local:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            except PermissionError:
                break
            time.sleep(0.02)
    return 0


def cmd_session(a) -> int:
    from ..runtime.shared.jobs import parse_hosts
    from .tool import ToolError

    try:
        if a.action == "new":
            hosts = [[h.name, h.slots if ":" in a.hosts else 0] for h in parse_hosts(a.hosts)] \
                if a.hosts else None
            msg = {"t": "session_new", "hosts": hosts}
        else:
            msg = {"t": "session_end", "session": int(a.id)}
    except ValueError as exc:
        if a.action == "end":
            return fail(f"session end needs a session id, not {a.id!r}", 2)
        return fail(f"session new: {exc}", 2)
    try:
        r = _tool(a, msg)
    except (ToolError, ValueError) as exc:
        return tool_failed(exc, a.dvm)
    if a.action == "new":
        print(r["session"], flush=True)
    return 0


def cmd_ps(a) -> int:
    from .tool import ToolError

    try:
        r = _tool(a, {"t": "ps"})
    except (ToolError, ValueError) as exc:
        return tool_failed(exc, a.dvm)
    jobs = r.get("jobs") or []
    if a.json:
        print(json.dumps({"jobs": jobs}))
    else:
        print("\n".join(F.ps_lines(jobs)))
    return 0


def cmd_kill(a) -> int:
    """End each named job; return once every one has ended (its processes
    reaped, its data purged).  Exit 1 if any could not be killed."""
    from ..protocol import UriError
    from .tool import DvmUnreachable, ToolError

    code = 0
    for ns in a.nspace:
        try:
            if a.signal is not None:
                _tool(a, {"t": "signal_job", "nspace": ns, "signal": a.signal, "wait": True})
            else:
                _tool(a, {"t": "kill_job", "nspace": ns, "wait": True})
        except (ToolError, ValueError) as exc:
            code = tool_failed(exc, a.dvm)
            if isinstance(exc, (DvmUnreachable, UriError)) or code == 2:
                return code  # no DVM to ask about the rest
    return code


def cmd_release(a) -> int:
    """Release each named job started stopped in PMIx_Init; print the nodes
    where its processes were waiting.  Exit 1 if any could not be released."""
    from ..protocol import UriError
    from .tool import DvmUnreachable, ToolError

    code = 0
    for ns in a.nspace:
        try:
            r = _tool(a, {"t": "release_job", "nspace": ns})
        except (ToolError, ValueError) as exc:
            code = tool_failed(exc, a.dvm)
            if isinstance(exc, (DvmUnreachable, UriError)) or code == 2:
                return code
            continue
        where = ", ".join(r.get("waiting") or []) or "none yet"
        print(f"{ns}: released (processes were waiting in PMIx_Init on: {where})")
    return code


def cmd_store(a) -> int:
    from .tool import ToolError

    try:
        ask = {"t": "store"}
        if a.prefix is not None:
            ask["prefix"] = a.prefix
        r = _tool(a, ask)
    except (ToolError, ValueError) as exc:
        return tool_failed(exc, a.dvm)
    stores = r["stores"]
    if a.json:
        print(json.dumps({"stores": stores}))
        return 0
    print("\n".join(F.store_lines(stores)))
    return 0


def cmd_info(a) -> int:
    from .tool import ToolError

    if a.dvm or os.environ.get("PYDVM_URI"):
        try:
            r = _tool(a, {"t": "info"})
        except (ToolError, ValueError) as exc:
            return tool_failed(exc, a.dvm)
        if getattr(a, "pmix_uri", False) or getattr(a, "pmix_dir", False):
            t = (r.get("pmix") or {}).get("tools")
            if not t:
                return fail("this DVM serves no PMIx tools (PMIx is off or unavailable "
                            "beside its master: pydvm info says why)")
            print(t["uri"] if a.pmix_uri else os.path.dirname(t["file"]))
            return 0
        print(f"DVM {r['dvm']} at {r['uri']}")
        if r.get("launcher"):
            print(f"  launcher {r['launcher']}, nodes from {r.get('hosts_from') or '?'}")
        print(f"  logs in {r['log_dir']}" if r.get("log_dir") else
              "  logs: the master's standard error")
        for name, slots, state in r["nodes"]:
            print(f"  node {name} slots={slots} {state}")
        if r.get("head_node"):
            print(f"  head node {r['head_node']}: served by the master process (one hop)")
        d = r.get("direct")
        if d is not None and r["params"].get("pydvm_direct_data", ["off"])[0] == "on":
            print(f"  direct data: {d['open']} client connections open; {d['accepted']} "
                  f"accepted, {d['refused']} refused, {d['requests']} requests served")
            u = r.get("direct_unix")
            if u:
                print(f"  direct data socket (same-host nodes): {u['path']}; "
                      f"{u['accepted']} connections accepted there")
        seal = r.get("seal")
        if seal:
            print(f"  links: {seal['sealed_open']} sealed, {seal['clear_tcp_open']} clear over "
                  f"TCP (pydvm_seal {seal['mode']}); {seal['accepted']} sealed links accepted, "
                  f"{seal['refused']} refused, {seal['broken']} broken by a frame that did not "
                  "open")
        fds = r.get("descriptors")
        if fds:
            print(f"  descriptors: {fds['open']} open of {fds['limit']} (hard limit "
                  f"{fds['hard']}, {fds['reserve']} kept for authenticated peers); "
                  f"{fds['unauthenticated']} unauthenticated connections"
                  + (", AT THE LIMIT" if fds["at_limit"] else "")
                  + f"; {fds['closed_at_limit']} closed at the limit, "
                  f"{fds['accept_failed']} accepts failed")
        _print_pmix(r.get("pmix"))
        rows = [(k, v[0], v[1], v[2]) for k, v in r["params"].items()]
    else:
        from .start import _warn_ignored_env

        _warn_ignored_env()
        try:
            res = P.resolve()
        except ValueError as exc:
            return fail(str(exc))
        print("no DVM given; values this environment would start one with:")
        from ..runtime.pmixhost import pmix_status
        _print_pmix({"here": list(pmix_status())})
        rows = [(k, v.value, v.source, P.REGISTRY[k].help) for k, v in res.items()]
    width = max(len(r[0]) for r in rows)
    for name, value, source, help_ in rows:
        print(f"{name:<{width}}  {value!r:<12} ({source})  {help_}")
    return 0


def _print_pmix(info: dict | None) -> None:
    """One line per place that reported whether it can host PMIx clients."""
    if not info:
        return
    rows = [("this machine" if k == "here" else k, v) for k, v in info.items()
            if k not in ("nodes", "tools")]
    rows += [(f"node {n}", v) for n, v in (info.get("nodes") or {}).items()]
    for where, (ok, what, path) in rows:
        print(f"  PMIx on {where}: " + (f"available, {what} ({path})" if ok else
                                         f"unavailable: {what}"))
    t = info.get("tools")
    if t:
        where = f"to node {t['node']}" if t.get("node") else "beside the master (no head node)"
        print(f"  PMIx tools attach {where} at {t['uri']} (file {t['file']}; "
              f"TMPDIR=$(pydvm info --pmix-dir) pps); {len(t['connected'])} connected")
        if t.get("system_file"):
            print(f"  PMIx system server: {t['system_file']} (tools find this DVM first)")
        elif t.get("system_why"):
            print(f"  PMIx system server: not this DVM ({t['system_why']})")

