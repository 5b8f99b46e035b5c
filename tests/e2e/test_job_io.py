"""A job's standard streams through `pydvm run`, on the head node and on a daemon node.

* stdout is a terminal in each rank (stderr a pipe), so C and Python write it
  line by line: a line printed just before ``abort()`` or ``pydvm kill`` is not
  lost in a stdio buffer, and a server that prints and waits is heard at once;
* a closed stdout (``| head -1``) ends the job at once;
* a stalled reader costs the master at most the output window, however short
  the job's lines;
* ``pydvm run``'s stdin goes to rank 0 (the others read /dev/null), with flow
  control and end of file.

Node ``a`` is the head node (served by the master process), ``b`` a daemon.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest

from dvmkit import PYDVM, CMD_TIMEOUT, LineReader, finish, start_dvm, wait_for

pytestmark = pytest.mark.e2e

NODES = {"head": "a", "daemon": "b"}
MiB = 1024 * 1024
#: pydvm_output_window's default: what one job's output may hold in the master per node.
WINDOW = 1 * MiB


@pytest.fixture(scope="module")
def iodvm(tmp_path_factory):
    """Nodes a (the head node, in the master process) and b (a daemon)."""
    with start_dvm(tmp_path_factory.mktemp("iodvm"), "a,b", {"pydvm_head_node": "a"}) as d:
        yield d


def _env(dvm) -> dict[str, str]:
    return {**dvm.env, "PYDVM_URI": dvm.uri}


def _run(dvm, *args: str, input: bytes | None = None, stdin=None,
         timeout: float = CMD_TIMEOUT) -> subprocess.CompletedProcess:
    """``pydvm run ARGS`` with bytes output (no newline translation); its stdin
    ``input``, or ``stdin`` (default /dev/null)."""
    kw = {"input": input} if input is not None else \
        {"stdin": subprocess.DEVNULL if stdin is None else stdin}
    return subprocess.run(PYDVM + ["run", *args], env=_env(dvm), capture_output=True,
                          timeout=timeout, **kw)


def _cc(tmp_path: Path, name: str, source: str) -> str:
    """Build a C program with gcc in the test's directory; its path."""
    if not shutil.which("gcc"):
        pytest.skip("gcc not installed (apt-get install gcc)")
    src = tmp_path / f"{name}.c"
    src.write_text(source)
    exe = tmp_path / name
    r = subprocess.run(["gcc", "-O1", "-Wall", "-o", str(exe), str(src)], capture_output=True,
                       text=True, timeout=CMD_TIMEOUT)
    assert r.returncode == 0, r.stderr
    return str(exe)


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def _jobs(dvm) -> list:
    import json

    p = subprocess.run(PYDVM + ["ps", "--json"], env=_env(dvm), capture_output=True, text=True,
                       timeout=CMD_TIMEOUT, check=True)
    return json.loads(p.stdout)["jobs"]


class ByteReader:
    """Collects a binary stream on a thread, so that a test can wait for
    bytes of a still-running process (an unfinished line) with a deadline."""

    def __init__(self, stream) -> None:
        self.data = b""
        self.closed = False
        self._fd = stream.fileno()
        self._cv = threading.Condition()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        try:
            while True:
                chunk = os.read(self._fd, 65536)
                if not chunk:
                    break
                with self._cv:
                    self.data += chunk
                    self._cv.notify_all()
        finally:
            with self._cv:
                self.closed = True
                self._cv.notify_all()

    def wait_for(self, want: bytes, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        with self._cv:
            while want not in self.data:
                left = deadline - time.monotonic()
                if left <= 0 or self.closed:
                    raise AssertionError(f"no {want!r} within {timeout}s (closed={self.closed});"
                                         f" got {self.data[-300:]!r}")
                self._cv.wait(left)


ABORT_C = r"""
#include <stdio.h>
#include <stdlib.h>
int main(void)
{
    printf("LINE BEFORE ABORT\n");  /* no fflush: stdio's buffer decides */
    fprintf(stderr, "ERR LINE\n");
    abort();
}
"""

SERVER_C = r"""
#include <stdio.h>
#include <unistd.h>
int main(void)
{
    printf("LISTENING ON 5555\n");  /* no fflush, then wait to be killed */
    for (;;)
        pause();
}
"""


# ---------------------------------------------------------------------------
# output line by line: a terminal on stdout
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("node", list(NODES))
def test_a_c_programs_line_printed_just_before_abort_reaches_pydvm_run(iodvm, tmp_path, node):
    """printf (no fflush) then abort(): the line is on `pydvm run`'s stdout, the
    stderr line on its stderr only, and the job exits 134 (128 + SIGABRT)."""
    exe = _cc(tmp_path, "abort_after_printf", ABORT_C)
    p = _run(iodvm, "--host", NODES[node], "-n", "1", exe)
    assert p.stdout == b"LINE BEFORE ABORT\n", (p.stdout, p.stderr)
    assert p.returncode == 134, p.stderr
    assert b"ERR LINE\n" in p.stderr and b"LINE BEFORE ABORT" not in p.stderr, p.stderr


@pytest.mark.parametrize("node", list(NODES))
def test_a_c_servers_line_reaches_pydvm_run_while_it_waits_and_survives_pydvm_kill(
        iodvm, tmp_path, node):
    """A server prints its port without fflush and waits: the line reaches
    `pydvm run` while it runs; `pydvm kill` then ends it with the line kept."""
    exe = _cc(tmp_path, "server_waits", SERVER_C)
    bg = subprocess.Popen(PYDVM + ["run", "--tag-output", "--host", NODES[node], "-n", "1", exe],
                          env=_env(iodvm), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    out = LineReader(bg.stdout)
    try:
        line = out.wait_line("[", timeout=30)
        m = re.match(r"\[(\S+),0\] LISTENING ON 5555$", line)
        assert m, line
        assert bg.poll() is None
        k = subprocess.run(PYDVM + ["kill", m.group(1)], env=_env(iodvm), capture_output=True,
                           text=True, timeout=CMD_TIMEOUT)
        assert k.returncode == 0, k.stderr
        rc = finish(bg, 30)
    finally:
        if bg.poll() is None:
            bg.kill()
            bg.wait(10)
    assert rc == 143, bg.stderr.read()  # 128 + SIGTERM
    assert out.join() == [line]


@pytest.mark.parametrize("node", list(NODES))
def test_a_ranks_stdout_is_a_terminal_that_passes_bytes_unchanged(iodvm, node):
    """`test -t 1` is true in a rank, `test -t 2` and `test -t 0` false; \\r\\n,
    \\n and tabs arrive as written (no output processing), stderr separate."""
    script = ('test -t 1 && echo "stdout is a terminal"; '
              'test -t 2 || echo "stderr is not" >&2; '
              'test -t 0 || echo "stdin is not"; '
              "printf 'a\\r\\nb\\n\\tc\\n'")
    p = _run(iodvm, "--host", NODES[node], "-n", "1", "sh", "-c", script, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr
    assert p.stdout == b"stdout is a terminal\nstdin is not\na\r\nb\n\tc\n", p.stdout
    assert p.stderr == b"stderr is not\n", p.stderr


@pytest.mark.parametrize("node", list(NODES))
def test_a_python_rank_prints_line_by_line_without_dash_u(iodvm, node):
    """print() in a rank (no -u, no flush) reaches `pydvm run` while the rank runs."""
    env = _env(iodvm)
    env.pop("PYTHONUNBUFFERED", None)  # the job's environment is pydvm run's
    bg = subprocess.Popen(PYDVM + ["run", "--host", NODES[node], "-n", "1", sys.executable, "-c",
                                   "import time; print('READY', flush=False); time.sleep(120)"],
                          env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    out = LineReader(bg.stdout)
    try:
        out.wait_line("READY", timeout=30)
        assert bg.poll() is None
        os.kill(bg.pid, signal.SIGINT)
        assert finish(bg, 30) == 130
    finally:
        if bg.poll() is None:
            bg.kill()
            bg.wait(10)


def test_an_unfinished_line_such_as_a_prompt_is_forwarded_after_a_moment(iodvm):
    """`printf 'name? '` and wait: the prompt reaches `pydvm run` while the rank
    waits (an unfinished line goes as it is once its stream is quiet)."""
    bg = subprocess.Popen(PYDVM + ["run", "--host", "b", "-n", "1", "sh", "-c",
                                   "printf 'name? '; sleep 120"],
                          env=_env(iodvm), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE)
    out = ByteReader(bg.stdout)
    try:
        out.wait_for(b"name? ", timeout=30)
        assert bg.poll() is None
    finally:
        bg.send_signal(signal.SIGINT)
        finish(bg, 30)


def test_tagged_output_of_many_lines_and_a_long_line_stays_line_by_line(iodvm):
    """Lines are batched on the way: --tag-output still tags every line once,
    each rank's lines in order; a line longer than a message gets one tag."""
    p = _run(iodvm, "--tag-output", "--host", "a:1,b:1", "-n", "2", "seq", "1", "30000")
    assert p.returncode == 0, p.stderr
    out = p.stdout.decode().splitlines()
    ns = re.match(r"\[(\S+),[01]\] ", out[0]).group(1)
    for r in (0, 1):
        tag = f"[{ns},{r}] "
        assert [ln[len(tag):] for ln in out if ln.startswith(tag)] == \
            [str(i) for i in range(1, 30001)]
    assert len(out) == 60000
    long = "x" * 200_000
    q = _run(iodvm, "--tag-output", "--host", "b", "-n", "1", sys.executable, "-c",
             f"print('{long[:10]}' * 20000); print('end')")
    got = q.stdout.decode().splitlines()
    assert [ln.split("] ", 1)[1] for ln in got] == [long, "end"], [ln[:60] for ln in got]


def test_a_lingering_child_holding_the_terminal_does_not_keep_the_job(iodvm):
    """The exit is reported after a short idle wait although a child keeps the
    rank's stdout terminal open; the job ends and the child is killed."""
    t0 = time.monotonic()
    p = _run(iodvm, "--host", "a", "-n", "1", "sh", "-c", "sleep 300 & echo CHILD $!",
             timeout=30)
    assert p.returncode == 0, p.stderr
    assert time.monotonic() - t0 < 20
    child = int(p.stdout.split()[1])
    from dvmkit import pid_alive
    wait_for(lambda: not pid_alive(child), timeout=10, what="the lingering child to be killed")


# ---------------------------------------------------------------------------
# a closed stdout
# ---------------------------------------------------------------------------


def _head_1(cmd: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess]:
    """``CMD | head -1`` through a shell with pipefail: (seconds, result)."""
    line = " ".join(cmd) + " | head -1"
    t0 = time.monotonic()
    p = subprocess.run(["bash", "-c", f"set -o pipefail; {line}"], env=env, capture_output=True,
                       timeout=120, stdin=subprocess.DEVNULL)
    return time.monotonic() - t0, p


@pytest.mark.parametrize("where", ["a", "b", "a:1,b:1"], ids=["head", "daemon", "both"])
def test_pydvm_run_into_head_1_ends_the_job_at_once(iodvm, where):
    """`pydvm run -n 2 yes | head -1`: one line, exit 141 without a word, and
    about as soon as a job that ends by itself (the output already in flight
    is not worth waiting for) -- the bound is such a job's time (`true`, in
    the same pipeline), measured here under the same load, plus two seconds."""
    base, p = _head_1(PYDVM + ["run", "--host", where, "-n", "2", "true"], _env(iodvm))
    assert p.returncode == 0 and p.stdout == b"", (p.returncode, p.stderr[-500:])
    secs, p = _head_1(PYDVM + ["run", "--host", where, "-n", "2", "yes"], _env(iodvm))
    assert p.stdout == b"y\n" and p.returncode == 141, (p.returncode, p.stderr[-500:])
    assert p.stderr == b"", p.stderr[-500:]
    assert secs < base + 2.0, f"took {secs:.1f}s; a job ending by itself {base:.1f}s"
    wait_for(lambda: _jobs(iodvm) == [], timeout=10, what="the job to be gone")


def test_a_one_shot_pydvm_run_into_head_1_ends_at_once(tmp_path):
    """The same through a one-shot DVM: no longer than running `true` plus a few seconds."""
    env = dict(os.environ)
    env.pop("PYDVM_URI", None)
    env["PYDVM_STATE_DIR"] = str(tmp_path / "state")
    t0 = time.monotonic()
    q = subprocess.run(PYDVM + ["run", "-n", "1", "true"], env=env, capture_output=True,
                       timeout=120)
    base = time.monotonic() - t0
    assert q.returncode == 0, q.stderr
    secs, p = _head_1(PYDVM + ["run", "-n", "2", "yes"], env)
    assert p.stdout == b"y\n" and p.returncode == 141, (p.returncode, p.stderr[-500:])
    assert secs < base + 3.0, f"took {secs:.1f}s (a one-shot `true`: {base:.1f}s)"


# ---------------------------------------------------------------------------
# a stalled reader
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("node", list(NODES))
def test_a_stalled_reader_costs_the_master_no_more_than_the_output_window(tmp_path, node):
    """`pydvm run yes` whose stdout nobody reads: `yes` writes 2-byte lines as
    fast as it may; the master's memory grows by about the window (1 MiB), not
    by the tens of MiB that one message per line once cost."""
    dvm = start_dvm(tmp_path, "a,b", {"pydvm_head_node": "a"})
    host = NODES[node]
    tool = None
    try:
        # Warm up the path (first job, first output) so the baseline is the steady state.
        w = _run(dvm, "--host", host, "-n", "1", "sh", "-c", "yes | head -c 3000000")
        assert w.returncode == 0 and len(w.stdout) == 3_000_000, w.stderr
        time.sleep(0.5)
        base = _rss_kib(dvm.pid)
        tool = subprocess.Popen(PYDVM + ["run", "--host", host, "-n", "1", "yes"],
                                env=_env(dvm), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        peak = 0
        deadline = time.monotonic() + 6.0
        while time.monotonic() < deadline:
            peak = max(peak, _rss_kib(dvm.pid) - base)
            time.sleep(0.1)
        assert tool.poll() is None, tool.stderr.read()
        # The window, plus the allocator's slack and the tool connection's buffers.
        assert peak < (WINDOW + 3 * MiB) // 1024, f"master RSS grew by {peak} KiB"
    finally:
        if tool is not None:
            tool.kill()  # the master kills a job whose pydvm run went away
            tool.wait(10)
        try:
            wait_for(lambda: _jobs(dvm) == [], timeout=20, what="the job to end")
        finally:
            dvm.stop()


# ---------------------------------------------------------------------------
# stdin
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("node", list(NODES))
def test_stdin_goes_to_rank_0_and_the_other_ranks_read_dev_null(iodvm, node):
    """`printf abc | pydvm run -n 2 sh -c 'cat; echo " rank $PYDVM_RANK"'`: rank 0
    reads abc and then end of file; rank 1 reads nothing (/dev/null)."""
    p = _run(iodvm, "--host", NODES[node], "-n", "2", "sh", "-c",
             'cat; echo " rank $PYDVM_RANK"', input=b"abc")
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.decode().splitlines()) == [" rank 1", "abc rank 0"], p.stdout


def test_publish_files_reads_a_value_piped_into_pydvm_run(iodvm, tmp_path):
    """`cat big.bin | pydvm run -n 1 pydvm publish --files k=-`: the bytes (more
    than the stdin window, so flow control is on the way) arrive whole."""
    blob = os.urandom(3 * MiB + 17)
    p = _run(iodvm, "--host", "b", "-n", "1", "pydvm", "publish", "--files", "big=-",
             "--persistence", "session", input=blob)
    assert p.returncode == 0, p.stderr
    assert b"STATUS PMIX_SUCCESS" in p.stdout, p.stdout
    q = _run(iodvm, "--host", "a", "-n", "1", sys.executable, "-c",
             "import hashlib; from pydvm import Client; c = Client(); "
             "v = c.lookup(['big'])['big']; print(len(v), hashlib.sha256(v).hexdigest()); "
             "c.unpublish(['big'])")
    assert q.returncode == 0, q.stderr
    assert q.stdout.decode().split() == [str(len(blob)), hashlib.sha256(blob).hexdigest()]


@pytest.mark.parametrize("node", list(NODES))
def test_a_huge_stdin_is_held_back_not_buffered(iodvm, tmp_path, node):
    """64 MiB piped into a rank 0 that reads nothing for a while: the master
    (and the daemon) do not grow while it waits, `pydvm run` reads only as the
    rank reads, and every byte arrives."""
    size = 64 * MiB
    go = tmp_path / "go"
    os.mkfifo(go)  # the rank reads nothing until the test writes a line here
    bg = subprocess.Popen(["sh", "-c", f"head -c {size} /dev/zero | {' '.join(PYDVM)} run "
                                       f"--host {NODES[node]} -n 1 sh -c 'read -r _ < {tmp_path}/go"
                                       f" ; wc -c'"],
                          env=_env(iodvm), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE)
    watched = [iodvm.pid] + ([iodvm.daemon_pids["b"]] if node == "daemon" else [])
    try:
        time.sleep(1.5)
        base = {p: _rss_kib(p) for p in watched}
        tool = wait_for(lambda: _tool_pid(bg.pid), what="pydvm run to start")
        tool_base = _rss_kib(tool)
        time.sleep(2.0)
        grown = {p: _rss_kib(p) - base[p] for p in watched}
        tool_grown = _rss_kib(tool) - tool_base
        with open(go, "w") as f:
            f.write("go\n")
        out, err = bg.communicate(timeout=120)
    finally:
        if bg.poll() is None:
            bg.kill()
            bg.wait(10)
    assert out.split() == [str(size).encode()], (out, err)
    assert all(g < 2048 for g in grown.values()), f"RSS grew by {grown} KiB"
    assert tool_grown < 2048, f"pydvm run grew by {tool_grown} KiB"


def _tool_pid(shell_pid: int) -> int | None:
    """The pid of the `pydvm run` a shell started (its child running python)."""
    try:
        kids = Path(f"/proc/{shell_pid}/task/{shell_pid}/children").read_text().split()
    except OSError:
        return None
    for k in kids:
        try:
            if b"pydvm" in Path(f"/proc/{k}/cmdline").read_bytes():
                return int(k)
        except OSError:
            pass
    return None


def test_a_rank_0_that_stops_reading_stops_pydvm_run_reading(iodvm):
    """`yes | pydvm run -n 1 head -1` prints one line and ends; an endless stdin
    into a job that never reads it does not keep `pydvm run` going."""
    p = subprocess.run(["sh", "-c", f"yes | {' '.join(PYDVM)} run --host b -n 1 head -1"],
                       env=_env(iodvm), capture_output=True, timeout=60)
    assert p.returncode == 0 and p.stdout == b"y\n", (p.returncode, p.stderr)
    q = subprocess.run(["sh", "-c", f"yes | {' '.join(PYDVM)} run --host a -n 1 true"],
                       env=_env(iodvm), capture_output=True, timeout=60)
    assert q.returncode == 0, q.stderr


def test_stdin_from_a_regular_file(iodvm, tmp_path):
    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(1 * MiB + 3))
    with open(data, "rb") as f:
        p = _run(iodvm, "--host", "b", "-n", "1", "sha256sum", stdin=f)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split()[0].decode() == hashlib.sha256(data.read_bytes()).hexdigest()


def _on_a_terminal(dvm, *args: str, background: bool) -> tuple[int, Path]:
    """Start `pydvm run ARGS` with a new terminal as its stdin (the controlling
    terminal of a session led by a small helper), in the terminal's foreground
    process group or in a background one.  Returns the terminal's master side
    and the file the helper writes `pydvm run`'s output and status to."""
    master, slave = os.openpty()
    out = Path(dvm.log_dir).parent / f"tty-run-{time.monotonic_ns()}.out"
    helper = f"""
import os, subprocess, sys
argv = {PYDVM + ['run', *args]!r}
p = subprocess.Popen(argv, stdin=0, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                     process_group={0 if background else None!r})
data = p.communicate()[0]
import fcntl
mode = b'NONBLOCK' if fcntl.fcntl(0, fcntl.F_GETFL) & os.O_NONBLOCK else b'BLOCKING'
with open({str(out)!r}, 'wb') as f:
    f.write(data + b'EXIT %d ' % p.returncode + mode)
"""

    def make_controlling() -> None:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    subprocess.Popen([sys.executable, "-c", helper], stdin=slave, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, env=_env(dvm), start_new_session=True,
                     preexec_fn=make_controlling)
    os.close(slave)
    return master, out


def test_a_terminal_stdin_is_forwarded_while_pydvm_run_is_in_the_foreground(iodvm):
    """Typed lines reach rank 0; Ctrl-D (end of file on the terminal) ends its input."""
    master, out = _on_a_terminal(iodvm, "--host", "b", "-n", "1", "sh", "-c",
                                 'cat; echo "rank 0 saw EOF"', background=False)
    try:
        time.sleep(1.0)
        os.write(master, b"typed line\n")
        time.sleep(0.5)
        os.write(master, b"\x04")  # Ctrl-D at the start of a line: end of file
        wait_for(lambda: out.exists(), timeout=30, what="pydvm run to end")
    finally:
        os.close(master)
    text = out.read_bytes().decode()
    assert "typed line\nrank 0 saw EOF\nEXIT 0 BLOCKING" in text, text


def test_a_background_pydvm_run_does_not_read_the_terminal(iodvm):
    """A `pydvm run` in a background process group of its terminal leaves the
    terminal alone (it would be stopped by SIGTTIN otherwise) and its job runs."""
    master, out = _on_a_terminal(iodvm, "--host", "a", "-n", "1", "sh", "-c",
                                 "echo started; sleep 1; echo done", background=True)
    try:
        time.sleep(0.5)
        os.write(master, b"not for the background job\n")
        wait_for(lambda: out.exists(), timeout=30, what="pydvm run to end")
    finally:
        os.close(master)
    assert out.read_bytes().decode() == "started\ndone\nEXIT 0 BLOCKING"


def test_a_jobs_terminals_and_pipes_are_closed_with_it(iodvm, tmp_path):
    """Jobs that end normally, fail, are killed, or leave a child behind leave
    no descriptor open in the master (head node) or the daemon."""
    pids = [iodvm.pid, iodvm.daemon_pids["b"]]

    def fds() -> list[int]:
        return [len(os.listdir(f"/proc/{p}/fd")) for p in pids]

    _run(iodvm, "--host", "a:1,b:1", "-n", "2", "true")  # warm up
    before = fds()
    exe = _cc(tmp_path, "abort_after_printf", ABORT_C)
    for _ in range(3):
        for host in ("a", "b"):
            assert _run(iodvm, "--host", host, "-n", "2", "cat", input=b"x").returncode == 0
            assert _run(iodvm, "--host", host, "-n", "1", exe).returncode == 134
            assert _run(iodvm, "--host", host, "-n", "1", "sh", "-c",
                        "sleep 300 & echo $!").returncode == 0
    wait_for(lambda: fds() <= before, timeout=20, what=f"descriptors back to {before}")


def test_pydvm_run_leaves_the_stdin_it_shares_blocking(iodvm):
    """Waiting for stdin data must not make the shared stdin non-blocking: the
    next command reading the same pipe would fail with EAGAIN."""
    check = (f"{sys.executable} -c 'import fcntl, os; "
             "print(\"NONBLOCK\" if fcntl.fcntl(0, fcntl.F_GETFL) & os.O_NONBLOCK "
             "else \"BLOCKING\")'")
    p = subprocess.run(["sh", "-c", f"{' '.join(PYDVM)} run --host b -n 1 head -1; {check}"],
                       env=_env(iodvm), input=b"data\nrest\n", capture_output=True, timeout=60)
    assert p.stdout == b"data\nBLOCKING\n", (p.stdout, p.stderr)


# ---------------------------------------------------------------------------
# --stdin all, --stdin N: stdin to ranks on several nodes
# ---------------------------------------------------------------------------

#: the stdin window (protocol.STDIN_WINDOW): what pydvm run may have sent and
#: not seen written into every reading rank's pipe.
STDIN_WINDOW = 256 * 1024


def test_stdin_all_gives_every_rank_on_every_node_the_whole_input_and_its_end(iodvm):
    """`--stdin all` with ranks on the head node (two) and a daemon node (one):
    each reads every byte, in order, then end of file -- more than the window,
    so flow control is on the way for every pipe."""
    blob = os.urandom(3 * STDIN_WINDOW + 5)
    p = _run(iodvm, "--stdin", "all", "--host", "a:2,b:1", "-n", "3", "sh", "-c",
             'echo "$PYDVM_RANK $PYDVM_NODE $(sha256sum | cut -d" " -f1)"', input=blob)
    assert p.returncode == 0, p.stderr
    digest = hashlib.sha256(blob).hexdigest()
    assert sorted(p.stdout.decode().splitlines()) == [
        f"0 a {digest}", f"1 a {digest}", f"2 b {digest}"], p.stdout


def test_stdin_all_with_empty_input_gives_every_rank_end_of_file(iodvm):
    p = _run(iodvm, "--stdin", "all", "--host", "a:1,b:1", "-n", "2", "sh", "-c",
             'read -r line || line=EOF; echo "$PYDVM_RANK:$line"', input=b"")
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.decode().split()) == ["0:EOF", "1:EOF"]


#: Rank 0 reads `STDIN_WINDOW` bytes, publishes `read0`, reads the rest and
#: prints how much it read; rank 1 reads nothing until then, then all of it.
_LAGGARD = f"""
import os, subprocess, sys
rank = os.environ["PYDVM_RANK"]
n = 0
if rank == "0":
    while n < {STDIN_WINDOW}:
        n += len(os.read(0, {STDIN_WINDOW} - n))
    subprocess.run(["pydvm", "publish", "read0=1"], check=True, stdout=subprocess.DEVNULL)
else:
    subprocess.run(["pydvm", "lookup", "--wait", "read0"], check=True, stdout=subprocess.DEVNULL)
while True:
    b = os.read(0, 65536)
    if not b:
        break
    n += len(b)
print(rank, n)
"""


@pytest.mark.parametrize("slow", ["a", "b"])
def test_stdin_all_a_rank_that_does_not_read_holds_the_others_back_by_the_window_only(
        iodvm, slow):
    """A rank that reads nothing lets the others read at least the window
    ahead of it (here it waits until rank 0 has); then it reads everything:
    nothing is dropped for it."""
    fast = "b" if slow == "a" else "a"
    size = 4 * STDIN_WINDOW
    p = _run(iodvm, "--stdin", "all", "--host", f"{fast}:1,{slow}:1", "-n", "2",
             sys.executable, "-c", _LAGGARD, input=b"x" * size)
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.decode().splitlines()) == [f"0 {size}", f"1 {size}"], p.stdout


def test_stdin_all_a_rank_that_ends_or_closes_its_stdin_holds_nobody_back(iodvm):
    """Rank 1 ends at once, rank 2 closes its stdin and lives on until rank 0
    has read everything: rank 0 gets the whole input."""
    size = 4 * STDIN_WINDOW
    script = ('case $PYDVM_RANK in '
              '0) echo "0 $(wc -c)"; pydvm publish done=1 >/dev/null;; '
              '1) exit 0;; '
              '2) exec 0<&-; pydvm lookup --wait done >/dev/null; echo 2 lived;; esac')
    p = _run(iodvm, "--stdin", "all", "--host", "a:1,b:2", "-n", "3", "sh", "-c", script,
             input=b"y" * size)
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.decode().splitlines()) == [f"0 {size}", "2 lived"], p.stdout


@pytest.mark.parametrize("reader", ["a", "b"])
def test_stdin_n_on_another_node_than_rank_0_reads_beyond_the_window(iodvm, reader):
    """`--stdin 1` with rank 1 on another node than rank 0: its node's
    acknowledgements count, so more than the window gets through."""
    other = "b" if reader == "a" else "a"
    size = 4 * STDIN_WINDOW
    p = _run(iodvm, "--stdin", "1", "--host", f"{other}:1,{reader}:1", "-n", "2", "sh", "-c",
             'echo "$PYDVM_RANK $PYDVM_NODE $(wc -c)"', input=b"z" * size)
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.decode().splitlines()) == [f"0 {other} 0",
                                                      f"1 {reader} {size}"], p.stdout
