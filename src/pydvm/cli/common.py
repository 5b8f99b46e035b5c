"""What every command shares: how it fails, how it writes, how it exits.

Nothing here imports another module of the command line at load time, so
every command module may import it without a cycle.
"""

from __future__ import annotations

import sys

#: Set by a command after which nothing needs the interpreter's orderly
#: shutdown (``pydvm run`` against a persistent DVM: no threads, no atexit
#: handler, no logging of ours); :func:`entry` then ends the process at once.
QUICK_EXIT = False


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
