"""Running ``pydvm run`` with mpirun's placement and binding options, and ``mpirun``
with the same, for tests that compare them.

:func:`pydvm_run` takes the command line a user types (``--bind-to core
--report-bindings -n 2 cmd``).  Options the ``pydvm run`` command line
accepts go to it as typed; those it does not accept yet are turned into
the run request's ``placement`` (the keys the lead fixed, see
src/pydvm/cli/toolcommon.py) and the job goes through
``jobs/placed_run.py``, which submits the same request the CLI will.  Once
the CLI takes an option, the tests run it unchanged (:func:`cli_takes`
decides, per option).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from dvmkit import CMD_TIMEOUT, PYDVM

PLACED_RUN = Path(__file__).parent / "jobs" / "placed_run.py"
#: mpirun's options these tests use, and how many values each takes.
OPTIONS = {"--bind-to": 1, "--report-bindings": 0, "--cpu-set": 1, "--cpu-list": 1,
           "--map-by": 1, "--use-hwthread-cpus": 0, "--oversubscribe": 0}
CPUS = "grep Cpus_allowed_list /proc/self/status"


def cli_takes(option: str) -> bool:
    """Whether ``pydvm run``'s command line accepts ``option``."""
    from pydvm.cli.run import parse_run
    argv = [option] + ["core"] * OPTIONS[option] + ["true"]
    try:
        parse_run(argv)
    except ValueError:
        return False
    return True


def to_placement(args: list[str]) -> tuple[dict, list[str]]:
    """(placement, the other arguments) for the options the CLI does not take."""
    placement: dict = {}
    rest: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a not in OPTIONS or cli_takes(a):
            rest.append(a)
            i += 1
            continue
        v = args[i + 1] if OPTIONS[a] else ""
        i += 1 + OPTIONS[a]
        if a == "--bind-to":
            what, _, mod = v.partition(":")
            placement["bind_to"] = what
            if "overload-allowed" in mod.lower():
                placement["overload"] = True
        elif a == "--report-bindings":
            placement["report_bindings"] = True
        elif a in ("--cpu-set", "--cpu-list"):
            placement["cpu_set"] = [int(c) for c in v.split(",")]
        elif a == "--map-by":
            what, *mods = v.split(":")
            placement["map_by"] = what
            for m in mods:
                if m.upper().startswith("PE="):
                    placement["pe"] = int(m[3:])
        elif a == "--use-hwthread-cpus":
            placement["use_hwthread_cpus"] = True
        elif a == "--oversubscribe":
            placement["oversubscribe"] = True
    return placement, rest


def pydvm_run(args: list[str], env: dict[str, str], uri: str | None = None,
              timeout: float = CMD_TIMEOUT) -> subprocess.CompletedProcess:
    """``pydvm run ARGS`` (on the DVM at ``uri``, else a one-shot DVM)."""
    e = dict(env)
    e.pop("PYDVM_URI", None)
    if uri:
        e["PYDVM_URI"] = uri
    placement, rest = to_placement(args)
    if placement:
        e["PYDVM_TEST_PLACEMENT"] = json.dumps(placement)
        argv = [sys.executable, str(PLACED_RUN), *rest]
    else:
        argv = PYDVM + ["run", *rest]
    return subprocess.run(argv, env=e, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


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
