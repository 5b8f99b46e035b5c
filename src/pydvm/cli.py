"""The ``pydvm`` command line (SPEC 9): a dispatcher that loads only what a command uses.

DVM-level commands (``start``, ``run``, ``stop``, ``session``, ``store``,
``info``, ``daemon``), commands to find DVMs and jobs (``dvms``, ``ps``,
``kill``) and in-job commands for scripts (``publish``, ``lookup``,
``unpublish``).  Exit status 2 is a usage error, reported before the
command does anything.

What a command costs before it does anything is paid by every job that
uses it, so the commands a job runs most start without argparse, asyncio,
the store or the runtime: ``run`` against a persistent DVM
(:mod:`pydvm.cli_run`, :mod:`pydvm.tool_run`), ``publish``, ``lookup`` and
``unpublish`` whose arguments :func:`pydvm.cli_injob.parse_light` reads, and
``--version``.  Everything else -- the other commands, every ``--help``, a
usage error -- goes through the argparse tree (:mod:`pydvm.cli_parser`),
which words every help text and usage error as it always has.

The commands live by concern: :mod:`pydvm.cli_start` (``start``,
``daemon``, the event loop), :mod:`pydvm.cli_run` (``run``),
:mod:`pydvm.cli_admin` (``stop``, ``session``, ``ps``, ``kill``,
``store``, ``info``), :mod:`pydvm.cli_dvms` (``dvms``, stale URIs, a second
``start``, the one-shot data-loss warning), :mod:`pydvm.cli_injob`
(``publish``, ``lookup``, ``unpublish``).  What is printed is formatted in
:mod:`pydvm.cli_format`; help texts and argument checks are in
:mod:`pydvm.cli_help`.
"""

from __future__ import annotations

import sys

#: The in-job commands, parsed without argparse when their arguments allow.
INJOB = ("publish", "lookup", "unpublish")
#: Set by a command after which nothing needs the interpreter's orderly
#: shutdown (``pydvm run`` against a persistent DVM: no threads, no atexit
#: handler, no logging of ours); :func:`entry` then ends the process at once.
QUICK_EXIT = False


def entry() -> None:
    """The ``pydvm`` program (its console script and ``python -m pydvm``):
    :func:`main`, then exit with its status.

    After a command that set :data:`QUICK_EXIT`, the standard streams are
    flushed and the process ends without the interpreter's teardown (module
    cleanup, a last garbage collection): 5-10 ms of every ``pydvm run``,
    which a job launched by a script pays each time."""
    rc = main()
    if QUICK_EXIT:
        import os

        for s in (sys.stdout, sys.stderr):
            try:
                s.flush()
            except (OSError, ValueError):
                pass  # a reader gone or a stream closed: nothing more to say there
        os._exit(rc if isinstance(rc, int) else 1)
    sys.exit(rc)


def whole_writes() -> None:
    """Make every write to our stdout and stderr go out whole.

    A stream closed before the program started (None) becomes a sink.
    Under ``PYTHONUNBUFFERED=1`` (or ``python -u``) the binary layer of
    ``sys.stdout``/``sys.stderr`` is the raw file, whose ``write`` may take
    only part of its bytes when a pipe to a slow reader is full -- and the
    text layer drops the rest without an error (``pydvm store --json |
    slow`` lost all past 64 KiB).  A buffered writer retries until all is
    written; with line buffering and write-through nothing waits longer than
    its line.  Only the interpreter's own streams are replaced (not one a
    caller put there), by writers on their own file objects for the same
    descriptors, so closing either leaves the other working.
    """
    import io

    for name in ("stdout", "stderr"):
        s = getattr(sys, name)
        if s is None:
            # closed before we started (``pydvm ... >&-``): what would go
            # there is dropped, as print() drops it, rather than a traceback
            import os

            setattr(sys, name, open(os.devnull, "w"))
            continue
        if s is not getattr(sys, f"__{name}__") or not isinstance(getattr(s, "buffer", None),
                                                                   io.RawIOBase):
            continue  # buffered already, or not the interpreter's own stream
        try:
            s.flush()
            # a file object of our own on the same descriptor, which closing leaves open
            raw = io.FileIO(s.fileno(), "wb", closefd=False)
        except (OSError, ValueError):
            continue  # closed: nothing to write to anyway
        setattr(sys, name, io.TextIOWrapper(io.BufferedWriter(raw), encoding=s.encoding,
                                            errors=s.errors, line_buffering=True,
                                            write_through=True))


def fail(msg: str, code: int = 1) -> int:
    """Say ``pydvm: msg`` on stderr; return the exit status ``code``."""
    sys.stderr.write(f"pydvm: {msg}\n")
    return code


def tool_failed(exc: Exception, dvm_option: str | None) -> int:
    """Report a failed tool command: a URI nobody answers at gets an
    explanation naming where the URI came from (``--dvm`` or
    ``PYDVM_URI``) and what to do; a malformed URI is a usage error."""
    from .protocol import UriError
    from .tool_common import DvmUnreachable

    if isinstance(exc, DvmUnreachable):
        from .cli_dvms import unreachable_lines

        sys.stderr.write("".join(f"{ln}\n" for ln in
                                 unreachable_lines(exc.uri, str(exc), from_env=not dvm_option)))
        return 1
    if isinstance(exc, UriError):
        where = "--dvm" if dvm_option else "PYDVM_URI"
        return fail(f"{where}: {exc}", 2)
    return fail(str(exc))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from . import _trace
    if _trace.PATH:
        _trace.mark("tool.start")
    whole_writes()
    try:
        if argv:
            cmd = argv[0]
            if cmd == "run":
                from .cli_run import cmd_run

                return cmd_run(argv[1:])
            if cmd in INJOB:
                from .cli_injob import parse_light

                a = parse_light(cmd, argv[1:])
                if a is not None:
                    return a.func(a)
            elif cmd == "--version" and len(argv) == 1:
                from . import __version__

                sys.stdout.write(f"pydvm {__version__}\n")
                return 0
        from .cli_parser import run_parsed

        return run_parsed(argv)
    except BrokenPipeError:
        # Our stdout's reader went away (``pydvm info | head``): stop quietly,
        # with the status SIGPIPE would have given.
        from .tool_common import SIGPIPE, silence

        silence(1)
        return 128 + SIGPIPE


#: Where the names this module held before it was split live now; ``from
#: pydvm.cli import build_parser`` (and the like) still works, loading only
#: the module asked for.
_MOVED = {
    "cli_parser": ("build_parser", "run_parsed"),
    "cli_start": ("run_async", "cmd_start", "cmd_daemon", "_serve", "_daemonize", "_hosts",
                  "_resolve_params", "_warn_ignored_env", "_mca_values_verbatim",
                  "_start_hosts", "_bind", "_write_private"),
    "cli_run": ("parse_run", "cmd_run", "_one_shot", "_one_shot_hosts"),
    "cli_admin": ("cmd_stop", "cmd_session", "cmd_ps", "cmd_kill", "cmd_store", "cmd_info",
                  "_tool", "_print_pmix"),
    "cli_injob": ("cmd_publish", "cmd_lookup", "cmd_unpublish"),
}


def __getattr__(name: str):
    for module, names in _MOVED.items():
        if name in names:
            import importlib

            return getattr(importlib.import_module(f"{__package__}.{module}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    sys.exit(main())
