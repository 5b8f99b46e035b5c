"""The server's private directory on disk: the topology image it shares, and
what killed servers leave behind (:func:`cleanup_stale`)."""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile

log = logging.getLogger("pydvm.pmix")

#: Name prefix of a server's private directory: ``pydvm-pmix.<pid>.<random>``.
TMPDIR_PREFIX = "pydvm-pmix."


def open_topology(tmpdir: str) -> None:
    """Let every client of the server read the topology image libpmix wrote.

    libpmix creates it owner-only (0600), as the server's user; a client
    of another user (a multi-user DVM's processes served by the node's own
    server) that can reach the directory would then fail to open it -- and
    Open MPI reports that as an error rather than falling back to the XML
    copy.  The topology is no secret (any process reads it from /sys)."""
    image = os.path.join(tmpdir, "hwloc.sm")
    try:
        os.chmod(image, 0o644)
    except FileNotFoundError:
        pass                  # libpmix without hwloc shmem: XML only, or nothing
    except OSError as e:
        log.warning("cannot make the topology image %s readable: %s", image, e)


def cleanup_stale(tmpdir: str | os.PathLike | None = None) -> list[str]:
    """Remove private server directories left in ``tmpdir`` by dead processes.

    A killed server leaves its ``pmix_dstor_*`` stores (megabytes each) in its
    private directory ``pydvm-pmix.<pid>.*``; this removes every such
    directory whose pid is no longer alive and returns their paths.
    """
    base = os.fspath(tmpdir) if tmpdir is not None else tempfile.gettempdir()
    removed = []
    pat = re.compile(re.escape(TMPDIR_PREFIX) + r"(\d+)\.")
    try:
        names = os.listdir(base)
    except OSError:
        return removed
    for name in names:
        m = pat.match(name)
        if not m:
            continue
        pid = int(m.group(1))
        if pid == os.getpid() or _alive(pid):
            continue
        path = os.path.join(base, name)
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
