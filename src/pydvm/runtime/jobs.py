"""Jobs, applications, processes and sessions as the master tracks them.

Pure bookkeeping, no I/O: the master feeds it process terminations and asks
it which lifetimes ended as a result.  :meth:`Job.proc_ended` is the one
place where the per-application termination count lives -- the piece of
accounting the data store's APP horizon depends on.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


@dataclass(frozen=True)
class HostSpec:
    name: str
    slots: int = 1


def parse_hosts(text: str) -> list[HostSpec]:
    """Parse ``h1,h2:4,...`` into host specs (one slot unless given)."""
    out: list[HostSpec] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        name, _, slots = part.partition(":")
        if not name:
            raise ValueError(f"empty host name in {text!r}")
        if slots:
            try:
                n = int(slots)
            except ValueError:
                raise ValueError(f"bad slot count {slots!r} for host {name!r}") from None
            if n < 1:
                raise ValueError(f"slot count for host {name!r} must be >= 1")
        else:
            n = 1
        out.append(HostSpec(name, n))
    if not out:
        raise ValueError(f"no hosts in {text!r}")
    names = [h.name for h in out]
    dups = {n for n in names if names.count(n) > 1}
    if dups:
        raise ValueError(f"host listed twice: {', '.join(sorted(dups))}")
    return out


def map_app(n: int, hosts: list[HostSpec]) -> list[str]:
    """Node of each of an app's ``n`` ranks (in rank order).

    The default mapping: ranks fill the hosts in the order listed, one slot
    at a time (all of a host's slots before the next host), wrapping around
    to the first host when every slot is used -- oversubscription is allowed.
    """
    seq = [h.name for h in hosts for _ in range(h.slots)]
    return [seq[i % len(seq)] for i in range(n)]


class ProcState(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    ENDED = "ended"


@dataclass
class ProcRecord:
    rank: int
    app_idx: int
    node: str
    state: ProcState = ProcState.PENDING
    exit_status: int | None = None


@dataclass
class AppRecord:
    idx: int
    argv: list[str]
    ranks: list[int]
    terminated: int = 0

    @property
    def done(self) -> bool:
        return self.terminated == len(self.ranks)


@dataclass
class JobRecord:
    """One job.  ``procs`` by rank; ranks numbered across the whole job."""

    nspace: str
    session_id: int
    apps: list[AppRecord]
    procs: dict[int, ProcRecord]
    terminated: int = 0
    #: exit status of the first process to end with a non-zero status.
    first_failure: int | None = None
    #: human-readable reason the job failed (launch error, lost node...).
    error: str = ""
    killed: bool = False
    #: the submitting user; the job's processes run as them.
    uid: int | None = None
    gid: int | None = None

    @property
    def size(self) -> int:
        return len(self.procs)

    @property
    def done(self) -> bool:
        return self.terminated == self.size

    @property
    def exit_status(self) -> int:
        return self.first_failure or 0

    def nodes(self) -> set[str]:
        return {p.node for p in self.procs.values()}

    def proc_ended(self, rank: int, status: int) -> tuple[bool, bool]:
        """Record that ``rank`` ended with ``status``.

        Returns ``(app_done, job_done)``; both False if the rank had
        already ended (a duplicate report is ignored).
        """
        p = self.procs[rank]
        if p.state is ProcState.ENDED:
            return False, False
        p.state = ProcState.ENDED
        p.exit_status = status
        if status != 0 and self.first_failure is None:
            self.first_failure = status
        app = self.apps[p.app_idx]
        app.terminated += 1
        self.terminated += 1
        return app.done, self.done


def build_job(
    nspace: str, session_id: int, apps: list[tuple[list[str], int, list[HostSpec]]]
) -> JobRecord:
    """Lay out a job: number ranks across apps and map each app to its hosts."""
    app_recs: list[AppRecord] = []
    procs: dict[int, ProcRecord] = {}
    rank = 0
    for idx, (argv, n, hosts) in enumerate(apps):
        nodes = map_app(n, hosts)
        ranks = list(range(rank, rank + n))
        for r, node in zip(ranks, nodes):
            procs[r] = ProcRecord(r, idx, node)
        app_recs.append(AppRecord(idx, list(argv), ranks))
        rank += n
    return JobRecord(nspace, session_id, app_recs, procs)


@dataclass
class SessionRecord:
    id: int
    hosts: list[HostSpec]
    jobs: set[str] = field(default_factory=set)
    #: every namespace that ever ran in the session (for relayed purges).
    history: set[str] = field(default_factory=set)
    ending: bool = False
