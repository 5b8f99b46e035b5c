"""Running ``pydvm run`` and ``mpirun`` with the same placement and binding
options, for tests that compare them: :func:`pydvm_run` takes the command
line a user types (``--bind-to core --report-bindings -n 2 cmd``)."""

from __future__ import annotations

import os
import subprocess

from dvmkit import CMD_TIMEOUT, PYDVM

CPUS = "grep Cpus_allowed_list /proc/self/status"


def pydvm_run(args: list[str], env: dict[str, str], uri: str | None = None,
              timeout: float = CMD_TIMEOUT) -> subprocess.CompletedProcess:
    """``pydvm run ARGS`` (on the DVM at ``uri``, else a one-shot DVM)."""
    e = dict(env)
    e.pop("PYDVM_URI", None)
    if uri:
        e["PYDVM_URI"] = uri
    return subprocess.run(PYDVM + ["run", *args], env=e, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def mpirun(args: list[str], timeout: float = CMD_TIMEOUT) -> subprocess.CompletedProcess:
    """``mpirun --allow-run-as-root ARGS`` with no pydvm, PMIx or Open MPI variables."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYDVM_", "PMIX_", "OMPI_", "SLURM_"))}
    return subprocess.run(["mpirun", "--allow-run-as-root", *args], env=env,
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def cpus_allowed(p: subprocess.CompletedProcess) -> list[str]:
    """The ``Cpus_allowed_list`` values the ranks printed, sorted."""
    return sorted(ln.split(":", 1)[1].strip() for ln in p.stdout.splitlines()
                  if ln.startswith("Cpus_allowed_list:"))


def report(p: subprocess.CompletedProcess) -> list[str]:
    """The ``--report-bindings`` lines, ``[host:pid] `` cut, sorted by rank."""
    import re
    out = [re.sub(r"^\[[^\]]*\] ", "", ln) for ln in p.stderr.splitlines() if " MCW rank " in ln]
    return sorted(out, key=lambda ln: int(ln.split()[2]))
