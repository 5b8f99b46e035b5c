"""Links a network attacker can neither read nor forge (issue 43).

A DVM's node ``seal-a`` reaches the master only through the attacker's host
``seal-x`` (attacknet.py): a user-space relay that records every byte and
can flip, drop, replay, inject or cut frames of any of ``seal-a``'s
connections -- its daemon's, its tools', its jobs' direct data.  Node
``seal-b`` is on the bridge, out of the attacker's reach: the DVM's other
half, which must go on whatever is done to ``seal-a``.

Where the attack must fail on a sealed link, the same attack is also run
against ``pydvm_seal off`` when it can succeed there: the capture holds the
secrets, the injected ``run`` starts its job.  That the harness can do the
harm is what gives the sealed results their meaning.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

import dvmkit
from attacknet import (ATTACKER_ADDR, DOWN, MASTER_ADDR, UP, VICTIM, AttackNet, Mitm, Rule)
from dvmkit import LineReader, finish, wait_for
from hostnet import unavailable_reason

from pydvm.protocol import pack
from pydvm.seal import Offer

_REASON = unavailable_reason()
HB = "0.5"


@pytest.fixture
def attacknet():
    if _REASON:
        pytest.skip(f"the attacker's hosts need network namespaces: {_REASON}")
    with AttackNet() as net:
        yield net


@contextmanager
def dvm_behind_attacker(tmp: Path, net: AttackNet, mode: str = "network", **mca):
    """A DVM on seal-a (behind the attacker) and seal-b; its master on the
    bridge; (the DVM, the relay)."""
    port = net.free_port()
    mitm = Mitm(port).start()
    dvm = None
    try:
        dvm = dvmkit.start_dvm(
            tmp, f"{VICTIM},seal-b",
            {"plm_ssh_agent": "ip netns exec", "pydvm_heartbeat_interval": HB,
             "pydvm_seal": mode, **mca},
            extra=["--launcher", "ssh", "--bind", MASTER_ADDR, "--port", str(port)])
        yield dvm, mitm
    finally:
        if dvm is not None:
            dvm.stop()
        mitm.stop()


def victim_argv(*args: str) -> list[str]:
    return ["ip", "netns", "exec", VICTIM, sys.executable, "-m", "pydvm", *args]


def victim_env(dvm: dvmkit.Dvm, **extra: str) -> dict:
    return {**dvm.env, "PYDVM_URI": dvm.uri, **extra}


def in_victim(dvm: dvmkit.Dvm, *args: str, timeout: float = 60,
              **env: str) -> subprocess.CompletedProcess:
    """``pydvm ARGS...`` run on seal-a: its connection crosses the attacker."""
    return subprocess.run(victim_argv(*args), env=victim_env(dvm, **env), capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def info(dvm: dvmkit.Dvm) -> dict:
    code = ("import asyncio, json;from pydvm.cli.tool import call, resolve_uri;"
            "r = asyncio.run(call(resolve_uri(None), {'t': 'info'}));"
            "print(json.dumps({'seal': r['seal'], 'nodes': r['nodes'], 'direct': r['direct']}))")
    p = subprocess.run([sys.executable, "-c", code], env=victim_env(dvm), capture_output=True,
                       text=True, timeout=60, check=True)
    return json.loads(p.stdout)


def node_state(dvm: dvmkit.Dvm, name: str) -> str:
    return next((state for node, _, state in info(dvm)["nodes"] if node == name), "?")


def log_lines(dvm: dvmkit.Dvm, who: str, needle: str) -> list[str]:
    return [ln for ln in dvm.log(who).splitlines() if needle in ln]


def b_still_serves(dvm: dvmkit.Dvm) -> None:
    p = dvm.run("--host", "seal-b", "-n", "1", "echo", "b-ok")
    assert p.returncode == 0 and "b-ok" in p.stdout, p.stdout + p.stderr


# ---------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["network", "off"])
def test_a_jobs_secret_and_a_restricted_value_never_cross_the_wire_readable(
        tmp_path, attacknet, mode):
    """Sealed, the capture of everything seal-a said and heard holds neither
    a job's ``-x SECRET=...`` nor a value published with ``--access-uid``;
    with ``pydvm_seal off`` it holds both (the capture works)."""
    env_secret = "envsecret-" + secrets.token_hex(12)
    value = "storevalue-" + secrets.token_hex(12)
    with dvm_behind_attacker(tmp_path, attacknet, mode) as (dvm, mitm):
        p = in_victim(dvm, "run", "--host", VICTIM, "-n", "1", "-x", f"SECRET={env_secret}",
                      "sh", "-c", 'test "${#SECRET}" = 34 && echo HAS_SECRET')
        assert p.returncode == 0 and "HAS_SECRET" in p.stdout, p.stdout + p.stderr
        p = in_victim(dvm, "run", "--host", VICTIM, "-n", "1", "sh", "-c",
                      f"pydvm publish k43={value} --access-uid 0 --persistence session && "
                      "pydvm lookup k43")
        assert p.returncode == 0 and value in p.stdout, p.stdout + p.stderr
        roles = {c.role for c in mitm.conns}
        assert {"daemon", "tool", "client"} <= roles, roles  # every kind of link crossed
        seal = info(dvm)["seal"]
        capture = mitm.capture()
    assert len(capture) > 5_000
    if mode == "off":
        assert env_secret.encode() in capture and value.encode() in capture
        assert seal["sealed_open"] == 0
        return
    assert env_secret.encode() not in capture
    assert value.encode() not in capture
    assert b"k43" not in capture and b"SECRET" not in capture
    assert seal["mode"] == "network" and seal["clear_tcp_open"] == 0 and seal["broken"] == 0
    assert seal["sealed_open"] >= 2  # both daemons (the tools have left)


# ---------------------------------------------------------------------------
# the daemon's link: changed, dropped, replayed, cut or spliced frames
# ---------------------------------------------------------------------------

#: (action, direction, what the side that detects it logs)
TAMPERING = [
    ("flip", DOWN, "does not open"),
    ("flip", UP, "does not open"),
    ("drop", DOWN, "does not open"),
    ("replay", DOWN, "does not open"),
    ("insert", DOWN, "does not open"),
    ("cut", DOWN, "ended inside a frame"),
]


@pytest.mark.parametrize("action,direction,said", TAMPERING,
                         ids=[f"{a}-{d}" for a, d, _ in TAMPERING])
def test_a_tampered_daemon_frame_closes_that_link_and_starts_nothing(
        tmp_path, attacknet, action, direction, said):
    """The launch of a job to seal-a (or, the other way, whatever seal-a's
    daemon says next) is tampered with: the side that reads it closes the
    link with one log line naming its peer; the job does not run (a replayed
    launch: at most once); seal-a is handled as a lost node; seal-b goes on."""
    marker = tmp_path / "marker"
    with dvm_behind_attacker(tmp_path, attacknet) as (dvm, mitm):
        port = dvm.uri.rsplit(":", 1)[1].split("/")[0]
        data = b""
        if action == "insert":  # a clear launch of another command, as a forger would send
            data = pack({"t": "kill", "nspace": "*"})
        rule = mitm.arm(Rule(action, direction, role="daemon",
                             min_size=1000 if direction == DOWN else 0, data=data))
        if direction == DOWN:
            p = dvm.run("--host", VICTIM, "-n", "1", "sh", "-c", f"echo ran >> {marker}",
                        timeout=90)
            assert p.returncode != 0, p.stdout + p.stderr
        assert rule.fired.wait(30), "the relay never saw the frame to tamper with"
        wait_for(lambda: node_state(dvm, VICTIM) == "lost", timeout=30,
                 what="seal-a to be declared lost")
        ran = marker.read_text().splitlines() if marker.exists() else []
        assert len(ran) <= (1 if action == "replay" else 0), ran
        # one line where the link is closed (the loss it causes is told apart)
        if direction == DOWN:  # the daemon read it: its line names the master
            lines = log_lines(dvm, VICTIM, ": closed: ")
            assert len(lines) == 1, dvm.log(VICTIM)
            assert f"master {MASTER_ADDR}:{port}: closed:" in lines[0] and said in lines[0], lines
        else:  # the master read it: its line names the daemon and the address
            lines = log_lines(dvm, "master", ": closed: ")
            assert len(lines) == 1, dvm.log("master")
            assert f"daemon {VICTIM}: closed: sealed link broken from {ATTACKER_ADDR}:" \
                in lines[0] and said in lines[0], lines
        b_still_serves(dvm)
        if action != "cut":
            assert info(dvm)["seal"]["broken"] == (1 if direction == UP else 0)


# ---------------------------------------------------------------------------
# a tool's link: an injected run, a replayed run
# ---------------------------------------------------------------------------


def forged_run(path: Path) -> bytes:
    """A clear ``run`` frame of the attacker's command: it writes ``path``."""
    return pack({"t": "run", "id": 4242, "session": None, "abort_on_failure": None,
                 "apps": [{"argv": ["sh", "-c", f"echo pwned > {path}"], "n": 1,
                           "hosts": [["seal-b", 0]]}],
                 "env": {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, "cwd": "/",
                 "pmix": False, "stdin": False})


@pytest.mark.parametrize("mode", ["network", "off"])
def test_a_run_injected_into_a_tools_link_closes_it_and_starts_nothing(
        tmp_path, attacknet, mode):
    """While ``pydvm run`` on seal-a waits for its job, the attacker splices a
    ``run`` of its own into that authenticated stream.  Sealed: the master
    closes that tool's link with one line naming it, the forged job never
    runs, the DVM serves on.  Clear (``pydvm_seal off``): the master runs it
    as the DVM's owner -- the attack the seal stops."""
    pwned = tmp_path / "pwned"
    with dvm_behind_attacker(tmp_path, attacknet, mode) as (dvm, mitm):
        tool = subprocess.Popen(victim_argv("run", "--host", "seal-b", "-n", "1", "sh", "-c",
                                            "echo UP; exec sleep 30"),
                                env=victim_env(dvm), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
        try:
            LineReader(tool.stdout).wait_line("UP", timeout=60)
            (conn,) = [c for c in mitm.by_role("tool") if not c.closed.is_set()][-1:]
            mitm.inject(conn, UP, forged_run(pwned))
            if mode == "off":
                wait_for(pwned.exists, timeout=30, what="the forged job to run")
                return
            assert finish(tool, timeout=30) != 0
            lines = log_lines(dvm, "master", "sealed link broken")
            assert len(lines) == 1 and f"from {ATTACKER_ADDR}:" in lines[0], dvm.log("master")
            assert ": closed: " in lines[0] and "tool#" in lines[0]
            time.sleep(2)
            assert not pwned.exists()
            assert "4242" not in dvm.cmd("ps").stdout
            p = in_victim(dvm, "run", "--host", VICTIM, "-n", "1", "echo", "a-ok")
            assert p.returncode == 0 and "a-ok" in p.stdout, p.stderr
        finally:
            if tool.poll() is None:
                tool.kill()
                tool.communicate(timeout=10)


def test_a_replayed_run_is_refused_and_its_job_runs_at_most_once(tmp_path, attacknet):
    marker = tmp_path / "ran"
    with dvm_behind_attacker(tmp_path, attacknet) as (dvm, mitm):
        rule = mitm.arm(Rule("replay", UP, role="tool", min_size=1000))
        p = in_victim(dvm, "run", "--host", "seal-b", "-n", "1", "sh", "-c",
                      f"echo ran >> {marker}")
        assert rule.fired.is_set()
        assert p.returncode != 0, p.stdout + p.stderr
        lines = log_lines(dvm, "master", "sealed link broken")
        assert len(lines) == 1 and "does not open" in lines[0], dvm.log("master")
        time.sleep(1)
        assert len(marker.read_text().splitlines() if marker.exists() else []) <= 1
        b_still_serves(dvm)
        assert node_state(dvm, VICTIM) == "up"


# ---------------------------------------------------------------------------
# without the secret
# ---------------------------------------------------------------------------

#: An attacker's client: it skips every check a genuine peer makes and
#: seals with a key of its own (it has no secret), as ROLE, then says
#: whatever it likes.  Prints what the master answered, or how it ended.
ROGUE = r"""
import os, socket, sys
from pydvm.protocol import FrameDecoder, DvmUri, pack, packb
from pydvm.seal import Answer
uri, role, how = DvmUri.parse(sys.argv[1]), sys.argv[2], sys.argv[3]
s = socket.create_connection((uri.host, uri.port), timeout=10)
dec = FrameDecoder()
def recv():
    while True:
        data = s.recv(65536)
        if not data:
            return "EOF"
        got = dec.feed(data)
        if got:
            return got[0]
challenge = recv()
auth = {"t": "auth", "id": 1, "role": role, "mac": os.urandom(32), "node": "seal-c"}
if how == "clear":
    s.sendall(pack(auth))
else:
    a = Answer(challenge, dvm=uri.dvmid, role=role, secret=None)
    s.sendall(pack(a.message))
    box = a.box(os.urandom(32))
    s.sendall(box.sealer.frame(packb(auth)))
    dec.open_with(box.opener.open, 16)
try:
    print("ANSWER", recv())
except Exception as exc:
    print("ANSWER", type(exc).__name__, exc)
"""


@pytest.mark.parametrize("role,how", [("daemon", "sealed"), ("tool", "sealed"),
                                      ("daemon", "clear")])
def test_without_the_secret_nobody_joins(tmp_path, attacknet, role, how):
    with dvm_behind_attacker(tmp_path, attacknet) as (dvm, mitm):
        p = subprocess.run(["ip", "netns", "exec", VICTIM, sys.executable, "-c", ROGUE,
                            dvm.uri, role, how], env=victim_env(dvm), capture_output=True,
                           text=True, timeout=60)
        assert "ANSWER" in p.stdout, p.stderr
        # nothing it could read: the master's refusal, clear, or the link closed
        assert "'status': 0" not in p.stdout, p.stdout
        want = "does not open" if how == "sealed" else "must be sealed"
        lines = log_lines(dvm, "master", want)
        assert len(lines) == 1 and f"{ATTACKER_ADDR}" in lines[0], dvm.log("master")
        if how == "sealed":
            assert "lacks the key" in lines[0]
        assert sorted(n[0] for n in info(dvm)["nodes"]) == ["seal-a", "seal-b"]
        assert node_state(dvm, VICTIM) == "up"


def test_a_master_without_the_secret_is_not_spoken_to(tmp_path, attacknet):
    """The attacker answers seal-a's connections itself, with a challenge of
    its own making: the tool refuses it and says nothing -- not even its
    handshake's MAC."""
    with dvm_behind_attacker(tmp_path, attacknet) as (dvm, mitm):
        dvmid = dvm.uri.rsplit("/", 1)[1]
        mitm.impersonate = lambda conn: pack(Offer(dvmid, os.urandom(32), True).challenge)
        p = in_victim(dvm, "ps", timeout=60)
        assert p.returncode != 0
        assert f"not signed with DVM {dvmid}'s secret" in p.stderr, p.stderr
        posed = [c for c in mitm.conns if c.master is None]
        assert posed and all(not c.halves[UP].raw for c in posed)


def test_a_challenge_stripped_of_its_seal_is_refused_before_anything_is_said(
        tmp_path, attacknet):
    """The attacker rewrites the master's challenge to offer a clear link (a
    downgrade): the signature no longer matches, the tool refuses and sends
    nothing, so nothing of it is ever in clear."""
    with dvm_behind_attacker(tmp_path, attacknet) as (dvm, mitm):
        def strip(msg: dict) -> dict:
            msg = dict(msg)
            msg["seal"] = False
            msg.pop("kx", None)
            return msg

        mitm.rewrite_challenge = strip
        before = len(mitm.conns)
        p = in_victim(dvm, "ps", timeout=60)
        assert p.returncode != 0 and "not signed" in p.stderr, p.stderr
        tried = mitm.conns[before:]
        assert tried and all(not c.halves[UP].raw for c in tried)
        mitm.rewrite_challenge = None
        assert in_victim(dvm, "ps").returncode == 0
