"""Sanity tests of the Slurm test cluster itself (cluster.py, conftest.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import pytest
from cluster import ClusterError, SlurmCluster, _all_pids, _descendants, _zombie

pytestmark = pytest.mark.slurm


def test_all_nodes_idle(slurm):
    assert slurm.nodes == ["sn1", "sn2", "sn3"]
    r = slurm.run("sinfo", "--noheader", "--Node", "--format=%N %t", check=True)
    assert sorted(r.stdout.split("\n")[:-1]) == ["sn1 idle", "sn2 idle", "sn3 idle"]


def test_salloc_srun_hostname(slurm):
    r = slurm.salloc("srun", "--ntasks-per-node=1", "hostname", nodes=3)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split()) == ["sn1", "sn2", "sn3"]


def test_tasks_see_their_own_node(slurm):
    """Each task runs in its node's namespaces: its own address, hostname and hosts file."""
    script = ('import os, socket; n = os.environ["SLURMD_NODENAME"]; '
              'print(n, socket.gethostname(), socket.gethostbyname(n), '
              'socket.gethostbyname("snhead"), socket.gethostbyname(socket.gethostname()))')
    r = slurm.salloc("srun", "--ntasks-per-node=1", sys.executable, "-c", script)
    assert r.returncode == 0, r.stderr
    rows = sorted(line.split() for line in r.stdout.splitlines())
    assert rows == [[n, n, slurm.addresses[n], slurm.head_addr, slurm.addresses[n]]
                    for n in slurm.nodes]


def test_task_reaches_host_side_by_tcp(slurm):
    """The pydvm master will listen on the host side: every node reaches it by name."""
    srv = socket.create_server((slurm.head_addr, 0))
    srv.settimeout(30)
    port = srv.getsockname()[1]
    got: list[str] = []

    def serve():
        try:
            for _ in slurm.nodes:
                conn, addr = srv.accept()
                with conn:
                    got.append(f"{conn.recv(100).decode()}@{addr[0]}")
        except OSError:
            pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        for name in slurm.host_names:  # snhead and this machine's own hostname
            got.clear()
            client = ("import os, socket; "
                      f"s = socket.create_connection(({name!r}, {port}), timeout=10); "
                      "s.sendall(os.environ['SLURMD_NODENAME'].encode()); s.close()")
            if not t.is_alive():
                t = threading.Thread(target=serve, daemon=True)
                t.start()
            r = slurm.salloc("srun", "--ntasks-per-node=1", sys.executable, "-c", client)
            assert r.returncode == 0, r.stderr
            t.join(10)
            assert sorted(got) == sorted(f"{n}@{a}" for n, a in slurm.addresses.items())
    finally:
        srv.close()


def test_nodes_reach_each_other_by_name(slurm):
    """A task on sn1 connects to a server in a task on sn3, by node name."""
    server = ("import socket; s = socket.create_server(('', 7777)); s.settimeout(20); "
              "c, a = s.accept(); print('from', a[0], c.recv(10).decode())")
    client = ("import socket, time\n"
              "for i in range(100):\n"
              "    try:\n"
              "        s = socket.create_connection(('sn3', 7777), timeout=5); break\n"
              "    except OSError:\n"
              "        time.sleep(0.1)\n"
              "s.sendall(b'hello')\n")
    script = (f"srun -N1 -w sn3 --overlap {sys.executable} -c \"{server}\" & "
              f"srun -N1 -w sn1 --overlap {sys.executable} -c \"{client}\"; wait")
    r = slurm.salloc("sh", "-c", script)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["from", slurm.addresses["sn1"], "hello"]


def test_sbatch_wait(slurm):
    r, out = slurm.sbatch_wait(
        "#!/bin/sh\necho batch on $(hostname) job $SLURM_JOB_ID\n"
        "srun --ntasks-per-node=1 hostname | sort\n", "--nodes=3")
    assert r.returncode == 0, r.stderr
    lines = out.split("\n")
    assert lines[0] == f"batch on sn1 job {r.stdout.strip()}"
    assert lines[1:4] == ["sn1", "sn2", "sn3"]


def test_allocation_environment(slurm):
    r = slurm.salloc("env", nodes=3)
    env = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
    assert env["SLURM_JOB_ID"].isdigit()
    assert env["SLURM_JOB_NODELIST"] == "sn[1-3]"
    assert env["SLURM_TASKS_PER_NODE"] == "1(x3)"
    r = slurm.salloc("env", nodes=None, args=("--ntasks=5",))
    env = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
    assert env["SLURM_TASKS_PER_NODE"] == "2(x2),1"
    assert env["SLURM_JOB_CPUS_PER_NODE"] == "2(x2),1"


def test_steps_and_scancel_step(slurm):
    """``scancel JOB.STEP`` ends that step; the allocation and its other steps survive."""
    with slurm.allocation(nodes=3) as job:
        long = slurm.popen("srun", f"--jobid={job}", "--nodes=3", "--ntasks-per-node=1", "--overlap",
                           "--job-name=long", "sleep", "300")
        other = slurm.popen("srun", f"--jobid={job}", "--nodes=1", "--overlap",
                            "--job-name=other", "sleep", "300")
        steps = slurm.wait_for(lambda: len(slurm.steps()) == 2 and slurm.steps(),
                               what="two steps")
        by_name = {s.name: s for s in steps}
        assert by_name["long"].nodes == "sn[1-3]" and by_name["long"].tasks == 3
        assert by_name["other"].tasks == 1
        slurm.wait_for(lambda: slurm.find("sn2", r"(^|/)sleep 300$"), what="the task on sn2")
        slurm.run("scancel", by_name["long"].id, check=True)
        long.wait(timeout=20)
        assert [s.name for s in slurm.steps()] == ["other"]
        assert slurm.jobs()[job] == "RUNNING"
        assert not slurm.find("sn2", r"(^|/)sleep 300$")
        assert slurm.run("srun", f"--jobid={job}", "--overlap", "true", timeout=30).returncode == 0
        assert other.poll() is None


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def _leftover_free(c: SlurmCluster) -> None:
    assert c.procs == {} and c.clients == []
    assert c.leftovers() == []


def test_bring_up_and_tear_down_leave_nothing(make_slurm_cluster):
    """A cluster of its own (names sx1..sx3): after down(), nothing of it is left,
    not even a task that escaped its step with setsid."""
    c = make_slurm_cluster(tag=8, prefix="sx")
    assert c.up_seconds < 15
    with c.allocation(nodes=3) as job:
        # (its output must not be srun's, or srun would wait for it)
        c.run("srun", f"--jobid={job}", "-N3", "--ntasks-per-node=1", "--overlap", "setsid", "-f",
              "sh", "-c", "exec sleep 600 </dev/null >/dev/null 2>&1", check=True, timeout=30)
        # escaped: still there after its step
        c.wait_for(lambda: c.find("sx2", r"(^|/)sleep 600$"), what="the escaped task")
    assert c.find("sx2", r"(^|/)sleep 600$")
    bg = c.popen("salloc", "-N3", "sleep", "600")  # a client left running, with a child
    c.wait_for(lambda: c.jobs(), what="the salloc job")
    kids = c.wait_for(lambda: _descendants(bg.pid), what="salloc's command")
    c.down()
    print(f"\nbring-up {c.up_seconds:.2f} s, tear-down {c.down_seconds:.2f} s")
    assert c.down_seconds < 15
    assert bg.poll() is not None
    assert [k for k in kids if os.path.exists(f"/proc/{k}") and not _zombie(k)] == []
    _leftover_free(c)


@pytest.mark.parametrize("how", ["exits", "never-registers"])
def test_failed_bring_up_cleans_up(make_slurm_cluster, how):
    """A bring-up that fails half way raises ClusterError with the daemons' logs,
    and removes what it had made: when a daemon exits at once, and when a node
    never registers (the deadline)."""

    class Broken(SlurmCluster):
        def _start_slurmd(self, i, node):
            if i != 2:
                return super()._start_slurmd(i, node)
            if how == "exits":
                argv = ["sh", "-c", "echo sx2 cannot start >&2; exit 3"]
            else:  # a slurmd that keeps looking for a configuration it cannot find
                argv = ["slurmd", "-D", "-N", node, "-f", "/nonexistent/slurm.conf"]
            self._spawn(f"slurmd-{node}", ["nsenter", f"--net=/run/netns/{node}", "--", *argv])

    c = Broken(tag=8, prefix="sx", up_timeout=4)
    with pytest.raises(ClusterError) as e:
        with c:
            pass
    msg = str(e.value)
    if how == "exits":
        assert msg.startswith("slurmd-sx2 exited with status 3 during bring-up")
        assert "sx2 cannot start" in msg
    else:
        assert msg.startswith("nodes not idle after 4 s")
    assert "--- slurmctld.out ---" in msg and "--- slurmd-sx2.out ---" in msg
    _leftover_free(c)


def test_second_cluster_with_same_tag_is_refused(slurm):
    with pytest.raises(ClusterError, match="another Slurm test cluster with tag 7"):
        with SlurmCluster():
            pass
    # the refused one touched nothing of the running one
    assert slurm.run("sinfo", "--noheader", "--format=%t").stdout.split() == ["idle"]


def test_commands_time_out_and_are_killed(slurm):
    """A client command that overruns is ended with everything it started, and
    its allocation is given back (salloc gets SIGTERM before SIGKILL)."""
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        slurm.salloc("sh", "-c", "sleep 600; :", timeout=2)
    assert time.monotonic() - t0 < 10
    slurm.wait_for(lambda: not slurm.jobs(), timeout=30, what="the killed salloc's job to end")
    assert not [pid for pid in _all_pids() if _cmdline(pid) == "sleep 600"]


def test_unavailable_reason_names_what_is_missing(monkeypatch):
    """Runs anywhere: the skip reason tells what to install, or that root is needed."""
    import cluster

    monkeypatch.setattr(cluster.os, "geteuid", lambda: 1000)
    assert "needs root" in cluster.unavailable_reason()
    monkeypatch.setattr(cluster.os, "geteuid", lambda: 0)
    real = cluster._which
    monkeypatch.setattr(cluster, "_which",
                        lambda p: None if p in ("slurmd", "sinfo", "munged") else real(p))
    assert cluster.unavailable_reason() == (
        "Slurm test cluster: missing packages "
        "(apt-get install --no-install-recommends munge slurm-client slurmd)")
