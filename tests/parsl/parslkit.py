"""What the Parsl tests here share: the MPI families Debian ships, and
building ``mpi_sum.c`` with each (skipping, with the package to install,
where one is missing)."""

from __future__ import annotations

import shutil
import subprocess
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
