"""Starting daemons: the ``local`` and ``ssh`` launchers, and logging set-up.

Both launchers run ``python -m pydvm daemon --master URI --node NAME``; the
``ssh`` one prefixes it with the ``plm_ssh_agent`` command and the host name
(``ssh n1 ...`` on a cluster, ``ip netns exec n1 ...`` for network-namespace
test hosts).  The DVM secret is written to the daemon's standard input, so
it never appears in a process listing.  On the remote side the daemon is
found as the same Python interpreter path as the master's (a shared install
or identical images); ``pydvm_remote_python`` overrides it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import sys
from pathlib import Path

LAUNCHERS = ("local", "ssh")

log = logging.getLogger("pydvm.launch")


def daemon_argv(
    launcher: str, host: str, master_uri: str, agent: str, log_dir: str | None,
    remote_python: str = "",
) -> list[str]:
    python = remote_python or sys.executable
    cmd = [python, "-m", "pydvm", "daemon", "--master", master_uri, "--node", host]
    if log_dir:
        cmd += ["--log-dir", log_dir]
    if launcher == "local":
        return cmd
    if launcher == "ssh":
        return shlex.split(agent) + [host] + cmd
    raise ValueError(f"unknown launcher {launcher!r}; expected one of {', '.join(LAUNCHERS)}")


async def start_daemon(argv: list[str], secret: bytes) -> asyncio.subprocess.Process:
    """Start one daemon process and hand it the secret on stdin."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=None,
        start_new_session=True,
    )
    assert proc.stdin is not None
    proc.stdin.write(secret.hex().encode() + b"\n")
    try:
        await proc.stdin.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass
    proc.stdin.close()
    return proc


def setup_logging(name: str, log_dir: str | None, verbose: int = 0) -> None:
    """Log to ``LOG_DIR/NAME.log`` if given, else to stderr.

    The store's trace (``pydvm.store`` at INFO) is shown when
    ``prte_data_server_verbose`` is above 0.
    """
    root = logging.getLogger("pydvm")
    for h in list(root.handlers):
        root.removeHandler(h)
    if log_dir:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        handler: logging.Handler = logging.FileHandler(os.path.join(log_dir, f"{name}.log"))
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(
        f"%(asctime)s {name} %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    root.propagate = False
    logging.getLogger("pydvm.store").setLevel(logging.INFO if verbose > 0 else logging.WARNING)
    if os.environ.get("PYDVM_DEBUG"):
        root.setLevel(logging.DEBUG)
