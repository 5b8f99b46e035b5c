"""The ``pydvm`` command line (SPEC 9).

DVM-level commands (``start``, ``run``, ``stop``, ``session``, ``store``,
``info``, ``daemon``), commands to find DVMs and jobs (``dvms``, ``ps``,
``kill``) and in-job commands for scripts (``publish``, ``lookup``,
``unpublish``).

What is printed is formatted in :mod:`pydvm.cli_format`; help texts and
argument checks are in :mod:`pydvm.cli_help`; finding DVMs (``dvms``, stale
URIs, a second ``start``, the one-shot data-loss warning) in
:mod:`pydvm.cli_dvms`; the in-job commands in :mod:`pydvm.cli_injob`.  Exit status 2 is a usage error, reported before the
command does anything.
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

from . import cli_format as F
from . import params as P
from .cli_help import (ACCESS_HELP, LOOKUP_OUTPUT_HELP, MAIN_DESCRIPTION, MAIN_EPILOG,
                       PERSISTENCES_HELP, PUBLISH_VALUES_HELP, RANGES_HELP, RUN_HELP, RUN_USAGE,
                       count, id_number, port, seconds)
from .cli_injob import cmd_lookup, cmd_publish, cmd_unpublish
from .enums import Persistence, Range

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


def _tool_failed(exc: Exception, dvm_option: str | None) -> int:
    """Report a failed tool command: a URI nobody answers at gets an
    explanation naming where the URI came from (``--dvm`` or
    ``PYDVM_URI``) and what to do; a malformed URI is a usage error."""
    from .cli_dvms import unreachable_lines
    from .runtime.auth import UriError
    from .tool import DvmUnreachable

    if isinstance(exc, DvmUnreachable):
        sys.stderr.write("".join(f"{ln}\n" for ln in
                                 unreachable_lines(exc.uri, str(exc), from_env=not dvm_option)))
        return 1
    if isinstance(exc, UriError):
        where = "--dvm" if dvm_option else "PYDVM_URI"
        return _fail(f"{where}: {exc}", 2)
    return _fail(str(exc))


# ----------------------------------------------------------------------
# start / daemon
# ----------------------------------------------------------------------


def _hosts(text: str | None):
    from .runtime.jobs import HostSpec, parse_hosts

    if text:
        return parse_hosts(text)
    return [HostSpec(socket.gethostname(), os.cpu_count() or 1)]


def _resolve_params(mca: list[list[str]] | None) -> dict[str, P.Resolved]:
    _warn_ignored_env()
    return P.resolve([(n, v[1:] if v.startswith(" -") else v) for n, v in (mca or [])])


def _warn_ignored_env() -> None:
    """One stderr line per ``PRTE_MCA_*`` variable that looks meant for pydvm
    but names none of its parameters (:func:`pydvm.params.ignored_env_warnings`)."""
    for line in P.ignored_env_warnings():
        sys.stderr.write(f"pydvm: {line}\n")


def _mca_values_verbatim(argv: list[str]) -> list[str]:
    """``--mca plm_slurm_args --exclusive``: argparse would take a value that
    starts with '-' for an option and refuse the line, so such a value gets a
    leading space here, which :func:`_resolve_params` takes off again."""
    out = list(argv)
    i = 0
    while i < len(out) and out[i] != "--":
        if out[i] == "--mca" and i + 2 < len(out):
            if out[i + 2].startswith("-"):
                out[i + 2] = " " + out[i + 2]
            i += 3
        else:
            i += 1
    return out


def _start_hosts(text: str | None, launcher: str | None, env):
    """The hosts and the launcher of a DVM started with ``--hosts text``
    and ``--launcher launcher`` in environment ``env``.

    Inside a Slurm allocation (``SLURM_JOB_ID`` set) the launcher defaults
    to ``slurm`` and the hosts to the allocation's nodes with their slots;
    ``--hosts`` then picks some of them (one refused if not allocated).
    Elsewhere: ``local``, this machine.  Raises ValueError with the reason.
    """
    from .runtime.jobs import parse_hosts
    from .runtime.launch import LAUNCHERS, make_launcher
    from .runtime.slurm import allocation_from_env, in_allocation, select_hosts

    if launcher is None:
        launcher = "slurm" if in_allocation(env) else "local"
    if launcher not in LAUNCHERS:
        raise ValueError(f"unknown launcher {launcher!r}; expected one of {', '.join(LAUNCHERS)}")
    if launcher != "slurm":
        return _hosts(text), make_launcher(launcher, "--hosts" if text else "this machine")
    if not in_allocation(env):
        raise ValueError("--launcher slurm needs a Slurm allocation, and SLURM_JOB_ID is not "
                         "set: run pydvm inside salloc or an sbatch script")
    alloc = allocation_from_env(env)
    if not text:
        return list(alloc.nodes), make_launcher("slurm", alloc.source)
    hosts = select_hosts(alloc, parse_hosts(text))
    return hosts, make_launcher("slurm", f"{alloc.source}, --hosts {text}")


def _bind(given: str | None, launcher) -> str:
    """The address the master listens on: ``--bind``, else ``PYDVM_BIND``,
    else all interfaces for the Slurm launcher (the nodes must reach it; the
    URI then names this host by its hostname), else 127.0.0.1."""
    if given:
        return given
    if os.environ.get("PYDVM_BIND"):
        return os.environ["PYDVM_BIND"]
    return "0.0.0.0" if launcher.name == "slurm" else "127.0.0.1"


def cmd_start(a: argparse.Namespace) -> int:
    try:
        hosts, launcher = _start_hosts(a.hosts, a.launcher, os.environ)
        resolved = _resolve_params(a.mca)
    except ValueError as exc:
        return _fail(str(exc), 2)
    a.bind = _bind(a.bind, launcher)
    if a.daemonize:
        return _daemonize(a, hosts, launcher, resolved)
    return run_async(_serve(a, hosts, launcher, resolved, ready_fd=None), profile_name="master")


async def _serve(a, hosts, launcher, resolved, ready_fd: int | None) -> int:
    import signal

    from .runtime.launch import setup_logging
    from .runtime.master import Master, StartError

    setup_logging("master", a.log_dir, resolved["prte_data_server_verbose"].value)
    from .runtime.auth import DvmUri, UriError

    try:
        ds = DvmUri.parse(a.data_server_uri) if a.data_server_uri else None
    except UriError as exc:
        return _fail(str(exc), 2)
    master = Master(hosts, launcher, resolved, bind=a.bind, log_dir=a.log_dir,
                    data_server=ds, port=a.port, dvmid=a.dvm_id, multi_user=a.multi_user,
                    metrics=a.metrics)
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


def _daemonize(a, hosts, launcher, resolved) -> int:
    import secrets

    from .runtime.launch import default_log_dir

    if not a.log_dir:  # a detached DVM has no terminal: it logs to its own directory
        a.dvm_id = a.dvm_id or secrets.token_hex(4)
        try:
            a.log_dir = str(default_log_dir(a.dvm_id))
        except OSError as exc:
            return _fail(f"cannot create the DVM's log directory: {exc}")
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
            code = run_async(_serve(a, hosts, launcher, resolved, ready_fd=w),
                             profile_name="master")
        finally:
            os._exit(0)
        os._exit(code)
    os.close(w)
    os.waitpid(pid, 0)
    with os.fdopen(r) as f:
        text = f.read().strip()  # an error may run to several lines (a daemon's stderr)
    if text.startswith("OK "):
        print(text[3:], flush=True)
        return 0
    if text.startswith("ERR "):
        return _fail(f"cannot start the DVM: {text[4:]}")
    return _fail(f"the DVM exited during start-up (see {a.log_dir})")


def cmd_daemon(a: argparse.Namespace) -> int:
    from .runtime.daemon import run_daemon
    from .runtime.launch import setup_logging

    from .runtime.guard import Guardian

    # Under the slurm launcher every task runs the same command: the node
    # name is the one slurmstepd gives the task.
    node = a.node or os.environ.get("SLURMD_NODENAME", "").strip()
    if not node:
        return _fail("daemon: no node name: give --node NAME (SLURMD_NODENAME, which Slurm "
                     "sets in a job step, is not set either)", 2)
    setup_logging(node, a.log_dir)
    line = sys.stdin.readline().strip()
    try:
        secret = bytes.fromhex(line)
    except ValueError:
        return _fail("daemon: expected the DVM secret on standard input")
    guardian = Guardian()
    guardian.start()  # before any thread or event loop exists
    try:
        return run_async(run_daemon(a.master, node, secret, guardian), profile_name=node)
    finally:
        guardian.close()


# ----------------------------------------------------------------------
# run
# ----------------------------------------------------------------------

def parse_run(argv: list[str]) -> dict[str, Any]:
    """Parse ``pydvm run`` arguments (MPMD contexts separated by ':')."""
    from .runtime.jobs import parse_hosts

    opts: dict[str, Any] = {"dvm": None, "session": None, "mca": [], "tag_output": False,
                            "abort_on_failure": None, "apps": [], "pmix": False}
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
            elif idx == 0 and name in ("--abort-on-failure", "--no-abort-on-failure"):
                want = name == "--abort-on-failure"
                if opts["abort_on_failure"] is not None and opts["abort_on_failure"] != want:
                    raise ValueError("--abort-on-failure and --no-abort-on-failure "
                                     "contradict each other")
                opts["abort_on_failure"] = want
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
        if argv:
            print(RUN_HELP)
            return 0
        sys.stderr.write("pydvm run: nothing to run: give a command, such as "
                         f"'pydvm run -n 2 hostname' ('pydvm run --help' says more)\n{RUN_USAGE}\n")
        return 2
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
                                     abort_on_failure=opts["abort_on_failure"],
                                     pmix=opts["pmix"]))
        except (ToolError, ValueError) as exc:
            return _tool_failed(exc, opts["dvm"])
    if opts["session"] is not None:
        return _fail("--session needs a persistent DVM (--dvm URI or PYDVM_URI)", 2)
    try:
        resolved = _resolve_params(opts["mca"])
    except ValueError as exc:
        return _fail(str(exc), 2)
    return run_async(_one_shot(opts, resolved))


def _one_shot_hosts(named: list[str], env):
    """Nodes and launcher of a one-shot DVM whose apps name hosts ``named``.

    Outside a Slurm allocation, hosts named by ``--host`` become local
    daemons of those names (else one daemon, this machine).  Inside one,
    the DVM runs on the allocation through the slurm launcher: on the named
    nodes (each must be allocated), else on every allocated node.
    """
    from .runtime.jobs import HostSpec
    from .runtime.launch import make_launcher
    from .runtime.slurm import allocation_from_env, in_allocation, select_hosts

    if not in_allocation(env):
        hosts = [HostSpec(n, 1) for n in named] if named else _hosts(None)
        return hosts, make_launcher("local", "--host" if named else "this machine")
    alloc = allocation_from_env(env)
    if not named:
        return list(alloc.nodes), make_launcher("slurm", alloc.source)
    select_hosts(alloc, [HostSpec(n) for n in named])  # refuses a host not allocated
    return ([HostSpec(n, alloc.slots(n)) for n in named],
            make_launcher("slurm", f"{alloc.source}, --host {','.join(named)}"))


async def _one_shot(opts: dict, resolved) -> int:
    """Run one job on a private DVM on this machine, then take it down."""
    from .cli_dvms import one_shot_warning
    from .runtime.launch import setup_logging
    from .runtime.master import Master, StartError
    from .tool import ToolError, run_job

    setup_logging("pydvm-run", None, resolved["prte_data_server_verbose"].value)
    named = sorted({h[0] for a in opts["apps"] for h in (a["hosts"] or [])})
    try:
        hosts, launcher = _one_shot_hosts(named, os.environ)
    except ValueError as exc:
        return _fail(str(exc), 2)
    master = Master(hosts, launcher, resolved, bind=_bind(None, launcher))
    try:
        uri = await master.start()
    except (StartError, OSError) as exc:
        return _fail(f"cannot start the one-shot DVM: {exc}")
    try:
        code = await run_job(uri, opts["apps"], None, opts["tag_output"],
                             abort_on_failure=opts["abort_on_failure"], pmix=opts["pmix"])
        warning = await one_shot_warning(uri)
        if warning:
            sys.stderr.write(f"{warning}\n")
        return code
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
        return _tool_failed(exc, a.dvm)
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
            msg = {"t": "session_new", "hosts": hosts}
        else:
            msg = {"t": "session_end", "session": int(a.id)}
    except ValueError as exc:
        if a.action == "end":
            return _fail(f"session end needs a session id, not {a.id!r}", 2)
        return _fail(f"session new: {exc}", 2)
    try:
        r = _tool(a, msg)
    except (ToolError, ValueError) as exc:
        return _tool_failed(exc, a.dvm)
    if a.action == "new":
        print(r["session"], flush=True)
    return 0


def cmd_ps(a: argparse.Namespace) -> int:
    from .tool import ToolError

    try:
        r = _tool(a, {"t": "ps"})
    except (ToolError, ValueError) as exc:
        return _tool_failed(exc, a.dvm)
    jobs = r.get("jobs") or []
    if a.json:
        print(json.dumps({"jobs": jobs}))
    else:
        print("\n".join(F.ps_lines(jobs)))
    return 0


def cmd_kill(a: argparse.Namespace) -> int:
    """End each named job; return once every one has ended (its processes
    reaped, its data purged).  Exit 1 if any could not be killed."""
    from .runtime.auth import UriError
    from .tool import DvmUnreachable, ToolError

    code = 0
    for ns in a.nspace:
        try:
            _tool(a, {"t": "kill_job", "nspace": ns, "wait": True})
        except (ToolError, ValueError) as exc:
            code = _tool_failed(exc, a.dvm)
            if isinstance(exc, (DvmUnreachable, UriError)) or code == 2:
                return code  # no DVM to ask about the rest
    return code


def cmd_store(a: argparse.Namespace) -> int:
    from .tool import ToolError

    try:
        ask = {"t": "store"}
        if a.prefix is not None:
            ask["prefix"] = a.prefix
        r = _tool(a, ask)
    except (ToolError, ValueError) as exc:
        return _tool_failed(exc, a.dvm)
    stores = r["stores"]
    if a.json:
        print(json.dumps({"stores": stores}))
        return 0
    print("\n".join(F.store_lines(stores)))
    return 0


def cmd_info(a: argparse.Namespace) -> int:
    from .tool import ToolError

    if a.dvm or os.environ.get("PYDVM_URI"):
        try:
            r = _tool(a, {"t": "info"})
        except (ToolError, ValueError) as exc:
            return _tool_failed(exc, a.dvm)
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
        _print_pmix(r.get("pmix"))
        rows = [(k, v[0], v[1], v[2]) for k, v in r["params"].items()]
    else:
        _warn_ignored_env()
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
# argument parsing
# ----------------------------------------------------------------------


def _dvm_id(text: str) -> str:
    import re

    if not re.fullmatch(r"[A-Za-z0-9_-]{1,32}", text):
        raise argparse.ArgumentTypeError("a DVM id is 1-32 letters, digits, '-' or '_'")
    return text


def _dvm_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dvm", metavar="URI",
                   help="the DVM to talk to (default: $PYDVM_URI; 'pydvm dvms' lists yours)")


def _json_option(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--json", action="store_true", help=f"print {what} as one JSON object")


def _parser(sub, name: str, help_: str, description: str = "", epilog: str = ""):
    """A subcommand whose description is one paragraph (wrapped here) and
    whose epilog is laid out already (tables of words and their meaning)."""
    import textwrap

    return sub.add_parser(name, help=help_, description=textwrap.fill(description or help_, 79),
                          epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)


def _metrics_address(text: str) -> tuple[str, int]:
    from .runtime.metrics import parse_address

    try:
        return parse_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .cli_dvms import cmd_dvms

    p = argparse.ArgumentParser(prog="pydvm", description=MAIN_DESCRIPTION, epilog=MAIN_EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"pydvm {__version__}",
                   help="print pydvm's version and exit")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")

    s = _parser(sub, "start", "start a persistent DVM and print its URI",
                "Start a persistent DVM and print its URI (tcp://HOST:PORT/ID) on one line. "
                "If PYDVM_URI already names a running DVM of yours, a warning naming it goes "
                "to stderr: both keep running and 'pydvm dvms' lists them.")
    s.add_argument("--hosts", metavar="H[:SLOTS],...",
                   help="nodes of the DVM, one daemon each (default: this machine, one slot "
                        "per CPU; a listed host has one slot unless given)")
    s.add_argument("--launcher",
                   help="how daemons start: local (on this machine, named after the hosts), "
                        "ssh (AGENT HOST python -m pydvm daemon ...), or slurm (one srun "
                        "step; the default inside a Slurm allocation, else local)")
    s.add_argument("--mca", nargs=2, action="append", metavar=("NAME", "VALUE"),
                   help="set a parameter for the whole DVM (repeatable; 'pydvm info' lists "
                        "them with their meaning and range)")
    s.add_argument("--daemonize", action="store_true",
                   help="run in the background; return once every daemon has reported in")
    s.add_argument("--uri-file", metavar="F", help="also write the URI to F (mode 0600)")
    s.add_argument("--data-server-uri", metavar="URI",
                   help="keep no store: relay every data request to the DVM at URI")
    s.add_argument("--log-dir", metavar="D",
                   help="one log file per process in D (default: stderr; with --daemonize, "
                        "$PYDVM_STATE_DIR/logs/DVMID)")
    s.add_argument("--bind", metavar="ADDR",
                   help="address the master listens on, which the URI carries (default "
                        "$PYDVM_BIND, else all interfaces with the slurm launcher, else "
                        "127.0.0.1)")
    s.add_argument("--multi-user", action="store_true",
                   help="(root) serve every local user; jobs run as their submitter")
    s.add_argument("--port", type=port, default=0, metavar="P",
                   help="port the master listens on, 0-65535 (default 0: any free port)")
    s.add_argument("--dvm-id", type=_dvm_id, metavar="ID",
                   help="the DVM's id (1-32 letters, digits, '-', '_'); reusing one keeps the "
                        "URI across restarts; refused while a DVM of that id runs")
    s.add_argument("--metrics", type=_metrics_address, metavar="ADDR:PORT",
                   help="serve Prometheus metrics at http://ADDR:PORT/metrics")
    s.set_defaults(func=cmd_start)

    s = sub.add_parser("run", help="run one job (see 'pydvm run --help')", add_help=False)
    s.set_defaults(func=None)

    s = _parser(sub, "dvms", "list your running DVMs",
                "List this user's running DVMs on this machine: id, URI, hosts, start time "
                "and jobs running ('?' if the DVM did not answer).  Records of DVMs that "
                "have ended are dropped.  The DVM PYDVM_URI names is marked '*'.")
    _json_option(s, "the list")
    s.add_argument("-q", "--quiet", action="store_true", help="print only the URIs, one a line")
    s.set_defaults(func=cmd_dvms)

    s = _parser(sub, "ps", "list the DVM's jobs",
                "List the DVM's running jobs, every user's: namespace, user, session, state "
                "(starting, running, killing, ending), start time, ranks per node (NODE:N) "
                "and app contexts.")
    _dvm_option(s)
    _json_option(s, "the jobs")
    s.set_defaults(func=cmd_ps)

    s = _parser(sub, "kill", "end jobs",
                "End each job named (its processes get SIGTERM, then SIGKILL); return once "
                "it has ended and its data has been purged.  Its pydvm run says it was "
                "killed by 'pydvm kill'.  Your own jobs; root and the DVM's owner may kill "
                "any.  Exit 1 if a job could not be killed.")
    s.add_argument("nspace", nargs="+", metavar="NSPACE", help="a job's namespace (pydvm ps)")
    _dvm_option(s)
    s.set_defaults(func=cmd_kill)

    s = _parser(sub, "stop", "stop a DVM",
                "Stop a DVM: end its jobs (their pydvm run says the DVM was stopped), shut "
                "every daemon down; return once every process of the DVM has exited.")
    _dvm_option(s)
    s.set_defaults(func=cmd_stop)

    s = _parser(sub, "store", "show every store's contents",
                "Show every store (the master's, each node's): items, waiting lookups, "
                "evictions, expiries and bytes per uid; then each of your own keys with "
                "its persistence, range, time since last access, time until the idle "
                "timeout removes it, size and publisher.  Other users' keys are counted, "
                "never named.")
    _dvm_option(s)
    _json_option(s, "every store")
    s.add_argument("--prefix", metavar="P",
                   help="list only your keys starting with P, in sorted order (e.g. "
                        "'torch/' for the keys of PyTorch stores); the counts stay whole")
    s.set_defaults(func=cmd_store)

    s = _parser(sub, "info", "show parameters and nodes",
                "Show the DVM's nodes and parameters (each value and where it came from); "
                "without a DVM, the values a DVM started here would get.")
    _dvm_option(s)
    s.set_defaults(func=cmd_info)

    s = _parser(sub, "session", "create or end a session")
    ssub = s.add_subparsers(dest="action", required=True, metavar="ACTION")
    sn = _parser(ssub, "new", "create a session and print its id",
                 "Create a session over some nodes and print its id alone on one line.")
    sn.add_argument("--hosts", metavar="H[:SLOTS],...",
                    help="nodes of the session (default: every node that is up)")
    _dvm_option(sn)
    se = _parser(ssub, "end", "end a session",
                 "End a session: kill its jobs (their pydvm run says so), purge its "
                 "SESSION items everywhere; return once that is done.")
    se.add_argument("id", metavar="ID", help="the session id 'session new' printed")
    _dvm_option(se)
    s.set_defaults(func=cmd_session)

    s = _parser(sub, "daemon", "run one daemon (what launchers run)",
                "Run one node's daemon; it reads the DVM secret on standard input.  "
                "Launchers run this; people rarely do.")
    s.add_argument("--master", required=True, metavar="URI", help="the master's URI")
    s.add_argument("--node", metavar="NAME",
                   help="this node's name (default $SLURMD_NODENAME)")
    s.add_argument("--log-dir", metavar="D", help="write the log to D/NAME.log")
    s.set_defaults(func=cmd_daemon)

    ranges = [r.word for r in Range]
    persistences = [p.word for p in Persistence if p is not Persistence.INVALID]
    s = _parser(sub, "publish", "publish K=V pairs (inside a job)",
                "Publish K=V pairs as one item (inside a job: it acts as its process).",
                f"{PUBLISH_VALUES_HELP}\n\n{RANGES_HELP}\n\n{PERSISTENCES_HELP}\n\n"
                f"{ACCESS_HELP}")
    s.add_argument("pairs", nargs="+", metavar="K=V", help="K=V (with --files also K=@FILE or K=-; see below)")
    s.add_argument("--range", default="session", choices=ranges, metavar="R",
                   help="who may see it (default session; see below)")
    s.add_argument("--persistence", choices=persistences, metavar="P",
                   help="how long it lives (default nspace; see below)")
    s.add_argument("--access-uid", type=id_number, action="append", default=[], metavar="U",
                   help="a uid that may read it (repeatable)")
    s.add_argument("--access-gid", type=id_number, action="append", default=[], metavar="G",
                   help="a gid that may read it (repeatable)")
    s.add_argument("--replace", action="store_true",
                   help="replace your own items holding these keys (else PMIX_ERR_DUPLICATE_KEY)")
    s.add_argument("--files", action="store_true",
                   help="read K=@FILE from FILE and K=- from standard input, as bytes")
    s.add_argument("--hold", type=seconds, default=0.0, metavar="SECONDS",
                   help="stay alive this long after publishing (>= 0), so PROC items live on")
    s.set_defaults(func=cmd_publish)

    s = _parser(sub, "lookup", "look keys up (inside a job)",
                "Look keys up (inside a job: it asks as its process).",
                f"{LOOKUP_OUTPUT_HELP}\n\n{RANGES_HELP}")
    s.add_argument("keys", nargs="+", metavar="K", help="a key to look up")
    s.add_argument("--range", default="session", choices=ranges, metavar="R",
                   help="whose items to search (default session; see below)")
    s.add_argument("--wait", action="store_true",
                   help="wait until every key is published (see --timeout)")
    s.add_argument("--wait-count", type=count, metavar="N",
                   help="wait until N of the keys are published (0: all)")
    s.add_argument("--timeout", type=seconds, metavar="S",
                   help="give up waiting after S seconds (PMIX_ERR_TIMEOUT); 0, as PMIx's "
                        "PMIX_TIMEOUT 0, means no limit, the default (not to wait, leave "
                        "out --wait)")
    _json_option(s, "the answer")
    s.set_defaults(func=cmd_lookup)

    s = _parser(sub, "unpublish", "unpublish keys, or everything (inside a job)",
                "Remove the named keys from every item you own (whoever published them); "
                "with no key, everything this process published.  Prints STATUS; exit 0.")
    s.add_argument("keys", nargs="*", metavar="K", help="a key to remove")
    s.set_defaults(func=cmd_unpublish)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv and argv[0] == "run":
            return cmd_run(argv[1:])
        parser = build_parser()
        if argv and argv[0] == "start":
            argv = _mca_values_verbatim(argv)
        a = parser.parse_args(argv)
        if not getattr(a, "func", None):
            parser.print_help()
            return 2
        if a.cmd == "start":
            from .cli_dvms import warn_before_second_start

            warn_before_second_start(a)
        return a.func(a)
    except BrokenPipeError:
        # Our stdout's reader went away (``pydvm info | head``): stop quietly,
        # with the status SIGPIPE would have given.
        from .tool import _silence

        _silence(1)
        return 128 + 13


if __name__ == "__main__":
    sys.exit(main())
