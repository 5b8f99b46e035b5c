"""The job API's connection to a DVM's master, and starting a DVM of one's own.

What :func:`pydvm.client.jobs.connect` and :func:`~pydvm.client.jobs.start`
do before there is a :class:`~pydvm.client.jobs.Dvm`: reach the master as
``pydvm run`` does (:mod:`pydvm.client.connect`: the DVM's secret, or a
multi-user DVM's tool socket), answer its challenge, and run ``pydvm start
--daemonize``.
"""

from __future__ import annotations

from ..errors import UnreachableError
from ..protocol import DvmUri, FrameDecoder

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def open_tool(uri: "str | None", timeout: float
              ) -> tuple[Any, DvmUri, str, FrameDecoder, list, Any]:
    """A connection to the master of the DVM at ``uri`` (default
    ``$PYDVM_URI``), let in as a tool: the socket (blocking), the URI, the
    master's name for messages, the frame decoder, what came after the
    welcome and the link's box (None: clear; :mod:`pydvm.seal`).
    UnreachableError if no DVM answers or it refuses us."""
    from .connect import DvmError, connect_socket, handshake, resolve_uri

    try:
        parsed = resolve_uri(uri)
        sock, secret, name = connect_socket(parsed)
    except DvmError as exc:
        raise UnreachableError(str(exc)) from None
    try:
        dec, early, box = handshake(sock, parsed, secret, name, timeout)
    except DvmError as exc:
        sock.close()
        raise UnreachableError(str(exc)) from None
    except BaseException:
        sock.close()
        raise
    return sock, parsed, name, dec, early, box


def start_dvm(hosts: Any, params: dict[str, Any], args: Any, timeout: float) -> str:
    """Run ``pydvm start --daemonize`` (see :func:`pydvm.client.jobs.start`);
    the URI it prints.  RuntimeError with its words if it fails."""
    import subprocess
    import sys

    # Started from /, with -P: the caller's working directory is not on the
    # import path of the DVM's master and daemons, so a script of the
    # caller's named like a module they import (queue.py) is never run by
    # them -- or made to start a DVM in turn.  Paths in ``args``: absolute.
    argv = [sys.executable, "-P", "-m", "pydvm", "start", "--daemonize"]
    if hosts is not None:
        argv += ["--hosts", hosts if isinstance(hosts, str) else ",".join(hosts)]
    for k, v in params.items():
        argv += ["--mca", k, str(v)]
    argv += list(args)
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL, cwd="/")
    if p.returncode != 0 or not p.stdout.strip():
        raise RuntimeError(p.stderr.strip() or f"pydvm start exited {p.returncode}")
    return p.stdout.strip().splitlines()[-1]


def stop_dvm(uri: str, timeout: float) -> None:
    """``pydvm stop`` the DVM at ``uri`` (a start whose connection failed)."""
    import subprocess
    import sys

    subprocess.run([sys.executable, "-P", "-m", "pydvm", "stop", "--dvm", uri],
                   capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL, cwd="/")
