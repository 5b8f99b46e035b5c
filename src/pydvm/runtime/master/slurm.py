"""Running a DVM inside a Slurm allocation: what was allocated, and the srun line.

Pure functions: nothing here reads the process environment, runs a command
or touches a file.  Callers pass the environment (``os.environ``) in; the
launcher runs the argv that :func:`srun_argv` builds.

The allocation
--------------
Inside ``salloc`` or an ``sbatch`` script Slurm describes the allocation in
the environment:

``SLURM_JOB_ID``
    the job (``SLURM_JOBID`` is the old spelling, accepted too);
``SLURM_JOB_NODELIST``
    the nodes, as a compressed host list such as ``sn[1-3]`` or
    ``n[01-04,07],login2`` (``SLURM_NODELIST`` is accepted as a fallback).
    Expanded with the ``python-hostlist`` package (a dependency of pydvm),
    in the order given: the allocation order;
``SLURM_TASKS_PER_NODE``
    how many tasks each of those nodes may run, in the same order, with runs
    written ``COUNT(xREPEAT)``: ``2(x3),1`` is 2, 2, 2, 1.  These become the
    nodes' slots;
``SLURM_CPUS_PER_TASK``
    set when the job asked for ``--cpus-per-task``.

**The CPUs-per-task rule.**  ``SLURM_TASKS_PER_NODE`` already counts
*tasks*: Slurm has divided each node's CPUs by the CPUs per task before
writing it (``salloc -N3 -c2`` on 2-CPU nodes gives
``SLURM_TASKS_PER_NODE=1(x3)`` next to ``SLURM_JOB_CPUS_PER_NODE=2(x3)``,
measured on Slurm 22.05).  So by default the slots are the task counts as
given, and ``SLURM_CPUS_PER_TASK`` is only checked (a positive integer).
Dividing again would count each task's CPUs twice -- PRRTE's ``ras/slurm``
did so until 2011 and then stopped for this reason; it too now takes
``SLURM_TASKS_PER_NODE`` as is.  The division belongs to CPU counts: with
``slots="cpus"`` a node's slots are ``SLURM_JOB_CPUS_PER_NODE`` divided by
``SLURM_CPUS_PER_TASK`` (rounded down, at least 1) -- every CPU of the
allocation, for a DVM that wants them all, or for a master started inside a
job step, where ``SLURM_TASKS_PER_NODE`` describes that step, not the
allocation.

A tasks-per-node list longer than the node list is accepted (the extra
entries are ignored, as PRRTE does: some Slurm versions wrote such lists);
a shorter one is an error.

The daemons
-----------
All daemons start as ONE job step, one task per node (:func:`srun_argv`).
The command is the same for every task: each daemon learns its node name
from ``SLURMD_NODENAME``, which slurmstepd sets to the Slurm node name -- the
name in ``SLURM_JOB_NODELIST`` (:func:`node_from_env` adapts a command that
takes ``--node NAME``).  The DVM secret goes to srun's standard input, which
``--input=all`` copies to every task: each daemon reads one line.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ..shared.jobs import HostSpec

__all__ = [
    "Allocation", "SlurmEnvError", "allocation_from_env", "compress_hosts", "expand_hosts",
    "in_allocation", "node_from_env", "parse_tasks_per_node", "select_hosts", "srun_argv",
]


class SlurmEnvError(ValueError):
    """The Slurm environment is missing a variable or has a malformed one."""


@dataclass(frozen=True)
class Allocation:
    """The nodes Slurm gave this job, in allocation order, with their slots."""

    job_id: str
    nodes: tuple[HostSpec, ...]
    #: for ``pydvm info``: where these hosts came from.
    source: str
    #: ``SLURM_CPUS_PER_TASK`` (1 when unset).
    cpus_per_task: int = 1

    @property
    def names(self) -> list[str]:
        return [h.name for h in self.nodes]

    def slots(self, name: str) -> int:
        """Slots Slurm allocated on node ``name`` (KeyError if not allocated)."""
        for h in self.nodes:
            if h.name == name:
                return h.slots
        raise KeyError(name)


def _get(env: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    """(name, value) of the first of ``names`` set to a non-blank value."""
    for name in names:
        value = env.get(name)
        if value is not None and value.strip():
            return name, value.strip()
    return None


def in_allocation(env: Mapping[str, str]) -> bool:
    """True inside a Slurm job (salloc shell/command, sbatch script, srun task).

    Only the job id is looked at: a job id with a missing or broken node list
    is a broken environment, which :func:`allocation_from_env` reports,
    rather than a reason to quietly run somewhere else.
    """
    return _get(env, "SLURM_JOB_ID", "SLURM_JOBID") is not None


def _hostlist():
    try:
        import hostlist
    except ImportError:  # pragma: no cover - depends on the installation
        raise SlurmEnvError(
            "reading a Slurm node list needs the python-hostlist package, a dependency of "
            "pydvm missing here: pip install python-hostlist (or reinstall pydvm)") from None
    return hostlist


def expand_hosts(text: str, what: str = "node list") -> list[str]:
    """``sn[1-3],login`` -> ``['sn1', 'sn2', 'sn3', 'login']`` (order kept)."""
    hl = _hostlist()
    try:
        names = hl.expand_hostlist(text, allow_duplicates=True, sort=False)
    except hl.BadHostlist as e:
        raise SlurmEnvError(f"bad {what} {text!r}: {e}") from None
    if not names or any(not n for n in names):
        raise SlurmEnvError(f"bad {what} {text!r}: no host names in it")
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise SlurmEnvError(f"bad {what} {text!r}: lists {', '.join(dups)} twice")
    return names


def compress_hosts(names: Iterable[str]) -> str:
    """``['sn1', 'sn2', 'sn3']`` -> ``'sn[1-3]'`` (sorted, as Slurm prints lists)."""
    return _hostlist().collect_hostlist(list(names))


_TASKS_ITEM = re.compile(r"(\d+)(?:\(x(\d+)\))?")


def parse_tasks_per_node(text: str, what: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """``2(x3),1`` -> ``[2, 2, 2, 1]``; every count and repeat must be >= 1."""
    out: list[int] = []
    for item in text.split(","):
        m = _TASKS_ITEM.fullmatch(item.strip())
        if not m:
            raise SlurmEnvError(
                f"bad {what} {text!r}: {item.strip()!r} is not COUNT or COUNT(xREPEAT)")
        count, repeat = int(m.group(1)), int(m.group(2) or 1)
        if count < 1 or repeat < 1:
            raise SlurmEnvError(f"bad {what} {text!r}: counts and repeats must be >= 1")
        if len(out) + repeat > 1_000_000:
            raise SlurmEnvError(f"bad {what} {text!r}: more than a million nodes")
        out += [count] * repeat
    return out


def _positive_int(name: str, value: str) -> int:
    if not re.fullmatch(r"\d+", value) or int(value) < 1:
        raise SlurmEnvError(f"bad {name} {value!r}: expected a positive integer")
    return int(value)


def allocation_from_env(env: Mapping[str, str], slots: str = "tasks") -> Allocation:
    """The allocation described by a Slurm job's environment ``env``.

    ``slots="tasks"`` (default): a node's slots are its ``SLURM_TASKS_PER_NODE``
    entry.  ``slots="cpus"``: ``SLURM_JOB_CPUS_PER_NODE`` // ``SLURM_CPUS_PER_TASK``
    (at least 1).  See the module documentation for why.  Raises
    :class:`SlurmEnvError` when a variable is missing or malformed.
    """
    if slots not in ("tasks", "cpus"):
        raise ValueError(f"slots must be 'tasks' or 'cpus', not {slots!r}")
    job = _get(env, "SLURM_JOB_ID", "SLURM_JOBID")
    if job is None:
        raise SlurmEnvError("not inside a Slurm job: SLURM_JOB_ID is not set")
    job_id = job[1]
    if not re.fullmatch(r"\d+", job_id):
        raise SlurmEnvError(f"bad {job[0]} {job_id!r}: expected a job number")
    nodelist = _get(env, "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    if nodelist is None:
        raise SlurmEnvError(f"Slurm job {job_id}: SLURM_JOB_NODELIST is not set")
    list_var, list_text = nodelist
    names = expand_hosts(list_text, list_var)

    cpt = _get(env, "SLURM_CPUS_PER_TASK")
    cpus_per_task = _positive_int(*cpt) if cpt else 1

    if slots == "tasks":
        step = _get(env, "SLURM_STEP_ID", "SLURM_STEPID")
        count_var = "SLURM_TASKS_PER_NODE"
        found = _get(env, count_var)
        if found is None:
            raise SlurmEnvError(f"Slurm job {job_id}: {count_var} is not set")
        counts = parse_tasks_per_node(found[1], count_var)
        if len(counts) < len(names) and step is not None:
            raise SlurmEnvError(
                f"Slurm job {job_id}: running inside job step {job_id}.{step[1]}, whose "
                f"{count_var}={found[1]} describes the step, not the allocation's "
                f"{len(names)} nodes; start pydvm from the allocation itself (the salloc "
                "command or the sbatch script), or count slots from CPUs")
    else:
        count_var = "SLURM_JOB_CPUS_PER_NODE"
        found = _get(env, count_var)
        if found is None:
            raise SlurmEnvError(f"Slurm job {job_id}: {count_var} is not set")
        counts = [max(1, c // cpus_per_task) for c in parse_tasks_per_node(found[1], count_var)]
    if len(counts) < len(names):
        raise SlurmEnvError(
            f"Slurm job {job_id}: {count_var}={found[1]} covers {len(counts)} node(s) but "
            f"{list_var}={list_text} lists {len(names)}")

    # (SLURM_NNODES is not checked: inside a step it counts the step's nodes)
    num = _get(env, "SLURM_JOB_NUM_NODES")
    if (num is not None and list_var == "SLURM_JOB_NODELIST"
            and _positive_int(*num) != len(names)):
        raise SlurmEnvError(
            f"Slurm job {job_id}: SLURM_JOB_NUM_NODES={num[1]} but "
            f"{list_var}={list_text} lists {len(names)} node(s)")

    detail = f"{list_var}={list_text}, {count_var}={found[1]}"
    if cpt:
        detail += f", SLURM_CPUS_PER_TASK={cpus_per_task}"
    return Allocation(
        job_id=job_id,
        nodes=tuple(HostSpec(n, c) for n, c in zip(names, counts)),
        source=f"Slurm job {job_id} ({detail})",
        cpus_per_task=cpus_per_task,
    )


def select_hosts(allocation: Allocation, requested: Sequence[HostSpec]) -> list[HostSpec]:
    """The ``--hosts`` a user gave inside an allocation, checked against it.

    Every host must be one of the allocation's nodes (else SlurmEnvError
    naming all that are not), listed once, and ask for no more slots than
    Slurm allocated on it.  The result keeps the requested order and slot
    counts: ``--hosts`` means the same inside an allocation as outside
    (``sn2`` alone is one slot).  To use a node's whole share, ask for it
    (``sn2:2``) or take ``allocation.nodes`` instead of calling this.
    """
    if not requested:
        raise SlurmEnvError("no hosts requested")
    allocated = {h.name: h.slots for h in allocation.nodes}
    unknown = [h.name for h in requested if h.name not in allocated]
    if unknown:
        raise SlurmEnvError(
            f"host{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
            f"{'are' if len(unknown) > 1 else 'is'} not in {allocation.source}")
    names = [h.name for h in requested]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise SlurmEnvError(f"host listed twice: {', '.join(dups)}")
    for h in requested:
        if h.slots > allocated[h.name]:
            raise SlurmEnvError(
                f"host {h.name} asks for {h.slots} slots but Slurm job {allocation.job_id} "
                f"allocated {allocated[h.name]} there")
    return list(requested)


#: The srun options every daemon step gets, and why (each checked on Slurm 22.05).
SRUN_FIXED = (
    # one daemon per node, on exactly these nodes
    "--ntasks-per-node=1",
    # do not link an MPI/PMI plugin into the daemons
    "--mpi=none",
    # the daemons must not be pinned: the processes they start inherit that
    "--cpu-bind=none",
    # the step shares the allocation's CPUs and memory: without it a later
    # ``srun`` in the same allocation waits for CPUs the daemons hold
    "--overlap",
    # srun's standard input (the DVM secret) reaches every task, not task 0
    "--input=all",
    # the daemons see the master's environment even where a site or user
    # sets SLURM_EXPORT_ENV=NONE
    "--export=ALL",
)
#: A lost daemon or node must cost the DVM that node, not every daemon.
SRUN_RESILIENT = (
    # a daemon that dies (signal or non-zero exit) does not end the step
    "--kill-on-bad-exit=0",
    # a node that fails does not end the step (the job needs --no-kill too)
    "--no-kill",
    # no deadline for the other tasks once one has exited (site WaitTime)
    "--wait=0",
)


def srun_argv(nodes: Sequence[HostSpec | str], daemon_cmd: Sequence[str],
              extra_args: str = "", *, kill_on_bad_exit: bool = False,
              job_name: str = "pydvm-daemons", external_launcher: bool = False,
              label: bool = False, srun: str = "srun") -> list[str]:
    """One ``srun`` step starting ``daemon_cmd`` once on each of ``nodes``.

    ``daemon_cmd`` is the same for every task (its node name comes from
    ``SLURMD_NODENAME``; see :func:`node_from_env`).  ``extra_args`` is a
    user's string of further srun options (shell-split) placed before the
    command.  Write the secret followed by a newline to srun's standard input
    and close it: every task reads it.

    By default the step survives losing a daemon or a node
    (:data:`SRUN_RESILIENT`); ``kill_on_bad_exit=True`` makes any daemon's
    death end the whole step (``--kill-on-bad-exit=1``) instead.
    ``external_launcher=True`` adds ``--external-launcher``, which only
    Slurm 23.11 and later know (it marks the step as a launcher's, sharing
    the allocation like ``--overlap``).  ``label=True`` adds ``--label``:
    every line a task writes on stdout or stderr starts with its task number
    (``1: ...``), so the launcher can tell whose stderr it is reading.
    """
    names = [n.name if isinstance(n, HostSpec) else n for n in nodes]
    if not names:
        raise ValueError("srun_argv: no nodes")
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise ValueError(f"srun_argv: node listed twice: {', '.join(dups)}")
    if not daemon_cmd:
        raise ValueError("srun_argv: empty daemon command")
    n = len(names)
    argv = [srun, f"--nodes={n}", f"--ntasks={n}", f"--nodelist={compress_hosts(names)}",
            *SRUN_FIXED]
    if kill_on_bad_exit:
        argv.append("--kill-on-bad-exit=1")
    else:
        argv += SRUN_RESILIENT
    if external_launcher:
        argv.append("--external-launcher")
    if label:
        argv.append("--label")
    if job_name:
        argv.append(f"--job-name={job_name}")
    try:
        argv += shlex.split(extra_args)
    except ValueError as e:
        raise ValueError(f"bad extra srun arguments {extra_args!r}: {e}") from None
    return argv + list(daemon_cmd)


def node_from_env(cmd: Sequence[str], option: str = "--node",
                  variable: str = "SLURMD_NODENAME") -> list[str]:
    """``cmd`` made to end with ``OPTION $VARIABLE``, the value read where it runs.

    For a daemon command that takes its node name as an option: the result
    is one argv that is the same for every task, and a POSIX shell on the
    node appends the name.  The shell ``exec``s the command, so the daemon
    is still the task's process (signals from Slurm reach it).
    """
    if not cmd:
        raise ValueError("node_from_env: empty command")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", variable):
        raise ValueError(f"bad variable name {variable!r}")
    script = f'exec "$@" {shlex.quote(option)} "${{{variable}:?not set}}"'
    return ["/bin/sh", "-c", script, "pydvm-daemon", *cmd]
