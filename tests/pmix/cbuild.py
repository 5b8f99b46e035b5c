"""Building and finding the programs the PMIx tests run.

Shared by tests/pmix (the binding on its own) and tests/pmix_e2e (programs
under ``pydvm run``).  Each helper skips, naming the Debian package, when
what it needs is missing; CI installs all of it and turns a skip into a
failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

PMIX_INCLUDE = "/usr/lib/x86_64-linux-gnu/pmix2/include"
#: The C clients both suites share (pmix_ops.c and the MPI programs).
PMIX_CLIENTS = Path(__file__).parent / "clients"


def require_libpmix() -> str:
    """libpmix's description (name, version), or skip saying why it is unusable."""
    from pydvm import pmix
    ok, why, _ = pmix.available()
    if not ok:
        pytest.skip(f"libpmix unusable (apt-get install libpmix2): {why}")
    return why


def pmix_cflags() -> list[str]:
    """Compiler flags for a PMIx client: pkg-config's, else Debian's paths."""
    try:
        out = subprocess.run(["pkg-config", "--cflags", "--libs", "pmix"], capture_output=True,
                             text=True, check=True).stdout.split()
        if out:
            return out
    except (OSError, subprocess.CalledProcessError):
        pass
    if os.path.exists(os.path.join(PMIX_INCLUDE, "pmix.h")):
        return [f"-I{PMIX_INCLUDE}", "-lpmix"]
    return []


def _builder(build_dir: Path, cmd: list[str], flags: list[str],
             source_dirs: tuple[Path, ...]) -> Callable[[str], str]:
    """A function compiling ``NAME.c`` (first found in ``source_dirs``) once with
    ``cmd ... flags``; it returns the executable's path."""
    built: dict[str, str] = {}

    def build(name: str) -> str:
        if name not in built:
            src = next((d / f"{name}.c" for d in source_dirs if (d / f"{name}.c").exists()),
                       None)
            assert src is not None, f"no {name}.c in {[str(d) for d in source_dirs]}"
            exe = build_dir / name
            r = subprocess.run([*cmd, "-o", str(exe), str(src), *flags], capture_output=True,
                               text=True)
            assert r.returncode == 0, r.stderr
            built[name] = str(exe)
        return built[name]

    return build


def _pmix_flags_or_skip() -> list[str]:
    if not shutil.which("gcc"):
        pytest.skip("gcc not installed (apt-get install gcc)")
    flags = pmix_cflags()
    if not flags:
        pytest.skip("PMIx headers not found (apt-get install libpmix-dev)")
    return flags


def pmix_builder(build_dir: Path, *source_dirs: Path) -> Callable[[str], str]:
    """Builds the PMIx C client ``NAME.c`` (first found in ``source_dirs``) with
    gcc -lpmix, once; returns the executable's path."""
    return _builder(build_dir, ["gcc", "-O1", "-Wall"], _pmix_flags_or_skip(), source_dirs)


def build_pmix_ops(build_dir: Path) -> str:
    """tests/pmix/clients/pmix_ops.c built with gcc -lpmix; the executable's path."""
    return pmix_builder(build_dir, PMIX_CLIENTS)("pmix_ops")


def mpicc_builder(build_dir: Path, *source_dirs: Path) -> Callable[[str], str]:
    """Builds ``NAME.c`` (first found in ``source_dirs``) with mpicc, once."""
    if not shutil.which("mpicc"):
        pytest.skip("mpicc not installed (apt-get install libopenmpi-dev openmpi-bin)")
    return _builder(build_dir, ["mpicc"], [], source_dirs)


def find_mpi4py_python() -> str:
    """A Python that has mpi4py: this one, else Debian's /usr/bin/python3."""
    for py in (sys.executable, "/usr/bin/python3"):
        if py and os.path.exists(py):
            r = subprocess.run([py, "-c", "import mpi4py"], capture_output=True)
            if r.returncode == 0:
                return py
    pytest.skip("mpi4py not installed (apt-get install python3-mpi4py)")
