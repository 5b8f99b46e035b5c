"""Fixtures for the PMI-1 tests: Debian's MPICH, its programs built once, a DVM."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "e2e"))

from dvmkit import start_dvm  # noqa: E402

PROGRAMS = Path(__file__).parent / "programs"
FAMILY = Path(__file__).parent.parent / "mpifamily" / "programs"


@pytest.fixture(scope="module")
def mpich(tmp_path_factory) -> dict[str, str]:
    """Debian's MPICH 4.0.2 programs (``apt-get install mpich libmpich-dev``),
    built once per module: name -> path."""
    cc = shutil.which("mpicc.mpich")
    if cc is None or shutil.which("mpiexec.hydra") is None:
        pytest.skip("Debian's MPICH is not installed (apt-get install mpich libmpich-dev)")
    out = tmp_path_factory.mktemp("mpich")
    built = {}
    for src in [PROGRAMS / "names.c", FAMILY / "hello.c"]:
        exe = out / src.stem
        subprocess.run([cc, "-O1", "-o", str(exe), str(src)], check=True, timeout=120,
                       capture_output=True)
        built[src.stem] = str(exe)
    return built


@pytest.fixture(scope="module")
def dvm2(tmp_path_factory):
    """A DVM of two local nodes of two slots, a and b."""
    with start_dvm(tmp_path_factory.mktemp("dvm2"), "a:2,b:2") as d:
        yield d
