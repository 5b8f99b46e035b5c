"""Where a DVM's logs go, and what a failed start-up says (issue 11, "Logs").

A ``--daemonize``'d DVM has no terminal: without ``--log-dir`` it logs --
master and every daemon -- to its own directory, which ``pydvm info``
names.  A daemon that dies before reporting in has its standard error quoted
in ``pydvm start``'s error, daemonized or not.  (The same for a daemon that
srun could not start: tests/slurm/test_pydvm_slurm.py.)
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import textwrap

import pytest

from dvmkit import PYDVM, Dvm, _pids_from_info

pytestmark = pytest.mark.e2e


def _env(tmp_path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PYDVM_URI"))}
    env["PYDVM_STATE_DIR"] = str(tmp_path / "state")
    return env


def _start(env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(PYDVM + ["start", *args], env=env, capture_output=True, text=True,
                          timeout=60)


def test_a_daemonized_dvm_logs_to_its_own_directory_and_info_names_it(tmp_path):
    env = _env(tmp_path)
    p = _start(env, "--daemonize", "--hosts", "a,b", "--dvm-id", "logtest")
    assert p.returncode == 0, p.stderr
    dvm = Dvm(p.stdout.strip(), env, tmp_path / "state" / "logs" / "logtest")
    try:
        dvm.pid, dvm.daemon_pids = _pids_from_info(dvm)
        info = dvm.cmd("info", check=True).stdout
        assert f"logs in {dvm.log_dir}\n" in info, info
        assert "launcher local, nodes from --hosts" in info, info
        assert stat.S_IMODE(dvm.log_dir.stat().st_mode) == 0o700
        assert {"master.log", "a.log", "b.log"} <= {f.name for f in dvm.log_dir.iterdir()}
        # jobs still run as before: their output goes to pydvm run, not to the logs
        r = dvm.run("--host", "b", "-n", "1", "sh", "-c", "echo out; echo err >&2")
        assert r.returncode == 0 and r.stdout == "out\n"
    finally:
        dvm.stop()


def test_a_foreground_dvm_without_log_dir_logs_to_stderr_and_info_says_so(tmp_path):
    env = _env(tmp_path)
    p = subprocess.Popen(PYDVM + ["start", "--hosts", "a"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        uri = p.stdout.readline().strip()
        dvm = Dvm(uri, env, tmp_path)
        info = dvm.cmd("info", check=True).stdout
        assert "logs: the master's standard error" in info, info
        assert not (tmp_path / "state" / "logs").exists()
        # (stop waits for the master's pid to go, which as our child it does only
        # once we have reaped it: stop in the background, reap, then collect stop)
        stop = subprocess.Popen(PYDVM + ["stop", "--dvm", uri], env=env)
        assert p.wait(timeout=30) == 0
        assert stop.wait(timeout=30) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def _script(tmp_path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize("daemonize", [False, True], ids=["foreground", "daemonize"])
def test_a_daemon_that_fails_before_reporting_in_shows_its_stderr(tmp_path, daemonize):
    """An ssh that cannot connect, an agent that fails silently, a remote Python that
    is not there: each start fails naming the node, with the daemon's last stderr lines."""
    env = _env(tmp_path)
    flags = ["--daemonize"] if daemonize else []
    refused = _script(tmp_path, "refused", """\
        echo "ssh: connect to host $1 port 22: Connection refused" >&2
        exit 255
        """)
    p = _start(env, *flags, "--launcher", "ssh", "--hosts", "n1",
               "--mca", "plm_ssh_agent", refused)
    assert p.returncode == 1
    assert "cannot start the DVM: the daemon for n1 exited with status 255 before reporting " \
           "in" in p.stderr, p.stderr
    assert "  ssh: connect to host n1 port 22: Connection refused" in p.stderr, p.stderr

    p = _start(env, *flags, "--launcher", "ssh", "--hosts", "n1", "--mca", "plm_ssh_agent",
               "false")
    assert p.returncode == 1
    assert "the daemon for n1 exited with status 1 before reporting in; it wrote nothing " \
           "on its standard error" in p.stderr, p.stderr

    hop = _script(tmp_path, "hop", 'shift\nexec "$@"\n')  # runs the command "on" the host
    p = _start(env, *flags, "--launcher", "ssh", "--hosts", "n1", "--mca", "plm_ssh_agent", hop,
               "--mca", "pydvm_remote_python", "/nonexistent/python3")
    assert p.returncode == 1
    assert "the daemon for n1 exited with status 127 before reporting in" in p.stderr, p.stderr
    assert "/nonexistent/python3" in p.stderr.split("standard error ended with:")[1], p.stderr

    # nothing left running: every record in the state directory is a dead DVM's
    left = [json.loads(f.read_text()) for f in (tmp_path / "state").glob("*.json")]
    assert all(not os.path.exists(f"/proc/{r['pid']}") for r in left), left
