"""Fault runs: what a DVM does when the world misbehaves (issue 34, item 7).

``python bench/faults/faults.py`` (as root) runs each case against real DVMs and
prints a table -- case, what was done, what was measured, verdict -- and a
last line ``faults N of M held``; it exits 0 only when every case held.
``--quick`` runs the quick cases only (frozen daemon, big-frame stranger,
SIGTERM to a run), as tests/e2e/test_faults_script.py does in CI.

Cases (each bounded in time; each ends the processes it started, by pid, and
removes the devices and namespaces it made):

1. ``lossy-link``: a daemon in its own network namespace, joined to the
   master's side not by a veth pair but by two TAP devices and a user-space
   impairer in this process that forwards Ethernet frames between them with
   a delay (100 ms +- 20 ms each way) and a loss rate (5 %) -- this kernel
   has no ``netem``.  Jobs run over it; each must end with its own status.
2. ``frozen-daemon``: SIGSTOP a daemon that runs a job; the master must
   declare the node lost (heartbeat 0.5 s); after SIGCONT the daemon and the
   job's process must be gone, and the other node still serves.
3. ``big-frame``: strangers send a large frame's header and 16 MiB of it to
   the master's TCP port; the master's RSS (/proc) must stay put and a
   job must run meanwhile.
4. ``fd-storm``: a master started with RLIMIT_NOFILE 256 and 400 idle
   connections held against it: jobs are still served, and a tool right
   after the storm ends.
5. ``sigterm-run``: SIGTERM to a ``pydvm run`` whose processes ignore it:
   the tool exits 143 promptly, and the job's processes are ended.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import heapq
import os
import random
import resource
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
sys.path.insert(0, str(ROOT / "tests" / "multinode"))

import dvmkit  # noqa: E402
from dvmkit import pid_alive, start_dvm, wait_for  # noqa: E402

from pydvm.runtime.shared.auth import DvmUri  # noqa: E402
from pydvm.wire import HEADER  # noqa: E402

MiB = 1 << 20


class Row:
    def __init__(self, case: str, done: str) -> None:
        self.case, self.done, self.measured, self.held = case, done, "", False



def seconds_until_gone(pids, since: float, timeout: float = 20) -> float | None:
    """Seconds from ``since`` until none of ``pids`` runs; None if some
    still do after ``timeout``."""
    try:
        wait_for(lambda: not any(pid_alive(p) for p in pids), timeout=timeout,
                 what="the processes to end")
    except AssertionError:
        return None
    return time.monotonic() - since

def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def children(pid: int) -> list[int]:
    """Every descendant of ``pid`` now (from /proc)."""
    parent: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


def kill_pids(pids) -> None:
    for p in pids:
        if p and pid_alive(p):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass


def end_popen(p: subprocess.Popen | None) -> None:
    if p is not None and p.poll() is None:
        p.kill()
        p.communicate(timeout=10)


# ---------------------------------------------------------------------------
# 1. a lossy, slow link: two TAP devices and a user-space impairer
# ---------------------------------------------------------------------------

TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns")


def open_tap(name: str, netns: str | None = None) -> int:
    """Attach to the existing TAP device ``name`` (in ``netns``, if given)."""
    home = os.open("/proc/self/ns/net", os.O_RDONLY) if netns else -1
    try:
        if netns:
            nsfd = os.open(f"/var/run/netns/{netns}", os.O_RDONLY)
            try:
                _setns(nsfd)
            finally:
                os.close(nsfd)
        fd = os.open("/dev/net/tun", os.O_RDWR)
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
        return fd
    finally:
        if netns:
            _setns(home)
            os.close(home)


class Impairer(threading.Thread):
    """Forwards frames between two TAP fds, each delayed ``delay +- jitter``
    seconds and dropped with probability ``loss``."""

    def __init__(self, a: int, b: int, delay=0.100, jitter=0.020, loss=0.05) -> None:
        super().__init__(daemon=True)
        self.fds = (a, b)
        self.delay, self.jitter, self.loss = delay, jitter, loss
        self.stop = threading.Event()
        self.forwarded = self.dropped = 0
        self.rng = random.Random(34)

    def run(self) -> None:
        sel = selectors.DefaultSelector()
        a, b = self.fds
        sel.register(a, selectors.EVENT_READ, b)
        sel.register(b, selectors.EVENT_READ, a)
        due: list[tuple[float, int, int, bytes]] = []
        seq = 0
        while not self.stop.is_set():
            now = time.monotonic()
            while due and due[0][0] <= now:
                _, _, out, frame = heapq.heappop(due)
                try:
                    os.write(out, frame)
                    self.forwarded += 1
                except OSError:
                    pass
            wait = min(0.05, max(0.0, due[0][0] - now)) if due else 0.05
            for key, _ in sel.select(wait):
                try:
                    frame = os.read(key.fd, 65536)
                except OSError:
                    continue
                if self.rng.random() < self.loss:
                    self.dropped += 1
                    continue
                d = self.delay + self.rng.uniform(-self.jitter, self.jitter)
                seq += 1
                heapq.heappush(due, (time.monotonic() + d, seq, key.data, frame))
        sel.close()


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {p.stderr.strip()}")
    return p


#: Median time of 5 TCP connects to (host, port), in ms: one round trip each.
RTT_PROBE = """
import socket, statistics, sys, time
ts = []
for _ in range(5):
    t = time.monotonic()
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10).close()
    ts.append(time.monotonic() - t)
print(f"{statistics.median(ts) * 1000:.0f}")
"""


def case_lossy_link(tmp: Path, jobs: int) -> Row:
    row = Row("lossy-link", f"master and a daemon's namespace joined by 2 TAPs + user-space "
                            f"impairer (100+-20 ms each way, 5 % loss); {jobs} jobs -n 2")
    tag = 234
    ns, tap_m, tap_d = f"pdvmf{tag}-h1", f"pdvmf{tag}-tm", f"pdvmf{tag}-td"
    master_addr, host_addr = f"10.250.{tag}.1", f"10.250.{tag}.11"

    def down() -> None:
        for pid in _ip("netns", "pids", ns, check=False).stdout.split():
            kill_pids([int(pid)])
        _ip("netns", "del", ns, check=False)
        _ip("link", "del", tap_m, check=False)

    # One run at a time per machine: the names are fixed (released on close, even on a crash).
    lock = os.open("/run/lock/pydvm-faults-lossy.lock" if os.path.isdir("/run/lock")
                   else "/tmp/pydvm-faults-lossy.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    down()  # leftovers of a crashed earlier run
    fds: list[int] = []
    imp = None
    dvm = None
    try:
        _ip("netns", "add", ns)
        _ip("tuntap", "add", "dev", tap_m, "mode", "tap")
        _ip("tuntap", "add", "dev", tap_d, "mode", "tap")
        _ip("link", "set", tap_d, "netns", ns)
        _ip("addr", "add", f"{master_addr}/24", "dev", tap_m)
        _ip("link", "set", tap_m, "up")
        for args in (["addr", "add", f"{host_addr}/24", "dev", tap_d],
                     ["link", "set", tap_d, "up"], ["link", "set", "lo", "up"]):
            _ip("netns", "exec", ns, "ip", *args)
        fds = [open_tap(tap_m), open_tap(tap_d, ns)]
        imp = Impairer(*fds)
        imp.start()
        t0 = time.monotonic()
        dvm = start_dvm(tmp, ns, {"plm_ssh_agent": "ip netns exec"},
                        extra=["--launcher", "ssh", "--bind", master_addr])
        started = time.monotonic() - t0
        port = DvmUri.parse(dvm.uri).port
        rtt = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", RTT_PROBE,
                              master_addr, str(port)], capture_output=True, text=True,
                             timeout=60).stdout.strip() or "?"
        times, wrong = [], []
        for i in range(jobs):
            want = i % 3  # exit statuses 0, 1, 2 in turn
            t = time.monotonic()
            p = dvm.run("--host", ns, "-n", "2", "sh", "-c", f"echo r$PYDVM_RANK; exit {want}",
                        timeout=120)
            times.append(time.monotonic() - t)
            if p.returncode != want or sorted(p.stdout.split()) != ["r0", "r1"]:
                wrong.append(f"job {i}: {p.returncode} (want {want}) {p.stdout!r} {p.stderr!r}")
        times.sort()
        row.measured = (f"TCP connect rtt {rtt} ms; start {started:.1f} s; "
                        f"job median {times[len(times) // 2]:.2f} s, max {times[-1]:.2f} s; "
                        f"{jobs - len(wrong)}/{jobs} right status; frames "
                        f"{imp.forwarded} fwd, {imp.dropped} dropped")
        lost = "no heartbeat" in dvm.log("master")
        row.measured += f"; node lost: {lost}"
        if wrong:
            row.measured += "; " + wrong[0]
        row.held = not wrong and not lost
    except Exception as e:  # noqa: BLE001 -- a case that breaks did not hold
        row.measured += f" error: {e}"
    finally:
        if dvm is not None:
            dvm.stop()
        if imp is not None:
            imp.stop.set()
            imp.join(5)
        for fd in fds:
            os.close(fd)
        down()
        os.close(lock)
    return row


# ---------------------------------------------------------------------------
# 2. a frozen daemon
# ---------------------------------------------------------------------------


def case_frozen_daemon(tmp: Path) -> Row:
    row = Row("frozen-daemon", "SIGSTOP daemon b (running a job; heartbeat 0.5 s), "
                               "then SIGCONT")
    dvm = start_dvm(tmp, "a,b", {"pydvm_heartbeat_interval": "0.5"})
    job = None
    left: list[int] = []
    try:
        job = dvm.run_bg("--host", "b", "-n", "1", "sh", "-c", "echo UP; exec sleep 60")
        assert job.stdout.readline().strip() == "UP"
        bpid = dvm.daemon_pids["b"]
        left = [bpid, *children(bpid)]
        os.kill(bpid, signal.SIGSTOP)
        t0 = time.monotonic()
        wait_for(lambda: "no heartbeat" in dvm.log("master"), timeout=30,
                 what="the master to declare b lost")
        lost = time.monotonic() - t0
        job.communicate(timeout=30)
        os.kill(bpid, signal.SIGCONT)
        gone = seconds_until_gone(left, time.monotonic())
        still = dvm.run("--host", "a", "-n", "1", "echo", "ok")
        refused = dvm.run("--host", "b", "-n", "1", "true")
        row.measured = (f"lost after {lost:.1f} s; run exited {job.returncode}; after SIGCONT "
                        + (f"daemon+job gone in {gone:.2f} s" if gone is not None else
                           f"left: {[p for p in left if pid_alive(p)]}")
                        + f"; node a serves: {still.returncode == 0}; b refused: "
                          f"{refused.returncode != 0}")
        row.held = (gone is not None and job.returncode != 0 and still.returncode == 0
                    and refused.returncode != 0)
    except Exception as e:  # noqa: BLE001
        row.measured += f" error: {e}"
    finally:
        for p in left[:1]:
            if pid_alive(p):
                os.kill(p, signal.SIGCONT)
        end_popen(job)
        dvm.stop()
        kill_pids(left)
    return row


# ---------------------------------------------------------------------------
# 3. a big-frame stranger
# ---------------------------------------------------------------------------

STRANGERS = 4
SENT = 16 * MiB
ANNOUNCED = 48 * MiB


def _stranger(host: str, port: int, closed: list, release: threading.Event) -> None:
    try:
        s = socket.create_connection((host, port), timeout=10)
    except OSError:
        return
    chunk = b"\x00" * MiB
    try:
        s.sendall(HEADER.pack(ANNOUNCED))
        for _ in range(SENT // MiB):
            s.sendall(chunk)
    except OSError:
        closed.append(1)  # closed on us: the door held
    release.wait(30)
    s.close()


def case_big_frame(tmp: Path) -> Row:
    row = Row("big-frame", f"{STRANGERS} strangers on the master's TCP port, each sends "
                           f"{SENT // MiB} MiB of a {ANNOUNCED // MiB} MiB frame")
    dvm = start_dvm(tmp, "a")
    release = threading.Event()
    threads: list[threading.Thread] = []
    try:
        dvm.run("-n", "1", "true")  # warm
        before = rss(dvm.pid)
        uri = DvmUri.parse(dvm.uri)
        closed: list = []
        threads = [threading.Thread(target=_stranger, args=(uri.host, uri.port, closed, release),
                                    daemon=True) for _ in range(STRANGERS)]
        for t in threads:
            t.start()
        p = dvm.run("-n", "1", "echo", "served")
        wait_for(lambda: len(closed) == STRANGERS, timeout=20, what="every stranger closed")
        after = rss(dvm.pid)
        row.measured = (f"master RSS {before / MiB:.1f} -> {after / MiB:.1f} MiB; "
                        f"{len(closed)}/{STRANGERS} closed by the master; job meanwhile "
                        f"exit {p.returncode}")
        row.held = after - before < 12 * MiB and p.returncode == 0 and "served" in p.stdout
    except Exception as e:  # noqa: BLE001
        row.measured += f" error: {e}"
    finally:
        release.set()
        for t in threads:
            t.join(10)
        dvm.stop()
    return row


# ---------------------------------------------------------------------------
# 4. a descriptor storm
# ---------------------------------------------------------------------------

LOW_NOFILE = 256
STORM = 400


def _low_nofile() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (LOW_NOFILE, LOW_NOFILE))


class Storm(threading.Thread):
    """Holds ``STORM`` idle connections to the master, reopening what it closes."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(daemon=True)
        self.addr = (host, port)
        self.stop = threading.Event()
        self.opened = 0

    def run(self) -> None:
        sel = selectors.DefaultSelector()
        socks: set[socket.socket] = set()
        while not self.stop.is_set():
            while len(socks) < STORM and not self.stop.is_set():
                try:
                    s = socket.create_connection(self.addr, timeout=5)
                except OSError:
                    break
                s.setblocking(False)
                sel.register(s, selectors.EVENT_READ)
                socks.add(s)
                self.opened += 1
            for key, _ in sel.select(0.05):
                try:
                    data = key.fileobj.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    sel.unregister(key.fileobj)
                    key.fileobj.close()
                    socks.discard(key.fileobj)
        for s in socks:
            s.close()
        sel.close()


def case_fd_storm(tmp: Path) -> Row:
    row = Row("fd-storm", f"master with RLIMIT_NOFILE {LOW_NOFILE}; {STORM} idle connections "
                          f"held (reopened as closed); 3 jobs during")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < STORM + 200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    dvm = start_dvm(tmp, "a", preexec=_low_nofile)
    storm = None
    try:
        uri = DvmUri.parse(dvm.uri)
        storm = Storm(uri.host, uri.port)
        storm.start()
        wait_for(lambda: storm.opened >= STORM, timeout=60, what="the storm's connections")
        times, ok = [], 0
        for i in range(3):
            t = time.monotonic()
            p = dvm.run("-n", "1", "echo", f"served{i}")
            times.append(time.monotonic() - t)
            ok += p.returncode == 0 and f"served{i}" in p.stdout
        storm.stop.set()
        storm.join(30)
        ended = time.monotonic()
        p = dvm.cmd("info")
        back = time.monotonic() - ended
        row.measured = (f"{storm.opened} connections opened; {ok}/3 jobs served "
                        f"(max {max(times):.2f} s); `pydvm info` {back:.2f} s after the storm; "
                        f"limit episode logged: "
                        f"{'descriptor limit reached' in dvm.log('master')}")
        row.held = ok == 3 and p.returncode == 0 and back < 5.0
    except Exception as e:  # noqa: BLE001
        row.measured += f" error: {e}"
    finally:
        if storm is not None:
            storm.stop.set()
            storm.join(30)
        dvm.stop()
    return row


# ---------------------------------------------------------------------------
# 5. SIGTERM to a run whose processes ignore it
# ---------------------------------------------------------------------------

IGNORES_TERM = 'trap "" TERM; echo "UP $$"; while :; do sleep 0.2; done'


def case_sigterm_run(tmp: Path) -> Row:
    row = Row("sigterm-run", "SIGTERM to `pydvm run -n 2` whose processes ignore SIGTERM")
    dvm = start_dvm(tmp, "a")
    proc = None
    pids: list[int] = []
    try:
        proc = dvm.run_bg("-n", "2", "sh", "-c", IGNORES_TERM)
        for _ in range(2):
            line = proc.stdout.readline().split()
            pids.append(int(line[1]))
        os.kill(proc.pid, signal.SIGTERM)
        t0 = time.monotonic()
        proc.communicate(timeout=30)
        took = time.monotonic() - t0
        gone = seconds_until_gone(pids, t0)
        row.measured = (f"exit {proc.returncode} after {took:.2f} s; job processes "
                        + (f"gone {gone:.2f} s after the signal" if gone is not None
                           else "still there"))
        row.held = proc.returncode == 143 and took < 2.5 and gone is not None
    except Exception as e:  # noqa: BLE001
        row.measured += f" error: {e}"
    finally:
        end_popen(proc)
        dvm.stop()
        kill_pids(pids)
    return row


# ---------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="only the quick cases: frozen-daemon, big-frame, sigterm-run")
    ap.add_argument("--jobs", type=int, default=20, help="jobs over the lossy link (20)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/faults/faults.py must run as root (namespaces, TAP devices)", file=sys.stderr)
        return 2
    cases = [("frozen-daemon", case_frozen_daemon), ("big-frame", case_big_frame),
             ("sigterm-run", case_sigterm_run)]
    if not args.quick:
        cases = [("lossy-link", lambda t: case_lossy_link(t, args.jobs)), cases[0], cases[1],
                 ("fd-storm", case_fd_storm), cases[2]]
    rows = []
    with tempfile.TemporaryDirectory(prefix="pydvm-faults-") as td:
        for name, fn in cases:
            sub = Path(td) / name
            sub.mkdir()
            t = time.monotonic()
            try:
                r = fn(sub)
            except Exception as e:  # noqa: BLE001 -- e.g. the DVM did not start
                r = Row(name, "(could not run)")
                r.measured = f"error: {e}"
            r.measured += f" [{time.monotonic() - t:.1f} s]"
            rows.append(r)
            print(f"... {name}: {'held' if r.held else 'FAILED'}", file=sys.stderr, flush=True)
    print("| case | what was done | what was measured | verdict |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r.case} | {r.done} | {r.measured} | {'held' if r.held else 'FAILED'} |")
    held = sum(r.held for r in rows)
    print(f"faults {held} of {len(rows)} held")
    return 0 if held == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
