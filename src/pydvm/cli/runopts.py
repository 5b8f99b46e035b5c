"""``pydvm run``'s command line: its argv read into a job's options, and its help.

The options themselves -- every spelling, how many arguments each takes,
where it belongs, its help -- are declared once, in the library
(:mod:`pydvm.client.options`), and so is what each does to the job's
options and how its value is checked (:mod:`pydvm.client.request`, which
the job API's keyword arguments go through too).  Here: the argv split into
app contexts at ``:`` and each context's options read against that table
(:func:`parse_run`), ``--app``/``-configfile`` files (:func:`read_appfile`),
and ``pydvm run --help`` made of the table (:func:`run_help`).  An
``mpirun`` or ``mpiexec`` option pydvm does not take is refused with what to
use instead: :mod:`pydvm.cli.mpirunopts` and :mod:`pydvm.cli.hydraopts`
name them all (and make the docs' tables), loaded only by a refusal -- no
``mpirun`` option is ever ignored silently.

This module is on the fast path of every ``pydvm run``: it imports nothing
but the library's option table and model; the placement parsers
(:mod:`pydvm.placement`) and the parameter registry are loaded only by
the options that need them.
"""

from __future__ import annotations

import os

from ..client.options import (  # noqa: F401 (re-exported: the table's old home)
    APP, BY_NAME, GLOBAL, JOB, KEYWORDS, OPTIONS, PAIR, Opt)
from ..client.request import (  # noqa: F401 (re-exported: the model's old home)
    apply_keywords, apply_option, empty_app, new_app, new_opts, parse_seconds)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# ----------------------------------------------------------------------
# parsing
# ----------------------------------------------------------------------


def _segment(seg: list[str], idx: int, opts: dict, app: dict, where: str,
             job_ok: bool) -> list[str]:
    """Read the options at the head of one app context (``seg``) into
    ``opts`` (the job's) and ``app`` (the context's); return its command."""
    i = 0
    while i < len(seg) and seg[i].startswith("-") and seg[i] != "-":
        tok = seg[i]
        if tok == "--":
            i += 1
            break
        name, eq, inline = tok.partition("=")
        o = BY_NAME.get(name)
        if o is None:
            from .hydraopts import HYDRA_NOT_SUPPORTED
            from .mpirunopts import NOT_SUPPORTED

            if name in NOT_SUPPORTED:
                raise ValueError(f"{name} (an mpirun option) is not supported{where}: "
                                 f"{NOT_SUPPORTED[name]}")
            if name in HYDRA_NOT_SUPPORTED:
                raise ValueError(f"{name} (an mpiexec option) is not supported{where}: "
                                 f"{HYDRA_NOT_SUPPORTED[name]}")
            raise ValueError(f"unknown option {tok}{where}")
        if o.scope == JOB and not job_ok:
            raise ValueError(f"{name} applies to the whole job: give it before the first "
                             f"command, not{where}")
        args: list[str] = []
        if o.nargs == 0:
            if eq:
                raise ValueError(f"{name} takes no value")
        elif o.nargs == PAIR:
            # NAME VALUE, or NAME=VALUE in one word (as mpiexec reads them)
            if eq or i + 1 >= len(seg):
                raise ValueError(f"{name} needs {o.metavar} (or NAME=VALUE)")
            var, eq2, value = seg[i + 1].partition("=")
            if eq2:
                args = [var, value]
                i += 1
            elif i + 2 >= len(seg):
                raise ValueError(f"{name} {seg[i + 1]} needs a value: {name} {o.metavar}")
            else:
                args = seg[i + 1:i + 3]
                i += 2
        elif eq:
            if o.nargs == 2:
                raise ValueError(f"{name} takes two arguments: {o.metavar}")
            args = [inline]
        else:
            if i + o.nargs >= len(seg):
                raise ValueError(f"{name} needs {'a value' if o.nargs == 1 else o.metavar}")
            args = seg[i + 1:i + 1 + o.nargs]
            i += o.nargs
        apply_option(o, name, args, opts, app)
        i += 1
    return seg[i:]


def _split(argv: list[str]) -> list[list[str]]:
    segments: list[list[str]] = [[]]
    for tok in argv:
        if tok == ":":
            segments.append([])
        else:
            segments[-1].append(tok)
    return segments


def read_appfile(path: str, opt: str = "--app") -> list[list[str]]:
    """The app contexts of an ``--app`` (or ``-configfile``) file: one a
    line, each its options and command as a shell would split them; ``#``
    starts a comment and blank lines are skipped.  ValueError naming the
    file (and line) if it cannot be read."""
    import shlex

    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{opt} {path}: cannot read it: {exc}") from None
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        try:
            words = shlex.split(line, comments=True)
        except ValueError as exc:
            raise ValueError(f"{opt} {path}:{lineno}: {exc}") from None
        if words:
            out.append((lineno, words))
    if not out:
        raise ValueError(f"{opt} {path}: no app context in it")
    return out


def parse_run(argv: list[str]) -> dict[str, Any]:
    """Parse ``pydvm run`` arguments (MPMD contexts separated by ``:``).

    Returns the job's options: ``dvm``, ``session``, ``mca`` (pydvm's and
    Open MPI's parameters, told apart later), ``tag_output``,
    ``abort_on_failure``, ``pmix``, ``placement`` (:mod:`pydvm.placement`'s
    keys), ``timeout``, ``stdin`` (the rank that reads pydvm run's stdin, "all", or
    None), ``queue`` (True, False, None: the DVM's default), output options, ``warnings`` (to print before running) and
    ``apps``: each ``{"argv", "n", "hosts", "env", "cwd", "path"}``.
    ValueError naming what is wrong.
    """
    opts = new_opts()
    segments = _split(argv)
    for idx, seg in enumerate(segments):
        app = empty_app()
        where = "" if idx == 0 else f" in app context {idx}"
        cmd = _segment(seg, idx, opts, app, where, job_ok=idx == 0)
        if opts["app_file"] is not None:
            if cmd or len(segments) > 1 or app != empty_app():
                raise ValueError(f"{opts['app_file_opt']} FILE names the app contexts: give "
                                 "no command, ':' or app option (-n, --host, -x, -env, "
                                 "--wdir, --path) beside it")
            break
        if not cmd:
            raise ValueError(f"app context {idx} has no command")
        app["argv"] = cmd
        opts["apps"].append(app)
    if opts["app_file"] is not None:
        # mpiexec's -configfile lines may hold options of the whole job too
        job_ok = opts["app_file_opt"] != "--app"
        for n, (lineno, words) in enumerate(read_appfile(opts["app_file"],
                                                         opts["app_file_opt"])):
            app = empty_app()
            where = f" in {opts['app_file']}:{lineno}"
            cmd = _segment(words, n, opts, app, where, job_ok=job_ok)
            if not cmd:
                raise ValueError(f"{opts['app_file']}:{lineno}: no command")
            app["argv"] = cmd
            opts["apps"].append(app)
    if opts["timeout"] is None and os.environ.get("MPIEXEC_TIMEOUT"):
        opts["timeout"] = parse_seconds("MPIEXEC_TIMEOUT", os.environ["MPIEXEC_TIMEOUT"])
    return opts


# ----------------------------------------------------------------------
# help
# ----------------------------------------------------------------------


def _wrap(text: str, width: int, indent: int) -> list[str]:
    words, lines, cur = text.split(), [], ""
    for w in words:
        if cur and len(cur) + 1 + len(w) > width - indent:
            lines.append(cur)
            cur = w
        else:
            cur = f"{cur} {w}" if cur else w
    if cur:
        lines.append(cur)
    return lines


def _option_lines(scope: str) -> list[str]:
    out = []
    for o in OPTIONS:
        if o.scope != scope and not (scope == JOB and o.scope == GLOBAL):
            continue
        if o.hydra and not o.mirrors:  # mpiexec's: as mpiexec users write them
            shown = [n for n in o.names if not n.startswith("--")]
        else:  # not mpirun's one-dash longs
            shown = [n for n in o.names if not (n.startswith("-") and not n.startswith("--")
                                                and len(n) > 2)]
        head = ", ".join(f"{n} {o.metavar}".rstrip() for n in shown)
        body = _wrap(o.help, 79, 22)
        if len(head) <= 19:
            out.append(f"  {head:<19} {body[0]}")
            rest = body[1:]
        else:
            out.append(f"  {head}")
            rest = body
        out += [" " * 22 + ln for ln in rest]
    return out


RUN_USAGE = """\
usage: pydvm run [--dvm URI] [--session ID] [--mca N V]... [--tag-output]
                 [--abort-on-failure | --no-abort-on-failure] [--pmix]
                 [--stop-in-init] [mpirun's options: see below]
                 [--host H[:SLOTS],...] [-n N] CMD ARGS...
                 [: [--host H[:SLOTS],...] [-n M] CMD2 ARGS...]..."""


def run_help() -> str:
    """``pydvm run --help``, made from :data:`OPTIONS`."""
    intro = """\
Run one job and exit with its status: the first non-zero exit of its
processes (128+N for a process killed by signal N), else 0.  Output is
forwarded live, line by line: each process's stdout is a terminal, as under
mpirun, its stderr a pipe.  pydvm run's own stdin goes to rank 0 (unless it
is /dev/null; --stdin says which rank, or all); the other ranks read
/dev/null.  Processes that fail are
reported on stderr, one line each (rank, node, exit status or signal), and
so is whoever ended the job ('pydvm kill', 'pydvm session end', 'pydvm
stop').  mpirun's command lines work as they are: docs/mpirun.md lists every
mpirun option and what pydvm does with it; one pydvm does not support is
refused with what to use instead.  So do MPICH's and Intel MPI's (mpiexec,
Hydra) where they do not clash with mpirun's: docs/mpiexec.md."""
    tail = """\
Job processes find PYDVM_NSPACE, PYDVM_RANK, PYDVM_APP_IDX, PYDVM_JOB_SIZE,
PYDVM_NODE and PYDVM_SERVER in their environment, and the OMPI_COMM_WORLD_*
variables mpirun sets.  Ctrl-C or SIGTERM kills the job and exits 128+N."""
    return "\n".join([RUN_USAGE, "", intro, "",
                      "options of the whole job (before the first command; mpiexec's",
                      "-hosts, -f, -ppn and -genv... in any context):",
                      *_option_lines(JOB), "",
                      "options of each app context (before its command; ':' starts the next):",
                      *_option_lines(APP),
                      "  --                  end of options: what follows is the command", "",
                      tail])
