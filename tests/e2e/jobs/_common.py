"""Shared bits of the e2e job programs (imported from the jobs directory)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from pydvm import Client, Persistence, Range  # noqa: F401  (re-exported for the jobs)
from pydvm.errors import NotFoundError

RANK = int(os.environ.get("PYDVM_RANK", "-1"))
APP_IDX = int(os.environ.get("PYDVM_APP_IDX", "-1"))


def out(*args) -> None:
    print(*args, flush=True)


def present(c: Client, key: str, range: Range = Range.SESSION) -> bool:
    """True if ``key`` is found (do not use on FIRST_READ keys: it consumes them)."""
    try:
        c.lookup([key], range=range)
        return True
    except NotFoundError:
        return False


def wait_gone(c: Client, key: str, range: Range = Range.SESSION, timeout: float = 15.0) -> bool:
    """Poll until ``key`` reads as NOT_FOUND; False if it is still there at the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not present(c, key, range):
            return True
        time.sleep(0.05)
    return False


def wait_file(path: str, timeout: float = 30.0) -> bool:
    """Wait (bounded) for the test to create ``path`` as its go signal."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if Path(path).exists():
            return True
        time.sleep(0.05)
    return False


def die(msg: str, code: int = 99) -> None:
    out(msg)
    sys.exit(code)
