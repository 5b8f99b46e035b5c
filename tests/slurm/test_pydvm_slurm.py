"""pydvm inside a real Slurm allocation: discovery, one srun step, loss, stop, the end.

The module's cluster names its nodes ``a``, ``b``, ``c`` (in network
namespaces sn1..sn3), so the multi-node cases of ``tests/e2e`` run here
unchanged with a DVM whose daemons Slurm started.  "Inside salloc" is real:
each test holds an allocation with ``salloc --no-kill`` running a small
holder that reports the environment salloc gave it, and every pydvm command
runs with that environment -- what a user's shell inside ``salloc`` has.
The master listens on the bridge (``PYDVM_BIND``), which the nodes reach;
the sbatch test runs the master on the allocation's first node and leaves
the bind address to pydvm's default.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cluster import SlurmCluster, need_cluster

sys.path.insert(0, str(Path(__file__).parents[1] / "e2e"))

import dvmkit  # noqa: E402
from dvmkit import PYDVM, Dvm, lines, status  # noqa: E402
from test_lookup_rules import (  # noqa: E402,F401
    test_local_range_item_is_held_by_its_daemon_and_seen_only_from_its_node,
)
from test_retention import (  # noqa: E402,F401
    test_app_item_goes_with_its_application_while_nspace_item_stays_until_job_end,
    test_first_read_item_survives_its_publishers_job_and_goes_with_the_first_read,
    test_nspace_item_survives_an_early_finishing_daemons_share_of_the_job,
    test_session_item_survives_its_job_and_goes_when_the_session_ends,
)
from test_waiting import (  # noqa: E402,F401
    test_waiting_lookup_on_one_daemon_is_answered_by_a_publish_on_another,
)

pytestmark = pytest.mark.slurm

NODES = ["a", "b", "c"]
#: prints the environment salloc gave it, then holds the allocation until stdin closes
HOLDER = "import json, os, sys; print(json.dumps(dict(os.environ)), flush=True); sys.stdin.read()"
DAEMON = r"-m pydvm daemon"


@pytest.fixture(scope="module")
def slurm_cluster():
    """This module's cluster: nodes a, b, c (namespaces sn1..sn3, tag 7)."""

    need_cluster()
    with SlurmCluster(names=tuple(NODES)) as c:
        yield c


# -- helpers ----------------------------------------------------------------------------

@contextlib.contextmanager
def salloc_env(c: SlurmCluster, tmp: Path, nodes: int = 3, args: tuple[str, ...] = ("--no-kill",)):
    """Hold an allocation; yield (job id, the environment a shell inside it has)."""
    p = c.popen("salloc", f"--nodes={nodes}", *args, sys.executable, "-c", HOLDER,
                stdin=subprocess.PIPE)
    try:
        ready, _, _ = select.select([p.stdout], [], [], 60)
        line = p.stdout.readline() if ready else ""
        if not line:
            p.kill()
            raise AssertionError(f"salloc gave no environment: {p.stderr.read()}")
        env = json.loads(line)
        env["PYDVM_STATE_DIR"] = str(tmp / "state")
        env["PYDVM_BIND"] = c.head_addr
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
        env.pop("PYDVM_URI", None)
        yield int(env["SLURM_JOB_ID"]), env
    finally:
        if p.poll() is None:
            p.stdin.close()  # the holder exits; salloc gives the allocation back
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def pydvm(env: dict, *args: str, cwd: Path | None = None, timeout: float = 60):
    return subprocess.run(PYDVM + list(args), env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def start(tmp: Path, env: dict, *args: str) -> Dvm:
    """``pydvm start --daemonize`` inside the allocation (env); a Dvm to drive it."""
    log_dir = tmp / "logs"
    p = pydvm(env, "start", "--daemonize", "--log-dir", str(log_dir), *args, cwd=tmp)
    assert p.returncode == 0, f"pydvm start failed ({p.returncode}): {p.stderr}"
    d = Dvm(p.stdout.strip().splitlines()[-1], env, log_dir)
    d.pid, d.daemon_pids = dvmkit._pids_from_info(d)
    return d


def daemon_pids(c: SlurmCluster) -> dict[str, list[int]]:
    """PIDs of pydvm daemons running on each node (in its own namespace); a daemon's
    guardian, a fork of it with the same command line, is not counted."""
    out = {}
    for n in c.nodes:
        found = c.find(n, DAEMON)
        out[n] = [p for p in found if _ppid(p) not in found]
    return out


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def our_steps(c: SlurmCluster, job: int):
    return [s for s in c.steps() if s.job_id == job]


def stop_and_check(c: SlurmCluster, d: Dvm, job: int) -> None:
    """pydvm stop: the master and every daemon gone, no step left, allocation running."""
    t0 = time.monotonic()
    r = d.cmd("stop", timeout=60)
    assert r.returncode == 0, r.stderr
    dvmkit.wait_for(lambda: not dvmkit.pid_alive(d.pid), timeout=20, what="the master to exit")
    c.wait_for(lambda: not our_steps(c, job), timeout=20, what="the daemon step to leave squeue")
    took = time.monotonic() - t0
    assert daemon_pids(c) == {n: [] for n in c.nodes}
    assert c.jobs()[job] == "RUNNING"
    print(f"\npydvm stop: master, daemons and step gone after {took:.2f} s")


@pytest.fixture
def dvm(slurm, tmp_path):
    """A DVM over the whole allocation a, b, c (for the imported e2e cases)."""
    with salloc_env(slurm, tmp_path) as (job, env):
        d = start(tmp_path, env)
        try:
            yield d
        finally:
            d.stop()


@pytest.fixture
def make_dvm(slurm, tmp_path):
    with contextlib.ExitStack() as stack:
        job, env = stack.enter_context(salloc_env(slurm, tmp_path))
        made: list[Dvm] = []

        def make(hosts: str = "a,b,c", **mca) -> Dvm:
            assert not made, "one DVM per allocation"
            args = ["--hosts", hosts]
            for k, v in mca.items():
                args += ["--mca", k, str(v)]
            made.append(start(tmp_path, env, *args))
            return made[-1]

        try:
            yield make
        finally:
            for d in made:
                d.stop()


# -- inside salloc ----------------------------------------------------------------------

def test_start_in_salloc_runs_one_daemon_step_over_the_allocation(slurm, tmp_path):
    """No --hosts, no --launcher: the allocation's nodes, one srun step, one daemon per
    node in that node's namespace; ranks land where the mapping says; stop ends the step
    and leaves the allocation."""
    with salloc_env(slurm, tmp_path) as (job, env):
        t0 = time.monotonic()
        d = start(tmp_path, env)
        up = time.monotonic() - t0
        info = d.cmd("info", check=True).stdout
        assert "launcher slurm, nodes from Slurm job " f"{job} (SLURM_JOB_NODELIST=a,b,c" in info
        assert f"logs in {tmp_path / 'logs'}" in info
        for n in NODES:
            assert f"node {n} slots=1 up" in info, info
        steps = our_steps(slurm, job)
        assert [(s.name, s.nodes, s.tasks) for s in steps] == [("pydvm-daemons", "a,b,c", 3)]
        pids = daemon_pids(slurm)
        assert all(len(p) == 1 for p in pids.values()), pids  # one daemon in each namespace
        for n in NODES:
            environ = Path(f"/proc/{pids[n][0]}/environ").read_bytes().split(b"\0")
            assert f"SLURMD_NODENAME={n}".encode() in environ
            assert f"SLURM_STEP_ID={steps[0].step_id}".encode() in environ

        # ranks 0..5 fill a, b, c one slot each, wrapping around
        p = d.run("-n", "6", "sh", "-c", 'echo "R $PYDVM_RANK $PYDVM_NODE $(hostname)"; '
                  'ip -o -4 addr show eth0')
        assert p.returncode == 0, p.stderr
        ranks = sorted(ln.split()[1:4] for ln in lines(p, "R "))
        assert ranks == [[str(r), NODES[r % 3], NODES[r % 3]] for r in range(6)], p.stdout
        for n, addr in slurm.addresses.items():
            assert f"inet {addr}/24" in p.stdout
        assert f"inet {slurm.head_addr}/" not in p.stdout
        logs = sorted(f.name for f in (tmp_path / "logs").iterdir())
        assert {"master.log", "a.log", "b.log", "c.log"} <= set(logs), logs
        stop_and_check(slurm, d, job)
        print(f"start over 3 nodes: {up:.2f} s")


def test_a_killed_daemon_task_is_a_lost_node_and_the_dvm_serves_on(slurm, tmp_path):
    """SIGKILL to b's daemon: b is lost (the step keeps its other tasks), jobs run on a
    and c, and stop still leaves no step."""
    with salloc_env(slurm, tmp_path) as (job, env):
        d = start(tmp_path, env)
        [pid] = daemon_pids(slurm)["b"]
        os.kill(pid, 9)
        dvmkit.wait_for(lambda: "node b slots=1 lost" in d.cmd("info").stdout, timeout=15,
                        what="b to be lost")
        assert [s.tasks for s in our_steps(slurm, job)] == [3]
        p = d.run("-n", "2", "sh", "-c", 'echo "R $PYDVM_RANK $PYDVM_NODE"')
        assert p.returncode == 0, p.stderr
        assert sorted(lines(p, "R ")) == ["R 0 a", "R 1 c"]
        q = d.run("--host", "a", "-n", "1", "pydvm", "publish", "k=v", "--persistence",
                  "session")
        assert status(q) == "PMIX_SUCCESS"
        assert "lost node b" in d.log("master")
        stop_and_check(slurm, d, job)


def test_hosts_pick_nodes_of_the_allocation_and_refuse_others(slurm, tmp_path):
    """In a 2-node allocation (a, b): --hosts c is refused naming c, before anything
    starts; --hosts b runs the DVM on b alone; a one-shot run uses the allocation too."""
    with salloc_env(slurm, tmp_path, nodes=2) as (job, env):
        r = pydvm(env, "start", "--daemonize", "--hosts", "a,c", cwd=tmp_path)
        assert r.returncode == 2
        assert f"host c is not in Slurm job {job}" in r.stderr, r.stderr
        r = pydvm(env, "run", "--host", "c", "-n", "1", "true", cwd=tmp_path)
        assert r.returncode == 2 and "host c is not in Slurm job" in r.stderr, r.stderr
        assert our_steps(slurm, job) == []

        r = pydvm(env, "run", "-n", "2", "sh", "-c", 'echo "R $PYDVM_RANK $(hostname)"',
                  cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert sorted(lines(r, "R ")) == ["R 0 a", "R 1 b"]

        d = start(tmp_path, env, "--hosts", "b")
        assert [s.nodes for s in our_steps(slurm, job)] == ["b"]
        assert "nodes from Slurm job" in d.cmd("info").stdout
        p = d.run("-n", "1", "hostname")
        assert p.stdout.split() == ["b"]
        stop_and_check(slurm, d, job)


def test_a_daemon_that_cannot_start_under_srun_fails_start_with_its_stderr(slurm, tmp_path):
    """A bad remote Python and a bad srun option: start fails at once, quoting what
    slurmstepd / srun said, and leaves no step behind."""
    with salloc_env(slurm, tmp_path, nodes=2) as (job, env):
        t0 = time.monotonic()
        r = pydvm(env, "start", "--mca", "pydvm_remote_python", "/nonexistent/python3",
                  cwd=tmp_path)
        took = time.monotonic() - t0
        assert r.returncode == 1
        assert "before reporting in" in r.stderr
        assert "execve(): /nonexistent/python3: No such file or directory" in r.stderr, r.stderr
        assert took < 15, took
        r = pydvm(env, "start", "--daemonize", "--mca", "plm_slurm_args", "--no-such-option",
                  cwd=tmp_path)
        assert r.returncode == 1
        assert "unrecognized option '--no-such-option'" in r.stderr, r.stderr
        assert our_steps(slurm, job) == []


def test_the_end_of_the_allocation_ends_the_dvm(slurm, tmp_path):
    """scancel JOB: the daemons get SIGTERM, srun exits, the master (which gets no signal
    under salloc) stops by itself; nothing of the DVM is left."""
    with salloc_env(slurm, tmp_path) as (job, env):
        d = start(tmp_path, env)
        bg = d.run_bg("-n", "3", "sleep", "300")
        dvmkit.wait_for(lambda: all(slurm.find(n, r"^sleep 300") for n in NODES),
                        what="the job on every node")
        t0 = time.monotonic()
        slurm.run("scancel", str(job), check=True)
        dvmkit.wait_for(lambda: not dvmkit.pid_alive(d.pid), timeout=30,
                        what="the master to stop")
        took = time.monotonic() - t0
        assert dvmkit.finish(bg) != 0
        assert daemon_pids(slurm) == {n: [] for n in NODES}
        assert all(not slurm.find(n, r"^sleep 300") for n in NODES)
        assert "every daemon is gone; stopping the DVM" in d.log("master")
        print(f"\nscancel {job}: DVM gone after {took:.2f} s")


# -- inside sbatch ----------------------------------------------------------------------

def test_sbatch_script_runs_a_dvm_on_its_first_node(slurm, tmp_path):
    """docs/clusters.md's sbatch script: the master runs on node a (no --bind: pydvm listens on
    all of a's interfaces and names itself a) and serves node a itself (the head node);
    daemons on b and c as one step."""
    state = tmp_path / "state"
    py = sys.executable
    script = f"""#!/bin/sh
export PYDVM_STATE_DIR={state} PATH={os.path.dirname(py)}:$PATH
cd {tmp_path}
export PYDVM_URI=$({py} -m pydvm start --daemonize) || exit 1
echo "URI $PYDVM_URI"
{py} -m pydvm info
echo "STEPS $(squeue --steps --noheader -j $SLURM_JOB_ID --format=%j:%N | sort | tr '\\n' ' ')"
{py} -m pydvm run --tag-output -n 3 sh -c 'echo "R $PYDVM_RANK $(hostname)"'
{py} -m pydvm run --host b -n 1 pydvm publish k=v --persistence session
{py} -m pydvm run --host c -n 1 pydvm lookup k
{py} -m pydvm stop
sleep 0.5
echo "AFTER $(squeue --steps --noheader -j $SLURM_JOB_ID --format=%j | sort | tr '\\n' ' ')"
"""
    r, out = slurm.sbatch_wait(script, "--nodes=3", "--no-kill", timeout=90)
    assert r.returncode == 0, (r.stderr, out)
    assert "URI " in out and "tcp://a:" in out, out
    assert "launcher slurm, nodes from Slurm job" in out
    assert "logs in " + str(state / "logs") in out, out  # the --daemonize default
    steps = next(ln for ln in out.splitlines() if ln.startswith("STEPS"))
    assert "pydvm-daemons:b,c" in steps, out
    assert "head node a: served by the master process" in out, out
    assert sorted(ln.split("] ")[1] for ln in out.splitlines() if "] R " in ln) == [
        "R 0 a", "R 1 b", "R 2 c"], out
    assert "FOUND k v from" in out, out
    after = next(ln for ln in out.splitlines() if ln.startswith("AFTER"))
    assert "pydvm-daemons" not in after, out
    [logs] = list((state / "logs").iterdir())
    assert {"master.log", "b.log", "c.log"} <= {f.name for f in logs.iterdir()}


# -- MPI programs inside an allocation ---------------------------------------------------

MPI4PY_WORLD = Path(__file__).parents[1] / "pmix_e2e" / "clients" / "mpi4py_world.py"


def _mpi4py_python() -> str:
    sys.path.insert(0, str(Path(__file__).parents[1] / "pmix"))
    from cbuild import find_mpi4py_python, require_libpmix
    require_libpmix()
    return find_mpi4py_python()


def test_an_mpi_job_in_salloc_is_one_job_on_pydvms_pmix_server(slurm, tmp_path):
    """`pydvm run --pmix -n 3 python3 allreduce.py` inside salloc: one MPI world of 3
    across the nodes, not three singletons (Open MPI's Slurm component would take
    the allocation's SLURM_* variables for a step of its own); the ranks see no
    resource manager's variable; Slurm lists no step but the daemons'."""
    py = _mpi4py_python()
    with salloc_env(slurm, tmp_path) as (job, env):
        d = start(tmp_path, env)
        try:
            p = d.run("--pmix", "-n", "3", py, str(MPI4PY_WORLD), timeout=90)
            assert p.returncode == 0, p.stdout + p.stderr
            for r in range(3):
                assert f"WORLD rank={r} size=3" in p.stdout, p.stdout
                assert f"SUM rank={r} sum=3" in p.stdout, p.stdout
            p = d.run("--pmix", "-n", "3", "sh", "-c",
                      # PMI_FD is pydvm's own: the socket on which a PMI-1
                      # client behind 'sh' would be told to use --mpi pmi1
                      'env | grep -E "^(SLURM|SLURMD|SRUN|PMI)_" | grep -v "^PMI_FD=" '
                      '| wc -l; hostname')
            assert p.returncode == 0, p.stdout + p.stderr
            assert sorted(p.stdout.split()) == ["0", "0", "0", "a", "b", "c"], p.stdout
            assert [s.name for s in our_steps(slurm, job)] == ["pydvm-daemons"]
        finally:
            d.stop()


def test_an_mpi_job_in_an_sbatch_script_is_one_job_on_pydvms_pmix_server(slurm, tmp_path):
    py = _mpi4py_python()
    state = tmp_path / "state"
    script = f"""#!/bin/sh
export PYDVM_STATE_DIR={state} PATH={os.path.dirname(sys.executable)}:$PATH
cd {tmp_path}
export PYDVM_URI=$(pydvm start --daemonize) || exit 1
pydvm run --pmix -n 3 {py} {MPI4PY_WORLD}
echo "RUN $?"
pydvm stop
"""
    r, out = slurm.sbatch_wait(script, "--nodes=3", "--no-kill", timeout=120)
    assert r.returncode == 0, (r.stderr, out)
    assert "RUN 0" in out, out
    for rank in range(3):
        assert f"WORLD rank={rank} size=3" in out, out
        assert f"SUM rank={rank} sum=3" in out, out


# -- outside an allocation --------------------------------------------------------------

def test_launcher_slurm_outside_an_allocation_is_refused(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PYDVM_STATE_DIR"] = str(tmp_path)
    r = pydvm(env, "start", "--launcher", "slurm")
    assert r.returncode == 2
    assert "--launcher slurm needs a Slurm allocation" in r.stderr
    assert "SLURM_JOB_ID is not set" in r.stderr
    assert not list(tmp_path.iterdir())  # nothing started, nothing written
