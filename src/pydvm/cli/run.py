"""``pydvm run``: its arguments, and which tool runs the job.

The argv is read into a job's options (:func:`pydvm.cli.runopts.parse_run`)
and made the ``run`` request by the library (:mod:`pydvm.client.request`:
the model the job API's keyword arguments go through too).

With a persistent DVM (``--dvm URI`` or ``PYDVM_URI``) the job is submitted
by the blocking tool (:mod:`pydvm.cli.submit`): this module, and everything
that path loads, imports neither argparse nor asyncio nor anything of the
store or the runtime (``tests/test_layers.py`` keeps it so).  Without one,
a one-shot DVM starts in this process, runs the job and stops: that path
runs on asyncio (:func:`_one_shot`).
"""

from __future__ import annotations

import os
import sys

from ..client.request import build_request  # noqa: F401 (re-exported)
from ..client.request import is_pydvm_param as _is_pydvm_param
from .common import fail

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def job_output(opts: dict[str, Any]):
    """Where the job's output goes, as the options say."""
    from .toolcommon import JobOutput

    return JobOutput(opts["tag_output"], timestamp=opts["timestamp_output"],
                     merge_stderr=opts["merge_stderr"], files=opts["output_filename"],
                     quiet=opts["quiet"])


def _check_wdirs(opts: dict[str, Any]) -> None:
    for a in opts["apps"]:
        if a["cwd"] and not os.path.isdir(a["cwd"]):
            raise ValueError(f"--wdir {a['cwd']}: no such directory")


def cmd_run(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        from .runopts import RUN_USAGE, run_help

        if argv:
            print(run_help())
            return 0
        sys.stderr.write("pydvm run: nothing to run: give a command, such as "
                         f"'pydvm run -n 2 hostname' ('pydvm run --help' says more)\n{RUN_USAGE}\n")
        return 2
    from .runopts import parse_run

    try:
        opts = parse_run(argv)
        _check_wdirs(opts)
    except ValueError as exc:
        from .runopts import RUN_USAGE

        sys.stderr.write(f"pydvm run: {exc}\n{RUN_USAGE}\n")
        return 2
    if not opts["quiet"]:
        for w in opts["warnings"]:
            sys.stderr.write(f"pydvm run: warning: {w}\n")
    ours = [(n, v) for n, v in opts["mca"] if _is_pydvm_param(n)]
    uri_text = opts["dvm"] or os.environ.get("PYDVM_URI")
    if uri_text:
        if ours:
            return fail(f"--mca {ours[0][0]}: pydvm's parameters apply to a one-shot DVM only; "
                        "set them on 'pydvm start' (other names are Open MPI's, passed to the "
                        "job's processes)", 2)
        from . import common
        from .toolcommon import ToolError, resolve_uri
        from .submit import run_job

        common.QUICK_EXIT = True  # nothing of ours runs at interpreter exit
        try:
            uri = resolve_uri(uri_text)
            return run_job(uri, request=build_request(opts), output=job_output(opts),
                           forward_stdin=opts["stdin"] is not None)
        except (ToolError, ValueError) as exc:
            from .dvms import tool_failed

            return tool_failed(exc, opts["dvm"])
    if opts["session"] is not None:
        return fail("--session needs a persistent DVM (--dvm URI or PYDVM_URI)", 2)
    from .start import _resolve_params, run_async

    try:
        resolved = _resolve_params(ours)
    except ValueError as exc:
        return fail(str(exc), 2)
    return run_async(_one_shot(opts, resolved))


def _one_shot_hosts(named: dict[str, int], env):
    """Nodes and launcher of a one-shot DVM whose apps name hosts ``named``
    (name -> slots asked for, 0 if none).

    Outside a Slurm allocation, hosts named by ``--host`` or a hostfile
    become local daemons of those names (else one daemon, this machine),
    each with the slots asked for (at least one).  Inside one,
    the DVM runs on the allocation through the slurm launcher: on the named
    nodes (each must be allocated), else on every allocated node.
    """
    from .start import _hosts
    from ..runtime.shared.jobs import HostSpec
    from ..runtime.master import make_launcher
    from ..runtime.master import allocation_from_env, in_allocation, select_hosts

    if not in_allocation(env):
        hosts = [HostSpec(n, max(1, slots)) for n, slots in sorted(named.items())] \
            if named else _hosts(None)
        return hosts, make_launcher("local", "--host" if named else "this machine")
    alloc = allocation_from_env(env)
    if not named:
        return list(alloc.nodes), make_launcher("slurm", alloc.source)
    names = sorted(named)
    select_hosts(alloc, [HostSpec(n) for n in names])  # refuses a host not allocated
    return ([HostSpec(n, alloc.slots(n)) for n in names],
            make_launcher("slurm", f"{alloc.source}, --host {','.join(names)}"))


async def _one_shot(opts: dict, resolved) -> int:
    """Run one job on a private DVM on this machine, then take it down."""
    from .dvms import one_shot_warning
    from .start import _bind
    from ..runtime.shared.logs import setup_logging
    from ..runtime.master import Master, StartError
    from .tool import ToolError, run_job

    setup_logging("pydvm-run", None, resolved["prte_data_server_verbose"].value)
    named = {h[0]: h[1] for a in opts["apps"] for h in (a["hosts"] or [])}
    for h in opts["hostfile"] or []:  # a hostfile's hosts, with their slots, make the DVM
        named[h[0]] = max(named.get(h[0], 0), h[1])
    try:
        hosts, launcher = _one_shot_hosts(named, os.environ)
    except ValueError as exc:
        return fail(str(exc), 2)
    if resolved["pydvm_pmix_isolate"].value == "auto":
        # one job: no other job or later one to protect from a libpmix crash,
        # and no server process to start (docs/pmix.md, "Isolation")
        from ..params import Resolved
        resolved = {**resolved, "pydvm_pmix_isolate": Resolved("off", "one-shot")}
    master = Master(hosts, launcher, resolved, bind=_bind(None, launcher))
    try:
        uri = await master.start()
    except (StartError, OSError) as exc:
        return fail(f"cannot start the one-shot DVM: {exc}")
    try:
        code = await run_job(uri, request=build_request(opts), output=job_output(opts),
                             forward_stdin=opts["stdin"] is not None)
        if master.jobs:
            return code  # interrupted, not waiting: see below
        warning = await one_shot_warning(uri)
        if warning and not opts["quiet"]:
            sys.stderr.write(f"{warning}\n")
        return code
    except ToolError as exc:
        return fail(str(exc))
    finally:
        if not master.jobs:
            await master.stop()
        # else a signal ended the run before its job ended (processes that
        # ignore SIGTERM) and we exit now, which ends the rest: the head
        # node's processes have SIGKILL as their parent-death signal (and the
        # guardian kills their groups), a daemon that loses its master ends
        # its processes within a second (SIGTERM, then SIGKILL).

