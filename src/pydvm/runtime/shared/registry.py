"""This user's running DVMs: one lock, one secret and one record per DVM id.

In the state directory (``$PYDVM_STATE_DIR``, default ``~/.pydvm``, mode
0700) a DVM with id X owns three files:

``X.lock``
    held with ``flock(LOCK_EX)`` by the master for its whole life.  A second
    ``pydvm start --dvm-id X`` cannot take it and is refused, naming the
    running DVM, *before* it writes anything -- so it can never overwrite
    X's secret and leave X unreachable.  The kernel drops the lock when the
    master dies however it dies, so a crashed DVM never blocks its id.
``X.secret``
    the DVM secret (0600), see :mod:`pydvm.runtime.shared.auth`.
``X.json``
    what ``pydvm dvms`` and the refusal message show: URI, master pid,
    hosts, start time.

A record whose lock nobody holds belongs to a dead DVM; :func:`running`
skips such records and removes them, and :func:`is_running` answers for one
id (``pydvm`` uses it to tell a stale ``PYDVM_URI`` from an unreachable one).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .auth import state_dir, write_secret


class AlreadyRunning(RuntimeError):
    """A DVM with this id is running (the message names it)."""


def _paths(dvmid: str) -> tuple[Path, Path, Path]:
    d = state_dir()
    return d / f"{dvmid}.lock", d / f"{dvmid}.secret", d / f"{dvmid}.json"


@dataclass
class DvmLock:
    """The held lock of one DVM id (see the module docstring)."""

    dvmid: str
    fd: int

    @classmethod
    def acquire(cls, dvmid: str) -> "DvmLock":
        """Take the id's lock or raise :class:`AlreadyRunning`."""
        d = state_dir()
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(d, 0o700)
        lock, _, record = _paths(dvmid)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            info = read_record(record)
            where = f" at {info['uri']} (master pid {info['pid']})" if info else ""
            uri = info.get("uri", "URI") if info else "URI"
            raise AlreadyRunning(
                f"DVM {dvmid} is already running{where}; stop it first "
                f"(pydvm stop --dvm {uri}) or choose another --dvm-id") from None
        return cls(dvmid, fd)

    def publish(self, secret: bytes, uri: Any, hosts: list[str]) -> None:
        """Write the secret and the record (after the lock is ours)."""
        write_secret(self.dvmid, secret)
        _, _, record = _paths(self.dvmid)
        text = json.dumps({"dvm": self.dvmid, "uri": str(uri), "pid": os.getpid(),
                           "hosts": hosts, "started": time.time()})
        tmp = record.with_suffix(".json.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
        os.replace(tmp, record)

    def release(self) -> None:
        """Remove the secret and the record, then drop the lock."""
        if self.fd < 0:
            return
        for path in _paths(self.dvmid)[1:]:
            try:
                path.unlink()
            except FileNotFoundError:
                pass
        os.close(self.fd)
        self.fd = -1


def read_record(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def running() -> list[dict]:
    """Records of this user's running DVMs.

    A record whose lock nobody holds is a dead DVM's: its record and secret
    are removed while we hold its lock (so a DVM starting under that id
    meanwhile cannot lose its fresh files); lock files themselves stay, since
    removing one could let two DVMs lock different files of the same name.
    """
    d = state_dir()
    out = []
    for record in sorted(d.glob("*.json")) if d.is_dir() else ():
        dvmid = record.stem
        lock, secret, _ = _paths(dvmid)
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            fd = -1
        try:
            if fd >= 0:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # held: alive
            info = read_record(record)
            if info:
                out.append(info)
        else:
            for path in (record, secret):
                try:
                    path.unlink()
                except FileNotFoundError:
                    pass
        finally:
            if fd >= 0:
                os.close(fd)
    return out


def is_running(dvmid: str) -> bool | None:
    """Whether this user's DVM ``dvmid`` is running on this machine: True
    (its lock is held), False (its lock file exists and nobody holds it: it
    ran here and has ended), or None (no DVM of that id ever ran here for
    this user -- another machine's or another user's, or a mistyped id)."""
    lock, _, _ = _paths(dvmid)
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also drops the lock if we took it
    return False
