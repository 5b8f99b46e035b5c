"""Logging of the master, the daemons and a one-shot ``pydvm run``.

:func:`setup_logging` sends the ``pydvm`` loggers to ``LOG_DIR/NAME.log``
(or stderr) through a handler that **degrades to a counter** when the log
cannot be written (a full disk: ENOSPC; a read-only or vanished file
system): a record that fails is counted, never answered with a traceback
(the standard handler prints one per failed record, to stderr -- which for
a daemon is the master's log, on the same full disk).  The first failure,
and then at most one a minute, is one line on stderr; once writing works
again the log gets one line saying how many records were lost, since when
and why.

:func:`store_verbosity` applies ``prte_data_server_verbose`` (the store's
trace: removals at 1, every operation at 2) -- at start for the master, on
the welcome for a daemon, which learns the DVM's parameters only then.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

#: At most one "log records lost" line on stderr per this many seconds.
STDERR_EVERY = 60.0


class _Counting:
    """A handler mix-in: failed writes counted, reported once writing works."""

    def _init_counting(self) -> None:
        self.lost = 0
        self.lost_since = 0.0
        self.lost_why = ""
        self._said = -STDERR_EVERY  # time.monotonic() of the last stderr line
        self._failed = False

    def emit(self, record: logging.LogRecord) -> None:  # type: ignore[override]
        self._failed = False
        super().emit(record)  # type: ignore[misc]
        if not self._failed and self.lost:
            lost, since, why = self.lost, self.lost_since, self.lost_why
            self.lost = 0
            note = logging.LogRecord(
                "pydvm.logs", logging.WARNING, __file__, 0,
                "%d log record(s) could not be written since %s (%s); they may be missing "
                "here", (lost, time.strftime("%H:%M:%S", time.localtime(since)), why), None)
            super().emit(note)  # type: ignore[misc]

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        exc = sys.exc_info()[1]
        if not isinstance(exc, OSError):
            super().handleError(record)  # type: ignore[misc]  # a bug of ours: say so
            return
        self._failed = True
        if not self.lost:
            self.lost_since = time.time()
        self.lost += 1
        self.lost_why = f"{exc.strerror or exc}"
        now = time.monotonic()
        if now - self._said >= STDERR_EVERY:
            self._said = now
            where = getattr(self, "baseFilename", "stderr")
            try:
                os.write(2, f"pydvm: cannot write the log {where}: {self.lost_why}; "
                            f"{self.lost} record(s) lost so far (counted, reported there "
                            "once writing works again)\n".encode())
            except OSError:
                pass


class CountingFileHandler(_Counting, logging.FileHandler):
    """A :class:`logging.FileHandler` whose failed writes are counted (module docstring)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self._init_counting()


class CountingStreamHandler(_Counting, logging.StreamHandler):
    """A :class:`logging.StreamHandler` whose failed writes are counted (module docstring)."""

    def __init__(self, stream=None) -> None:
        super().__init__(stream)
        self._init_counting()


def setup_logging(name: str, log_dir: str | None, verbose: int = 0) -> None:
    """Log to ``LOG_DIR/NAME.log`` if given, else to stderr.

    A log directory that cannot be created or written falls back to stderr
    with a warning (a daemon whose node cannot see the master's directory).
    The store's trace (``pydvm.store`` at INFO) is shown when
    ``prte_data_server_verbose`` is above 0 (:func:`store_verbosity`).
    """
    root = logging.getLogger("pydvm")
    for h in list(root.handlers):
        root.removeHandler(h)
    handler: logging.Handler
    problem = ""
    if log_dir:
        try:
            Path(log_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
            handler = CountingFileHandler(os.path.join(log_dir, f"{name}.log"))
        except OSError as exc:
            problem = f"cannot log to {log_dir} ({exc}); logging to stderr"
            handler = CountingStreamHandler(sys.stderr)
    else:
        handler = CountingStreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(
        f"%(asctime)s {name} %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    root.propagate = False
    store_verbosity(verbose)
    if os.environ.get("PYDVM_DEBUG"):
        root.setLevel(logging.DEBUG)
    if problem:
        root.warning("%s", problem)


def store_verbosity(verbose: int) -> None:
    """Show the store's trace (``pydvm.store`` at INFO) if ``verbose`` > 0
    (``prte_data_server_verbose``)."""
    logging.getLogger("pydvm.store").setLevel(logging.INFO if verbose > 0 else logging.WARNING)
