"""An Open MPI program's output when it aborts: under ``pydvm run`` as under ``mpirun``.

Open MPI's launcher gives each rank's stdout a pseudo-terminal, so C stdio
writes it line by line and a line printed just before ``MPI_Abort`` is not
lost; ``pydvm run`` does the same.  The program is run by both, the same
way (``-n 2 ./prog`` from its directory), and both must show every rank's
stdout line on stdout and stderr line on stderr, and exit 3.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from dvmkit import PYDVM
from pmixkit import FAR, HEAD

PLACEMENTS = {"head": [f"{HEAD}:2"], "daemon": [f"{FAR}:2"], "both": [f"{HEAD}:1,{FAR}:1"]}
WANT_OUT = ["OUT rank 0 isatty=1", "OUT rank 1 isatty=1"]
WANT_ERR = ["ERR rank 0", "ERR rank 1"]


def _streams(p: subprocess.CompletedProcess) -> tuple[list[str], list[str]]:
    out = sorted(ln for ln in p.stdout.splitlines() if ln.startswith(("OUT", "ERR")))
    err = sorted(ln for ln in p.stderr.splitlines() if ln.startswith(("OUT", "ERR")))
    return out, err


@pytest.mark.parametrize("where", list(PLACEMENTS))
def test_lines_printed_before_mpi_abort_reach_stdout_and_stderr_as_under_mpirun(
        pdvm, mpicc, where):
    exe = Path(mpicc("mpi_abort_io"))
    env = {**pdvm.env, "PYDVM_URI": pdvm.uri}
    p = subprocess.run(PYDVM + ["run", "--pmix", "--host", *PLACEMENTS[where], "-n", "2",
                                f"./{exe.name}"],
                       cwd=exe.parent, env=env, capture_output=True, text=True, timeout=120)
    assert _streams(p) == (WANT_OUT, WANT_ERR), (p.stdout, p.stderr)
    assert p.returncode == 3, p.stderr
    assert "called PMIx_Abort with status 3" in p.stderr, p.stderr

    if not shutil.which("mpirun"):
        pytest.skip("mpirun not installed (apt-get install openmpi-bin)")
    ref_env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PYDVM_", "PMIX_", "OMPI_", "PRTE_"))}
    q = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-n", "2",
                        f"./{exe.name}"],
                       cwd=exe.parent, env=ref_env, capture_output=True, text=True, timeout=120)
    assert _streams(q) == (WANT_OUT, WANT_ERR), (q.stdout, q.stderr)
    assert q.returncode == 3, q.stderr
