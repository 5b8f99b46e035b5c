"""The ``pydvm`` command line (SPEC 9).

DVM-level commands (``start``, ``run``, ``stop``, ``session``, ``store``,
``info``, ``daemon``) and in-job commands for scripts (``publish``,
``lookup``, ``unpublish``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import time
from typing import Any

from . import params as P
from .enums import Persistence, Range
from .errors import PMIxError, Status

# ----------------------------------------------------------------------
# event loop
# ----------------------------------------------------------------------


def run_async(coro, profile_name: str = "") -> Any:
    """Run ``coro`` on uvloop when available (unless PYDVM_NO_UVLOOP is set).

    With ``PYDVM_PROFILE_DIR`` set, a master or daemon runs under cProfile and
    writes ``<dir>/<name>.prof`` when it exits (for performance work).
    """
    prof_dir = os.environ.get("PYDVM_PROFILE_DIR")
    if prof_dir and profile_name:
        import cProfile

        pr = cProfile.Profile()
        pr.enable()
        try:
            return run_async(coro)
        finally:
            pr.disable()
            pr.dump_stats(os.path.join(prof_dir, f"{profile_name}.prof"))
    if not os.environ.get("PYDVM_NO_UVLOOP"):
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.run(coro)
    return asyncio.run(coro)


def _fail(msg: str, code: int = 1) -> int:
    sys.stderr.write(f"pydvm: {msg}\n")
    return code


# ----------------------------------------------------------------------
# start / daemon
# ----------------------------------------------------------------------


def _hosts(text: str | None):
    from .runtime.jobs import HostSpec, parse_hosts

    if text:
        return parse_hosts(text)
    return [HostSpec(socket.gethostname(), os.cpu_count() or 1)]


def _resolve_params(mca: list[list[str]] | None) -> dict[str, P.Resolved]:
    return P.resolve([(n, v) for n, v in (mca or [])])


def cmd_start(a: argparse.Namespace) -> int:
    from .runtime.launch import LAUNCHERS

    try:
        hosts = _hosts(a.hosts)
        resolved = _resolve_params(a.mca)
    except ValueError as exc:
        return _fail(str(exc), 2)
    if a.launcher not in LAUNCHERS:
        return _fail(f"unknown launcher {a.launcher!r}", 2)
    if a.daemonize:
        return _daemonize(a, hosts, resolved)
    return run_async(_serve(a, hosts, resolved, ready_fd=None), profile_name="master")


async def _serve(a, hosts, resolved, ready_fd: int | None) -> int:
    import signal

    from .runtime.launch import setup_logging
    from .runtime.master import Master, StartError

    setup_logging("master", a.log_dir, resolved["prte_data_server_verbose"].value)
    from .runtime.auth import DvmUri, UriError

    try:
        ds = DvmUri.parse(a.data_server_uri) if a.data_server_uri else None
    except UriError as exc:
        return _fail(str(exc), 2)
    master = Master(hosts, a.launcher, resolved, bind=a.bind, log_dir=a.log_dir,
                    data_server=ds, port=a.port, dvmid=a.dvm_id, multi_user=a.multi_user)
    try:
        uri = await master.start()
    except (StartError, OSError) as exc:
        if ready_fd is not None:
            os.write(ready_fd, f"ERR {exc}\n".encode())
            os.close(ready_fd)
        return _fail(f"cannot start the DVM: {exc}")
    if a.uri_file:
        _write_private(a.uri_file, f"{uri}\n")
    if ready_fd is not None:
        os.write(ready_fd, f"OK {uri}\n".encode())
        os.close(ready_fd)
    else:
        print(uri, flush=True)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: asyncio.ensure_future(master.stop()))
    await master.wait_stopped()
    await asyncio.sleep(0.05)  # let the stop reply reach its tool
    return 0


def _write_private(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _daemonize(a, hosts, resolved) -> int:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: detach and serve
        os.close(r)
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        try:
            code = run_async(_serve(a, hosts, resolved, ready_fd=w), profile_name="master")
        finally:
            os._exit(0)
        os._exit(code)
    os.close(w)
    os.waitpid(pid, 0)
    with os.fdopen(r) as f:
        line = f.readline().strip()
    if line.startswith("OK "):
        print(line[3:], flush=True)
        return 0
    return _fail(line[4:] if line.startswith("ERR ") else "DVM exited during start-up")


def cmd_daemon(a: argparse.Namespace) -> int:
    from .runtime.daemon import run_daemon
    from .runtime.launch import setup_logging

    from .runtime.guard import Guardian

    setup_logging(a.node, a.log_dir)
    line = sys.stdin.readline().strip()
    try:
        secret = bytes.fromhex(line)
    except ValueError:
        return _fail("daemon: expected the DVM secret on standard input")
    guardian = Guardian()
    guardian.start()  # before any thread or event loop exists
    try:
        return run_async(run_daemon(a.master, a.node, secret, guardian), profile_name=a.node)
    finally:
        guardian.close()


# ----------------------------------------------------------------------
# run
# ----------------------------------------------------------------------

RUN_USAGE = ("usage: pydvm run [--dvm URI] [--session ID] [--mca N V]... [--tag-output] [--pmix] "
             "[--host H[:SLOTS],...] -n N CMD ARGS... [: [--host ...] -n M CMD2 ...]")


def parse_run(argv: list[str]) -> dict[str, Any]:
    """Parse ``pydvm run`` arguments (MPMD contexts separated by ':')."""
    from .runtime.jobs import parse_hosts

    opts: dict[str, Any] = {"dvm": None, "session": None, "mca": [], "tag_output": False,
                            "apps": [], "pmix": False}
    segments: list[list[str]] = [[]]
    for tok in argv:
        if tok == ":":
            segments.append([])
        else:
            segments[-1].append(tok)
    for idx, seg in enumerate(segments):
        n = None
        hosts = None
        i = 0
        while i < len(seg) and seg[i].startswith("-"):
            opt = seg[i]
            name, eq, inline = opt.partition("=")

            def value() -> str:
                nonlocal i
                if eq:
                    return inline
                i += 1
                if i >= len(seg):
                    raise ValueError(f"{opt} needs a value")
                return seg[i]

            if name in ("-n", "--np", "-np"):
                v = value()
                try:
                    n = int(v)
                except ValueError:
                    raise ValueError(f"-n needs a number, not {v!r}") from None
                if n < 1:
                    raise ValueError("-n must be at least 1")
            elif name in ("--host", "-H"):
                hosts = [[h.name, h.slots] for h in parse_hosts(value())]
            elif idx == 0 and name == "--dvm":
                opts["dvm"] = value()
            elif idx == 0 and name == "--session":
                v = value()
                try:
                    opts["session"] = int(v)
                except ValueError:
                    raise ValueError(f"--session needs a session id, not {v!r}") from None
            elif idx == 0 and name == "--mca":
                if eq:
                    raise ValueError("--mca takes two arguments: NAME VALUE")
                if i + 2 >= len(seg):
                    raise ValueError("--mca takes two arguments: NAME VALUE")
                opts["mca"].append((seg[i + 1], seg[i + 2]))
                i += 2
            elif idx == 0 and name == "--tag-output":
                opts["tag_output"] = True
            elif idx == 0 and name == "--pmix":
                opts["pmix"] = True  # refuse the job unless every node of it hosts PMIx
            elif name == "--":
                i += 1
                break
            else:
                where = "" if idx == 0 else f" in app context {idx}"
                raise ValueError(f"unknown option {opt}{where}")
            i += 1
        cmd = seg[i:]
        if not cmd:
            raise ValueError(f"app context {idx} has no command")
        opts["apps"].append({"argv": cmd, "n": n if n is not None else 1, "hosts": hosts})
    return opts


def cmd_run(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(RUN_USAGE)
        return 0 if argv else 2
    try:
        opts = parse_run(argv)
    except ValueError as exc:
        sys.stderr.write(f"pydvm run: {exc}\n{RUN_USAGE}\n")
        return 2
    from .tool import ToolError, resolve_uri, run_job

    uri_text = opts["dvm"] or os.environ.get("PYDVM_URI")
    if uri_text:
        if opts["mca"]:
            return _fail("--mca applies to a one-shot DVM only; set parameters on 'pydvm start'",
                         2)
        try:
            uri = resolve_uri(uri_text)
            return run_async(run_job(uri, opts["apps"], opts["session"], opts["tag_output"],
                                     pmix=opts["pmix"]))
        except (ToolError, ValueError) as exc:
            return _fail(str(exc))
    if opts["session"] is not None:
        return _fail("--session needs a persistent DVM (--dvm URI or PYDVM_URI)", 2)
    try:
        resolved = _resolve_params(opts["mca"])
    except ValueError as exc:
        return _fail(str(exc), 2)
    return run_async(_one_shot(opts, resolved))


async def _one_shot(opts: dict, resolved) -> int:
    """Run one job on a private DVM on this machine, then take it down."""
    from .runtime.launch import setup_logging
    from .runtime.master import Master, StartError
    from .tool import ToolError, run_job

    setup_logging("pydvm-run", None, resolved["prte_data_server_verbose"].value)
    from .runtime.jobs import HostSpec

    named = sorted({h[0] for a in opts["apps"] for h in (a["hosts"] or [])})
    # A one-shot DVM runs hosts named by --host as local daemons of that name.
    hosts = [HostSpec(n, 1) for n in named] if named else _hosts(None)
    master = Master(hosts, "local", resolved)
    try:
        uri = await master.start()
    except (StartError, OSError) as exc:
        return _fail(f"cannot start the one-shot DVM: {exc}")
    try:
        return await run_job(uri, opts["apps"], None, opts["tag_output"], pmix=opts["pmix"])
    except ToolError as exc:
        return _fail(str(exc))
    finally:
        await master.stop()


# ----------------------------------------------------------------------
# stop / session / store / info
# ----------------------------------------------------------------------


def _tool(a, msg: dict, timeout: float | None = None) -> dict:
    from .tool import call, resolve_uri

    return run_async(call(resolve_uri(a.dvm), msg, timeout))


def cmd_stop(a: argparse.Namespace) -> int:
    from .tool import ToolError

    try:
        r = _tool(a, {"t": "stop"})
    except (ToolError, ValueError) as exc:
        return _fail(str(exc))
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


def cmd_session(a: argparse.Namespace) -> int:
    from .runtime.jobs import parse_hosts
    from .tool import ToolError

    try:
        if a.action == "new":
            hosts = [[h.name, h.slots if ":" in a.hosts else 0] for h in parse_hosts(a.hosts)] \
                if a.hosts else None
            r = _tool(a, {"t": "session_new", "hosts": hosts})
            print(r["session"], flush=True)
        else:
            try:
                sid = int(a.id)
            except (TypeError, ValueError):
                return _fail(f"session end needs a session id, not {a.id!r}", 2)
            _tool(a, {"t": "session_end", "session": sid})
    except (ToolError, ValueError) as exc:
        return _fail(str(exc))
    return 0


def cmd_store(a: argparse.Namespace) -> int:
    from .tool import ToolError

    try:
        r = _tool(a, {"t": "store"})
    except (ToolError, ValueError) as exc:
        return _fail(str(exc))
    stores = r["stores"]
    if a.json:
        print(json.dumps({"stores": stores}))
        return 0
    print(f"{'store':<20} {'items':>7} {'parked':>7} {'evictions':>9} {'expiries':>8}  bytes by uid")
    for s in stores:
        if "error" in s:
            print(f"{s['store']:<20} unavailable: {s['error']}")
            continue
        by_uid = ", ".join(f"{u}: {b}" for u, b in s["bytes_by_uid"].items()) or "-"
        print(f"{s['store']:<20} {s['items']:>7} {s['parked']:>7} {s['evictions']:>9} "
              f"{s['expiries']:>8}  {by_uid}")
        if s.get("keys"):
            print(f"{'':<20} your keys: {' '.join(s['keys'])}")
    return 0


def cmd_info(a: argparse.Namespace) -> int:
    from .tool import ToolError

    if a.dvm or os.environ.get("PYDVM_URI"):
        try:
            r = _tool(a, {"t": "info"})
        except (ToolError, ValueError) as exc:
            return _fail(str(exc))
        print(f"DVM {r['dvm']} at {r['uri']}")
        for name, slots, state in r["nodes"]:
            print(f"  node {name} slots={slots} {state}")
        if r.get("head_node"):
            print(f"  head node {r['head_node']}: served by the master process (one hop)")
        _print_pmix(r.get("pmix"))
        rows = [(k, v[0], v[1], v[2]) for k, v in r["params"].items()]
    else:
        try:
            res = P.resolve()
        except ValueError as exc:
            return _fail(str(exc))
        print("no DVM given; values this environment would start one with:")
        from .runtime.pmixhost import pmix_status
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
    rows = [("this machine" if k == "here" else k, v) for k, v in info.items() if k != "nodes"]
    rows += [(f"node {n}", v) for n, v in (info.get("nodes") or {}).items()]
    for where, (ok, what, path) in rows:
        print(f"  PMIx on {where}: " + (f"available, {what} ({path})" if ok else
                                         f"unavailable: {what}"))


# ----------------------------------------------------------------------
# in-job commands
# ----------------------------------------------------------------------


def _status_line(st: Status) -> None:
    print(f"STATUS {st.pmix_name}", flush=True)


def cmd_publish(a: argparse.Namespace) -> int:
    from .client import Client

    pairs = {}
    for kv in a.pairs:
        k, eq, v = kv.partition("=")
        if not eq or not k:
            sys.stderr.write(f"pydvm publish: expected K=V, got {kv!r}\n")
            _status_line(Status.ERR_BAD_PARAM)
            return 1
        pairs[k] = v
    try:
        rng = Range.from_word(a.range)
        per = Persistence.from_word(a.persistence) if a.persistence else None
    except ValueError as exc:
        sys.stderr.write(f"pydvm publish: {exc}\n")
        _status_line(Status.ERR_BAD_PARAM)
        return 1
    st = Status.SUCCESS
    try:
        with Client() as c:
            c.publish(pairs, range=rng, persistence=per, access_uids=a.access_uid,
                      access_gids=a.access_gid, replace=a.replace)
            for k in pairs:
                print(f"PUBLISHED {k}")
            _status_line(st)
            if a.hold:
                time.sleep(a.hold)
    except PMIxError as exc:
        st = exc.status
        if exc.message:
            sys.stderr.write(f"pydvm publish: {exc.message}\n")
        _status_line(st)
    return 0 if st is Status.SUCCESS else 1


def cmd_lookup(a: argparse.Namespace) -> int:
    from .client import Client

    try:
        rng = Range.from_word(a.range)
    except ValueError as exc:
        sys.stderr.write(f"pydvm lookup: {exc}\n")
        _status_line(Status.ERR_BAD_PARAM)
        return 1
    wait: bool | int = False
    if a.wait_count is not None:
        wait = a.wait_count
    elif a.wait:
        wait = True
    try:
        with Client() as c:
            r = c.lookup(a.keys, range=rng, wait=wait, timeout=a.timeout)
    except PMIxError as exc:
        if exc.message and exc.status not in (Status.ERR_NOT_FOUND, Status.ERR_TIMEOUT):
            sys.stderr.write(f"pydvm lookup: {exc.message}\n")
        _status_line(exc.status)
        return 1
    for key, f in r.found.items():
        v = f.value if isinstance(f.value, str) else repr(f.value)
        print(f"FOUND {key} {v} from {f.nspace}:{f.rank}")
    _status_line(r.status)
    return 0 if r.status is Status.SUCCESS else 1


def cmd_unpublish(a: argparse.Namespace) -> int:
    from .client import Client

    try:
        with Client() as c:
            c.unpublish(a.keys or None)
    except PMIxError as exc:
        _status_line(exc.status)
        return 1
    _status_line(Status.SUCCESS)
    return 0


# ----------------------------------------------------------------------
# argument parsing
# ----------------------------------------------------------------------


def _dvm_id(text: str) -> str:
    import re

    if not re.fullmatch(r"[A-Za-z0-9_-]{1,32}", text):
        raise argparse.ArgumentTypeError("a DVM id is 1-32 letters, digits, '-' or '_'")
    return text


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pydvm", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")

    s = sub.add_parser("start", help="start a persistent DVM and print its URI")
    s.add_argument("--hosts", help="H[:SLOTS],... (default: this machine)")
    s.add_argument("--launcher", default="local", help="local (default) or ssh")
    s.add_argument("--mca", nargs=2, action="append", metavar=("NAME", "VALUE"))
    s.add_argument("--daemonize", action="store_true",
                   help="return once every daemon has reported in")
    s.add_argument("--uri-file", help="also write the URI to this file (mode 0600)")
    s.add_argument("--data-server-uri", help="relay every data request to this DVM")
    s.add_argument("--log-dir", help="one log file per process here (default stderr)")
    s.add_argument("--bind", default=os.environ.get("PYDVM_BIND", "127.0.0.1"),
                   help="address the master listens on (default 127.0.0.1)")
    s.add_argument("--multi-user", action="store_true",
                   help="(root) serve every local user; jobs run as their submitter")
    s.add_argument("--port", type=int, default=0,
                   help="port the master listens on (default: any free port)")
    s.add_argument("--dvm-id", type=_dvm_id,
                   help="reuse this DVM id, so a restarted DVM keeps its URI")
    s.set_defaults(func=cmd_start)

    s = sub.add_parser("run", help="run one job (see 'pydvm run --help')", add_help=False)
    s.set_defaults(func=None)

    for name, helptext, func in (("stop", "stop a DVM", cmd_stop),
                                 ("store", "show every store's contents", cmd_store),
                                 ("info", "show parameters and nodes", cmd_info)):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("--dvm", help="DVM URI (default $PYDVM_URI)")
        if name == "store":
            s.add_argument("--json", action="store_true")
        s.set_defaults(func=func)

    s = sub.add_parser("session", help="create or end a session")
    ssub = s.add_subparsers(dest="action", required=True)
    sn = ssub.add_parser("new")
    sn.add_argument("--hosts")
    sn.add_argument("--dvm")
    se = ssub.add_parser("end")
    se.add_argument("id")
    se.add_argument("--dvm")
    s.set_defaults(func=cmd_session)

    s = sub.add_parser("daemon", help="run one daemon (what launchers run)")
    s.add_argument("--master", required=True)
    s.add_argument("--node", required=True)
    s.add_argument("--log-dir")
    s.set_defaults(func=cmd_daemon)

    ranges = [r.word for r in Range]
    s = sub.add_parser("publish", help="publish K=V pairs (inside a job)")
    s.add_argument("pairs", nargs="+", metavar="K=V")
    s.add_argument("--range", default="session", choices=ranges)
    s.add_argument("--persistence", choices=[p.word for p in Persistence
                                             if p is not Persistence.INVALID])
    s.add_argument("--access-uid", type=int, action="append", default=[])
    s.add_argument("--access-gid", type=int, action="append", default=[])
    s.add_argument("--replace", action="store_true")
    s.add_argument("--hold", type=float, default=0.0)
    s.set_defaults(func=cmd_publish)

    s = sub.add_parser("lookup", help="look keys up (inside a job)")
    s.add_argument("keys", nargs="+", metavar="K")
    s.add_argument("--range", default="session", choices=ranges)
    s.add_argument("--wait", action="store_true")
    s.add_argument("--wait-count", type=int)
    s.add_argument("--timeout", type=float)
    s.set_defaults(func=cmd_lookup)

    s = sub.add_parser("unpublish", help="unpublish keys, or everything (inside a job)")
    s.add_argument("keys", nargs="*", metavar="K")
    s.set_defaults(func=cmd_unpublish)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv and argv[0] == "run":
            return cmd_run(argv[1:])
        parser = build_parser()
        a = parser.parse_args(argv)
        if not getattr(a, "func", None):
            parser.print_help()
            return 2
        return a.func(a)
    except BrokenPipeError:
        # Our stdout's reader went away (``pydvm info | head``): stop quietly,
        # with the status SIGPIPE would have given.
        from .tool import _silence

        _silence(1)
        return 128 + 13


if __name__ == "__main__":
    sys.exit(main())
