"""The log handler that degrades to a counter (runtime/shared/logs.py), on a stream
whose writes fail on demand: no traceback per failed record, one stderr line,
one line in the log once writing works again."""

from __future__ import annotations

import errno
import io
import logging

from pydvm.runtime.shared import logs


class Disk(io.StringIO):
    """A stream that fails with ENOSPC while ``full``."""

    full = False

    def write(self, s):
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(s)


def _logger(stream):
    handler = logs.CountingStreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log = logging.getLogger("pydvm.test-log-handler")
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.INFO)
    return log, handler


def test_failed_writes_are_counted_said_once_and_reported_when_writing_works(capfd):
    disk = Disk()
    log, handler = _logger(disk)
    log.info("before")
    disk.full = True
    for i in range(50):
        log.warning("lost %d", i)
    assert handler.lost == 50
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Logging error" not in err, err
    assert err.count("cannot write the log") == 1, err
    disk.full = False
    log.info("after")
    lines = disk.getvalue().splitlines()
    assert lines[0] == "before" and lines[1] == "after", lines
    assert lines[2].startswith("50 log record(s) could not be written since "), lines
    assert "No space left on device" in lines[2]
    assert handler.lost == 0
    log.info("again")
    assert disk.getvalue().splitlines()[3:] == ["again"]  # reported once


def test_a_formatting_bug_is_still_reported_as_one(capfd):
    log, handler = _logger(Disk())
    log.warning("%d", "not a number")
    assert handler.lost == 0  # not a write failure: logging's own report
    assert "Logging error" in capfd.readouterr().err


def test_store_verbosity_sets_the_store_trace():
    logs.store_verbosity(1)
    assert logging.getLogger("pydvm.store").level == logging.INFO
    logs.store_verbosity(0)
    assert logging.getLogger("pydvm.store").level == logging.WARNING
