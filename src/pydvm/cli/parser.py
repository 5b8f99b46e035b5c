"""The argparse tree of the command line: every command but ``run``.

Only what :func:`pydvm.cli.main` cannot parse itself comes here: ``start``,
``stop``, ``session``, ``store``, ``info``, ``daemon``, ``dvms``, ``ps``,
``events``, ``kill``, every ``--help``, and an in-job command (``publish``,
``lookup``, ``unpublish``) whose arguments the light parser of
:mod:`pydvm.cli.injob` leaves to argparse (a usage error among them) --
so argparse words every usage error and help text.  ``tests/test_cli_usage.py``
checks that every option has a help text.
"""

from __future__ import annotations

import argparse

from .helptext import (ACCESS_HELP, LOOKUP_OUTPUT_HELP, MAIN_DESCRIPTION, MAIN_EPILOG,
                       PERSISTENCES_HELP, PUBLISH_VALUES_HELP, RANGES_HELP, count, id_number,
                       port, seconds, signal_arg)
from ..enums import Persistence, Range


def _dvm_id(text: str) -> str:
    import re

    if not re.fullmatch(r"[A-Za-z0-9_-]{1,32}", text):
        raise argparse.ArgumentTypeError("a DVM id is 1-32 letters, digits, '-' or '_'")
    return text


def _dvm_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dvm", metavar="URI",
                   help="the DVM to talk to (default: $PYDVM_URI; 'pydvm dvms' lists yours)")


def _json_option(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--json", action="store_true", help=f"print {what} as one JSON object")


def _parser(sub, name: str, help_: str, description: str = "", epilog: str = ""):
    """A subcommand whose description is one paragraph (wrapped here) and
    whose epilog is laid out already (tables of words and their meaning)."""
    import textwrap

    return sub.add_parser(name, help=help_, description=textwrap.fill(description or help_, 79),
                          epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)


def _metrics_address(text: str) -> tuple[str, int]:
    from ..runtime.master import parse_address

    try:
        return parse_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__
    from .admin import (cmd_info, cmd_kill, cmd_ps, cmd_release, cmd_session, cmd_stop,
                        cmd_store)
    from .dvms import cmd_dvms
    from .events import cmd_events
    from .injob import cmd_lookup, cmd_publish, cmd_unpublish
    from .start import cmd_daemon, cmd_start

    p = argparse.ArgumentParser(prog="pydvm", description=MAIN_DESCRIPTION, epilog=MAIN_EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"pydvm {__version__}",
                   help="print pydvm's version and exit")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")

    s = _parser(sub, "start", "start a persistent DVM and print its URI",
                "Start a persistent DVM and print its URI (tcp://HOST:PORT/ID) on one line. "
                "If PYDVM_URI already names a running DVM of yours, a warning naming it goes "
                "to stderr: both keep running and 'pydvm dvms' lists them.")
    s.add_argument("--hosts", metavar="H[:SLOTS],...",
                   help="nodes of the DVM, one daemon each (default: this machine, one slot "
                        "per CPU; a listed host has one slot unless given)")
    s.add_argument("--launcher",
                   help="how daemons start: local (on this machine, named after the hosts), "
                        "ssh (AGENT HOST python -m pydvm daemon ...), or slurm (one srun "
                        "step; the default inside a Slurm allocation, else local)")
    s.add_argument("--mca", nargs=2, action="append", metavar=("NAME", "VALUE"),
                   help="set a parameter for the whole DVM (repeatable; 'pydvm info' lists "
                        "them with their meaning and range)")
    s.add_argument("--daemonize", action="store_true",
                   help="run in the background; return once every daemon has reported in")
    s.add_argument("--uri-file", metavar="F", help="also write the URI to F (mode 0600)")
    s.add_argument("--data-server-uri", metavar="URI",
                   help="keep no store: relay every data request to the DVM at URI")
    s.add_argument("--log-dir", metavar="D",
                   help="one log file per process in D (default: stderr; with --daemonize, "
                        "$PYDVM_STATE_DIR/logs/DVMID)")
    s.add_argument("--bind", metavar="ADDR",
                   help="address the master listens on, which the URI carries (default "
                        "$PYDVM_BIND, else all interfaces with the slurm launcher, else "
                        "127.0.0.1)")
    s.add_argument("--multi-user", action="store_true",
                   help="(root) serve every local user; jobs run as their submitter")
    s.add_argument("--port", type=port, default=0, metavar="P",
                   help="port the master listens on, 0-65535 (default 0: any free port)")
    s.add_argument("--dvm-id", type=_dvm_id, metavar="ID",
                   help="the DVM's id (1-32 letters, digits, '-', '_'); reusing one keeps the "
                        "URI across restarts; refused while a DVM of that id runs")
    s.add_argument("--metrics", type=_metrics_address, metavar="ADDR:PORT",
                   help="serve Prometheus metrics at http://ADDR:PORT/metrics")
    s.set_defaults(func=cmd_start)

    s = sub.add_parser("run", help="run one job (see 'pydvm run --help')", add_help=False)
    s.set_defaults(func=None)

    s = _parser(sub, "dvms", "list your running DVMs",
                "List this user's running DVMs on this machine: id, URI, hosts, start time "
                "and jobs running ('?' if the DVM did not answer).  Records of DVMs that "
                "have ended are dropped.  The DVM PYDVM_URI names is marked '*'.")
    _json_option(s, "the list")
    s.add_argument("-q", "--quiet", action="store_true", help="print only the URIs, one a line")
    s.set_defaults(func=cmd_dvms)

    s = _parser(sub, "ps", "list the DVM's jobs",
                "List the DVM's running jobs, every user's: namespace, user, session, state "
                "(starting, running, stopped -- in PMIx_Init, for a debugger --, killing, "
                "ending), start time, ranks per node (NODE:N) and app contexts; then the "
                "jobs waiting in the queue (state queued, their submission time), in the "
                "order they will start.")
    _dvm_option(s)
    _json_option(s, "the jobs")
    s.set_defaults(func=cmd_ps)

    s = _parser(sub, "events", "stream the DVM's job events",
                "Print the DVM's job events as they happen, one line each: time, namespace, "
                "kind (queued, started, proc_exit, ended) and its details -- until Ctrl-C, "
                "or with --job until that job has ended.  You see your own jobs; root and "
                "the DVM's owner see every user's.")
    s.add_argument("--job", metavar="NSPACE", help="only this job (running or queued); "
                   "stop once it has ended")
    s.add_argument("--session", type=id_number, metavar="ID", help="only this session's jobs")
    _dvm_option(s)
    _json_option(s, "each event")
    s.set_defaults(func=cmd_events)

    s = _parser(sub, "kill", "end jobs",
                "End each job named (its processes get SIGTERM, then SIGKILL); return once "
                "it has ended and its data has been purged.  Its pydvm run says it was "
                "killed by 'pydvm kill'.  Your own jobs; root and the DVM's owner may kill "
                "any.  Exit 1 if a job could not be killed.  With --signal, every process "
                "of each job gets that signal instead: TERM is the plain kill, KILL ends "
                "the job at once (no SIGTERM first); any other signal returns once "
                "delivered and the job goes on.  A queued job is taken off the queue.")
    s.add_argument("-s", "--signal", type=signal_arg, metavar="SIG",
                   help="the signal to send, by number or name (USR1, SIGUSR1)")
    s.add_argument("nspace", nargs="+", metavar="NSPACE", help="a job's namespace (pydvm ps)")
    _dvm_option(s)
    s.set_defaults(func=cmd_kill)

    s = _parser(sub, "release", "release jobs started stopped in PMIx_Init",
                "Release each named job started with 'pydvm run --stop-in-init': its "
                "processes waiting in PMIx_Init (for a debugger to attach) go on, and so do "
                "those that reach it later.  Prints the nodes where they were waiting.  "
                "Your own jobs; root and the DVM's owner may release any.  Exit 1 if a job "
                "could not be released (not running, not started stopped, not yours).")
    s.add_argument("nspace", nargs="+", metavar="NSPACE", help="a job's namespace (pydvm ps)")
    _dvm_option(s)
    s.set_defaults(func=cmd_release)

    s = _parser(sub, "stop", "stop a DVM",
                "Stop a DVM: end its jobs (their pydvm run says the DVM was stopped), shut "
                "every daemon down; return once every process of the DVM has exited.")
    _dvm_option(s)
    s.set_defaults(func=cmd_stop)

    s = _parser(sub, "store", "show every store's contents",
                "Show every store (the master's, each node's): items, waiting lookups, "
                "evictions, expiries and bytes per uid; then each of your own keys with "
                "its persistence, range, time since last access, time until the idle "
                "timeout removes it, size and publisher.  Other users' keys are counted, "
                "never named.")
    _dvm_option(s)
    _json_option(s, "every store")
    s.add_argument("--prefix", metavar="P",
                   help="list only your keys starting with P, in sorted order (e.g. "
                        "'torch/' for the keys of PyTorch stores); the counts stay whole")
    s.set_defaults(func=cmd_store)

    s = _parser(sub, "info", "show parameters and nodes",
                "Show the DVM's nodes and parameters (each value and where it came from); "
                "without a DVM, the values a DVM started here would get.")
    _dvm_option(s)
    pm = s.add_mutually_exclusive_group()
    pm.add_argument("--pmix-uri", action="store_true",
                    help="print only the URI PMIx tools attach at (the PMIx tool "
                         "server beside the master), e.g. pattrs --uri \"$(pydvm info --pmix-uri)\" --host-fns")
    pm.add_argument("--pmix-dir", action="store_true",
                    help="print only the directory holding this DVM's PMIx rendezvous "
                         "files, for tools that search TMPDIR: TMPDIR=$(pydvm info "
                         "--pmix-dir) pps")
    s.set_defaults(func=cmd_info)

    s = _parser(sub, "session", "create or end a session")
    ssub = s.add_subparsers(dest="action", required=True, metavar="ACTION")
    sn = _parser(ssub, "new", "create a session and print its id",
                 "Create a session over some nodes and print its id alone on one line.")
    sn.add_argument("--hosts", metavar="H[:SLOTS],...",
                    help="nodes of the session (default: every node that is up)")
    _dvm_option(sn)
    se = _parser(ssub, "end", "end a session",
                 "End a session: kill its jobs (their pydvm run says so), purge its "
                 "SESSION items everywhere; return once that is done.")
    se.add_argument("id", metavar="ID", help="the session id 'session new' printed")
    _dvm_option(se)
    s.set_defaults(func=cmd_session)

    s = _parser(sub, "daemon", "run one daemon (what launchers run)",
                "Run one node's daemon; it reads the DVM secret on standard input.  "
                "Launchers run this; people rarely do.")
    s.add_argument("--master", required=True, metavar="URI", help="the master's URI")
    s.add_argument("--node", metavar="NAME",
                   help="this node's name (default $SLURMD_NODENAME)")
    s.add_argument("--log-dir", metavar="D", help="write the log to D/NAME.log")
    s.set_defaults(func=cmd_daemon)

    ranges = [r.word for r in Range]
    persistences = [p.word for p in Persistence if p is not Persistence.INVALID]
    s = _parser(sub, "publish", "publish K=V pairs (inside a job)",
                "Publish K=V pairs as one item (inside a job: it acts as its process).",
                f"{PUBLISH_VALUES_HELP}\n\n{RANGES_HELP}\n\n{PERSISTENCES_HELP}\n\n"
                f"{ACCESS_HELP}")
    s.add_argument("pairs", nargs="+", metavar="K=V", help="K=V (with --files also K=@FILE or K=-; see below)")
    s.add_argument("--range", default="session", choices=ranges, metavar="R",
                   help="who may see it (default session; see below)")
    s.add_argument("--persistence", choices=persistences, metavar="P",
                   help="how long it lives (default nspace; see below)")
    s.add_argument("--access-uid", type=id_number, action="append", default=[], metavar="U",
                   help="a uid that may read it (repeatable)")
    s.add_argument("--access-gid", type=id_number, action="append", default=[], metavar="G",
                   help="a gid that may read it (repeatable)")
    s.add_argument("--replace", action="store_true",
                   help="replace your own items holding these keys (else PMIX_ERR_DUPLICATE_KEY)")
    s.add_argument("--files", action="store_true",
                   help="read K=@FILE from FILE and K=- from standard input, as bytes")
    s.add_argument("--hold", type=seconds, default=0.0, metavar="SECONDS",
                   help="stay alive this long after publishing (>= 0), so PROC items live on")
    s.set_defaults(func=cmd_publish)

    s = _parser(sub, "lookup", "look keys up (inside a job)",
                "Look keys up (inside a job: it asks as its process).",
                f"{LOOKUP_OUTPUT_HELP}\n\n{RANGES_HELP}")
    s.add_argument("keys", nargs="+", metavar="K", help="a key to look up")
    s.add_argument("--range", default="session", choices=ranges, metavar="R",
                   help="whose items to search (default session; see below)")
    s.add_argument("--wait", action="store_true",
                   help="wait until every key is published (see --timeout)")
    s.add_argument("--wait-count", type=count, metavar="N",
                   help="wait until N of the keys are published (0: all)")
    s.add_argument("--timeout", type=seconds, metavar="S",
                   help="give up waiting after S seconds (PMIX_ERR_TIMEOUT); 0, as PMIx's "
                        "PMIX_TIMEOUT 0, means no limit, the default (not to wait, leave "
                        "out --wait)")
    _json_option(s, "the answer")
    s.set_defaults(func=cmd_lookup)

    s = _parser(sub, "unpublish", "unpublish keys, or everything (inside a job)",
                "Remove the named keys from every item you own (whoever published them); "
                "with no key, everything this process published.  Prints STATUS; exit 0.")
    s.add_argument("keys", nargs="*", metavar="K", help="a key to remove")
    s.set_defaults(func=cmd_unpublish)
    return p



def run_parsed(argv: list[str]) -> int:
    """Parse ``argv`` with the tree and run the command it names."""
    parser = build_parser()
    if argv and argv[0] == "start":
        from .start import _mca_values_verbatim

        argv = _mca_values_verbatim(argv)
    a = parser.parse_args(argv)
    if not getattr(a, "func", None):
        parser.print_help()
        return 2
    if a.cmd == "start":
        from .dvms import warn_before_second_start

        warn_before_second_start(a)
    return a.func(a)
