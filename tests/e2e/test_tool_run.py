"""The blocking ``pydvm run`` (pydvm/cli/submit.py) against real DVMs.

What it loads, the master's side of its pipelined handshake (a ``run``
sent behind the ``auth`` answer runs only if the auth is accepted),
signals, a master that goes away mid-job, and peers that are not masters.
Output, stdin, ``| head``, stale URIs and the multi-user tool socket are
covered where they were before (test_job_io.py, test_jobs.py,
test_finding_dvms.py, tests/multiuser/).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from dvmkit import CMD_TIMEOUT, PYDVM, LineReader, finish, pid_alive, start_dvm, wait_for
from rawpeers import master_peer

from pydvm.protocol import mac, pack

#: What a persistent DVM's ``pydvm run`` and the in-job commands must not load.
NOT_ON_THE_FAST_PATH = ("asyncio", "argparse", "pydvm.store", "pydvm.runtime", "uvloop")


def _env(dvm) -> dict[str, str]:
    return dict(dvm.env, PYDVM_URI=dvm.uri)


def _slow_imports(stderr: str) -> list[str]:
    mods = [ln.split("|")[-1].strip() for ln in stderr.splitlines()
            if ln.startswith("import time:") and "|" in ln]
    assert "pydvm.cli.submit" in mods or "pydvm.cli.injob" in mods, stderr[-2000:]
    return [m for m in mods if m in NOT_ON_THE_FAST_PATH or m.startswith(
        tuple(p + "." for p in NOT_ON_THE_FAST_PATH))]


def test_run_and_the_in_job_commands_load_neither_asyncio_argparse_store_nor_runtime(
        dvm, tmp_path):
    """``python -X importtime`` of ``pydvm run`` (through ``-m pydvm`` and the
    console script) and, inside its job, of publish, lookup and unpublish."""
    py = sys.executable
    script = shutil.which("pydvm", path=os.path.dirname(py)) or shutil.which("pydvm")
    assert script
    inner = " && ".join(
        f"{py} -X importtime -m pydvm {cmd} 2>{name}.imports >{name}.out"
        for name, cmd in (("publish", "publish k=v"), ("lookup", "lookup --wait k"),
                          ("unpublish", "unpublish k")))
    for launcher in ([py, "-X", "importtime", "-m", "pydvm"], [py, "-X", "importtime", script]):
        p = subprocess.run([*launcher, "run", "-n", "1", "sh", "-c", inner], env=_env(dvm),
                           cwd=tmp_path, capture_output=True, text=True, timeout=CMD_TIMEOUT,
                           stdin=subprocess.DEVNULL)
        assert p.returncode == 0, p.stderr[-3000:]
        assert _slow_imports(p.stderr) == [], launcher
        for name in ("publish", "lookup", "unpublish"):
            out = (tmp_path / f"{name}.out").read_text()
            assert out.splitlines()[-1] == "STATUS PMIX_SUCCESS", (name, out)
            assert _slow_imports((tmp_path / f"{name}.imports").read_text()) == [], name
        assert "FOUND k v from " in (tmp_path / "lookup.out").read_text()


def test_sigterm_to_run_kills_the_job_and_exits_143(dvm):
    """SIGTERM, like Ctrl-C, is passed on as a kill of the job; run waits for
    its end (1 s at most) and exits 128 + 15, quietly (it was asked to) --
    or, on a machine so loaded the end takes longer, with the one line
    saying it did not wait."""
    bg = dvm.run_bg("--host", "b", "-n", "1", sys.executable, "-c",
                    "import os, time; print('PID', os.getpid(), flush=True); time.sleep(120)")
    out = LineReader(bg.stdout)
    try:
        pid = int(out.wait_line("PID ", timeout=30).split()[1])
        os.kill(bg.pid, signal.SIGTERM)
        rc = finish(bg, 30)
    finally:
        if bg.poll() is None:
            bg.kill()
            bg.wait(10)
    err = bg.stderr.read()
    assert rc == 143, (rc, err)
    assert err == "" or err.startswith("pydvm run: SIGTERM: ") and err.count("\n") == 1, err
    wait_for(lambda: not pid_alive(pid), timeout=15, what=f"job process {pid} to be gone")


def test_a_signal_while_output_streams_ends_the_job_and_run_promptly(dvm):
    """A job writing without pause: the signal is seen between messages, not
    after the output stops (it never does)."""
    bg = dvm.run_bg("--host", "a", "-n", "1", "yes")
    out = LineReader(bg.stdout)
    try:
        out.wait_line("y", timeout=30)
        t0 = time.monotonic()
        os.kill(bg.pid, signal.SIGINT)
        rc = finish(bg, 30)
        took = time.monotonic() - t0
    finally:
        if bg.poll() is None:
            bg.kill()
            bg.wait(10)
    assert rc == 130, bg.stderr.read()
    assert took < 15, took


@pytest.mark.parametrize("node", ["a", "b"], ids=["head", "daemon"])
def test_what_a_signalled_run_still_writes_is_about_the_output_window(dvm, node):
    """`pydvm run yes` whose reader pauses, then SIGINT: what comes out after
    the signal is what was in flight -- the node's output window (1 MiB) and
    a little in the kernels, not the 4-5 MiB TCP let the master's send
    buffer grow to for a slow reader (which a loaded machine's reader then
    took 15 s to get through)."""
    bg = dvm.run_bg("--host", node, "-n", "1", "yes")
    try:
        assert bg.stdout.readline() == "y\n"
        time.sleep(1.0)  # not reading: everything in flight piles up
        os.kill(bg.pid, signal.SIGINT)
        after = 0
        while True:
            chunk = os.read(bg.stdout.fileno(), 1 << 16)
            if not chunk:
                break
            after += len(chunk)
        rc = finish(bg, 30)
    finally:
        if bg.poll() is None:
            bg.kill()
            bg.wait(10)
    assert rc == 130, bg.stderr.read()
    assert after < 2.5 * 1024 * 1024, f"{after / 2**20:.1f} MiB after the signal"


def test_a_run_pipelined_behind_its_auth_runs_and_one_behind_a_refused_auth_never(
        dvm, tmp_path):
    """What the blocking tool relies on: the master reads a connection's
    messages in order, so ``auth`` + ``run`` in one write runs the job once
    the auth is accepted -- and a refused auth closes the connection before
    the ``run`` behind it is looked at."""
    marker = tmp_path / "ran"

    def run_msg(rid: int) -> dict:
        return {"t": "run", "id": rid, "apps": [{"argv": ["sh", "-c", f"echo ran >> {marker}"],
                                                 "n": 1, "hosts": None}],
                "session": None, "env": dict(os.environ), "cwd": str(tmp_path),
                "stdin": False}

    peer, challenge = master_peer(dvm)
    bad = mac(b"\0" * 32, challenge["nonce"], "tool")
    peer.send_raw(pack({"t": "auth", "id": 1, "role": "tool", "mac": bad}) + pack(run_msg(2)))
    got = peer.expect_closed()
    assert [(m["t"], m.get("id")) for m in got] == [("reply", 1)], got
    assert got[0]["status"] != 0 and "bad credentials" in got[0]["msg"], got
    peer.close()

    peer, challenge = master_peer(dvm)
    good = mac(dvm.secret(), challenge["nonce"], "tool")
    peer.send_raw(pack({"t": "auth", "id": 1, "role": "tool", "mac": good}) + pack(run_msg(2)))
    welcome = peer.recv()
    assert (welcome["t"], welcome["id"], welcome["status"]) == ("reply", 1, 0), welcome
    while True:
        m = peer.recv(timeout=CMD_TIMEOUT)
        if m["t"] == "reply":
            break
    assert m["id"] == 2 and m["status"] == 0 and m["exit"] == 0, m
    peer.close()
    # Only the accepted run ran (and nothing of the refused one is pending).
    assert marker.read_text() == "ran\n"
    assert dvm.cmd("ps", "--json", check=True).stdout.strip() == '{"jobs": []}'


def test_a_master_that_dies_mid_job_ends_run_with_a_clear_error(tmp_path):
    dvm = start_dvm(tmp_path, "a")
    bg = dvm.run_bg("-n", "1", "sh", "-c", "echo STARTED; sleep 300")
    out = LineReader(bg.stdout)
    try:
        out.wait_line("STARTED", timeout=30)
        os.kill(dvm.pid, signal.SIGKILL)
        rc = finish(bg, 30)
    finally:
        if bg.poll() is None:
            bg.kill()
            bg.wait(10)
        dvm.stop()
    err = bg.stderr.read()
    assert rc == 1, err
    assert err.startswith("pydvm run: PMIX_ERR_UNREACH: connection to master ") and \
        " lost: " in err, err


class _FakeMaster:
    """A TCP server on loopback that is not a DVM's master: it greets each
    connection with ``challenge`` (None: says nothing) and reads what comes."""

    def __init__(self, challenge: dict | None) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.challenge = challenge
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            if self.challenge is not None:
                conn.sendall(pack(self.challenge))

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


def _run_against(fake: _FakeMaster, dvmid: str, tmp_path) -> tuple[subprocess.CompletedProcess,
                                                                   float]:
    """``pydvm run -n 1 true`` against ``fake`` (closed afterwards): its
    result and how long it took."""
    try:
        return _run_once(fake, dvmid, tmp_path)
    finally:
        fake.close()


def _run_once(fake: _FakeMaster, dvmid: str, tmp_path) -> tuple[subprocess.CompletedProcess,
                                                                float]:
    state = tmp_path / "state"
    state.mkdir(mode=0o700, exist_ok=True)
    (state / f"{dvmid}.secret").write_text("00" * 32)
    env = dict(os.environ, PYDVM_STATE_DIR=str(state))
    env.pop("PYDVM_URI", None)
    t0 = time.monotonic()
    p = subprocess.run(PYDVM + ["run", "--dvm", f"tcp://127.0.0.1:{fake.port}/{dvmid}", "-n",
                                "1", "true"], env=env, capture_output=True, text=True,
                       timeout=CMD_TIMEOUT, stdin=subprocess.DEVNULL)
    return p, time.monotonic() - t0


def test_a_peer_that_is_another_dvm_is_refused_before_anything_is_sent(tmp_path):
    fake = _FakeMaster({"t": "challenge", "nonce": b"n" * 32, "dvm": "other"})
    p, _ = _run_against(fake, "mine", tmp_path)
    assert p.returncode == 1, p
    assert p.stderr.startswith(f"pydvm: --dvm tcp://127.0.0.1:{fake.port}/mine: ") and \
        f"127.0.0.1:{fake.port} is DVM other, not mine" in p.stderr, p.stderr


def test_a_peer_that_never_greets_gets_up_to_the_handshake_timeout(tmp_path):
    """Nobody hangs: a listener that never sends a challenge is given up on
    after the handshake timeout (10 s), with the reason."""
    fake = _FakeMaster(None)
    p, took = _run_against(fake, "mine", tmp_path)
    assert p.returncode == 1, p
    assert "no challenge within 10s" in p.stderr, p.stderr
    assert 9 < took < 30, took


def test_a_peer_that_greets_but_never_welcomes_gets_up_to_the_handshake_timeout(tmp_path):
    # a challenge signed with the secret the tool holds (_run_once's: zeros)
    from pydvm.seal import challenge_sig
    fake = _FakeMaster({"t": "challenge", "nonce": b"n" * 32, "dvm": "mine", "seal": False,
                        "sig": challenge_sig(bytes(32), "mine", b"n" * 32, False, b"")})
    p, took = _run_against(fake, "mine", tmp_path)
    assert p.returncode == 1, p
    assert "master refused the connection: no reply from master 127.0.0.1:" in p.stderr, \
        p.stderr
    assert 9 < took < 30, took


def test_a_challenge_not_signed_with_the_secret_is_refused_before_anything_is_sent(tmp_path):
    """Not this DVM's master (or a challenge changed on the way): the tool
    says nothing -- not even its MAC -- and names why."""
    fake = _FakeMaster({"t": "challenge", "nonce": b"n" * 32, "dvm": "mine"})
    try:
        p, took = _run_once(fake, "mine", tmp_path)
        conn = fake.conns[0]
        conn.settimeout(5)
        sent = conn.recv(1 << 16)
    finally:
        fake.close()
    assert p.returncode == 1, p
    assert "challenge is not signed with DVM mine's secret" in p.stderr, p.stderr
    assert took < 9, took
    assert sent == b""  # it closed without a word


def test_ctrl_c_while_waiting_for_the_master_ends_run_at_once_submitting_nothing(tmp_path):
    """A signal before anything was submitted: nothing to kill, nothing to wait for."""
    fake = _FakeMaster(None)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "mine.secret").write_text("00" * 32)
    env = dict(os.environ, PYDVM_STATE_DIR=str(state))
    env.pop("PYDVM_URI", None)
    p = subprocess.Popen(PYDVM + ["run", "--dvm", f"tcp://127.0.0.1:{fake.port}/mine", "true"],
                         env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: fake.conns, timeout=30, what="pydvm run to connect")
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        rc = finish(p, 30)
        took = time.monotonic() - t0
        conn = fake.conns[0]
        conn.settimeout(5)
        sent = conn.recv(1 << 16)  # it closed without sending anything
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
        fake.close()
    assert rc == 130 and p.stderr.read() == "", rc
    assert took < 5, took
    assert sent == b""
