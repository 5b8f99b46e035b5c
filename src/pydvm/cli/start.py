"""``pydvm start`` and ``pydvm daemon``: a DVM's master and its daemons.

Also the event loop every asyncio command runs on (:func:`run_async`) and
the DVM parameters a start (or a one-shot ``pydvm run``) resolves from
``--mca`` and the environment.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from typing import Any

from .. import params as P
from .common import fail as _fail

# ----------------------------------------------------------------------
# event loop
# ----------------------------------------------------------------------


def run_async(coro, profile_name: str = "") -> Any:
    """Run ``coro`` on uvloop when available (unless PYDVM_NO_UVLOOP is set).

    With ``PYDVM_PROFILE_DIR`` set, a master or daemon runs under cProfile and
    writes ``<dir>/<name>.prof`` when it exits (for performance work); with
    ``PYDVM_PROFILE_CLOCK=cpu`` it counts the loop thread's CPU time instead
    of wall time (waits for the scheduler, for a CPU, do not count).
    """
    prof_dir = os.environ.get("PYDVM_PROFILE_DIR")
    if prof_dir and profile_name:
        import cProfile

        import time

        cpu = os.environ.get("PYDVM_PROFILE_CLOCK") == "cpu"
        pr = cProfile.Profile(time.thread_time) if cpu else cProfile.Profile()
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



# ----------------------------------------------------------------------
# start / daemon
# ----------------------------------------------------------------------


def _hosts(text: str | None):
    from ..runtime.shared.jobs import HostSpec, parse_hosts

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
    from ..runtime.shared.jobs import parse_hosts
    from ..runtime.master import LAUNCHERS, make_launcher
    from ..runtime.master import allocation_from_env, in_allocation, select_hosts

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


def cmd_start(a) -> int:
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

    from ..runtime.shared.logs import setup_logging
    from ..runtime.master import Master, StartError

    setup_logging("master", a.log_dir, resolved["prte_data_server_verbose"].value)
    from ..runtime.shared.auth import DvmUri, UriError

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

    from ..runtime.master import default_log_dir

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


def cmd_daemon(a) -> int:
    from ..runtime.node import run_daemon
    from ..runtime.shared.logs import setup_logging

    from ..runtime.shared.guard import Guardian

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

