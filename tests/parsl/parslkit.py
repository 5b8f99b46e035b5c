"""What the Parsl tests here share: the MPI families Debian ships, and
building ``mpi_sum.c`` with each (skipping, with the package to install,
where one is missing)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent

#: family -> (its C compiler, what to install when it is missing, the
#: interface its ranks need).  ``mpicc`` is Open MPI's (Debian ranks its
#: alternative above MPICH's); ``mpicc.mpich`` is MPICH's by name.
FAMILIES = {
    "openmpi": ("mpicc", "libopenmpi-dev openmpi-bin", "pmix"),
    "mpich": ("mpicc.mpich", "mpich libmpich-dev", "pmi1"),
}


def build_or_skip(family: str, out: Path) -> str:
    """``mpi_sum.c`` built with ``family``'s compiler into ``out``; skip
    naming the package when the compiler (or, for a PMIx MPI, libpmix) is
    missing."""
    cc, package, iface = FAMILIES[family]
    if shutil.which(cc) is None:
        pytest.skip(f"{cc} not installed (apt-get install {package})")
    if iface == "pmix":
        from cbuild import require_libpmix

        require_libpmix()
    exe = out / f"mpi_sum.{family}"
    p = subprocess.run([cc, "-O1", "-o", str(exe), str(HERE / "mpi_sum.c")],
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    return str(exe)


LINE = re.compile(r"^rank (\d+) of (\d+) on (\S+) sum (-?\d+) via (\w+)$")


def ranks_printed(text: str) -> list[tuple[int, int, str, int, str]]:
    """``(rank, size, node, sum, interface)`` of each line mpi_sum printed, by rank."""
    rows = [LINE.match(ln) for ln in text.splitlines()]
    return sorted((int(m[1]), int(m[2]), m[3], int(m[4]), m[5]) for m in rows if m)


def apps_env(monkeypatch, tmp_path) -> None:
    """What the apps' processes need: Parsl's scripts on ``PATH``, this
    directory importable (they import the apps' module by name), Open MPI
    between local nodes over loopback only; the test runs in ``tmp_path``."""
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep
                       + os.environ.get("PATH", ""))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(HERE)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    monkeypatch.setenv("OMPI_MCA_btl_tcp_if_include", "lo")
    monkeypatch.chdir(tmp_path)
