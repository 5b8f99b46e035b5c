"""``pydvm run``: its arguments, and which tool runs the job.

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

from .common import fail
from ..protocol import parse_host_list

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def parse_run(argv: list[str]) -> dict[str, Any]:
    """Parse ``pydvm run`` arguments (MPMD contexts separated by ':');
    ValueError naming what is wrong."""
    opts: dict[str, Any] = {"dvm": None, "session": None, "mca": [], "tag_output": False,
                            "abort_on_failure": None, "apps": [], "pmix": False}
    segments: list[list[str]] = [[]]
    for tok in argv:
        if tok == ":":
            segments.append([])
        else:
            segments[-1].append(tok)
    for idx, seg in enumerate(segments):
        n = None
        hosts = None
        i = 0
        while i < len(seg) and seg[i].startswith("-"):
            opt = seg[i]
            name, eq, inline = opt.partition("=")

            def value() -> str:
                nonlocal i
                if eq:
                    return inline
                i += 1
                if i >= len(seg):
                    raise ValueError(f"{opt} needs a value")
                return seg[i]

            if name in ("-n", "--np", "-np"):
                v = value()
                try:
                    n = int(v)
                except ValueError:
                    raise ValueError(f"-n needs a number, not {v!r}") from None
                if n < 1:
                    raise ValueError("-n must be at least 1")
            elif name in ("--host", "-H"):
                hosts = [[name, slots] for name, slots in parse_host_list(value())]
            elif idx == 0 and name == "--dvm":
                opts["dvm"] = value()
            elif idx == 0 and name == "--session":
                v = value()
                try:
                    opts["session"] = int(v)
                except ValueError:
                    raise ValueError(f"--session needs a session id, not {v!r}") from None
            elif idx == 0 and name == "--mca":
                if eq:
                    raise ValueError("--mca takes two arguments: NAME VALUE")
                if i + 2 >= len(seg):
                    raise ValueError("--mca takes two arguments: NAME VALUE")
                opts["mca"].append((seg[i + 1], seg[i + 2]))
                i += 2
            elif idx == 0 and name == "--tag-output":
                opts["tag_output"] = True
            elif idx == 0 and name in ("--abort-on-failure", "--no-abort-on-failure"):
                want = name == "--abort-on-failure"
                if opts["abort_on_failure"] is not None and opts["abort_on_failure"] != want:
                    raise ValueError("--abort-on-failure and --no-abort-on-failure "
                                     "contradict each other")
                opts["abort_on_failure"] = want
            elif idx == 0 and name == "--pmix":
                opts["pmix"] = True  # refuse the job unless every node of it hosts PMIx
            elif name == "--":
                i += 1
                break
            else:
                where = "" if idx == 0 else f" in app context {idx}"
                raise ValueError(f"unknown option {opt}{where}")
            i += 1
        cmd = seg[i:]
        if not cmd:
            raise ValueError(f"app context {idx} has no command")
        opts["apps"].append({"argv": cmd, "n": n if n is not None else 1, "hosts": hosts})
    return opts


def cmd_run(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        from .helptext import RUN_HELP, RUN_USAGE

        if argv:
            print(RUN_HELP)
            return 0
        sys.stderr.write("pydvm run: nothing to run: give a command, such as "
                         f"'pydvm run -n 2 hostname' ('pydvm run --help' says more)\n{RUN_USAGE}\n")
        return 2
    try:
        opts = parse_run(argv)
    except ValueError as exc:
        from .helptext import RUN_USAGE

        sys.stderr.write(f"pydvm run: {exc}\n{RUN_USAGE}\n")
        return 2
    uri_text = opts["dvm"] or os.environ.get("PYDVM_URI")
    if uri_text:
        if opts["mca"]:
            return fail("--mca applies to a one-shot DVM only; set parameters on 'pydvm start'",
                        2)
        from . import common
        from .toolcommon import ToolError, resolve_uri
        from .submit import run_job

        common.QUICK_EXIT = True  # nothing of ours runs at interpreter exit
        try:
            uri = resolve_uri(uri_text)
            return run_job(uri, opts["apps"], opts["session"], opts["tag_output"],
                           abort_on_failure=opts["abort_on_failure"], pmix=opts["pmix"])
        except (ToolError, ValueError) as exc:
            from .dvms import tool_failed

            return tool_failed(exc, opts["dvm"])
    if opts["session"] is not None:
        return fail("--session needs a persistent DVM (--dvm URI or PYDVM_URI)", 2)
    from .start import _resolve_params, run_async

    try:
        resolved = _resolve_params(opts["mca"])
    except ValueError as exc:
        return fail(str(exc), 2)
    return run_async(_one_shot(opts, resolved))


def _one_shot_hosts(named: list[str], env):
    """Nodes and launcher of a one-shot DVM whose apps name hosts ``named``.

    Outside a Slurm allocation, hosts named by ``--host`` become local
    daemons of those names (else one daemon, this machine).  Inside one,
    the DVM runs on the allocation through the slurm launcher: on the named
    nodes (each must be allocated), else on every allocated node.
    """
    from .start import _hosts
    from ..runtime.jobs import HostSpec
    from ..runtime.launch import make_launcher
    from ..runtime.slurm import allocation_from_env, in_allocation, select_hosts

    if not in_allocation(env):
        hosts = [HostSpec(n, 1) for n in named] if named else _hosts(None)
        return hosts, make_launcher("local", "--host" if named else "this machine")
    alloc = allocation_from_env(env)
    if not named:
        return list(alloc.nodes), make_launcher("slurm", alloc.source)
    select_hosts(alloc, [HostSpec(n) for n in named])  # refuses a host not allocated
    return ([HostSpec(n, alloc.slots(n)) for n in named],
            make_launcher("slurm", f"{alloc.source}, --host {','.join(named)}"))


async def _one_shot(opts: dict, resolved) -> int:
    """Run one job on a private DVM on this machine, then take it down."""
    from .dvms import one_shot_warning
    from .start import _bind
    from ..runtime.launch import setup_logging
    from ..runtime.master import Master, StartError
    from .tool import ToolError, run_job

    setup_logging("pydvm-run", None, resolved["prte_data_server_verbose"].value)
    named = sorted({h[0] for a in opts["apps"] for h in (a["hosts"] or [])})
    try:
        hosts, launcher = _one_shot_hosts(named, os.environ)
    except ValueError as exc:
        return fail(str(exc), 2)
    master = Master(hosts, launcher, resolved, bind=_bind(None, launcher))
    try:
        uri = await master.start()
    except (StartError, OSError) as exc:
        return fail(f"cannot start the one-shot DVM: {exc}")
    try:
        code = await run_job(uri, opts["apps"], None, opts["tag_output"],
                             abort_on_failure=opts["abort_on_failure"], pmix=opts["pmix"])
        warning = await one_shot_warning(uri)
        if warning:
            sys.stderr.write(f"{warning}\n")
        return code
    except ToolError as exc:
        return fail(str(exc))
    finally:
        await master.stop()

