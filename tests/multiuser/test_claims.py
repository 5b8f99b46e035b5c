"""Claims on a multi-user DVM: nobody borrows another user's identity (issue 8, item 1).

Users reach a multi-user DVM as tools on its tool socket, identified by
their peer credentials.  A data request may carry ``requestor`` /
``req_uid`` / ``req_gid`` claims -- that is how a relaying DVM speaks for its
processes -- but only root and the DVM's owner may claim another identity.
Each test below read or removed another user's items on the code before
the rule (except the ones showing that root and a user's own relay still work).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

RUNUSER = shutil.which("runuser") or "/usr/sbin/runuser"
A, B = "pdvmtesta", "pdvmtestb"

PROBE = '''
import asyncio, json, sys
from pydvm.cli.tool import open_tool, resolve_uri

async def main():
    ch = await open_tool(resolve_uri(None))
    r = await ch.call(json.loads(sys.argv[1]), 20)
    ch.close("done")
    print(json.dumps({"status": r.get("status"), "msg": r.get("msg"),
                      "found": r.get("found")}))

asyncio.run(main())
'''


@pytest.fixture
def probe(readable_script):
    """A tool-socket probe script readable by the test users; returns its path."""
    return readable_script(PROBE)


def _send(mudvm, user, probe, msg: dict) -> dict:
    bindir = str(Path(mudvm.python).parent)
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": "/tmp", "PYDVM_URI": mudvm.uri}
    cmd = [mudvm.python, probe, json.dumps(msg)]
    if user is not None:
        cmd = [RUNUSER, "-u", user, "--", "env", *[f"{k}={v}" for k, v in env.items()], *cmd]
    else:
        env = {**mudvm.root_env, **env}
    q = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd="/tmp", env=env)
    assert q.returncode == 0, q.stderr
    return json.loads(q.stdout)


def _gid(user: str) -> int:
    return pwd.getpwnam(user).pw_gid


def test_a_user_claiming_another_users_uid_can_neither_read_nor_remove(mudvm, users, probe):
    """B on the tool socket claims A's uid/gid: lookup and unpublish are refused
    NO_PERMISSIONS naming the rule; A's item is still there, unchanged."""
    assert mudvm.run(A, "publish", "k=a", "--persistence", "session").returncode == 0
    claim = {"req_uid": users[A], "req_gid": _gid(A)}
    r = _send(mudvm, B, probe, {"t": "lookup", "keys": ["k"], "range": 4, **claim})
    assert r["status"] == -23 and "may not act as uid" in r["msg"], r
    assert not r["found"]
    r = _send(mudvm, B, probe, {"t": "unpublish", "keys": ["k"], **claim})
    assert r["status"] == -23, r
    r = _send(mudvm, B, probe, {"t": "publish", "pairs": {"k2": "forged"}, "range": 4,
                                "persist": 4, **claim})
    assert r["status"] == -23, r
    assert "FOUND k a " in mudvm.run(A, "lookup", "k").stdout
    assert mudvm.store()["master"]["bytes_by_uid"] == {str(users[A]): 130}


def test_a_requestor_claim_never_widens_what_its_uid_could_remove(mudvm, users, probe):
    """B's unpublish() naming A's running process is refused; naming A's process
    once its job is gone (unknown to the DVM) removes nothing of A's."""
    job = mudvm.popen_as(A, "run", "-n", "1", "sh", "-c",
                         'echo "NS $PYDVM_NSPACE"; '
                         'pydvm publish mine=1 --persistence session --hold 30 >/dev/null')
    try:
        ns = job.stdout.readline().split()[1]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "mine" not in mudvm.store(A)["master"]["keys"]:
            time.sleep(0.1)
        r = _send(mudvm, B, probe, {"t": "unpublish", "keys": None, "requestor": [ns, 0]})
        assert r["status"] == -23 and "another user" in r["msg"], r
        assert "FOUND mine 1 " in mudvm.run(A, "lookup", "mine").stdout
    finally:
        job.kill()
        job.wait(timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _jobs(mudvm):
        time.sleep(0.1)
    r = _send(mudvm, B, probe, {"t": "unpublish", "keys": None, "requestor": [ns, 0]})
    assert r["status"] == 0, r  # allowed -- but ownership still decides what goes
    assert "FOUND mine 1 " in mudvm.run(A, "lookup", "mine").stdout


def test_root_may_relay_for_any_user(mudvm, users, probe):
    """Root's claims are honoured: it reads A's item as A, and removes it as A."""
    assert mudvm.run(A, "publish", "forroot=a", "--persistence", "session").returncode == 0
    claim = {"req_uid": users[A], "req_gid": _gid(A)}
    r = _send(mudvm, None, probe, {"t": "lookup", "keys": ["forroot"], "range": 4, **claim})
    assert r["status"] == 0 and r["found"][0][1] == "a", r
    r = _send(mudvm, None, probe, {"t": "unpublish", "keys": ["forroot"], **claim})
    assert r["status"] == 0, r
    assert "STATUS PMIX_ERR_NOT_FOUND" in mudvm.run(A, "lookup", "forroot").stdout


def test_a_users_own_relay_dvm_speaks_for_that_users_processes(mudvm, users):
    """A single-user DVM of A relaying to the multi-user DVM (over its tool socket):
    A's relayed job publishes under A's uid, A's job on the shared DVM finds it,
    and the relay's job end purges only that job's items."""
    state = Path(tempfile.mkdtemp(prefix="pydvm-a-state-"))  # /tmp/pytest-of-root is 0700
    os.chown(state, users[A], _gid(A))
    bindir = str(Path(mudvm.python).parent)
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": "/tmp", "PYDVM_STATE_DIR": str(state)}
    envs = [f"{k}={v}" for k, v in env.items()]
    run_a = [RUNUSER, "-u", A, "--", "env", *envs, mudvm.python, "-m", "pydvm"]
    p = subprocess.run(run_a + ["start", "--daemonize", "--hosts", "r1",
                                "--data-server-uri", mudvm.uri],
                       capture_output=True, text=True, timeout=60, cwd="/tmp")
    assert p.returncode == 0, p.stderr
    relay_uri = p.stdout.strip()
    try:
        q = subprocess.run(run_a + ["run", "--dvm", relay_uri, "-n", "1", "pydvm", "publish",
                                    "viarelay=1", "--persistence", "session"],
                           capture_output=True, text=True, timeout=60, cwd="/tmp")
        assert q.returncode == 0 and "STATUS PMIX_SUCCESS" in q.stdout, q.stdout + q.stderr
        r = mudvm.run(A, "lookup", "viarelay")
        assert "FOUND viarelay 1 from pydvm-" in r.stdout, r.stdout + r.stderr
        assert str(users[A]) in mudvm.store()["master"]["bytes_by_uid"]
        assert "STATUS PMIX_ERR_NO_PERMISSIONS" in mudvm.run(B, "lookup", "viarelay").stdout
    finally:
        subprocess.run(run_a + ["stop", "--dvm", relay_uri], capture_output=True, timeout=60,
                       cwd="/tmp")
        shutil.rmtree(state, ignore_errors=True)


def _jobs(mudvm) -> list:
    code = ("import asyncio, json; from pydvm.cli.tool import call, resolve_uri;"
            "print(json.dumps(asyncio.run(call(resolve_uri(None), {'t': 'info'}))['jobs']))")
    q = subprocess.run([mudvm.python, "-c", code], capture_output=True, text=True, timeout=30,
                       env={**mudvm.root_env, "PYDVM_URI": mudvm.uri}, cwd="/tmp")
    return json.loads(q.stdout) if q.returncode == 0 else []
