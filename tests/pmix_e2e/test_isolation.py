"""A crash inside libpmix, on purpose: with ``pydvm_pmix_isolate=on`` it ends
the PMIx server it happened in and the processes that server served, never
the master, a daemon, or a job that did not use that server.

The crash is libpmix 4.2.0-4.2.4's own: an attribute query (``pattrs
--host-fns``) segfaults the server's progress thread
(src/pydvm/pmix/queries.py).  ``pydvm_pmix_attribute_fix=off`` leaves it in.
"""

from __future__ import annotations

import os

import pytest

from pmixkit import FAR, HEAD, NODES
from dvmkit import LineReader, finish

pytestmark = pytest.mark.pmix


def _affected() -> bool:
    from pydvm.pmix import _lib as L
    from pydvm.pmix.queries import affected
    return affected(L.parse_version(L.load().version))


@pytest.fixture
def pattrs():
    import shutil
    if shutil.which("pattrs") is None:
        pytest.skip("pattrs (Debian's libpmix-bin) is not installed")
    if not _affected():
        pytest.skip("this libpmix answers attribute queries without crashing")


@pytest.mark.parametrize("node", sorted(NODES))
def test_a_crash_inside_libpmix_ends_its_server_and_its_clients_not_the_dvm(
        make_pdvm, pmixcc, pattrs, node):
    where = NODES[node]
    d = make_pdvm(pydvm_pmix_isolate="on", pydvm_pmix_attribute_fix="off")
    daemon_pids = dict(d.daemon_pids)
    client = pmixcc("pmix_events")
    # a PMIx process connected to the server that will crash, and a plain one beside it
    served = d.run_bg("--host", where, "-n", "1", client, "sleep:600000")
    plain = d.run_bg("--host", where, "-n", "1", "sh", "-c", "echo UP; exec sleep 600")
    try:
        assert LineReader(served.stdout).wait_line("INIT", timeout=60) == "INIT status=0 rank=0"
        assert LineReader(plain.stdout).wait_line("UP", timeout=60) == "UP"

        # (pattrs itself gets a garbled answer and fails a moment before the server dies)
        crash = d.run("--host", where, "-n", "1", "pattrs", "--host-fns", timeout=60)
        assert crash.returncode != 0
        assert "HOST SUPPORTED FUNCTIONS:" not in crash.stderr

        # the connected process went with its server, and says why
        assert finish(served, timeout=60) != 0
        why = served.stderr.read()
        assert "its PMIx server ended" in why, why
        # the plain process, the master and the daemons live on
        assert plain.poll() is None
        os.kill(d.pid, 0)
        for pid in daemon_pids.values():
            os.kill(pid, 0)
        assert d.cmd("ps", check=True).returncode == 0

        # the next PMIx job gets a new server
        again = d.run("--host", where, "-n", "2", client, "fence", timeout=60)
        assert again.returncode == 0, again.stdout + again.stderr
        assert again.stdout.count("FENCE status=0") == 2
        log = d.log(where if where != HEAD else "master")
        assert "PMIx server of uid" in log and "ended" in log
    finally:
        for p in (served, plain):
            if p.poll() is None:
                p.terminate()
            finish(p)


def _server_process(parent: int, directory: str) -> int:
    """The pid of node process ``parent``'s PMIx server process running in
    ``directory`` (``pmix-u<uid>``: a user's; ``pmix-tools``: the tool server)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid == parent and os.path.basename(os.readlink(f"/proc/{entry}/cwd")) \
                    == directory:
                return int(entry)
        except (OSError, ValueError, IndexError):
            continue
    raise AssertionError(f"no PMIx server process of pid {parent} in {directory}")


@pytest.mark.parametrize("node", sorted(NODES))
def test_a_hung_pmix_server_is_ended_by_the_watchdog_and_its_clients_jobs_say_why(
        make_pdvm, pmixcc, node):
    """A server process that stops answering (here: stopped, SIGSTOP -- as
    stuck as a hang inside libpmix leaves it) is killed after
    ``pydvm_pmix_watchdog`` seconds; its connected process's job ends saying
    so, the node and the master live on, the next PMIx job gets a new server."""
    import signal
    where = NODES[node]
    d = make_pdvm(pydvm_pmix_isolate="on", pydvm_pmix_watchdog="4")
    client = pmixcc("pmix_events")
    served = d.run_bg("--host", where, "-n", "1", client, "sleep:600000")
    stopped = None
    try:
        assert LineReader(served.stdout).wait_line("INIT", timeout=60) == "INIT status=0 rank=0"
        parent = d.pid if where == HEAD else d.daemon_pids[where]
        stopped = _server_process(parent, f"pmix-u{os.geteuid()}")
        os.kill(stopped, signal.SIGSTOP)

        assert finish(served, timeout=60) != 0
        why = served.stderr.read()
        assert "its PMIx server ended" in why and "hung" in why, why
        os.kill(d.pid, 0)
        for pid in d.daemon_pids.values():
            os.kill(pid, 0)
        again = d.run("--host", where, "-n", "2", client, "fence", timeout=60)
        assert again.returncode == 0, again.stdout + again.stderr
        assert again.stdout.count("FENCE status=0") == 2
        log = d.log(where if where != HEAD else "master")
        assert f"(pid {stopped}) hung: its process did not answer the node" in log, log[-3000:]
        # the stopped process was killed, not left behind (a zombie until reaped)
        try:
            with open(f"/proc/{stopped}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            state = "gone"
        assert state in ("Z", "gone"), state
    finally:
        if served.poll() is None:
            served.terminate()
        finish(served)


def test_with_isolation_no_node_process_hosts_a_libpmix_server(make_pdvm, pmixcc):
    """``pydvm_pmix_isolate=on``: jobs and tools are served by server
    processes, so neither the master nor a daemon starts a libpmix server of
    its own (whose directory is ``pydvm-pmix.<its pid>.*``): nothing a local
    user sends to a libpmix listener can reach those processes."""
    import glob
    import tempfile
    d = make_pdvm(pydvm_pmix_isolate="on")
    r = d.run("--host", f"{HEAD},{FAR}", "-n", "2", "--map-by", "node",
              pmixcc("pmix_events"), "fence", timeout=60)
    assert r.returncode == 0 and r.stdout.count("FENCE status=0") == 2, r.stdout + r.stderr
    root = os.path.join(tempfile.gettempdir(), f"pydvm-{os.getuid()}*")

    def servers_of(pid: int) -> list[str]:
        return glob.glob(os.path.join(root, "**", f"pydvm-pmix.{pid}.*"), recursive=True)
    nodes = {HEAD: d.pid, **{n: p for n, p in d.daemon_pids.items() if n != HEAD}}
    for name, pid in nodes.items():
        assert servers_of(pid) == [], name
        agent = _server_process(pid, f"pmix-u{os.geteuid()}")
        assert servers_of(agent), (name, "the server process's directory is where expected")
    assert servers_of(_server_process(d.pid, "pmix-tools"))
