"""The in-job commands: ``pydvm publish``, ``pydvm lookup``, ``pydvm unpublish`` (SPEC 9).

They run inside a job and act as its process (``PYDVM_SERVER``,
``PYDVM_NSPACE``, ``PYDVM_RANK``), for scripts: each prints one line per
key and a final ``STATUS <PMIx name>``, and exits 0 on ``PMIX_SUCCESS``, 1
otherwise.  A pair or value that cannot be read (``--files K=@FILE`` of a
missing file, say) is answered the same way, ``STATUS PMIX_ERR_BAD_PARAM``, before
anything is sent; a bad option is a usage error (exit 2) from argparse.
How keys and values are printed is :mod:`pydvm.cli.formatting`'s.

A job may run these commands many times, so their arguments are read
without argparse when they are plainly well formed (:func:`parse_light`);
anything else -- ``--help``, a bad value, an abbreviated option, ``--`` --
goes to the argparse tree (:mod:`pydvm.cli.parser`), which words the usage
error or help text.  ``tests/test_cli_light.py`` checks that the two
parsers agree wherever the light one answers.
"""

from __future__ import annotations

import os
import sys
import time

from . import formatting as F
from ..enums import Persistence, Range
from ..errors import PMIxError, Status

# ----------------------------------------------------------------------
# arguments
# ----------------------------------------------------------------------

def _spec(command: str) -> tuple[dict, dict, str, bool]:
    """An in-job command's arguments as :func:`pydvm.cli_parser.build_parser`
    declares them: ``{option: (dest, action, check)}`` -- action ``"flag"``
    (store true), ``"store"`` or ``"append"`` a value that ``check`` (the
    argparse type, or the set of choices) accepts --, the defaults, the
    positionals' dest and whether at least one positional is needed."""
    from .helptext import count, id_number, seconds

    ranges = frozenset(r.word for r in Range)
    persistences = frozenset(p.word for p in Persistence if p is not Persistence.INVALID)
    if command == "publish":
        options = {
            "--range": ("range", "store", ranges), "--persistence": ("persistence", "store",
                                                                    persistences),
            "--access-uid": ("access_uid", "append", id_number),
            "--access-gid": ("access_gid", "append", id_number),
            "--replace": ("replace", "flag", None), "--files": ("files", "flag", None),
            "--hold": ("hold", "store", seconds),
        }
        defaults = {"range": "session", "persistence": None, "access_uid": [],
                    "access_gid": [], "replace": False, "files": False, "hold": 0.0}
        return options, defaults, "pairs", True
    if command == "lookup":
        options = {
            "--range": ("range", "store", ranges), "--wait": ("wait", "flag", None),
            "--wait-count": ("wait_count", "store", count),
            "--timeout": ("timeout", "store", seconds), "--json": ("json", "flag", None),
        }
        defaults = {"range": "session", "wait": False, "wait_count": None, "timeout": None,
                    "json": False}
        return options, defaults, "keys", True
    return {}, {}, "keys", False  # unpublish


def parse_light(command: str, args: list[str]):
    """``pydvm COMMAND ARGS`` (an in-job command) as argparse would parse it,
    without argparse -- or None when ARGS are not plainly well formed: an
    option not spelt out in full, ``--opt=value``, a value that starts with
    '-' or that argparse would refuse, ``-h``, ``--``, positionals in two
    runs.  The caller then lets argparse parse them (and word the error)."""
    from types import SimpleNamespace

    options, values, positional, needed = _spec(command)
    values = {k: (list(v) if isinstance(v, list) else v) for k, v in values.items()}
    found: list[str] = []
    run_over = False  # a run of positionals has ended: argparse takes no second one
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("-"):
            if run_over:
                return None
            found.append(arg)
            i += 1
            continue
        if found:
            run_over = True
        how = options.get(arg)
        if how is None:
            return None
        dest, action, check = how
        if action == "flag":
            values[dest] = True
            i += 1
            continue
        if i + 1 >= len(args) or args[i + 1].startswith("-"):
            return None
        text = args[i + 1]
        if isinstance(check, frozenset):
            if text not in check:
                return None
            value = text
        else:
            try:
                value = check(text)
            except Exception:  # argparse words the error
                return None
        if action == "append":
            values[dest].append(value)
        else:
            values[dest] = value
        i += 2
    if needed and not found:
        return None
    values[positional] = found
    return SimpleNamespace(cmd=command, func=_COMMANDS[command], **values)


def _status_line(st: Status) -> None:
    print(f"STATUS {st.pmix_name}", flush=True)


#: The most a value read from a file or standard input may hold: a publish
#: must fit one frame on the wire.
MAX_VALUE_BYTES = 60 * 1024 * 1024


def _publish_pairs(texts: list[str], files: bool) -> dict[str, str | bytes]:
    """``K=V`` arguments as pairs: ``V`` as a str (SPEC 9: whatever it holds),
    or -- with ``files`` (``--files``) -- ``K=@FILE`` / ``K=-`` as the bytes of
    FILE / of standard input.  Raises ValueError naming the argument at
    fault, before anything is sent.

    ``--files K=-`` refuses a standard input that is a terminal or
    ``/dev/null`` (the stdin of a job's ranks but rank 0, which reads its
    ``pydvm run``'s): a value is piped in or read from a file, never
    silently empty.
    """
    pairs: dict[str, str | bytes] = {}
    stdin_used = False
    for kv in texts:
        k, eq, v = kv.partition("=")
        if not eq or not k:
            want = "K=V, K=@FILE or K=-" if files else "K=V"
            raise ValueError(f"expected {want}, got {kv!r}")
        if not files or not (v == "-" or v.startswith("@")):
            pairs[k] = v
        elif v == "-":
            if stdin_used:
                raise ValueError("only one value can be read from standard input (K=-)")
            stdin_used = True
            if not _stdin_carries_data():
                raise ValueError(f"{kv!r} reads the value from standard input, which is a "
                                 "terminal or /dev/null here: pipe the value in (without "
                                 "--files, '-' is published as it is)")
            pairs[k] = _read_limited(sys.stdin.buffer, f"standard input (for {k})")
        elif v == "@":
            raise ValueError(f"{kv!r}: '@' must be followed by a file name")
        else:
            try:
                with open(v[1:], "rb") as f:
                    pairs[k] = _read_limited(f, f"{v[1:]} (for {k})")
            except OSError as exc:
                raise ValueError(f"cannot read the value of {k} from {v[1:]}: "
                                 f"{exc.strerror or exc}") from None
    return pairs


def _literal_hints(texts: list[str], files: bool) -> list[str]:
    """Without ``--files``, a value that looks like ``--files`` syntax -- ``@FILE``
    naming an existing file, or exactly ``-`` -- is still published as the str
    it is (SPEC 9: scripts rely on it); one hint line per such value says so,
    in case ``--files`` was meant."""
    if files:
        return []
    out = []
    for kv in texts:
        k, _, v = kv.partition("=")
        if v == "-":
            out.append(f"note: {F.quote(k)} was published as the literal string '-'; "
                       "with --files, K=- publishes the bytes piped to standard input")
        elif v.startswith("@") and os.path.isfile(v[1:]):
            out.append(f"note: {F.quote(k)} was published as the literal string {v!r}, not "
                       f"the file's contents; with --files, K=@FILE publishes the bytes "
                       f"of FILE")
    return out


def _stdin_carries_data() -> bool:
    """True when standard input is a pipe, socket or file (not a terminal,
    not a character device such as /dev/null, not closed)."""
    import stat

    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (OSError, ValueError, AttributeError):
        return False
    return not stat.S_ISCHR(mode)


def _read_limited(f, what: str) -> bytes:
    data = f.read(MAX_VALUE_BYTES + 1)
    if len(data) > MAX_VALUE_BYTES:
        raise ValueError(f"{what} holds more than {MAX_VALUE_BYTES} bytes, the most one "
                         "publish can carry")
    return data


def cmd_publish(a) -> int:
    from ..client import Client

    try:
        pairs = _publish_pairs(a.pairs, a.files)
    except ValueError as exc:
        sys.stderr.write(f"pydvm publish: {exc}\n")
        _status_line(Status.ERR_BAD_PARAM)
        return 1
    try:
        rng = Range.from_word(a.range)
        per = Persistence.from_word(a.persistence) if a.persistence else None
    except ValueError as exc:
        sys.stderr.write(f"pydvm publish: {exc}\n")
        _status_line(Status.ERR_BAD_PARAM)
        return 1
    st = Status.SUCCESS
    try:
        with Client() as c:
            c.publish(pairs, range=rng, persistence=per, access_uids=a.access_uid,
                      access_gids=a.access_gid, replace=a.replace)
            for k in pairs:
                print(f"PUBLISHED {F.quote(k)}")
            _status_line(st)
            for hint in _literal_hints(a.pairs, a.files):
                sys.stderr.write(f"pydvm publish: {hint}\n")
            sys.stderr.flush()
            if a.hold:
                time.sleep(a.hold)
    except PMIxError as exc:
        st = exc.status
        message = exc.message
        if st is Status.ERR_DUPLICATE_KEY:
            # The store speaks of the API's replace=True; name the flag here.
            message = message.replace("(use replace to", "(use --replace to")
        if message:
            sys.stderr.write(f"pydvm publish: {message}\n")
        _status_line(st)
    return 0 if st is Status.SUCCESS else 1


def cmd_lookup(a) -> int:
    from ..client import Client

    try:
        rng = Range.from_word(a.range)
    except ValueError as exc:
        sys.stderr.write(f"pydvm lookup: {exc}\n")
        _status_line(Status.ERR_BAD_PARAM)
        return 1
    wait: bool | int = False
    if a.wait_count is not None:
        wait = a.wait_count
    elif a.wait:
        wait = True
    try:
        with Client() as c:
            r = c.lookup(a.keys, range=rng, wait=wait, timeout=a.timeout)
    except PMIxError as exc:
        if exc.message and exc.status not in (Status.ERR_NOT_FOUND, Status.ERR_TIMEOUT):
            sys.stderr.write(f"pydvm lookup: {exc.message}\n")
        if a.json:
            import json

            print(json.dumps(F.lookup_json(exc.status.pmix_name, a.keys, ())), flush=True)
        else:
            _status_line(exc.status)
        return 1
    if a.json:
        import json

        print(json.dumps(F.lookup_json(r.status.pmix_name, a.keys, r.found.values())),
              flush=True)
    else:
        for key, f in r.found.items():
            print(F.found_line(key, f.value, f.nspace, f.rank))
        _status_line(r.status)
    return 0 if r.status is Status.SUCCESS else 1


def cmd_unpublish(a) -> int:
    from ..client import Client

    try:
        with Client() as c:
            c.unpublish(a.keys or None)
    except PMIxError as exc:
        _status_line(exc.status)
        return 1
    _status_line(Status.SUCCESS)
    return 0


_COMMANDS = {"publish": cmd_publish, "lookup": cmd_lookup, "unpublish": cmd_unpublish}
