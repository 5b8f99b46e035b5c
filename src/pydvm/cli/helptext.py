"""Help texts and argument checks of the command line.

Every option of every subcommand is described here or next to its
``add_argument`` in :mod:`pydvm.cli.parser`; ``tests/test_cli_usage.py`` checks
that none is left without a help text.  The argument types below turn a
bad value into a usage error (exit status 2, a message naming the option)
before the command does anything: nothing is published, started or
submitted on a bad argument.
"""

from __future__ import annotations

import math

from ..enums import Persistence, Range

# argparse and textwrap are imported where used: the commands parsed without
# argparse (run, publish, lookup, unpublish) check their values here too.

#: What each range word means, for ``--help`` (SPEC 4's range table, in words).
RANGE_MEANINGS: dict[Range, str] = {
    Range.SESSION: "(default) every process, of this DVM or of a DVM relaying to it",
    Range.GLOBAL: "the same as session here",
    Range.UNDEF: "the same as session here",
    Range.NAMESPACE: "processes of the same job only",
    Range.LOCAL: "processes on the same node only; such items are held in that node's "
                 "store, not the master's",
    Range.PROC_LOCAL: "the same process only",
    Range.RM: "the DVM itself only: tools connected to its master, never job processes",
    Range.CUSTOM: "publish only: the users/groups named by --access-uid/--access-gid",
}

#: What each persistence word means (SPEC 5's horizon table, in words).
PERSISTENCE_MEANINGS: dict[Persistence, str] = {
    Persistence.NSPACE: "(default) until the publisher's job ends",
    Persistence.PROC: "until the publishing process ends",
    Persistence.APP: "until the publisher's application (app context) has ended on every node",
    Persistence.SESSION: "until its session ends ('pydvm session end'; the default session "
                         "ends with the DVM)",
    Persistence.FIRST_READ: "until a lookup returns it (key by key), or it sits unread "
                            "longer than prte_data_server_timeout",
    Persistence.INDEF: "until unpublished or evicted, or unread longer than "
                       "prte_data_server_timeout",
}


def _word_table(title: str, meanings: dict) -> str:
    import textwrap

    width = max(len(k.word) for k in meanings)
    indent = " " * (width + 4)
    rows = "\n".join(textwrap.fill(v, 79, initial_indent=f"  {k.word:<{width}}  ",
                                   subsequent_indent=indent)
                     for k, v in meanings.items())
    return f"{textwrap.fill(title + ':', 79)}\n{rows}"


_WORD_TABLES = {
    "RANGES_HELP": ("ranges (publish: who may see the item; lookup: whose items it searches; "
                    "the access rule applies as well)", RANGE_MEANINGS),
    "PERSISTENCES_HELP": ("persistences (how long an item lives)", PERSISTENCE_MEANINGS),
}


def __getattr__(name: str) -> str:
    """``RANGES_HELP`` and ``PERSISTENCES_HELP``, laid out on first use
    (only a help text needs them)."""
    if name in _WORD_TABLES:
        text = _word_table(*_WORD_TABLES[name])
        globals()[name] = text
        return text
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

ACCESS_HELP = """\
access: with no --access-uid/--access-gid only the publisher's own uid and gid
may read an item; each list given is a requirement every reader must meet.
Only the owner (same uid, and gid) may unpublish, whatever the lists say."""

PUBLISH_VALUES_HELP = """\
values: K=V stores V as a str, whatever it holds.  With --files, K=@FILE stores
the bytes of FILE and K=- the bytes piped to standard input (one K=- per
publish; in a job, rank 0 reads pydvm run's; a terminal or /dev/null is
refused); such values are bytes, kept as
bytes.  Without --files, K=- and K=@FILE of an existing FILE are published as
the strings written, with a note on stderr saying so.

output: 'PUBLISHED K' per key once the store accepted the publish, then
'STATUS <PMIx name>'; exit 0 on PMIX_SUCCESS, 1 otherwise."""

LOOKUP_OUTPUT_HELP = """\
output: 'FOUND K V from NSPACE:RANK' per key found, then 'STATUS <PMIx name>';
exit 0 on PMIX_SUCCESS, 1 otherwise.  A str V prints as it is, spaces included,
unless it holds a line break or another unprintable character: then as a JSON
string literal ("line\\nnext").  K prints as it is when it is one plain token
(no whitespace, '"' or '\\', nothing unprintable), else as a JSON string
literal ("a b").  Other values print as their Python literal (b'..', 42, 1.5,
True).  --json prints one JSON object instead:
{"status": NAME, "found": {K: {"value": V, "type": "str"|"bytes"|"int"|"float"|
"bool", "publisher": {"nspace": NS, "rank": R}}}, "missing": [K, ...]}, a bytes
value as base64 text."""


MAIN_DESCRIPTION = """\
pydvm: a distributed virtual machine.  Start one ('pydvm start'), run jobs on
it ('pydvm run'), and let their processes find each other through its data
store ('pydvm publish', 'pydvm lookup'), every item with a bounded lifetime."""

MAIN_EPILOG = """\
'pydvm COMMAND --help' describes each command and every option;
'pydvm run --help' the job launcher.  Exit status 2 is a usage error: nothing
was done."""


# ----------------------------------------------------------------------
# argument types: a bad value is a usage error before anything happens
# ----------------------------------------------------------------------


def _bad(text: str) -> Exception:
    """The error an argument type raises: argparse then names the option."""
    import argparse

    return argparse.ArgumentTypeError(text)


def seconds(text: str) -> float:
    """A finite, non-negative number of seconds."""
    try:
        v = float(text)
    except ValueError:
        raise _bad(f"expected a number of seconds, not {text!r}") from None
    if not math.isfinite(v) or v < 0:
        raise _bad(f"must be a finite number of seconds >= 0, not {text}")
    return v


def port(text: str) -> int:
    """A TCP port, 0 (any free port) to 65535."""
    try:
        v = int(text)
    except ValueError:
        raise _bad(f"expected a port number, not {text!r}") from None
    if not 0 <= v <= 65535:
        raise _bad(f"a port is 0 (any free port) to 65535, not {v}")
    return v


def id_number(text: str) -> int:
    """A uid or gid: 0 to 2**32-1."""
    try:
        v = int(text)
    except ValueError:
        raise _bad(f"expected a numeric id, not {text!r}") from None
    if not 0 <= v <= 2**32 - 1:
        raise _bad(f"an id is 0 to 4294967295, not {v}")
    return v


def signal_arg(text: str) -> int:
    """A signal: its number or name (``USR1``, ``SIGUSR1``)."""
    from ..client.jobspec import signal_number

    try:
        return signal_number(int(text) if text.strip().isdigit() else text)
    except ValueError as exc:
        raise _bad(f"{exc} (a signal is a number or a name such as USR1)") from None


def count(text: str) -> int:
    """A non-negative integer."""
    try:
        v = int(text)
    except ValueError:
        raise _bad(f"expected a whole number, not {text!r}") from None
    if v < 0:
        raise _bad(f"must be >= 0, not {v}")
    return v
