"""What the PMIx end-to-end tests share: where the nodes and programs are, and
readers of the test clients' output.  (Imported by name from the test
modules, so it has a name no other test directory uses.)"""

from __future__ import annotations

import re
import socket
from pathlib import Path

HERE = Path(__file__).parent
CLIENTS = HERE / "clients"
PMIX_CLIENTS = HERE.parent / "pmix" / "clients"
HEAD = socket.gethostname()
FAR = "far"
#: the two ways a node is served: by the master process, or by a daemon.
NODES = {"head": HEAD, "daemon": FAR}


def statuses(out: str, prefix: str) -> list[int]:
    """The ``status=N`` of every line starting with ``prefix``."""
    return [int(re.search(r"status=(-?\d+)", ln).group(1))
            for ln in out.splitlines() if ln.startswith(prefix)]


def found(out: str) -> dict[str, tuple[int, str, str]]:
    """FOUND lines of pmix_ops -> {key: (type code, value, publisher)}."""
    got = {}
    for ln in out.splitlines():
        m = re.match(r"FOUND key=(\S+) proc=(\S+) type=(\d+) value=(.*)$", ln)
        if m:
            got[m.group(1)] = (int(m.group(3)), m.group(4), m.group(2))
    return got
