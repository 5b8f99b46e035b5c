"""Helpers for end-to-end tests: real DVMs, real daemons, real job processes.

Every subprocess is bounded by a timeout; waiting is done by polling with a
deadline (:func:`wait_for`), never by a fixed sleep.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

PYDVM = [sys.executable, "-m", "pydvm"]
JOBS = Path(__file__).parent / "jobs"
#: Generous bound for any single pydvm command in tests.
CMD_TIMEOUT = 60


def wait_for(pred, timeout: float = 20.0, interval: float = 0.05, what: str = "condition"):
    """Poll ``pred()`` until it returns a truthy value; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is not alive for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def job_script(name: str) -> list[str]:
    """Command line running ``tests/e2e/jobs/<name>.py`` with this Python."""
    return [sys.executable, str(JOBS / f"{name}.py")]


@dataclass
class Dvm:
    uri: str
    env: dict[str, str]
    log_dir: Path
    pid: int = 0
    daemon_pids: dict[str, int] = field(default_factory=dict)

    def cmd(self, *args: str, timeout: float = CMD_TIMEOUT, check: bool = False,
            env: dict[str, str] | None = None,
            cwd: str | Path | None = None) -> subprocess.CompletedProcess:
        """Run ``pydvm ARGS...`` against this DVM (in ``cwd``) and capture its output."""
        e = dict(self.env)
        e["PYDVM_URI"] = self.uri
        if env:
            e.update(env)
        # stdin: /dev/null, not whatever the test runner has (`pydvm run` passes
        # its stdin to rank 0).
        p = subprocess.run(PYDVM + list(args), env=e, capture_output=True, text=True,
                           timeout=timeout, cwd=cwd, stdin=subprocess.DEVNULL)
        if check and p.returncode != 0:
            raise AssertionError(f"pydvm {' '.join(args)} exited {p.returncode}\n"
                                 f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}")
        return p

    def run(self, *args: str, **kw) -> subprocess.CompletedProcess:
        """``pydvm run ARGS...`` on this DVM."""
        return self.cmd("run", *args, **kw)

    def run_bg(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        e = dict(self.env)
        e["PYDVM_URI"] = self.uri
        if env:
            e.update(env)
        return subprocess.Popen(PYDVM + ["run", *args], env=e, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)

    def secret(self) -> bytes:
        """This DVM's secret, as its owner's tools read it from the state directory."""
        dvmid = self.uri.rsplit("/", 1)[1]
        return bytes.fromhex((Path(self.env["PYDVM_STATE_DIR"]) / f"{dvmid}.secret")
                             .read_text().strip())

    def store(self) -> dict:
        p = self.cmd("store", "--json", check=True)
        return {s["store"]: s for s in json.loads(p.stdout)["stores"]}

    def log(self, name: str) -> str:
        path = self.log_dir / f"{name}.log"
        return path.read_text() if path.exists() else ""

    def stop(self) -> None:
        try:
            self.cmd("stop", timeout=30)
        except subprocess.TimeoutExpired:
            pass
        pids = [self.pid, *self.daemon_pids.values()]
        try:
            wait_for(lambda: not any(pid_alive(p) for p in pids if p), timeout=20,
                     what="DVM processes to exit")
        finally:
            for p in pids:
                if p and pid_alive(p):
                    os.kill(p, signal.SIGKILL)

    def __enter__(self) -> Dvm:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_dvm(tmp: Path, hosts: str = "a,b,c", mca: dict[str, str] | None = None,
              extra: list[str] | None = None, state_dir: Path | None = None,
              preexec: Callable[[], None] | None = None) -> Dvm:
    """Start a persistent DVM with ``local`` daemons named by ``hosts``.

    ``state_dir`` (default ``tmp/state``) holds the DVM's credentials; DVMs
    that must reach each other (a relay and its data server) share one.
    ``preexec`` runs in the ``pydvm start`` process before it starts (e.g.
    lowering a resource limit, which the master and daemons inherit).

    The DVM owner's PMIx server processes (``pydvm_pmix_isolate``) are off
    unless ``mca`` asks for them: every node would start one, and most
    tests start many short-lived DVMs that are not about PMIx; the PMIx
    end-to-end tests (tests/pmix_e2e) run with the default.
    """
    mca = {"pydvm_pmix_isolate": "off", **(mca or {})}
    env = dict(os.environ)
    env["PYDVM_STATE_DIR"] = str(state_dir or tmp / "state")
    env.pop("PYDVM_URI", None)
    log_dir = tmp / "logs"
    args = PYDVM + ["start", "--daemonize", "--hosts", hosts, "--log-dir", str(log_dir),
                    "--uri-file", str(tmp / "uri")]
    for k, v in (mca or {}).items():
        args += ["--mca", k, str(v)]
    args += extra or []
    p = subprocess.run(args, env=env, capture_output=True, text=True, timeout=CMD_TIMEOUT,
                       preexec_fn=preexec)
    if p.returncode != 0:
        raise AssertionError(f"pydvm start failed ({p.returncode}): {p.stderr}")
    uri = p.stdout.strip().splitlines()[-1]
    dvm = Dvm(uri, env, log_dir)
    info = dvm.cmd("info", check=True)
    # The master's pid and its daemons', for a teardown that leaves nothing.
    dvm.pid, dvm.daemon_pids = _pids_from_info(dvm)
    assert info.stdout
    return dvm


@contextmanager
def dvm_factory(tmp: Path, start: Callable[..., Dvm]) -> Iterator[Callable[..., Dvm]]:
    """A fixture's DVM factory: ``make(*args, **kw)`` calls ``start(SUB, *args,
    **kw)`` with a fresh directory ``SUB`` under ``tmp``; every DVM made is
    stopped when the block ends."""
    made: list[Dvm] = []

    def make(*args, **kw) -> Dvm:
        sub = tmp / f"dvm{len(made)}"
        sub.mkdir()
        d = start(sub, *args, **kw)
        made.append(d)
        return d

    try:
        yield make
    finally:
        for d in made:
            d.stop()


def _pids_from_info(dvm: Dvm) -> tuple[int, dict[str, int]]:
    code = ("import asyncio, json, sys;"
            "from pydvm.cli.tool import call, resolve_uri;"
            "r = asyncio.run(call(resolve_uri(None), {'t': 'info'}));"
            "print(json.dumps([r['pid'], r['daemon_pids']]))")
    e = dict(dvm.env)
    e["PYDVM_URI"] = dvm.uri
    p = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                       timeout=CMD_TIMEOUT, check=True)
    pid, daemons = json.loads(p.stdout)
    return pid, daemons


def lines(p: subprocess.CompletedProcess, prefix: str) -> list[str]:
    return [ln for ln in p.stdout.splitlines() if ln.startswith(prefix)]


class LineReader:
    """Collects a text stream's lines on a thread, so a test can wait for a
    line of a still-running process with a deadline (never a blocking read)."""

    def __init__(self, stream) -> None:
        import threading

        self.lines: list[str] = []
        self.closed = False
        self._stream = stream
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for line in self._stream:
                with self._cv:
                    self.lines.append(line.rstrip("\n"))
                    self._cv.notify_all()
        finally:
            with self._cv:
                self.closed = True
                self._cv.notify_all()

    def wait_line(self, prefix: str, timeout: float = 20.0) -> str:
        """The first line starting with ``prefix``; fail after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                for ln in self.lines:
                    if ln.startswith(prefix):
                        return ln
                left = deadline - time.monotonic()
                if left <= 0 or self.closed:
                    raise AssertionError(f"no line starting with {prefix!r} within {timeout}s "
                                         f"(closed={self.closed}); got {self.lines!r}")
                self._cv.wait(left)

    def join(self, timeout: float = 20.0) -> list[str]:
        self._thread.join(timeout)
        return list(self.lines)


def finish(proc: subprocess.Popen, timeout: float = CMD_TIMEOUT) -> int:
    """Wait for a background process with a bound; kill it if it overstays."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
        raise AssertionError(f"process {proc.args!r} did not exit within {timeout}s") from None


def status(p: subprocess.CompletedProcess) -> str:
    """The ``STATUS <name>`` word of an in-job command's output (last one)."""
    got = lines(p, "STATUS ")
    assert got, f"no STATUS line in stdout {p.stdout!r} (stderr {p.stderr!r})"
    return got[-1].split()[1]
