"""Finding DVMs and not losing data: ``pydvm dvms``, stale URIs, second starts, one-shot runs.

Every DVM this user runs on this machine has a record in the state
directory (:mod:`pydvm.runtime.shared.registry`); a record is trusted only while
its DVM holds its lock, so a DVM that died however it died never shows.
That registry answers three questions here:

* ``pydvm dvms``: which DVMs are running (URI, hosts, start time, and how
  many jobs each runs, asked of each master with a short timeout);
* a command whose ``PYDVM_URI`` (or ``--dvm``) names no running DVM: is it
  stale (the DVM ran here and ended) or just unreachable -- and what to do;
* ``pydvm start`` while ``PYDVM_URI`` names a running DVM: the usual
  ``export PYDVM_URI=$(pydvm start ...)`` would make the first one hard to
  find, so start warns on stderr naming it (and how to reach or stop it) and
  then starts the new one as asked: SPEC 9's ``pydvm start`` always starts
  a DVM, and ``pydvm dvms`` lists both.

A one-shot ``pydvm run`` (no DVM given) ends its private DVM with the job;
:func:`one_shot_warning` is the one line it prints when that DVM ends holding
items a persistent DVM would have kept (SESSION, INDEF, unread FIRST_READ).
"""

from __future__ import annotations

import os
import sys

from . import formatting as F
from .common import fail
from .toolcommon import START_HINT
from ..protocol import DvmUri, UriError

# asyncio and the registry (pydvm.runtime) are imported where used: a
# pydvm run that explains a stale URI, or says none is given, loads this.

#: How long ``pydvm dvms`` waits for each master's answer.
INFO_TIMEOUT = 3.0


# ----------------------------------------------------------------------
# pydvm dvms
# ----------------------------------------------------------------------


async def _jobs_of(uri: str) -> int | None:
    """How many jobs the DVM at ``uri`` runs; None if it does not answer in time."""
    import asyncio

    from .tool import ToolError, call

    try:
        r = await asyncio.wait_for(call(DvmUri.parse(uri), {"t": "info"}, INFO_TIMEOUT),
                                   INFO_TIMEOUT)
    except (ToolError, UriError, OSError, asyncio.TimeoutError):
        return None
    jobs = r.get("jobs")
    return len(jobs) if isinstance(jobs, list) else None


async def running_dvms() -> list[dict]:
    """This user's running DVMs (records of dead ones are dropped on the
    way), each with ``jobs``: how many jobs it runs, or None if it did not
    answer within :data:`INFO_TIMEOUT`."""
    import asyncio

    from ..runtime.shared import registry

    records = registry.running()
    counts = await asyncio.gather(*[_jobs_of(str(r.get("uri"))) for r in records])
    for rec, n in zip(records, counts):
        rec["jobs"] = n
    return sorted(records, key=lambda r: (r.get("started") or 0, str(r.get("dvm"))))


def cmd_dvms(a) -> int:
    import json

    from .start import run_async

    dvms = run_async(running_dvms())
    current = os.environ.get("PYDVM_URI", "").strip() or None
    if a.json:
        for d in dvms:
            d["current"] = bool(current) and d.get("uri") == current
        print(json.dumps({"dvms": dvms}))
    elif a.quiet:
        for d in dvms:
            print(d.get("uri"))
    elif dvms:
        print("\n".join(F.dvms_lines(dvms, current)))
    else:
        print(f"no running DVM of yours on this machine; start one with: {START_HINT}")
    return 0


# ----------------------------------------------------------------------
# a URI nobody answers at
# ----------------------------------------------------------------------


def unreachable_lines(uri: DvmUri, why: str, from_env: bool) -> list[str]:
    """What to tell a user whose command named a DVM that does not answer.

    ``from_env``: the URI came from ``PYDVM_URI`` (not ``--dvm``), so the
    message names the variable and how to clear or reset it.
    """
    from ..runtime.shared import registry

    running = registry.is_running(uri.dvmid)
    if running is False:  # it ran here and ended: the reason adds nothing
        state = f"DVM {uri.dvmid} is not running any more"
    elif running is True:
        state = f"DVM {uri.dvmid} is running but does not answer here ({why})"
    else:
        state = f"no DVM of yours answers there ({why})"
    where = f"PYDVM_URI={uri}" if from_env else f"--dvm {uri}"
    lines = [f"pydvm: {where}: {state}"]
    if from_env:
        lines.append("pydvm: unset PYDVM_URI ('pydvm run' then runs a one-shot DVM), or set "
                     "it to a running DVM: 'pydvm dvms' lists yours, "
                     f"'{START_HINT}' starts one")
    else:
        lines.append(f"pydvm: 'pydvm dvms' lists your running DVMs; '{START_HINT}' starts one")
    return lines


# ----------------------------------------------------------------------
# pydvm start while PYDVM_URI names a running DVM
# ----------------------------------------------------------------------


def warn_before_second_start(a) -> None:
    """Warn on stderr when ``PYDVM_URI`` names a running DVM of this user
    and ``pydvm start`` is about to start another (see the module
    docstring).  Silent when the new DVM is meant to use the first as its
    data server, or reuses its id (which start refuses anyway)."""
    text = os.environ.get("PYDVM_URI", "").strip()
    if not text:
        return
    try:
        uri = DvmUri.parse(text)
    except UriError:
        return
    if getattr(a, "data_server_uri", None) or getattr(a, "dvm_id", None) == uri.dvmid:
        return
    from ..runtime.shared import registry

    rec = next((r for r in registry.running() if r.get("dvm") == uri.dvmid), None)
    if rec is None:
        return
    sys.stderr.write(
        f"pydvm start: warning: PYDVM_URI names DVM {uri.dvmid} ({rec.get('uri')}), which is "
        f"running and stays running; starting another. Reach the first with "
        f"--dvm {rec.get('uri')}, stop it with 'pydvm stop --dvm {rec.get('uri')}'; "
        "'pydvm dvms' lists both\n")
    sys.stderr.flush()


# ----------------------------------------------------------------------
# a one-shot DVM's leftovers
# ----------------------------------------------------------------------


async def one_shot_warning(uri: DvmUri) -> str | None:
    """The data-loss warning for a one-shot DVM about to end, or None.

    Asks the DVM's stores (master and every node) for this user's keys;
    every job of a one-shot DVM runs as this user, so those are all of its
    items.  A DVM that does not answer gets no warning (it is going anyway).
    """
    import asyncio

    from .tool import ToolError, call

    try:
        r = await call(uri, {"t": "store"}, timeout=10)
    except (ToolError, OSError, asyncio.TimeoutError):
        return None
    stores = r.get("stores") or ()
    rows = [k for s in stores for k in s.get("key_info") or ()]
    return F.one_shot_warning(rows, truncated=any(s.get("key_info_truncated") for s in stores))


def tool_failed(exc: Exception, dvm_option: str | None) -> int:
    """Report a failed tool command: a URI nobody answers at gets an
    explanation naming where the URI came from (``--dvm`` or
    ``PYDVM_URI``) and what to do; a malformed URI is a usage error."""
    from ..protocol import UriError
    from .toolcommon import DvmUnreachable

    if isinstance(exc, DvmUnreachable):
        sys.stderr.write("".join(f"{ln}\n" for ln in
                         unreachable_lines(exc.uri, str(exc), from_env=not dvm_option)))
        return 1
    if isinstance(exc, UriError):
        where = "--dvm" if dvm_option else "PYDVM_URI"
        return fail(f"{where}: {exc}", 2)
    return fail(str(exc))
