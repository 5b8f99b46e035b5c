"""A job of another user gets the same standard streams as the DVM owner's:
a terminal on stdout it may reopen, a stderr pipe it may reopen, and its
`pydvm run`'s stdin on rank 0 -- on a daemon node and on the head node (the
master process), both run by root."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from conftest import RUNUSER

A = "pdvmtesta"

SCRIPT = ('test -t 1 && echo "stdout is a terminal"; '
          'echo "reopened stdout" > /dev/stdout; '
          'echo "reopened stderr" > /dev/stderr; '
          'cat /dev/stdin; '
          'id -u')


def _run_as(d, user: str, *args: str, input: bytes) -> subprocess.CompletedProcess:
    bindir = str(Path(d.python).parent)
    env = [f"PATH={bindir}:/usr/bin:/bin", "HOME=/tmp", f"PYDVM_URI={d.uri}"]
    return subprocess.run([RUNUSER, "-u", user, "--", "env", *env, d.python, "-m", "pydvm",
                           "run", *args], input=input, capture_output=True, timeout=60,
                          cwd="/tmp")


@pytest.mark.parametrize("head", [False, True], ids=["daemon", "head"])
def test_another_users_rank_may_reopen_its_terminal_and_pipes_and_reads_piped_stdin(
        make_mudvm, users, head):
    d = make_mudvm(**({"pydvm_head_node": "a"} if head else {}))
    p = _run_as(d, A, "--host", "a", "-n", "1", "sh", "-c", SCRIPT, input=b"piped in\n")
    assert p.returncode == 0, p.stderr
    assert p.stdout.decode().splitlines() == [
        "stdout is a terminal", "reopened stdout", "piped in", str(users[A])], p.stdout
    assert p.stderr == b"reopened stderr\n", p.stderr
