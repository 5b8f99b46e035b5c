"""Private directories for listening Unix sockets, and sweeping dead ones.

A node's client socket and the master's direct-data socket each live in a
directory of their own under ``$TMPDIR/pydvm-<uid>`` (``-mu`` for a
multi-user DVM), holding an ``owner`` file (``PID STARTTIME``).  Whoever
makes a new one first removes those whose owner process is gone: a DVM
killed with SIGKILL leaves nothing behind for long.  The jobs' shared-memory
directories (``/dev/shm``) are made the same way.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from .auth import host_identity

#: A socket directory without an owner file is left alone this long (its
#: daemon may be creating it right now).
STALE_GRACE = 60.0


def make_socket_dir(dvmid: str, label: str, multi_user: bool,
                    root: str | None = None) -> Path:
    """A private directory for a listening Unix socket (a node's client
    socket, the master's direct-data socket), after removing those left by
    processes that died (their ``owner`` process is gone).

    Single-user: only the DVM's user can enter it (under
    ``$TMPDIR/pydvm-<uid>``, 0700).  Multi-user: job processes of every
    user must reach the socket, so the directory is traversable (not
    listable) and the socket open to all -- identity comes from SO_PEERCRED
    (and, on the direct-data socket, a credential) and is checked against
    the job's owner; those live under ``$TMPDIR/pydvm-<uid>-mu`` (0711), a
    base of their own, so that a single-user DVM of the same user never
    closes it to the others.  ``root`` replaces ``$TMPDIR`` (``/dev/shm``
    for the jobs' shared-memory directories).
    """
    mode = 0o711 if multi_user else 0o700
    suffix = "-mu" if multi_user else ""
    base = Path(root or tempfile.gettempdir()) / f"pydvm-{os.getuid()}{suffix}"
    base.mkdir(mode=mode, exist_ok=True)
    if base.stat().st_mode & 0o777 != mode:
        os.chmod(base, mode)
    remove_stale_socket_dirs(base)
    d = Path(tempfile.mkdtemp(prefix=f"{dvmid}-{label}-", dir=base))
    # written whole or not at all: other DVMs' processes sweep this directory
    tmp = d / "owner.tmp"
    tmp.write_text(_process_identity(os.getpid()))
    tmp.rename(d / "owner")
    os.chmod(d, mode)
    return d


def same_host_socket(offer: object) -> str:
    """The master's direct-data socket path from a welcome's ``direct_unix``
    offer, if the master runs on this machine as this process sees it
    (:func:`~pydvm.runtime.shared.auth.host_identity`); else ""."""
    if not isinstance(offer, dict):
        return ""
    path, host = offer.get("path"), offer.get("host")
    if not (isinstance(path, str) and isinstance(host, str) and host):
        return ""
    return path if host == host_identity() else ""


def _process_identity(pid: int) -> str:
    """``PID STARTTIME``: names one process even if its pid is reused later."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            start = f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        start = "?"
    return f"{pid} {start}"


def remove_stale_socket_dirs(base: Path) -> list[Path]:
    """Remove socket directories under ``base`` whose daemon is dead.

    Each daemon writes ``owner`` (``PID STARTTIME``) into its directory; a
    directory whose owner process no longer exists (or is another process
    under a reused pid) is a dead DVM's.  One without an owner file, or with
    one not yet written whole, is left alone for :data:`STALE_GRACE` seconds.
    Returns what was removed.
    """
    removed = []
    try:
        entries = list(base.iterdir())
    except OSError:
        return removed
    now = time.time()
    for d in entries:
        if not d.is_dir():
            continue
        try:
            ident = (d / "owner").read_text().split()
        except OSError:
            ident = None
        if ident is not None and not (len(ident) == 2 and ident[0].isdigit()):
            ident = None  # being written by a daemon starting right now: as if missing
        if ident is None:
            try:
                if now - d.stat().st_mtime < STALE_GRACE:
                    continue
            except OSError:
                continue
        elif _process_identity(int(ident[0])) == " ".join(ident):
            continue  # its daemon is alive
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed
