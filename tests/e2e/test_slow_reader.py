"""What pydvm prints reaches a slow reader whole, however Python buffers stdout.

Under ``PYTHONUNBUFFERED=1`` (common in containers and CI) ``sys.stdout``'s
binary layer is the raw file: one write to a full pipe may take only part of
its bytes, and a writer that does not loop loses the rest without an error.
Both tests read nothing until the writer has filled the pipe.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from dvmkit import PYDVM

pytestmark = pytest.mark.e2e

BIG = "x" * 300


def _slow(dvm, args, unbuffered: bool) -> bytes:
    env = dict(dvm.env, PYDVM_URI=dvm.uri)
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    else:
        env.pop("PYTHONUNBUFFERED", None)
    p = subprocess.Popen(PYDVM + args, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    time.sleep(1.5)  # the pipe (64 KiB) fills; the writer waits
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err.decode()
    return out


@pytest.mark.parametrize("unbuffered", [True, False])
def test_store_json_larger_than_a_pipe_reaches_a_slow_reader_whole(dvm, unbuffered):
    # 400 keys, so that the listing of their names alone fills more than a pipe
    pairs = [f"k{i}={BIG}" for i in range(400)]
    dvm.run("-n", "1", "pydvm", "publish", *pairs, "--persist", "session", check=True)
    out = _slow(dvm, ["store", "--json"], unbuffered)
    assert len(out) > 65536
    text = json.dumps(json.loads(out))  # whole: it parses
    assert all(f'"k{i}"' in text for i in range(400))


@pytest.mark.parametrize("unbuffered", [True, False])
def test_job_output_larger_than_a_pipe_reaches_a_slow_reader_whole(dvm, unbuffered):
    script = f"for i in $(seq 1 600); do echo ${{i}}{BIG}; done"
    out = _slow(dvm, ["run", "-n", "1", "sh", "-c", script], unbuffered)
    lines = out.decode().splitlines()
    assert lines == [f"{i}{BIG}" for i in range(1, 601)]
