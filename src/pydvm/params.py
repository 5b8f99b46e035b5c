"""The parameter registry: every tunable of a DVM, with its type, default and source.

A value comes from, in increasing priority: the default, the environment
(``PRTE_MCA_<name>``), or ``--mca NAME VALUE`` on ``pydvm start`` / a
one-shot ``pydvm run``.  The master resolves and validates them once at
start-up (a malformed value is a start-up error naming the parameter) and
sends the resolved set to every daemon as it registers; nothing re-reads
them afterwards.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping


class ParamError(ValueError):
    """A parameter is unknown or its value malformed."""


def _nonneg_float(text: str) -> float:
    v = float(text)
    if not v >= 0 or v == float("inf"):
        raise ValueError("must be a finite number >= 0")
    return v


def _nonneg_int(text: str) -> int:
    v = int(text, 0) if isinstance(text, str) else int(text)
    if v < 0:
        raise ValueError("must be >= 0")
    return v


def _size(text: str) -> int:
    """Bytes, with an optional k/m/g suffix (powers of 1024)."""
    t = str(text).strip().lower()
    mult = 1
    if t and t[-1] in "kmg":
        mult = 1024 ** ("kmg".index(t[-1]) + 1)
        t = t[:-1]
    return _nonneg_int(t) * mult


def _verbose(text: str) -> int:
    v = _nonneg_int(text)
    if v > VERBOSE_MAX:
        raise ValueError(f"must be between 0 and {VERBOSE_MAX}")
    return v


#: The store's trace levels: 0 off, 1 removals, 2 every operation.
VERBOSE_MAX = 2


def _window(text: str) -> int:
    v = _size(text)
    if not 64 * 1024 <= v <= 1024 ** 3:
        raise ValueError("must be between 64k and 1g")
    return v


def _cap(text: str) -> int:
    v = _nonneg_int(text)
    if not 1 <= v <= 1_000_000:
        raise ValueError("must be between 1 and 1000000")
    return v


def _positive_float(text: str) -> float:
    v = _nonneg_float(text)
    if v <= 0:
        raise ValueError("must be > 0")
    return v


def _poll_us(text: str) -> float:
    v = _nonneg_float(text)
    if v > 10_000:
        raise ValueError("must be between 0 and 10000")
    return v


def _pmix_mode(text: str) -> str:
    v = str(text).strip().lower()
    if v not in ("auto", "on", "off"):
        raise ValueError("must be auto, on or off")
    return v


def _on_off(text: str) -> str:
    v = str(text).strip().lower()
    if v not in ("on", "off"):
        raise ValueError("must be on or off")
    return v


def _nonempty_str(text: str) -> str:
    if not str(text).strip():
        raise ValueError("must not be empty")
    return str(text)


def _srun_args(text: str) -> str:
    import shlex

    shlex.split(str(text))  # unbalanced quotes are a start-up error, not an srun one
    return str(text)


@dataclass(frozen=True)
class Param:
    name: str
    parse: Callable[[str], Any]
    default: Any
    help: str
    type_name: str


REGISTRY: dict[str, Param] = {
    p.name: p
    for p in (
        Param("prte_data_server_timeout", _nonneg_float, 300.0,
              "idle seconds before INDEF and unread FIRST_READ items are removed; 0 disables",
              "seconds"),
        Param("prte_data_server_max_size", _size, 16 * 1024 * 1024,
              "bytes one uid may hold in one store (k/m/g suffixes); 0 disables the cap",
              "size"),
        Param("prte_data_server_verbose", _verbose, 0,
              "store trace level: 0 off, 1 traces removals (evict, expire, purge), "
              "2 every operation (0..2)", "int"),
        Param("plm_ssh_agent", _nonempty_str, "ssh",
              "command (split on spaces) that runs the daemon on a remote host: "
              "AGENT HOST pydvm daemon ...", "command"),
        Param("plm_slurm_args", _srun_args, "",
              "extra srun options for the step that starts the daemons inside a Slurm "
              "allocation (shell-quoted; placed after pydvm's own, so they win)", "options"),
        Param("pydvm_remote_python", str, "",
              "python interpreter that runs 'python -m pydvm daemon' on remote hosts "
              "(default: the master's own sys.executable)", "path"),
        Param("pydvm_heartbeat_interval", _positive_float, 2.0,
              "seconds between master<->daemon (and relay<->data server) heartbeats; "
              "a peer silent for 3 periods is lost", "seconds"),
        Param("pydvm_head_node", _nonempty_str, "auto",
              "node served by the master process itself (one hop for its clients): 'auto' "
              "(the node named like this machine, if any), 'none', or a node name", "name"),
        Param("pydvm_output_window", _window, 1024 * 1024,
              "bytes of one job's output a node may have in flight to a slow 'pydvm run' "
              "before it stops reading the job's pipes (k/m suffixes; 64k..1g)", "size"),
        Param("pydvm_pmix", _pmix_mode, "auto",
              "host a PMIx server on every node for PMIx/MPI programs: 'auto' (where "
              "libpmix is usable), 'on' (a node without it fails to start), 'off'", "auto|on|off"),
        Param("pydvm_max_outstanding", _cap, 1024,
              "requests (waiting lookups included) one client or tool connection may have "
              "outstanding; beyond it PMIX_ERR_OUT_OF_RESOURCE (1..1000000)", "int"),
        Param("pydvm_master_poll_us", _poll_us, 200.0,
              "microseconds the master keeps polling for the next request after each one "
              "instead of sleeping (a sleeping process's wake-up costs tens of µs on a VM); "
              "0 never; never on a one-CPU machine (0..10000)", "microseconds"),
        Param("pydvm_direct_data", _on_off, "on",
              "clients on daemon nodes send their master-store requests straight to the "
              "master (one connection per client process, vouched for by its daemon); "
              "'off': every request goes through the daemon", "on|off"),
    )
}

ENV_PREFIX = "PRTE_MCA_"


@dataclass(frozen=True)
class Resolved:
    value: Any
    source: str  # "default", "environment", "command line"


def resolve(
    cli: Iterable[tuple[str, str]] = (), env: Mapping[str, str] | None = None
) -> dict[str, Resolved]:
    """Resolve every registered parameter; raises ParamError with a clear message."""
    env = os.environ if env is None else env
    out: dict[str, Resolved] = {}
    for name, p in REGISTRY.items():
        out[name] = Resolved(p.default, "default")
        raw = env.get(ENV_PREFIX + name)
        if raw is not None:
            out[name] = Resolved(_parse(p, raw, f"environment variable {ENV_PREFIX}{name}"),
                                 "environment")
    for name, raw in cli:
        p = REGISTRY.get(name)
        if p is None:
            raise ParamError(f"unknown parameter {name!r} (see 'pydvm info' for the list)")
        out[name] = Resolved(_parse(p, raw, f"--mca {name}"), "command line")
    return out


def _parse(p: Param, raw: str, where: str) -> Any:
    try:
        return p.parse(raw)
    except (ValueError, TypeError) as exc:
        raise ParamError(f"bad value {raw!r} for {p.name} ({where}): {exc}; "
                         f"expected {p.type_name}") from None


def values(resolved: Mapping[str, Resolved]) -> dict[str, Any]:
    return {k: r.value for k, r in resolved.items()}


def to_wire(resolved: Mapping[str, Resolved]) -> dict[str, list]:
    return {k: [r.value, r.source] for k, r in resolved.items()}


def from_wire(data: Mapping[str, Any]) -> dict[str, Resolved]:
    """Rebuild (and re-validate) a resolved set sent by the master."""
    out = {}
    for name, p in REGISTRY.items():
        if name in data:
            value, source = data[name]
            out[name] = Resolved(_parse(p, str(value), "from the master"), str(source))
        else:
            out[name] = Resolved(p.default, "default")
    return out
