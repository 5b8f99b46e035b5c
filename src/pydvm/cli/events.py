"""``pydvm events``: the DVM's job events, one line each, as they happen.

It subscribes (``subscribe``: to one job with ``--job``, a session's jobs
with ``--session``, else every job this user may see -- every user's for
root and the DVM's owner) and prints each ``job_event`` the master pushes
(:mod:`pydvm.runtime.master.jobevents` describes them), until Ctrl-C -- or, with
``--job``, until that job has ended.  ``--json`` prints each event as one
JSON object.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from typing import Any

from .dvms import tool_failed


def event_line(ev: dict[str, Any]) -> str:
    """One event as ``pydvm events`` prints it: time, namespace, kind, details."""
    t = ev.get("time")
    when = time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d}" \
        if isinstance(t, (int, float)) else "?"
    kind = ev.get("kind")
    if kind == "queued":
        what = f"position={ev.get('position')}"
    elif kind == "started":
        nodes = ev.get("nodes") or {}
        what = f"size={ev.get('size')} nodes=" + ";".join(
            f"{n}:{','.join(str(r) for r in ranks)}" for n, ranks in nodes.items())
    elif kind == "proc_exit":
        what = (f"rank={ev.get('rank')} node={ev.get('node')} status={ev.get('status')} "
                f"signal={ev.get('signal')}")
    elif kind == "ended":
        what = f"exit={ev.get('exit')} failed={ev.get('failed')} killed={ev.get('killed')}"
        if ev.get("reason"):
            what += f" reason={json.dumps(ev.get('reason'))}"
    else:
        what = str(ev.get("reason") or "")
    return f"{when} {ev.get('nspace') or '-'} {kind} {what}".rstrip()


async def _stream(uri, a) -> int:
    from .tool import ToolError, open_tool

    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()

    def on_message(ch, msg: dict) -> None:
        if msg.get("t") != "job_event":
            return
        ev = {k: v for k, v in msg.items() if k not in ("t", "ref")}
        try:
            print(json.dumps(ev) if a.json else event_line(ev), flush=True)
        except BrokenPipeError:  # our reader went away: so do we
            if not done.done():
                done.set_result(0)
            return
        if msg.get("kind") == "dropped" or (a.job and msg.get("kind") == "ended"):
            if not done.done():
                done.set_result(0 if msg.get("kind") == "ended" else 1)

    ch = await open_tool(uri, on_message)
    try:
        ask: dict[str, Any] = {"t": "subscribe"}
        if a.job:
            ask["nspace"] = a.job
        if a.session is not None:
            ask["session"] = a.session
        r = await ch.call(ask)
        if r.get("status") != 0:
            from .toolcommon import status_name

            raise ToolError(f"{status_name(r.get('status'))}: {r.get('msg')}")
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, lambda: done.done() or done.set_result(0))
        closed = asyncio.ensure_future(ch.wait_closed())
        await asyncio.wait([done, closed], return_when=asyncio.FIRST_COMPLETED)
        if not done.done():
            sys.stderr.write(f"pydvm events: connection to the DVM lost: {closed.result()}\n")
            return 1
        return done.result()
    finally:
        ch.close("done")


def cmd_events(a) -> int:
    from .start import run_async
    from .tool import ToolError, resolve_uri

    try:
        return run_async(_stream(resolve_uri(a.dvm), a))
    except (ToolError, ValueError) as exc:
        return tool_failed(exc, a.dvm)
