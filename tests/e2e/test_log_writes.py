"""Logs that cannot be written, and the daemons' store trace.

* A master logging to a full file system (a 64 KiB tmpfs this test mounts
  and fills, as root): each failed log write is counted -- no traceback on
  its stderr, at most one line there -- and once the disk has room again
  the log gets one line saying how many records were lost.
* ``prte_data_server_verbose`` reaches the daemons: a node store's
  removals are traced in the daemon's log.
"""

from __future__ import annotations

import errno
import os
import re
import subprocess

import pytest

from dvmkit import CMD_TIMEOUT, PYDVM, LineReader, start_dvm, wait_for
from rawpeers import Peer, log_lines

pytestmark = pytest.mark.e2e

#: Warnings the master is made to log while its disk is full.
WARNINGS = 20


def _mount_tmpfs(path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(path)],
                   check=True, timeout=CMD_TIMEOUT)


def _fill(path) -> None:
    """Write ``path`` until the file system is full."""
    chunk = b"\0" * 4096
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            try:
                os.write(fd, chunk)
            except OSError as exc:
                if exc.errno == errno.ENOSPC:
                    return
                raise
    finally:
        os.close(fd)


def _refused_handshake(host: str, port: int) -> None:
    """A stranger whose auth the master refuses (and logs)."""
    peer = Peer.tcp(host, port)
    try:
        assert peer.recv()["t"] == "challenge"
        peer.send({"t": "auth", "id": 1, "role": "tool", "mac": b"\0" * 32})
        peer.expect_closed()
    finally:
        peer.close()


def test_full_log_disk_is_counted_not_traced(tmp_path):
    logs = tmp_path / "logs"
    _mount_tmpfs(logs)
    env = dict(os.environ, PYDVM_STATE_DIR=str(tmp_path / "state"))
    env.pop("PYDVM_URI", None)
    master = subprocess.Popen(PYDVM + ["start", "--hosts", "a", "--log-dir", str(logs)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, stdin=subprocess.DEVNULL)
    out, err = LineReader(master.stdout), LineReader(master.stderr)
    uri = ""
    try:
        uri = out.wait_line("tcp://", timeout=CMD_TIMEOUT)
        host, port = re.match(r"tcp://([^:]+):(\d+)/", uri).groups()
        _fill(logs / "filler")
        for _ in range(WARNINGS):
            _refused_handshake(host, int(port))
        (logs / "filler").unlink()  # room again
        _refused_handshake(host, int(port))  # the next record is written, and the count
        notes = wait_for(lambda: log_lines_in(logs / "master.log", r"could not be written"),
                         timeout=10, what="the lost-records line in master.log")
    finally:
        if uri:
            subprocess.run(PYDVM + ["stop"], env=dict(env, PYDVM_URI=uri), timeout=CMD_TIMEOUT,
                           capture_output=True)
        try:
            master.wait(timeout=CMD_TIMEOUT)
        except subprocess.TimeoutExpired:
            master.kill()
            master.wait(timeout=10)
        subprocess.run(["umount", "-l", str(logs)], timeout=CMD_TIMEOUT)
    lines = err.join()
    traced = [ln for ln in lines if "Traceback" in ln or "Logging error" in ln]
    assert not traced, "\n".join(lines[:40])
    said = [ln for ln in lines if "cannot write the log" in ln]
    assert len(said) <= 1, said  # at most once a minute
    print("stderr:", said, "log:", notes)
    assert len(notes) == 1, notes
    lost = int(re.search(r"(\d+) log record\(s\) could not be written", notes[0]).group(1))
    assert 1 <= lost <= WARNINGS + 5, notes  # counted (some may have reached the disk later)


def log_lines_in(path, pattern: str) -> list[str]:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    return [ln for ln in text.splitlines() if re.search(pattern, ln)]


def test_daemons_trace_store_removals_when_verbose(tmp_path):
    dvm = start_dvm(tmp_path, hosts="a", mca={"prte_data_server_verbose": "1"})
    try:
        p = dvm.run("-n", "1", "pydvm", "publish", "--range", "local", "traced=1")
        assert p.returncode == 0, p.stdout + p.stderr
        wait_for(lambda: log_lines(dvm, "a", r"\[a\] purge .*removed 1 item"), timeout=10,
                 what="the node store's purge traced in a.log")
    finally:
        dvm.stop()
