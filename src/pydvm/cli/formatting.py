"""What the command line prints: every output format in one place, as pure functions.

Each function takes data (a reply from the master, a registry record) and
returns the lines to print; none of them reads the clock, the environment
or a socket, so every format is tested on its own
(``tests/test_cli_format.py``).

Plain output rules
------------------
SPEC 9 prints a str value **as is**: so does this module, spaces included,
unless the value holds a line break or another unprintable character --
then it is printed as a JSON string literal (double quotes, with ``\\n``,
``\\t``, ``\\"``, ``\\\\`` and ``\\uXXXX`` escapes), so that every
``FOUND`` stays one line.  A key is printed as is when it is one plain
token -- non-empty, printable, no whitespace, no ``"`` and no ``\\`` -- and
as a JSON string literal otherwise, so that ``K`` is always one token and
``V`` is everything between ``K`` and the last two tokens (``from
NSPACE:RANK``).  A value that is not a str (bytes, int, float, bool) is
printed as its Python literal (``repr``; ``ast.literal_eval`` reads it
back), as SPEC 9 says.  Plain output cannot tell a str ``"42"`` from an int
``42``, nor a str that looks quoted from a quoted one: ``--json`` can.
"""

from __future__ import annotations

import math
import time

from ..enums import Persistence

TYPE_CHECKING = False  # (not typing's: every pydvm run loads this module)
if TYPE_CHECKING:
    from typing import Any, Iterable

# ----------------------------------------------------------------------
# tokens
# ----------------------------------------------------------------------

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t",
            "\b": "\\b", "\f": "\\f"}


def is_plain(text: str) -> bool:
    """True when ``text`` prints as itself (see the module docstring)."""
    return bool(text) and text.isprintable() and not any(
        c.isspace() or c in '"\\' for c in text)


def quote(text: str) -> str:
    """``text`` as one unambiguous token: itself when plain, else a JSON string."""
    return text if is_plain(text) else _json_string(text)


def value_text(value: Any) -> str:
    """A looked-up value in plain output: a str as is (SPEC 9) unless it holds
    something unprintable (a line break...), then quoted; others as repr."""
    if isinstance(value, str):
        return value if value.isprintable() else _json_string(value)
    return repr(value)


def _json_string(text: str) -> str:
    """``text`` as a JSON string literal (always quoted)."""
    out = ['"']
    for c in text:
        esc = _ESCAPES.get(c)
        if esc is not None:
            out.append(esc)
        elif c == " " or c.isprintable():
            out.append(c)
        else:
            cp = ord(c)
            if cp > 0xFFFF:  # JSON spells astral code points as a surrogate pair
                cp -= 0x10000
                out.append(f"\\u{0xD800 + (cp >> 10):04x}\\u{0xDC00 + (cp & 0x3FF):04x}")
            else:
                out.append(f"\\u{cp:04x}")
    out.append('"')
    return "".join(out)


def found_line(key: str, value: Any, nspace: str, rank: int) -> str:
    """SPEC 9's ``FOUND K V from NSPACE:RANK`` (a plain str value exactly as before)."""
    return f"FOUND {quote(key)} {value_text(value)} from {nspace}:{rank}"


# ----------------------------------------------------------------------
# lookup --json
# ----------------------------------------------------------------------


def json_value(value: Any) -> tuple[Any, str]:
    """``(value, type)`` for ``lookup --json``.

    Types are ``str``, ``int``, ``float``, ``bool`` and ``bytes``; a bytes
    value is given as base64 text (the type says so), and a float that JSON
    cannot hold (nan, inf) as its Python spelling, ``"nan"`` or ``"inf"``.
    """
    if isinstance(value, bool):
        return value, "bool"
    if isinstance(value, int):
        return value, "int"
    if isinstance(value, float):
        return (value if math.isfinite(value) else repr(value)), "float"
    if isinstance(value, bytes):
        from base64 import b64encode

        return b64encode(value).decode("ascii"), "bytes"
    return value, "str"


def lookup_json(status: str, keys: Iterable[str], found: Iterable[Any]) -> dict:
    """The one object ``pydvm lookup --json`` prints.

    ``{"status": NAME, "found": {KEY: {"value", "type", "publisher":
    {"nspace", "rank"}}}, "missing": [KEY, ...]}``; ``found`` holds objects
    with ``key``, ``value``, ``nspace`` and ``rank``.
    """
    out: dict[str, Any] = {}
    for f in found:
        value, type_ = json_value(f.value)
        out[f.key] = {"value": value, "type": type_,
                      "publisher": {"nspace": f.nspace, "rank": f.rank}}
    return {"status": status, "found": out, "missing": [k for k in keys if k not in out]}


# ----------------------------------------------------------------------
# a job's end
# ----------------------------------------------------------------------


def signal_name(signum: int) -> str:
    try:
        from signal import Signals

        return Signals(signum).name
    except ValueError:
        return f"SIG{signum}"


def _how(status: int, signum: int, unfinalized: bool = False) -> str:
    if signum:
        how = f"was killed by signal {signal_name(signum)} ({signum})"
    else:
        how = f"exited with status {status}"
    if unfinalized:
        how += " without finalizing (it called PMIx_Init or MPI_Init but not the Finalize)"
    return how


def _procs(n: int, other: bool) -> str:
    o = "other " if other else ""
    return f"{n} {o}process was killed" if n == 1 else f"{n} {o}processes were killed"


def job_end_lines(r: dict, interrupted: bool, exit_status: int | None = None) -> list[str]:
    """What ``pydvm run`` prints on stderr when its job has ended (``r`` is
    the master's final reply): one line per process that failed on its own,
    a summary naming the first when several did, and who ended the job when
    it was killed -- unless ``interrupted`` (our own Ctrl-C or closed
    stdout), which ends the job quietly as before.

    ``exit_status`` is the status ``pydvm run`` exits with (default: the
    job's).  When it is not the job's -- an interrupted run exits 128+N for
    signal N whatever its processes did -- the summary says both, so that
    the line never names a status the command does not exit with."""
    ns = r.get("nspace")
    rows = r.get("failures") or []
    several_apps = (r.get("apps") or 1) > 1
    out = []
    for row in rows:
        rank, app_idx, node, status, signum = row[:5]
        unfinalized = bool(row[5]) if len(row) > 5 else False
        app = f" (app {app_idx})" if several_apps else ""
        out.append(f"pydvm run: process [{ns},{rank}]{app} on node {node} "
                   f"{_how(status, signum, unfinalized)}")
    for row in r.get("ended") or ():
        rank, app_idx, node, status, signum, who = row[:6]
        app = f" (app {app_idx})" if several_apps else ""
        out.append(f"pydvm run: process [{ns},{rank}]{app} on node {node} "
                   f"{_how(status, signum)}: ended by {who}")
    failed = r.get("failed") or 0
    if failed > len(rows):
        out.append(f"pydvm run: {ns}: ... and {failed - len(rows)} more failed processes")
    if failed > 1 and rows:
        first = (f"pydvm run: {ns}: {failed} of the job's processes failed; the first to "
                 f"fail was [{ns},{rows[0][0]}]")
        job_status = r.get("exit")
        if exit_status is None or exit_status == job_status:
            out.append(f"{first}, so the job exits with status {job_status}")
        else:
            why = (f"was interrupted by {signal_name(exit_status - 128)}" if exit_status > 128
                   else "was interrupted")
            out.append(f"{first} (status {job_status}), but pydvm run {why}, so it exits with "
                       f"status {exit_status}")
    msg = r.get("msg")
    if msg and not interrupted:
        killed = r.get("killed") or 0
        out.append(f"pydvm run: {ns}: {msg}" + (f"; {_procs(killed, bool(rows))}" if killed
                                                else ""))
    return out


def one_shot_warning(rows: list[dict], truncated: bool = False) -> str | None:
    """The one line a one-shot ``pydvm run`` prints when its DVM ends holding
    items a persistent DVM would have kept; ``rows`` are the ``key_info``
    rows of its stores (``truncated``: a store described only some of its
    keys, so the count is a lower bound).  None when there are none."""
    kept = [r for r in rows if r.get("persistence") in KEPT_BY_A_PERSISTENT_DVM]
    if not kept:
        return None
    shown = ", ".join(f"{quote(r['key'])} ({r['persistence']})" for r in kept[:5])
    more = f" and {len(kept) - 5} more" if len(kept) > 5 else ""
    n = len(kept)
    least = "at least " if truncated else ""
    return (f"pydvm run: warning: this one-shot DVM ended holding {least}{n} "
            f"key{'s' if n > 1 else ''} "
            f"that a persistent DVM would have kept: {shown}{more}; to keep data between "
            "jobs, start one first: export PYDVM_URI=$(pydvm start --daemonize)")


#: Persistence words whose items outlive a job in a persistent DVM's default
#: session: what a one-shot DVM loses when it ends.
KEPT_BY_A_PERSISTENT_DVM = frozenset(
    p.word for p in (Persistence.SESSION, Persistence.INDEF, Persistence.FIRST_READ))


# ----------------------------------------------------------------------
# tables
# ----------------------------------------------------------------------


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Left-aligned columns separated by two spaces; the last is not padded."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    out = []
    for row in [header, *rows]:
        cells = [str(c).ljust(w) for c, w in zip(row[:-1], widths)] + [str(row[-1])]
        out.append("  ".join(cells).rstrip())
    return out


def wall_time(t: float | None) -> str:
    """A wall-clock time (seconds since the epoch) as local ``YYYY-MM-DD HH:MM:SS``."""
    if not t:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def duration(seconds: float | None) -> str:
    """``0.4s``, ``42s``, ``5m03s``, ``2h01m``, ``3d04h``; ``-`` for None."""
    if seconds is None:
        return "-"
    s = max(0.0, seconds)
    if s < 10:
        return f"{s:.1f}s"
    s = int(s)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def user_name(uid: int | None) -> str:
    if uid is None:
        return "-"
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return str(uid)


def apps_text(apps: list[dict]) -> str:
    """A job's app contexts the way ``pydvm run`` takes them: ``-n 2 a : -n 1 b``."""
    return " : ".join(f"-n {a['n']} " + " ".join(quote(x) for x in a["argv"]) for a in apps)


def ps_lines(jobs: list[dict]) -> list[str]:
    """``pydvm ps``: one row per job, oldest first (fields: ``toolreqs.job_row``)."""
    rows = []
    for j in sorted(jobs, key=lambda j: (j.get("started") or 0, j["nspace"])):
        per_node = ",".join(f"{n}:{k}" for n, k in j["ranks_per_node"].items())
        rows.append([j["nspace"], user_name(j.get("uid")), str(j["session"]), j["state"],
                     wall_time(j.get("started")), per_node, apps_text(j["apps"])])
    return table(["NSPACE", "USER", "SESSION", "STATE", "STARTED", "RANKS", "APPS"], rows)


def dvms_lines(dvms: list[dict], current: str | None) -> list[str]:
    """``pydvm dvms``: one row per running DVM of this user; ``current`` is
    the URI in ``PYDVM_URI`` (its row is marked)."""
    rows = []
    for d in dvms:
        jobs = d.get("jobs")
        mark = "*" if current and d.get("uri") == current else ""
        rows.append([d.get("dvm", "?"), d.get("uri", "?"), ",".join(d.get("hosts") or []),
                     wall_time(d.get("started")),
                     "?" if jobs is None else str(jobs), mark])
    out = table(["DVM", "URI", "HOSTS", "STARTED", "JOBS", ""], rows)
    if any(r[-1] for r in rows):
        out.append("(* is the DVM PYDVM_URI names)")
    return out


# ----------------------------------------------------------------------
# pydvm store
# ----------------------------------------------------------------------


def store_lines(stores: list[dict]) -> list[str]:
    """``pydvm store``: the counts table as before, then the caller's own keys
    one per row (what ``OBJECT IDLETIME`` / ``TTL`` tell a Redis user)."""
    out = [f"{'store':<20} {'items':>7} {'parked':>7} {'evictions':>9} {'expiries':>8}  "
           "bytes by uid"]
    keyrows: list[list[str]] = []
    cut: list[str] = []
    for s in stores:
        if "error" in s:
            out.append(f"{s['store']:<20} unavailable: {s['error']}")
            continue
        by_uid = ", ".join(f"{u}: {b}" for u, b in s["bytes_by_uid"].items()) or "-"
        out.append(f"{s['store']:<20} {s['items']:>7} {s['parked']:>7} {s['evictions']:>9} "
                   f"{s['expiries']:>8}  {by_uid}")
        if s.get("keys"):
            out.append(f"{'':<20} your keys: {' '.join(quote(k) for k in s['keys'])}")
        for k in s.get("key_info") or ():
            keyrows.append([s["store"], quote(k["key"]), k["persistence"], k["range"],
                            duration(k["idle"]), duration(k["expires_in"]), str(k["size"]),
                            k["publisher"]])
        if s.get("key_info_truncated"):
            cut.append(f"({s['store']} holds more of your keys: only the "
                       f"{len(s.get('key_info') or ())} least recently used are shown)")
    if keyrows:
        out.append("")
        out.append("your keys (IDLE: since last access; EXPIRES: until the idle timeout "
                   "removes it, '-' when a lifetime does):")
        out += table(["STORE", "KEY", "PERSISTENCE", "RANGE", "IDLE", "EXPIRES", "SIZE",
                      "PUBLISHER"], keyrows)
    return out + cut
