"""The ``pydvm`` command line (SPEC 9): a dispatcher that loads only what a command uses.

DVM-level commands (``start``, ``run``, ``stop``, ``session``, ``store``,
``info``, ``daemon``), commands to find DVMs and jobs (``dvms``, ``ps``,
``events``, ``kill``) and in-job commands for scripts (``publish``, ``lookup``,
``unpublish``).  Exit status 2 is a usage error, reported before the
command does anything.

What a command costs before it does anything is paid by every job that
uses it, so the commands a job runs most start without argparse, asyncio,
the store or the runtime: ``run`` against a persistent DVM
(:mod:`pydvm.cli.run`, :mod:`pydvm.cli.submit`), ``publish``, ``lookup`` and
``unpublish`` whose arguments :func:`pydvm.cli.injob.parse_light` reads, and
``--version``.  Everything else -- the other commands, every ``--help``, a
usage error -- goes through the argparse tree (:mod:`pydvm.cli.parser`).

One module per command or concern:

========================  ==================================================
``run.py``                ``pydvm run``: its arguments, which tool runs the job
``runopts.py``            ``pydvm run``'s argv read into the library's job options, its ``--help``
``mpirunopts.py``         ``mpirun``'s options refused, with advice; docs/mpirun.md's table
``hydraopts.py``          the same of MPICH's ``mpiexec`` (Hydra); docs/mpiexec.md's table
``submit.py``             a persistent DVM's ``pydvm run``: one socket, one poll loop, no asyncio
``tool.py``               the asyncio tool: the other commands' requests, a one-shot DVM's run
``toolcommon.py``         what both runs share: output, stdin to the ranks, the job's end
``start.py``              ``start``, ``daemon``, the event loop
``admin.py``              ``stop``, ``session``, ``ps``, ``kill``, ``store``, ``info``
``dvms.py``               ``dvms``, stale URIs, a second ``start``, the one-shot data-loss warning
``events.py``             ``events``: the job events a DVM pushes, one line each
``injob.py``              ``publish``, ``lookup``, ``unpublish``
``parser.py``             the argparse tree of every command but ``run``
``formatting.py``         everything printed
``helptext.py``           help texts and argument checks
``common.py``             failing, whole writes, the quick exit
========================  ==================================================

What a job may ask, how its request is built and how a DVM is reached are
the library's (:mod:`pydvm.client.options`, :mod:`pydvm.client.request`,
:mod:`pydvm.client.connect`): the command line parses argv into that model
and calls it; nothing of the library imports the command line.  Modules
import one another in one direction only (``tests/test_layers.py`` checks
that the package has no import cycle).
"""


from __future__ import annotations

import sys

#: The in-job commands, parsed without argparse when their arguments allow.
INJOB = ("publish", "lookup", "unpublish")


def entry() -> None:
    """The ``pydvm`` program (its console script and ``python -m pydvm``):
    :func:`main`, then exit with its status.

    After a command that set :data:`QUICK_EXIT`, the standard streams are
    flushed and the process ends without the interpreter's teardown (module
    cleanup, a last garbage collection): 5-10 ms of every ``pydvm run``,
    which a job launched by a script pays each time."""
    from . import common

    rc = main()
    if common.QUICK_EXIT:
        import os

        for s in (sys.stdout, sys.stderr):
            try:
                s.flush()
            except (OSError, ValueError):
                pass  # a reader gone or a stream closed: nothing more to say there
        os._exit(rc if isinstance(rc, int) else 1)
    sys.exit(rc)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from .. import _trace
    if _trace.PATH:
        _trace.mark("tool.start")
    from .common import whole_writes

    whole_writes()
    try:
        if argv:
            cmd = argv[0]
            if cmd == "run":
                from .run import cmd_run

                return cmd_run(argv[1:])
            if cmd in INJOB:
                from .injob import parse_light

                a = parse_light(cmd, argv[1:])
                if a is not None:
                    return a.func(a)
            elif cmd == "--version" and len(argv) == 1:
                from .. import __version__

                sys.stdout.write(f"pydvm {__version__}\n")
                return 0
        from .parser import run_parsed

        return run_parsed(argv)
    except BrokenPipeError:
        # Our stdout's reader went away (``pydvm info | head``): stop quietly,
        # with the status SIGPIPE would have given.
        from .toolcommon import SIGPIPE, silence

        silence(1)
        return 128 + SIGPIPE


#: Names ``pydvm.cli`` held before it became a package; ``from pydvm.cli
#: import build_parser`` (and the like) still works, loading only the module
#: asked for.
_MOVED = {
    "parser": ("build_parser", "run_parsed"),
    "start": ("run_async", "cmd_start", "cmd_daemon", "_serve", "_daemonize", "_hosts",
              "_resolve_params", "_warn_ignored_env", "_mca_values_verbatim",
              "_start_hosts", "_bind", "_write_private"),
    "run": ("cmd_run", "_one_shot", "_one_shot_hosts"),
    "runopts": ("parse_run",),
    "admin": ("cmd_stop", "cmd_session", "cmd_ps", "cmd_kill", "cmd_store", "cmd_info",
              "_tool", "_print_pmix"),
    "injob": ("cmd_publish", "cmd_lookup", "cmd_unpublish"),
    "common": ("fail", "whole_writes", "QUICK_EXIT"),
    "dvms": ("tool_failed",),
}


def __getattr__(name: str):
    for module, names in _MOVED.items():
        if name in names:
            import importlib

            return getattr(importlib.import_module(f"{__package__}.{module}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    sys.exit(main())
