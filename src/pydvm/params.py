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

from .seal import MODES as SEAL_MODES


class ParamError(ValueError):
    """A parameter is unknown or its value malformed."""


def _nonneg_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise ValueError("not a number") from None
    if not v >= 0 or v == float("inf"):
        raise ValueError("must be a finite number >= 0")
    return v


def _nonneg_int(text: str) -> int:
    try:
        v = int(text, 0) if isinstance(text, str) else int(text)
    except ValueError:
        raise ValueError("not a whole number") from None
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
    try:
        return _nonneg_int(t) * mult
    except ValueError as exc:
        raise ValueError("not a size" if str(exc) == "not a whole number" else str(exc)) \
            from None


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


def _backlog(text: str) -> int:
    v = _size(text)
    if not 1024 <= v <= 1024 ** 3:
        raise ValueError("must be between 1k and 1g")
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


#: The interfaces a job's processes may be offered (``--mpi``, ``pydvm_mpi``).
MPI_INTERFACES = ("auto", "pmix", "pmi1", "none")


def _one_of(*words: str):
    """A check that takes exactly one of ``words`` (any case, spaces trimmed)."""
    said = ", ".join(words[:-1]) + f" or {words[-1]}"

    def check(text: str) -> str:
        v = str(text).strip().lower()
        if v not in words:
            raise ValueError(f"must be {said}")
        return v
    return check


_mpi_interface = _one_of(*MPI_INTERFACES)
_seal_mode = _one_of(*SEAL_MODES)  # which TCP links are sealed (pydvm_seal)
_pmi1_wire = _one_of("fd", "port")


def _auto_on(text: str) -> str:
    v = str(text).strip().lower()
    if v not in ("auto", "on"):
        raise ValueError("must be auto or on")
    return v


#: libpmix 4's job stores ("gds" modules), for pydvm_pmix_gds.
GDS_MODULES = ("hash", "ds12", "ds21")


def _gds(text: str) -> str:
    v = str(text).strip().lower().replace(" ", "")
    if v == "auto":
        return v
    names = v.split(",")
    if not v or any(n not in GDS_MODULES for n in names):
        raise ValueError("must be auto or a comma-separated list of " + ", ".join(GDS_MODULES))
    return v


def _on_off(text: str) -> str:
    v = str(text).strip().lower()
    if v not in ("on", "off"):
        raise ValueError("must be on or off")
    return v


def _auto_on_off(text: str) -> str:
    v = str(text).strip().lower()
    if v not in ("auto", "on", "off"):
        raise ValueError("must be auto, on or off")
    return v


def _nonempty_str(text: str) -> str:
    if not str(text).strip():
        raise ValueError("must not be empty")
    return str(text)


def _srun_args(text: str) -> str:
    import shlex

    shlex.split(str(text))  # unbalanced quotes are a start-up error, not an srun one
    return str(text)


#: What a valid value of a seconds or a size parameter looks like.
SECONDS = "seconds: a number >= 0, such as 300 or 0.5"
SIZE = ("a size in bytes: a whole number, optionally followed by k, m or g (powers of "
        "1024), such as 4096, 512k or 16m")


@dataclass(frozen=True)
class Param:
    name: str
    parse: Callable[[str], Any]
    default: Any
    help: str
    #: what a valid value looks like, for the message that refuses one.
    type_name: str


REGISTRY: dict[str, Param] = {
    p.name: p
    for p in (
        Param("prte_data_server_timeout", _nonneg_float, 300.0,
              "idle seconds before INDEF and unread FIRST_READ items are removed; 0 disables",
              SECONDS),
        Param("prte_data_server_max_size", _size, 16 * 1024 * 1024,
              "bytes one uid may hold in one store (k/m/g suffixes); 0 disables the cap",
              SIZE),
        Param("prte_data_server_verbose", _verbose, 0,
              "store trace level: 0 off, 1 traces removals (evict, expire, purge), "
              "2 every operation (0..2)", "a whole number from 0 to 2"),
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
              "a peer silent for 3 periods (of the time the judging process was running) "
              "is lost", "seconds: a number > 0, such as 2 or 0.5"),
        Param("pydvm_master_grace", _nonneg_float, 30.0,
              "seconds a daemon keeps its jobs running while its master is silent (its "
              "connection still open): a master stalled for less finds everything as it "
              "was; never less than 3 heartbeat periods", "seconds: a number >= 0, such as 30"),
        Param("pydvm_head_node", _nonempty_str, "auto",
              "node served by the master process itself (one hop for its clients): 'auto' "
              "(the node named like this machine, if any), 'none', or a node name", "name"),
        Param("pydvm_output_window", _window, 1024 * 1024,
              "bytes of one job's output a node may have in flight to a slow 'pydvm run' "
              "before it stops reading the job's streams, each message counted as its "
              "bytes plus 256; what the master holds of it (k/m suffixes; 64k..1g)",
              SIZE.replace("a size", "a size from 64k to 1g", 1)),
        Param("pydvm_mpi", _mpi_interface, "auto",
              "the process-management interface a job's processes get when its run does "
              "not say (--mpi): 'auto' (read off each program: PMI-1 for the MPICH family, "
              "PMIx otherwise), 'pmix', 'pmi1' or 'none'", "auto|pmix|pmi1|none"),
        Param("pydvm_pmi1_wire", _pmi1_wire, "fd",
              "how a PMI-1 process reaches its node: 'fd' (an inherited socket, PMI_FD, as "
              "MPICH's launcher gives it) or 'port' (PMI_PORT on the node's loopback and a "
              "one-time PMI_ID: for programs started by a wrapper that closes inherited "
              "descriptors)", "fd|port"),
        Param("pydvm_pmix", _pmix_mode, "auto",
              "host a PMIx server on every node for PMIx/MPI programs: 'auto' (where "
              "libpmix is usable), 'on' (a node without it fails to start), 'off'", "auto|on|off"),
        Param("pydvm_pmix_user_idle", _nonneg_float, 60.0,
              "multi-user DVMs: seconds a user's own PMIx server stays on a node after that "
              "user's last PMIx job there ended; 0 keeps it until the DVM stops", SECONDS),
        Param("pydvm_pmix_isolate", _pmix_mode, "auto",
              "'on': the DVM owner's PMIx/MPI jobs get a PMIx server in a process of its own "
              "on each node too, as other users' always do, so a crash inside libpmix ends "
              "only that server and the processes it served, never the node or the master "
              "(PMIx tools from outside any job get a server process of their own on the "
              "head node, likewise); 'off': the owner's jobs and tools use the node "
              "process's own server; 'auto': on for a "
              "DVM that 'pydvm start' starts, off for a one-shot 'pydvm run' (one job: "
              "nothing else to protect, and no extra process to start)", "auto|on|off"),
        Param("pydvm_pmix_watchdog", _nonneg_float, 30.0,
              "seconds within which a PMIx server process (pydvm_pmix_isolate, other "
              "users', the tool server) must answer the node's probe -- a call its libpmix "
              "completes on its progress thread -- or be ended as hung: its connected "
              "processes' jobs end saying so, the next job gets a new one; 0 disables",
              SECONDS),
        Param("pydvm_pmix_gds", _gds, "auto",
              "libpmix's job store for the PMIx servers of a node (PMIX_MCA_gds): 'hash' "
              "copies a job's data into each of its processes at PMIx_Init -- half "
              "libpmix's cost per job of the shared-memory stores and faster MPI_Init for "
              "small jobs --, 'ds21,ds12,hash' (libpmix's own choice) shares one copy per "
              "node, the smaller footprint for many local ranks of a large job; 'auto': "
              "hash on a node with at most 8 CPUs, libpmix's choice on larger ones",
              "auto|hash|ds21,ds12,hash"),
        Param("pydvm_pmix_attribute_fix", _on_off, "on",
              "libpmix 4.2.0-4.2.4 crash on an attribute query (pattrs --host-fns); 'on' "
              "answers those queries before libpmix can; 'off' leaves the crash in (to see "
              "what a crash inside libpmix does)", "on|off"),
        Param("pydvm_pmix_system_server", _auto_on_off, "auto",
              "'on' in a DVM started by root: its PMIx tool server is also this machine's "
              "system server ($TMPDIR/pmix.sys.<hostname>), which PMIx tools asking for one "
              "(pps, pevent, pattrs) try first -- also those run inside other DVMs' jobs; "
              "'auto': on for a multi-user DVM (every user's tools find it by themselves), "
              "off otherwise; never over another live server's file", "auto|on|off"),
        Param("pydvm_max_outstanding", _cap, 1024,
              "requests (waiting lookups included) one client or tool connection may have "
              "outstanding; beyond it PMIX_ERR_OUT_OF_RESOURCE (1..1000000)",
              "a whole number from 1 to 1000000"),
        Param("pydvm_death_signal", _auto_on, "auto",
              "the kernel's parent-death signal for job processes: 'on' starts every one "
              "through setpriv --pdeathsig (killed the instant its node process dies; "
              "about 1 ms of CPU per process); 'auto': only those started as another user "
              "(through setpriv for the switch anyway) -- the node's guardian ends the "
              "others, with their own children, within 50 ms of the node's death",
              "auto|on"),
        Param("pydvm_master_poll_us", _poll_us, 200.0,
              "microseconds the master keeps polling for the next request after each one "
              "instead of sleeping (a sleeping process's wake-up costs tens of µs on a VM), "
              "and a PMIx server process of its own (other users', pydvm_pmix_isolate) "
              "for the head node's answer to a data request, and the head node for that "
              "server's next one; 0 never; never on a one-CPU machine (0..10000)",
              "microseconds: a number from 0 to 10000"),
        Param("pydvm_direct_data", _on_off, "on",
              "clients on daemon nodes send their master-store requests straight to the "
              "master (one connection per client process, vouched for by its daemon); "
              "'off': every request goes through the daemon", "on|off"),
        Param("pydvm_seal", _seal_mode, "network",
              "which TCP links carry sealed frames (AES-256-GCM, keys per connection from "
              "the DVM secret and an X25519 exchange; a frame altered, replayed, reordered "
              "or dropped closes its link): 'network', every link whose peer is not on "
              "loopback -- between machines, or network namespaces; 'all', loopback too; "
              "'off', none: clear frames anyone on the path can read and forge (for "
              "measuring, or a network already encrypted below the DVM).  Unix sockets "
              "are never sealed: the kernel names their peer", "network|all|off"),
        Param("pydvm_queue", _on_off, "off",
              "'on': a job that does not fit the slots free now waits at the master for "
              "them (as 'pydvm run --queue' asks per job) instead of oversubscribing its "
              "nodes at once; a 'run' request's own 'queue' field overrides it", "on|off"),
        Param("pydvm_event_backlog", _backlog, 4 * 1024 * 1024,
              "bytes a tool connection may have unread before its job-event subscriptions "
              "('pydvm events') are dropped, so a subscriber that stops reading cannot grow "
              "the master's memory (k/m suffixes; 1k..1g)",
              SIZE.replace("a size", "a size from 1k to 1g", 1)),
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
            raise ParamError(_unknown_mca(name, raw))
        out[name] = Resolved(_parse(p, raw, f"--mca {name}"), "command line")
    return out


def _unknown_mca(name: str, value: str) -> str:
    """The one-line refusal of ``--mca NAME VALUE`` for a name pydvm does not know."""
    import shlex

    close = closest_name(name)
    if close is not None:
        return f"unknown parameter {name!r}: did you mean {close}? ('pydvm info' lists them)"
    if name.lower().startswith("pydvm_"):
        return f"unknown parameter {name!r} ('pydvm info' lists them)"
    return (f"unknown parameter {name!r}: --mca sets pydvm's own parameters only ('pydvm "
            f"info' lists them); an Open MPI parameter goes in the environment of 'pydvm "
            f"run', which its processes inherit: OMPI_MCA_{name}={shlex.quote(value)}")


#: The most edits (a letter inserted, dropped, changed, or two swapped) that
#: make a name a near miss of one of pydvm's.
NEAR_MISS_EDITS = 2


def closest_name(name: str) -> str | None:
    """The registered parameter ``name`` is a near miss of (a typo: at most
    :data:`NEAR_MISS_EDITS` edits, letter case aside), or None."""
    low = name.lower()
    best = min(REGISTRY, key=lambda known: (_edits(low, known), known))
    return best if _edits(low, best) <= NEAR_MISS_EDITS else None


def _edits(a: str, b: str) -> int:
    """Edit distance counting an adjacent swap as one edit (optimal string alignment)."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
    return prev[len(b)]


def ignored_env_warnings(env: Mapping[str, str] | None = None) -> list[str]:
    """One warning line per ``PRTE_MCA_*`` variable pydvm ignores although it
    looks meant for pydvm: a near miss of a pydvm parameter
    (``PRTE_MCA_prte_data_server_timeuot``), or any unknown ``pydvm_`` name.

    Other unknown ``PRTE_MCA_*`` names are left alone: PRRTE itself has
    hundreds of parameters under that prefix, and a user who also runs PRRTE
    may well have some set -- warning about each would be noise on every
    command, and would teach people to ignore the warning that matters.
    """
    env = os.environ if env is None else env
    out = []
    for var in sorted(env):
        if not var.startswith(ENV_PREFIX) or var[len(ENV_PREFIX):] in REGISTRY:
            continue
        name = var[len(ENV_PREFIX):]
        close = closest_name(name)
        if close is not None:
            out.append(f"warning: {var} is not a pydvm parameter and is ignored; did you mean "
                       f"{ENV_PREFIX}{close}?")
        elif name.lower().startswith("pydvm_"):
            out.append(f"warning: {var} is not a pydvm parameter and is ignored ('pydvm info' "
                       "lists them)")
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
