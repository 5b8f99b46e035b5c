"""Where a job's ranks go: ``mpirun``'s placement options, parsed and carried out.

Pure: no runtime, no asyncio, no argparse (the blocking ``pydvm run`` tool
imports the parsers; the master imports the mapper).  Two halves:

**Parsing** what a user types, into the run request's ``placement`` keys
(``docs/placement.md`` lists them): :func:`parse_map_by`,
:func:`parse_rank_by`, :func:`parse_bind_to`, :func:`parse_cpu_list`,
:func:`read_hostfile`.  Each raises ValueError whose text names the bad
text, worded after ``mpirun``'s message for the same mistake; the command
line prints it after ``pydvm run: ``.

**Mapping** (:func:`map_job`): which host each rank of each app runs on, as
Open MPI 4.1's ``mpirun`` decides it at the level of nodes (which object of
a node a rank is bound to is the node's business: it knows its topology).

* A job whose placement names no mapping option (no ``map_by``, ``ppr``,
  ``npernode``, ``rank_by``, ``span``, ``oversubscribe``) is mapped as
  pydvm always has (SPEC 9): each app fills its own hosts in the order
  listed, all of a host's slots before the next, wrapping around to the
  first host when every slot is used.
* Any mapping option makes the whole job ``mpirun``'s: ``slot`` (fill each
  host's slots in turn; past the slots, the rest is spread evenly, the
  first hosts taking one more), ``node`` (round robin over the hosts, as
  balanced as the slots allow), an object (``core``, ``socket``...: a
  host's slots, then one more per host per round), ``SPAN`` over objects
  (balanced over every object of every host, slots aside), ``ppr:N:R``
  and ``npernode`` (N per node or per object of a node).  The apps of a job
  share their hosts' slots: an app starts where the previous one left off.
  Ranks follow ``rank_by``: ``node`` deals them round robin over the hosts
  (the default for ``--map-by node``), anything else numbers each host's
  ranks in turn.
* ``ppn`` (``mpiexec``'s ``-ppn N``) makes every host of every app count N
  slots, whatever its own, before either rule: without a mapping option
  ranks fill N on a host, then the next, wrapping around -- as Hydra
  places them; and with ``wrap`` ``"job"`` (``mpiexec``'s ``-hosts``,
  ``-f``, ``-ppn``) an app on the same hosts as the previous one goes on
  from the slot after that one's last rank, as Hydra's contexts do.
* Oversubscription (more ranks on a host than its slots) is allowed unless
  ``oversubscribe`` is False (``--nooversubscribe``, ``:NOOVERSUBSCRIBE``):
  pydvm's default is SPEC 9's, where ``mpirun`` refuses by default.  A
  host's ``max_slots`` (hostfile) is a hard limit either way -- Open MPI
  4.1.4 lets ``--oversubscribe`` exceed it within one job; pydvm does not.
"""

from __future__ import annotations


#: Hardware objects ranks can be mapped by, ranked by, or counted per (ppr).
OBJECTS = ("core", "socket", "numa", "hwthread", "l3cache")
#: ``--map-by`` policies (besides ``ppr:N:RESOURCE``).
MAP_POLICIES = ("slot", "node", *OBJECTS)
#: ``--rank-by`` policies.
RANK_POLICIES = ("slot", "node", *OBJECTS)
#: ``--bind-to`` targets.
BIND_TARGETS = ("none", "core", "socket", "numa", "hwthread", "l3cache")
#: What ``ppr:N:RESOURCE`` may count per.
PPR_RESOURCES = ("node", *OBJECTS)
#: Other spellings of the same things (Open MPI 5 says package for socket).
_ALIASES = {"package": "socket", "l3": "l3cache", "hwthreads": "hwthread", "cores": "core",
            "sockets": "socket", "slots": "slot", "nodes": "node"}
#: ``mpirun`` 4.1 policies pydvm does not carry out, and what to use instead.
_UNSUPPORTED_MAP = {"l1cache": "core", "l2cache": "core", "board": "node", "seq": "a hostfile",
                    "dist": "numa", "rankfile": "a hostfile with --map-by slot"}

#: The placement keys that make a job mapped as ``mpirun`` maps it.
MAPPING_KEYS = ("map_by", "ppr", "npernode", "rank_by", "span", "oversubscribe")


def _word(text: str) -> str:
    w = text.strip().lower()
    return _ALIASES.get(w, w)


def _count(text: str, what: str, whole: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise ValueError(f"{what} must be a positive integer, not {text!r} in {whole!r}") from None
    if n < 1:
        raise ValueError(f"{what} must be a positive integer, not {text!r} in {whole!r}")
    return n


def parse_map_by(text: str) -> dict:
    """``--map-by`` text -> placement keys (``map_by``; ``ppr``; ``pe``,
    ``span``, ``oversubscribe`` from its modifiers).

    ``POLICY[:MODIFIER[,MODIFIER]...]`` or ``ppr:N:RESOURCE[:MODIFIER...]``;
    modifiers (``PE=n``, ``SPAN``, ``OVERSUBSCRIBE``, ``NOOVERSUBSCRIBE``)
    may be separated by ``:`` or ``,``; case does not matter (as
    ``mpirun``).  ``package`` means socket."""
    parts = [p for p in text.replace(",", ":").split(":")]
    policy = _word(parts[0]) if parts else ""
    out: dict = {}
    rest = parts[1:]
    if policy == "ppr":
        if len(rest) < 2 or not rest[0].strip() or not rest[1].strip():
            raise ValueError(f"the mapping request {text!r} does not match ppr's syntax "
                             "ppr:N:RESOURCE (e.g. ppr:2:node)")
        n = _count(rest[0].strip(), "the number of processes per resource (ppr)", text)
        res = _word(rest[1])
        if res not in PPR_RESOURCES:
            raise ValueError(f"unrecognized resource {rest[1]!r} for the number of processes per "
                             f"resource in {text!r} (one of {', '.join(PPR_RESOURCES)})")
        out["map_by"], out["ppr"] = "ppr", [n, res]
        rest = rest[2:]
    elif policy in MAP_POLICIES:
        out["map_by"] = policy
    elif policy in _UNSUPPORTED_MAP:
        raise ValueError(f"the mapping policy {parts[0]!r} (--map-by {text}) is not supported by "
                         f"pydvm; use {_UNSUPPORTED_MAP[policy]} instead")
    else:
        raise ValueError(f"the mapping policy {parts[0]!r} (--map-by {text}) is not recognized "
                         f"(one of {', '.join(MAP_POLICIES)}, ppr:N:RESOURCE)")
    for mod in rest:
        m = mod.strip()
        key, eq, val = m.partition("=")
        key = key.strip().lower()
        if key == "pe" and eq:
            out["pe"] = _count(val.strip(), "PE (cpus per process)", text)
        elif key == "span" and not eq:
            out["span"] = True
        elif key == "oversubscribe" and not eq:
            out["oversubscribe"] = True
        elif key == "nooversubscribe" and not eq:
            out["oversubscribe"] = False
        else:
            raise ValueError(f"the mapping request --map-by {text} contains an unrecognized "
                             f"modifier {m!r} (PE=n, SPAN, OVERSUBSCRIBE, NOOVERSUBSCRIBE)")
    return out


def parse_rank_by(text: str) -> str:
    """``--rank-by`` text -> the ``rank_by`` policy.  ``mpirun`` 4.1's
    ``:SPAN`` and ``:FILL`` modifiers are accepted and change nothing here
    (they order ranks among the objects of a node; pydvm ranks by node)."""
    parts = text.replace(",", ":").split(":")
    policy = _word(parts[0])
    if policy not in RANK_POLICIES:
        raise ValueError(f"the ranking policy {parts[0]!r} (--rank-by {text}) is not recognized "
                         f"(one of {', '.join(RANK_POLICIES)})")
    for mod in parts[1:]:
        if mod.strip().lower() not in ("span", "fill"):
            raise ValueError(f"the ranking request --rank-by {text} contains an unrecognized "
                             f"modifier {mod!r} (SPAN, FILL)")
    return policy


def parse_bind_to(text: str) -> dict:
    """``--bind-to`` text -> ``bind_to`` and ``overload`` (True with
    ``:overload-allowed``; ``:if-supported`` is accepted: binding that
    cannot be done is reported, not fatal, in pydvm anyway)."""
    parts = text.replace(",", ":").split(":")
    target = _word(parts[0])
    if target not in BIND_TARGETS:
        raise ValueError(f"the binding policy {parts[0]!r} (--bind-to {text}) is not recognized "
                         f"(one of {', '.join(BIND_TARGETS)})")
    overload = False
    for mod in parts[1:]:
        m = mod.strip().lower()
        if m == "overload-allowed":
            overload = True
        elif m != "if-supported":
            raise ValueError(f"the binding request --bind-to {text} contains an unrecognized "
                             f"qualifier {mod!r} (overload-allowed, if-supported)")
    return {"bind_to": target, "overload": overload}


def parse_cpu_list(text: str) -> list[int]:
    """``0,2-3`` -> ``[0, 2, 3]`` (sorted, each once)."""
    cpus: set[int] = set()
    for part in text.split(","):
        p = part.strip()
        lo, dash, hi = p.partition("-")
        try:
            a = int(lo)
            b = int(hi) if dash else a
        except ValueError:
            raise ValueError(f"bad cpu list {text!r}: {p!r} is not a cpu number or range "
                             "(e.g. 0,2-3)") from None
        if a < 0 or b < a:
            raise ValueError(f"bad cpu list {text!r}: {p!r} is not a cpu number or range "
                             "(e.g. 0,2-3)")
        cpus.update(range(a, b + 1))
    return sorted(cpus)


_SLOT_KEYS = ("slots", "slot", "count", "cpu", "cpus")
_MAX_KEYS = ("max_slots", "max-slots", "slots_max", "slots-max", "max_count", "max-count")


def read_hostfile(path: str) -> list[list]:
    """Open MPI's hostfile at ``path`` -> ``[[name, slots, max_slots or None], ...]``
    in first-listed order.

    One host a line, then ``slots=N`` (or ``count``, ``cpu``, ``cpus``) and
    ``max_slots=M`` (or ``max-slots``, ``slots_max``, ``max_count``);
    ``user@host`` is the host; ``#`` starts a comment.  A host listed
    again without ``slots=`` gains one slot (Open MPI's "once per slot");
    giving ``slots=`` for a host already listed is an error, as in Open
    MPI.  No ``slots=``: one slot, or ``max_slots`` if given.  Errors name
    ``path:line``."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise ValueError(f"cannot read hostfile {path}: {e.strerror or e}") from None
    hosts: dict[str, list] = {}
    for no, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split()
        name = words[0].rpartition("@")[2]
        where = f"hostfile {path}:{no}"
        if not name or "=" in name:
            raise ValueError(f"{where}: a line must start with a host name, not {words[0]!r}")
        if ":" in name:
            raise ValueError(f"{where}: {words[0]!r} is mpiexec's host:SLOTS form: give this "
                             f"file with -f, or write '{name.partition(':')[0]} slots=N'")
        slots = maxs = None
        for w in words[1:]:
            key, eq, val = w.partition("=")
            key = key.lower()
            if not eq or key not in _SLOT_KEYS + _MAX_KEYS:
                raise ValueError(f"{where}: cannot parse {w!r} (expected slots=N or "
                                 "max_slots=N)")
            try:
                v = int(val)
            except ValueError:
                v = -1
            if v < 1:
                raise ValueError(f"{where}: bad value in {w!r} (a positive integer)")
            if key in _SLOT_KEYS:
                slots = v
            else:
                maxs = v
        if slots is not None and maxs is not None and maxs < slots:
            raise ValueError(f"{where}: max_slots={maxs} is less than slots={slots} "
                             f"for host {name!r}")
        if name in hosts:
            if slots is not None:
                raise ValueError(f"{where}: host {name!r} is listed again with a slot count; "
                                 "list a host once per slot, or once with slots=N, not both")
            entry = hosts[name]
            entry[1] += 1
            if maxs is not None:
                entry[2] = maxs
            if entry[2] is not None and entry[1] > entry[2]:
                raise ValueError(f"{where}: host {name!r} has more slots ({entry[1]}) than "
                                 f"its max_slots ({entry[2]})")
            continue
        if slots is None:
            slots = maxs if maxs is not None else 1
        hosts[name] = [name, slots, maxs]
    if not hosts:
        raise ValueError(f"hostfile {path} names no host")
    return list(hosts.values())


def read_hydra_hostfile(path: str) -> list[list]:
    """MPICH's ``mpiexec -f`` host file (Hydra's format) at ``path`` ->
    ``[[name, slots], ...]`` in order.

    One host a line, ``host`` (one slot) or ``host:N``; ``#`` starts a
    comment.  A host on consecutive lines adds up its slots, as Hydra
    does; one listed again after another host is refused (Hydra would
    start a second set of its ranks there: list it once, ``host:N``).
    Hydra's ``binding=`` is refused (``--bind-to``), and so is Open MPI's
    ``slots=`` (``--hostfile``).  Errors name ``path:line``."""
    from .protocol import parse_host_list

    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise ValueError(f"cannot read host file {path}: {e.strerror or e}") from None
    hosts: list[list] = []
    for no, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"host file {path}:{no}"
        first, *rest = line.split()
        for w in rest:
            if w.lower().startswith(("slots=", "max_slots=", "max-slots=")):
                raise ValueError(f"{where}: {w!r} is Open MPI's hostfile form: give this "
                                 f"file with --hostfile, or write '{first}:N'")
            if w.lower().startswith("binding="):
                raise ValueError(f"{where}: {w!r}: bind with --bind-to, not in the host file")
            raise ValueError(f"{where}: cannot parse {w!r} (one host a line: host or host:N)")
        if "=" in first:
            raise ValueError(f"{where}: a line must start with a host name, not {first!r}")
        try:
            [(name, slots)] = parse_host_list(first)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        if hosts and hosts[-1][0] == name:
            hosts[-1][1] += slots
        elif any(h[0] == name for h in hosts):
            raise ValueError(f"{where}: host {name!r} is listed again after other hosts: list "
                             f"it once, as {name}:N")
        else:
            hosts.append([name, slots])
    if not hosts:
        raise ValueError(f"host file {path} names no host")
    return hosts


# ----------------------------------------------------------------------
# mapping
# ----------------------------------------------------------------------


class Host:
    """One host an app may run on: its ``slots``, ``max_slots`` (None: no
    limit) and ``topo`` (object counts, as nodes report them from
    :meth:`pydvm.runtime.node.topology.Topology.counts`; None: not
    known)."""

    __slots__ = ("name", "slots", "max_slots", "topo")

    def __init__(self, name: str, slots: int, max_slots: int | None = None,
                 topo: dict | None = None) -> None:
        self.name, self.slots, self.max_slots, self.topo = name, slots, max_slots, topo

    def __repr__(self) -> str:
        return f"Host({self.name!r}, {self.slots}, {self.max_slots}, {self.topo})"

    def objects(self, kind: str) -> int:
        """How many ``kind`` objects it has (``node``: 1); ValueError if unknown."""
        if kind == "node":
            return 1
        if not self.topo or not isinstance(self.topo.get(kind), int):
            raise ValueError(f"node {self.name} has not reported its topology: cannot count "
                             f"its {kind}s (use ppr:N:node, -N or a --map-by without SPAN)")
        return self.topo[kind]


def is_mpirun_mapping(placement: dict) -> bool:
    """Whether ``placement`` names a mapping option (then :func:`map_job`
    maps as ``mpirun``; else as SPEC 9)."""
    return any(placement.get(k) is not None for k in MAPPING_KEYS)


def _ppr(placement: dict) -> tuple[int, str] | None:
    """(N, resource) of ``ppr:N:R`` or ``npernode`` (None: neither)."""
    ppr = placement.get("ppr")
    if placement.get("map_by") == "ppr" or ppr:
        if not (isinstance(ppr, (list, tuple)) and len(ppr) == 2 and isinstance(ppr[0], int)
                and ppr[0] >= 1 and ppr[1] in PPR_RESOURCES):
            raise ValueError(f"bad ppr {ppr!r}: ppr:N:RESOURCE with N >= 1")
        return ppr[0], ppr[1]
    npn = placement.get("npernode")
    if npn is not None:
        if not isinstance(npn, int) or isinstance(npn, bool) or npn < 1:
            raise ValueError(f"-N/--npernode must be a positive integer, not {npn!r}")
        return npn, "node"
    return None


def check_placement(placement: dict) -> None:
    """ValueError naming the first key of ``placement`` that is malformed."""
    mb = placement.get("map_by")
    if mb is not None and mb not in MAP_POLICIES and mb != "ppr":
        raise ValueError(f"unknown map_by {mb!r}")
    rb = placement.get("rank_by")
    if rb is not None and rb not in RANK_POLICIES:
        raise ValueError(f"unknown rank_by {rb!r}")
    ov = placement.get("oversubscribe")
    if ov is not None and not isinstance(ov, bool):
        raise ValueError(f"oversubscribe must be true, false or null, not {ov!r}")
    pe = placement.get("pe")
    if pe is not None and (not isinstance(pe, int) or isinstance(pe, bool) or pe < 1):
        raise ValueError(f"PE must be a positive integer, not {pe!r}")
    ppn = placement.get("ppn")
    if ppn is not None and (not isinstance(ppn, int) or isinstance(ppn, bool) or ppn < 1):
        raise ValueError(f"-ppn must be a positive integer, not {ppn!r}")
    if placement.get("wrap") not in (None, "app", "job"):
        raise ValueError(f"wrap must be 'app' or 'job', not {placement['wrap']!r}")
    _ppr(placement)


def _wrap(n: int, hosts: list[Host], used: dict[str, int], start: int = 0) -> list[str]:
    """SPEC 9: fill the hosts' slots in order, wrapping around (hosts at
    their max_slots are passed over), from slot ``start``; ``.next`` of
    the answer is the slot after the last used."""
    seq = [h for h in hosts for _ in range(h.slots)]
    out: _Ranks = _Ranks()
    i, idle = start, 0
    while len(out) < n:
        h = seq[i % len(seq)]
        i += 1
        if h.max_slots is not None and used.get(h.name, 0) >= h.max_slots:
            idle += 1
            if idle >= len(seq):
                raise ValueError(_max_refusal(n, hosts))
            continue
        idle = 0
        used[h.name] = used.get(h.name, 0) + 1
        out.append(h.name)
    out.next = i % len(seq)
    return out


class _Ranks(list):
    """Hosts of an app's ranks, and where the next app goes on (:func:`_wrap`)."""

    next = 0


def _max_refusal(n: int, hosts: list[Host]) -> str:
    room = ", ".join(f"{h.name} max_slots={h.max_slots}" if h.max_slots is not None
                     else f"{h.name} no limit" for h in hosts)
    return (f"not enough slots available: {n} processes requested, more than the hosts' "
            f"max_slots allow ({room}); max_slots is a hard limit even with --oversubscribe")


class _Tally(dict):
    """Ranks per host, remembering the host given ranks last (``mpirun``'s
    bookmark: where the next app starts, :func:`_from_bookmark`)."""

    last: str | None = None

    def __setitem__(self, key: str, value: int) -> None:
        super().__setitem__(key, value)
        self.last = key


def _balanced(rem: int, hosts: list[Host]) -> list[int]:
    """``rem`` spread over ``hosts``, the first ones taking one more."""
    k, extra = divmod(rem, len(hosts))
    return [k + (1 if i < extra else 0) for i in range(len(hosts))]


def _by_slot(n: int, hosts: list[Host], used: dict[str, int]) -> dict[str, int]:
    counts = _Tally()
    left = n
    for h in hosts:  # each host's free slots, in order
        take = min(left, max(0, h.slots - used.get(h.name, 0)))
        if take:
            counts[h.name] = take
            used[h.name] = used.get(h.name, 0) + take
            left -= take
    if left:  # oversubscribed: the rest spread evenly, the first hosts one more
        for h, extra in zip(hosts, _balanced(left, hosts)):
            if extra:
                counts[h.name] = counts.get(h.name, 0) + extra
                used[h.name] = used.get(h.name, 0) + extra
    return counts


def _by_node(n: int, hosts: list[Host], used: dict[str, int]) -> dict[str, int]:
    counts = _Tally()
    free = {h.name: max(0, h.slots - used.get(h.name, 0)) for h in hosts}
    if n > sum(free.values()):  # oversubscribed: everyone takes an even share
        for h, share in zip(hosts, _balanced(n, hosts)):
            if share:
                counts[h.name] = share
    else:
        left, shared_by = n, len(hosts)
        while left and shared_by:
            # an even share of what is left (at least one each), the first
            # hosts with room one more; a host takes what its slots allow
            avg = max(1, left // shared_by)
            plus = left - avg * shared_by if left > avg * shared_by else 0
            shared_by = 0
            for h in hosts:
                if not free[h.name]:
                    continue
                take = min(avg + (1 if plus > 0 else 0), free[h.name], left)
                plus -= 1
                shared_by += 1
                counts[h.name] = counts.get(h.name, 0) + take
                free[h.name] -= take
                left -= take
                if not left:
                    break
    for name, c in counts.items():
        used[name] = used.get(name, 0) + c
    return counts


def _by_object(n: int, hosts: list[Host], used: dict[str, int]) -> dict[str, int]:
    counts = _Tally()
    left = n
    for h in hosts:  # first each host's free slots...
        take = min(left, max(0, h.slots - used.get(h.name, 0)))
        if take:
            counts[h.name] = take
            left -= take
    while left:  # ...then one more per host per round
        for h in hosts:
            if not left:
                break
            counts[h.name] = counts.get(h.name, 0) + 1
            left -= 1
    for name, c in counts.items():
        used[name] = used.get(name, 0) + c
    return counts


def _by_object_span(n: int, hosts: list[Host], kind: str,
                    used: dict[str, int]) -> dict[str, int]:
    objs = [(h, h.objects(kind)) for h in hosts]
    total = sum(k for _, k in objs)
    avg = max(1, n // total)
    extra = max(0, n - avg * total)
    counts = _Tally()
    left = n
    for h, k in objs:
        for _ in range(k):
            take = min(left, avg + (1 if extra > 0 else 0))
            extra -= 1
            if take:
                counts[h.name] = counts.get(h.name, 0) + take
                left -= take
    while left:  # not reached for n >= 1 (every object takes avg or more)
        for h, _ in objs:
            if left:
                counts[h.name] = counts.get(h.name, 0) + 1
                left -= 1
    for name, c in counts.items():
        used[name] = used.get(name, 0) + c
    return counts


def _by_ppr(n: int, hosts: list[Host], per: int, kind: str,
            used: dict[str, int]) -> dict[str, int]:
    counts = _Tally()
    left = n
    for h in hosts:
        take = min(left, per * h.objects(kind))
        if take:
            counts[h.name] = take
            used[h.name] = used.get(h.name, 0) + take
            left -= take
    return counts


def _ranked(counts: dict[str, int], order: list[str], rank_by: str) -> list[str]:
    """The hosts of an app's ranks in rank order: ``node`` deals round robin
    over the hosts, anything else numbers each host's ranks in turn."""
    hosts = [h for h in order if counts.get(h)]
    if rank_by != "node":
        return [h for h in hosts for _ in range(counts[h])]
    left = dict(counts)
    out: list[str] = []
    while hosts:
        for h in hosts:
            out.append(h)
            left[h] -= 1
        hosts = [h for h in hosts if left[h]]
    return out


def app_size(n: int | None, hosts: list[Host], placement: dict) -> int:
    """An app's rank count: ``n``, or derived as ``mpirun`` does when None:
    ppr/npernode's count on every host, else one rank per slot."""
    if n is not None:
        return n
    ppr = _ppr(placement)
    if ppr is not None:
        return sum(ppr[0] * h.objects(ppr[1]) for h in hosts)
    return sum(h.slots for h in hosts)


def map_job(apps: list[tuple[int | None, list[Host]]], placement: dict,
            names: list[str] | None = None) -> list[list[str]]:
    """The host of every rank of every app (``[[host of rank 0 of app 0,
    ...], ...]``), or ValueError saying why the job cannot be placed.

    ``apps``: each app's ``n`` (None: derive it, :func:`app_size`) and its
    hosts in order; ``placement``: the run request's; ``names``: each
    app's command, for messages.  See the module docstring for the rules."""
    check_placement(placement)
    names = names or [f"app {i}" for i in range(len(apps))]
    ppn = placement.get("ppn")
    if ppn is not None:  # mpiexec's -ppn: every host counts ppn slots
        apps = [(n, [Host(h.name, ppn, h.max_slots, h.topo) for h in hosts])
                for n, hosts in apps]
    used: dict[str, int] = {}
    if not is_mpirun_mapping(placement):
        out = []
        shared = placement.get("wrap") == "job"
        prev: list[str] | None = None
        start = 0
        for (n, hosts), name in zip(apps, names):
            size = app_size(n, hosts, placement)
            here = [h.name for h in hosts]
            # each app on its own (SPEC 9); mpiexec's (wrap "job"): an app of the
            # same hosts goes on from the slot after the previous app's last
            ranks = _wrap(size, hosts, {}, start if shared and here == prev else 0)
            start, prev = ranks.next, here
            out.append(list(ranks))
        return out
    ppr = _ppr(placement)
    map_by = placement.get("map_by") or ("ppr" if ppr else "slot")
    span = bool(placement.get("span"))
    over = placement.get("oversubscribe")
    rank_by = placement.get("rank_by") or ("node" if map_by == "node" else "slot")
    order: list[str] = []  # hosts in the order the job first used them
    out: list[list[str]] = []
    bookmark = None
    for (n, hosts), name in zip(apps, names):
        if bookmark is not None and not (ppr is not None and n is None):
            # later apps: the hosts with free slots, if they can hold the
            # app (else all; a ppr without -n counts every host), from the
            # first with room (SPAN: from where the previous app ended)
            start = bookmark if span and map_by in OBJECTS else hosts[0].name
            hosts = _from_bookmark(hosts, start, used)
            room = [h for h in hosts if used.get(h.name, 0) < h.slots]
            if n is None or sum(h.slots - used.get(h.name, 0) for h in room) >= n:
                hosts = room or hosts
        size = app_size(n, hosts, placement)
        free = sum(max(0, h.slots - used.get(h.name, 0)) for h in hosts)
        if ppr is not None:
            counts = _ppr_counts(size, n, hosts, ppr, used, over, name, placement)
        else:
            if over is False and size > free:
                raise ValueError(_slots_refusal(size, free, hosts, used, name))
            if map_by == "node":
                counts = _by_node(size, hosts, used)
            elif map_by == "slot":
                counts = _by_slot(size, hosts, used)
            elif span:
                counts = _by_object_span(size, hosts, map_by, used)
            else:
                counts = _by_object(size, hosts, used)
        for h in hosts:
            if counts.get(h.name) and h.name not in order:
                order.append(h.name)
        ranks = _ranked(counts, order, rank_by)
        bookmark = getattr(counts, "last", None) or bookmark
        _check_max_used(hosts, used, size, name)
        out.append(ranks)
    return out


def _from_bookmark(hosts: list[Host], last: str, used: dict[str, int]) -> list[Host]:
    """An app's hosts, starting from ``last`` (SPAN: the host the previous
    app was given ranks on last, ``mpirun``'s bookmark; else the first),
    unless it is full -- then from the next host with a free slot
    (wrapping around), or if none has one, from the least oversubscribed
    host if it is less so than ``last``."""
    names = [h.name for h in hosts]
    if last not in names:
        return hosts
    i = names.index(last)

    def over(j: int) -> int:
        return used.get(names[j], 0) - hosts[j].slots

    if over(i) >= 0:
        best = None
        for k in range(1, len(hosts)):
            j = (i + k) % len(hosts)
            if over(j) < 0:
                best = j
                break
            if best is None or over(j) <= over(best):
                best = j
        if best is not None and over(best) < over(i):
            i = best
    return hosts[i:] + hosts[:i]


def _ppr_counts(size: int, n: int | None, hosts: list[Host], ppr: tuple[int, str],
                used: dict[str, int], over: bool | None, name: str,
                placement: dict) -> dict[str, int]:
    per, kind = ppr
    most = sum(per * h.objects(kind) for h in hosts)
    if size > most:
        what = f"-N {per}" if placement.get("npernode") and not placement.get("ppr") \
            else f"ppr:{per}:{kind}"
        raise ValueError(f"{name}: {size} processes requested, more than {what} places on "
                         f"its {len(hosts)} host(s) ({most})")
    before = dict(used)
    counts = _by_ppr(size, hosts, per, kind, used)
    if over is False:
        for h in hosts:
            c = counts.get(h.name, 0)
            if c and before.get(h.name, 0) + c > h.slots:
                free = max(0, h.slots - before.get(h.name, 0))
                raise ValueError(
                    f"not enough slots available: {name} places {c} processes on {h.name}, "
                    f"which has {free} slot(s) free; request fewer processes per node, or allow "
                    f"oversubscription (--oversubscribe, or drop --nooversubscribe)")
    return counts


def _slots_refusal(size: int, free: int, hosts: list[Host], used: dict[str, int],
                   name: str) -> str:
    where = ", ".join(f"{h.name}:{max(0, h.slots - used.get(h.name, 0))}" for h in hosts)
    return (f"not enough slots available: {name} requests {size} slots and its hosts have "
            f"{free} ({where}); request fewer processes, or allow oversubscription "
            f"(--oversubscribe, or drop --nooversubscribe)")


def _check_max_used(hosts: list[Host], used: dict[str, int], size: int, name: str) -> None:
    for h in hosts:
        if h.max_slots is not None and used.get(h.name, 0) > h.max_slots:
            raise ValueError(
                f"not enough slots available: {name} would run {used[h.name]} processes on "
                f"{h.name}, whose max_slots is {h.max_slots} (a hard limit, even with "
                f"--oversubscribe); request fewer processes or raise max_slots")


# ----------------------------------------------------------------------
# --display-allocation, --display-map
# ----------------------------------------------------------------------


def display_allocation_lines(hosts: list[tuple[str, int, int | None]]) -> list[str]:
    """``mpirun --display-allocation``'s block for the job's hosts
    (``(name, slots, max_slots or None)`` in order).  Open MPI's node flags
    are left out; ``slots_inuse`` is 0 (a job is checked against its
    hosts' slots alone: docs/placement.md)."""
    lines = ["", "======================   ALLOCATED NODES   ======================"]
    for name, slots, maxs in hosts:
        lines.append(f"\t{name}: slots={slots} max_slots={maxs or 0} slots_inuse=0 state=UP")
    lines.append("=================================================================")
    return lines


def display_map_lines(nspace: str, procs: list[tuple[int, int, str]],
                      hosts: list[tuple[str, int, int | None]]) -> list[str]:
    """``mpirun --display-map``'s job map: ``procs`` are ``(rank, app,
    host)``; ``hosts`` ``(name, slots, max_slots or None)``.  The job is
    named by its namespace (``mpirun`` prints its daemon jobid); ``Bound``
    is ``N/A``: binding is each node's, which ``--report-bindings`` shows."""
    slots = {h[0]: h for h in hosts}
    by_host: dict[str, list[tuple[int, int]]] = {}
    for rank, app, host in sorted(procs):
        by_host.setdefault(host, []).append((rank, app))
    total = sum(slots[h][1] for h in by_host if h in slots)
    lines = [f" Data for JOB [{nspace}] offset 0 Total slots allocated {total}", "",
             " ========================   JOB MAP   ========================", ""]
    for host, ranks in by_host.items():
        _, s, m = slots.get(host, (host, 0, None))
        lines.append(f" Data for node: {host}\tNum slots: {s}\tMax slots: {m or 0}\t"
                     f"Num procs: {len(ranks)}")
        for rank, app in ranks:
            lines.append(f" \tProcess jobid: [{nspace}] App: {app} Process rank: {rank} "
                         "Bound: N/A")
        lines.append("")
    lines.append(" =============================================================")
    return lines
