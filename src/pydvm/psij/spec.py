"""What a PSI/J job asks of a DVM: the pure half of the ``pydvm`` executor.

:func:`plan_job` reads a :class:`psij.JobSpec` -- executable, arguments,
resources, environment, directory, the three standard streams, attributes,
launcher -- together with the DVM's nodes, and returns a :class:`JobPlan`:
the command, how many processes, on which nodes, what each process gets.
It does no I/O (the caller hands it the environment, the working directory
and the nodes), so every rule here is tested without a DVM
(``tests/test_psij_spec.py``); :mod:`pydvm.psij.executor` submits the plan.

What maps to what (``docs/workflows.md``, "The PSI/J executor", has the
table):

* ``launcher`` -- None, ``"pydvm"`` and the parallel launchers of PSI/J
  (``multiple``, ``mpirun``, ``srun``, ``aprun``, ``jsrun``, ``ibrun``) all
  mean the same: the DVM itself starts every process of the job, as Flux's
  and RADICAL-Pilot's executors do; no launcher script runs.  ``single``
  starts one process, on the first node of the job's allocation.  Any other
  name is refused.
* ``resources`` (``ResourceSpecV1``) -- ``process_count`` processes; when
  ``node_count`` or ``processes_per_node`` is given, exactly
  ``computed_node_count`` nodes of the DVM (the first ones up, in the DVM's
  order) with ``computed_processes_per_node`` each; else the DVM places them
  over all its nodes by its slots (or as custom attributes ``pydvm.map_by``
  / ``pydvm.rank_by`` say).  ``PSIJ_NODEFILE`` lists one node name per
  process when there is more than one.  ``memory``, ``cpu_cores_per_process``,
  ``gpu_cores_per_process`` and ``exclusive_node_use`` are accepted and not
  enforced: a persistent DVM places by slots and reserves nothing.
* ``environment`` / ``inherit_environment`` -- the submitting process's
  environment plus ``environment`` (or ``environment`` alone); the DVM adds
  its own ``PYDVM_*`` / ``PMIX_*`` variables.
* ``directory`` -- the processes' working directory (relative: to the
  submitter's); relative ``std*_path`` are relative to it.
* ``stdin_path`` / ``stdout_path`` / ``stderr_path`` -- files; left out,
  ``/dev/null``.
* ``attributes.duration`` -- a walltime: the job is killed after it and
  ends FAILED; ``queue_name``, ``account``, ``reservation_id`` -- ignored
  (a DVM has one queue and no accounts); custom attributes ``pydvm.KEY``
  -- the options of :data:`CUSTOM` (other executors' prefixes ignored).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from psij import InvalidJobException, JobSpec, ResourceSpecV1

#: Launchers that start one process.
SINGLE = frozenset({"single"})

#: Launchers whose meaning is "start every process of the job": the DVM does
#: that itself (``pydvm`` is the executor's own name for it).
PARALLEL = frozenset({"pydvm", "multiple", "mpirun", "srun", "aprun", "jsrun", "ibrun"})

#: Custom attributes ``pydvm.KEY`` and the type each takes: ``pydvm run``'s
#: placement options (``map_by`` as ``--map-by``, ``rank_by``, ``bind_to``,
#: ``oversubscribe``), ``hosts`` (node names: where the job may run),
#: ``pmix`` (host a PMIx server for the job, as ``--pmix``) and ``queue``
#: (True: wait for free slots instead of oversubscribing, where the DVM
#: queues; False: never wait, whatever the DVM's default).
CUSTOM: dict[str, type | tuple[type, ...]] = {
    "map_by": str,
    "rank_by": str,
    "bind_to": str,
    "oversubscribe": bool,
    "hosts": (list, tuple, str),
    "pmix": bool,
    "queue": bool,
}

#: Custom attribute prefix this executor reads.
PREFIX = "pydvm."


@dataclass
class JobPlan:
    """One PSI/J job as the DVM runs it.

    ``argv``: the command; ``n``: processes; ``npernode``: processes per
    node (None: the DVM's default placement); ``hosts``: the nodes it may
    use (None: all); ``nodefile``: the node name of each process of the
    allocation, in rank order (written to ``PSIJ_NODEFILE`` when it has more
    than one line); ``env``: each process's whole environment (before the
    DVM's own variables); ``cwd``; ``stdin`` / ``stdout`` / ``stderr``:
    absolute paths; ``timeout``: the walltime in seconds (None: none);
    ``queue``: wait for free slots rather than oversubscribe, or not
    (custom attribute ``pydvm.queue``; None: the DVM's default,
    ``pydvm_queue``); ``options``: the other options from custom attributes
    (:data:`CUSTOM`).
    """

    argv: list[str]
    n: int
    npernode: int | None
    hosts: list[str] | None
    nodefile: list[str]
    env: dict[str, str]
    cwd: str
    stdin: str
    stdout: str
    stderr: str
    timeout: float | None
    queue: bool | None
    options: dict[str, Any] = field(default_factory=dict)
    pre_launch: str | None = None
    post_launch: str | None = None


def launcher_kind(name: str | None) -> str:
    """``"single"`` or ``"parallel"`` for a PSI/J launcher name (None: the
    default, parallel); InvalidJobException naming the accepted ones for
    any other."""
    if name is None or name in PARALLEL:
        return "parallel"
    if name in SINGLE:
        return "single"
    raise InvalidJobException(
        f"the pydvm executor does not know launcher {name!r}; it launches through the DVM: "
        f"use one of {', '.join(sorted(SINGLE | PARALLEL))} (or none)")


def _abs(path: os.PathLike | str, base: str) -> str:
    return os.path.normpath(os.path.join(base, os.fspath(path)))


def _custom(attrs: Mapping[str, object] | None) -> dict[str, Any]:
    """The ``pydvm.*`` custom attributes, checked (others' are not ours)."""
    out: dict[str, Any] = {}
    for key, value in (attrs or {}).items():
        if not isinstance(key, str) or not key.startswith(PREFIX):
            continue
        name = key[len(PREFIX):]
        want = CUSTOM.get(name)
        if want is None:
            raise InvalidJobException(
                f"unknown custom attribute {key!r}; the pydvm executor reads "
                + ", ".join(PREFIX + k for k in sorted(CUSTOM)))
        if not isinstance(value, want) or (want is str and not value):
            raise InvalidJobException(f"custom attribute {key!r}: {value!r} is not a "
                                      f"{getattr(want, '__name__', 'list of node names')}")
        if name == "hosts":
            value = [h for h in value.split(",")] if isinstance(value, str) else list(value)
            if not value or not all(isinstance(h, str) and h for h in value):
                raise InvalidJobException(f"custom attribute {key!r}: {value!r} is not a "
                                          "list of node names")
        out[name] = value
    return out


def _resources(spec: JobSpec) -> ResourceSpecV1:
    res = spec.resources
    if res is None:
        return ResourceSpecV1()
    if not isinstance(res, ResourceSpecV1):
        raise InvalidJobException(f"the pydvm executor reads resource specifications of "
                                  f"version 1, not {getattr(res, 'version', res)!r}")
    return res


def _placement(options: Mapping[str, Any]) -> dict[str, Any]:
    """The run request's ``placement`` of the custom attributes' mapping
    options, as the DVM's master will read it (InvalidJobException for a
    value it would refuse)."""
    from ..placement import parse_map_by, parse_rank_by

    out: dict[str, Any] = {}
    try:
        if "map_by" in options:
            out.update(parse_map_by(options["map_by"]))
        if "rank_by" in options:
            out["rank_by"] = parse_rank_by(options["rank_by"])
    except ValueError as exc:
        raise InvalidJobException(f"custom attribute: {exc}") from None
    if options.get("oversubscribe") is not None:
        out["oversubscribe"] = options["oversubscribe"]
    return out


def _allocation(res: ResourceSpecV1, get_nodes: Callable[[], Sequence[tuple[str, int]]],
                hosts: list[str] | None, options: Mapping[str, Any]
                ) -> tuple[list[str] | None, int | None, list[str]]:
    """(hosts, npernode, node of each process) for ``res`` on the DVM's up
    nodes (``get_nodes()``: ``(name, slots)`` in order; asked only when the
    answer depends on them), the job restricted to ``hosts`` when given,
    mapped with the custom attributes' ``options``."""
    from ..placement import Host, map_job

    n = res.computed_process_count
    if n == 1 and hosts is None and res.node_count is None and res.processes_per_node is None:
        return None, None, ["?"]  # one process anywhere: no need to know the nodes
    nodes = list(get_nodes())
    if hosts is not None:
        unknown = [h for h in hosts if h not in {name for name, _ in nodes}]
        if unknown:
            raise InvalidJobException(
                f"custom attribute 'pydvm.hosts': {', '.join(unknown)} not among the DVM's "
                f"nodes that are up ({', '.join(n for n, _ in nodes) or 'none'})")
        # the job's own host list: in its order, one slot each (as
        # ``pydvm run --host`` gives them)
        nodes = [(h, 1) for h in dict.fromkeys(hosts)]
    if n < 1:
        raise InvalidJobException(f"process count {n}: a job needs at least one process")
    if res.node_count is not None or res.processes_per_node is not None:
        count, ppn = res.computed_node_count, res.computed_processes_per_node
        if count < 1 or ppn < 1:
            raise InvalidJobException(f"node count {count} with {ppn} processes per node")
        if count > len(nodes):
            raise InvalidJobException(
                f"the job asks for {count} nodes; the DVM has {len(nodes)} up"
                + (f" ({', '.join(name for name, _ in nodes)})" if nodes else ""))
        chosen = [name for name, _ in nodes[:count]]
        return chosen, ppn, [name for name in chosen for _ in range(ppn)]
    if not nodes:
        raise InvalidJobException("the DVM has no node up to run the job on")
    # the DVM's own placement (SPEC 9: each node's slots in turn, or the
    # mapping the options ask for), as its master will compute it: the same
    # pure function.  A mapping over objects needs the nodes' topologies,
    # which only the master has: the nodefile then follows SPEC 9's order
    # and the DVM judges the job.
    pool = [Host(name, max(1, slots)) for name, slots in nodes]
    try:
        where = map_job([(n, pool)], _placement(options))[0]
    except ValueError:
        where = map_job([(n, pool)], {})[0]
    return hosts, None, where


def plan_job(spec: JobSpec, *,
             nodes: Sequence[tuple[str, int]] | Callable[[], Sequence[tuple[str, int]]],
             environ: Mapping[str, str], cwd: str) -> JobPlan:
    """The :class:`JobPlan` of ``spec`` on a DVM whose up nodes are ``nodes``
    (``(name, slots)`` in the DVM's order, or a function returning them,
    called only if the plan depends on them), for a submitter whose
    environment is ``environ`` and working directory ``cwd``.  Raises
    InvalidJobException for what no DVM could run."""
    if not spec.executable:
        raise InvalidJobException("the job has no executable")
    args = list(spec.arguments or [])
    if not all(isinstance(a, str) for a in args):
        raise InvalidJobException(f"arguments must be strings: {args!r}")
    kind = launcher_kind(spec.launcher)
    res = _resources(spec)
    attrs = spec.attributes
    options = _custom(attrs.custom_attributes if attrs is not None else None)
    get_nodes = nodes if callable(nodes) else (lambda: nodes)
    if options.get("map_by") is not None:
        _placement(options)  # a bad value is refused before anything else
    hosts, npernode, nodefile = _allocation(res, get_nodes, options.pop("hosts", None),
                                            options)
    n = res.computed_process_count
    if kind == "single" and n > 1:
        n, npernode, hosts = 1, None, nodefile[:1]
    if npernode is not None and any(k in options for k in ("map_by",)):
        raise InvalidJobException("custom attribute 'pydvm.map_by' cannot be combined with "
                                  "node_count / processes_per_node (they set the mapping)")
    workdir = _abs(spec.directory, cwd) if spec.directory is not None else cwd
    env = dict(environ) if spec.inherit_environment else {}
    env.update(spec.environment or {})
    timeout = None
    if attrs is not None and attrs.duration is not None:
        timeout = attrs.duration.total_seconds()
        if timeout <= 0:
            raise InvalidJobException(f"duration {attrs.duration} is not positive")
    queue = options.pop("queue", None)

    def stream(p: os.PathLike | None) -> str:
        return os.devnull if p is None else _abs(p, workdir)

    return JobPlan(
        argv=[spec.executable, *args], n=n, npernode=npernode, hosts=hosts,
        nodefile=nodefile, env=env, cwd=workdir, stdin=stream(spec.stdin_path),
        stdout=stream(spec.stdout_path), stderr=stream(spec.stderr_path),
        timeout=timeout, queue=queue, options=options,
        pre_launch=None if spec.pre_launch is None else _abs(spec.pre_launch, cwd),
        post_launch=None if spec.post_launch is None else _abs(spec.post_launch, cwd))


def nodefile_text(plan: JobPlan) -> str | None:
    """What ``PSIJ_NODEFILE`` holds for ``plan`` (one node name a line), or
    None when the allocation is a single process (no file, as PSI/J's
    ``local`` executor does)."""
    if len(plan.nodefile) <= 1:
        return None
    return "".join(f"{name}\n" for name in plan.nodefile)


def exit_state(returncode: int | None, canceled: bool) -> str:
    """The PSI/J state a job that ended reaches: ``"COMPLETED"`` (status 0),
    ``"CANCELED"`` (canceled and not a success), else ``"FAILED"``."""
    if returncode == 0:
        return "COMPLETED"
    return "CANCELED" if canceled else "FAILED"


__all__ = ["JobPlan", "plan_job", "launcher_kind", "nodefile_text", "exit_state", "CUSTOM",
           "SINGLE", "PARALLEL"]
