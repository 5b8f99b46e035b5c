"""What the Slurm launcher relies on, checked against real Slurm.

The daemons of a DVM run as one srun step built by
``pydvm.runtime.master.slurm.srun_argv``; here each such step runs ``sigtask.py``
(a stand-in daemon that logs what happens to it) so these tests pin down:
the allocation as the environment describes it, the secret reaching every
task on stdin, the step not holding the allocation's CPUs, ``squeue`` and
``scancel`` on it, and what ends which task when a daemon, a node, srun or
the allocation goes away.  Measured times are printed (``pytest -s``).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cluster import SlurmCluster

from pydvm.runtime.shared.jobs import HostSpec
from pydvm.runtime.master.slurm import (
    SlurmEnvError,
    allocation_from_env,
    node_from_env,
    select_hosts,
    srun_argv,
)

pytestmark = pytest.mark.slurm

SIGTASK = str(Path(__file__).with_name("sigtask.py"))
DUMP_ENV = [sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"]


# -- helpers ----------------------------------------------------------------------------

class Daemons:
    """A stand-in daemon step: one sigtask.py per node, started by srun_argv's line."""

    def __init__(self, c: SlurmCluster, job: int, nodes: list[str], name: str, **kw):
        self.c, self.nodes = c, nodes
        self.logdir = c.last_dir / "out" / name
        self.logdir.mkdir()
        argv = srun_argv([HostSpec(n) for n in nodes],
                         [sys.executable, SIGTASK, str(self.logdir), "--stdin"],
                         kw.pop("extra", "") + f" --jobid={job}", **kw)
        self.srun = c.popen(*argv, stdin=subprocess.PIPE)
        self.srun.stdin.write("SECRET-1234\n")
        self.srun.stdin.close()
        c.wait_for(lambda: all(self.got(n, "stdin") for n in nodes), what="every task's stdin")
        self.step = next(s for s in c.steps() if s.job_id == job and s.name == "pydvm-daemons")

    def events(self, node: str) -> list[tuple[float, str]]:
        try:
            text = (self.logdir / f"{node}.log").read_text()
        except FileNotFoundError:
            return []
        return [(float(t), e) for t, _, e in (line.partition(" ") for line in text.splitlines())]

    def got(self, node: str, prefix: str) -> list[tuple[float, str]]:
        return [(t, e) for t, e in self.events(node) if e.startswith(prefix)]

    def pids(self, node: str) -> list[int]:
        return self.c.find(node, r"sigtask\.py")

    def alive(self) -> dict[str, bool]:
        return {n: bool(self.pids(n)) for n in self.nodes}

    def finish(self) -> tuple[int, str]:
        """Wait for srun to exit; (its status, its stderr)."""
        self.srun.wait(timeout=60)
        return self.srun.returncode, self.srun.stderr.read()


def alloc_env(c: SlurmCluster, *salloc_args: str, cmd=DUMP_ENV) -> dict[str, str]:
    r = c.run("salloc", *salloc_args, *cmd, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


# -- the allocation, as the environment describes it ----------------------------------

@pytest.mark.parametrize("args, slots", [
    (("-N3",), [1, 1, 1]),
    (("-n5",), [2, 2, 1]),
    (("-N2", "-n3"), [2, 1]),
    (("-N3", "--exclusive"), [2, 2, 2]),
    (("-N3", "-c2"), [1, 1, 1]),  # cpus-per-task already applied by Slurm
    (("-N3", "--ntasks-per-node=2"), [2, 2, 2]),
])
def test_allocation_from_real_environment(slurm, args, slots):
    env = alloc_env(slurm, *args)
    a = allocation_from_env(env)
    assert a.job_id == env["SLURM_JOB_ID"]
    assert [h.slots for h in a.nodes] == slots
    assert a.names == slurm.nodes[:len(slots)]
    assert a.source.startswith(f"Slurm job {a.job_id} (SLURM_JOB_NODELIST=sn[1-")
    if "-c2" in args:
        assert a.cpus_per_task == 2 and env["SLURM_JOB_CPUS_PER_NODE"] == "2(x3)"
    assert select_hosts(a, [HostSpec("sn1")]) == [HostSpec("sn1")]
    with pytest.raises(SlurmEnvError, match="host sn9 is not in Slurm job"):
        select_hosts(a, [HostSpec("sn9")])


def test_allocation_inside_a_job_step(slurm):
    """A master started by srun sees the step's task counts: refused unless slots='cpus'."""
    env = alloc_env(slurm, "-n5", cmd=["srun", "-N1", "-n1", *DUMP_ENV])
    assert env["SLURM_TASKS_PER_NODE"] == "1" and env["SLURM_STEP_ID"] == "0"
    with pytest.raises(SlurmEnvError, match="inside job step"):
        allocation_from_env(env)
    assert [h.slots for h in allocation_from_env(env, slots="cpus").nodes] == [2, 2, 1]


def test_sbatch_environment(slurm):
    r, out = slurm.sbatch_wait(f"#!/bin/sh\n{' '.join(DUMP_ENV[:2])} '{DUMP_ENV[2]}'\n",
                               "--nodes=3")
    assert r.returncode == 0, r.stderr
    a = allocation_from_env(json.loads(out))
    assert a.nodes == tuple(HostSpec(n) for n in slurm.nodes)


# -- the daemon step --------------------------------------------------------------------

def test_one_step_every_task_reads_the_secret(slurm):
    """One srun, three tasks, one per node; each reads the line written to srun's stdin,
    and learns its node name from SLURMD_NODENAME (node_from_env)."""
    reader = [sys.executable, "-c",
              "import os, sys; print(os.environ['SLURMD_NODENAME'], sys.argv[1:], "
              "sys.stdin.readline().strip())"]

    def body(env):
        return srun_argv(allocation_from_env(env).nodes, node_from_env(reader))

    env = alloc_env(slurm, "-N3")
    argv = body(env)  # the same line inside any 3-node allocation
    r = slurm.run("salloc", "-N3", *argv, input="SECRET-1234\n", timeout=60)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == [
        f"{n} ['--node', '{n}'] SECRET-1234" for n in slurm.nodes]


def test_daemon_step_leaves_the_allocation_to_job_steps(slurm):
    """With the daemons running, an application step can still use every CPU."""
    with slurm.allocation(nodes=3, args=("--ntasks-per-node=2",)) as job:
        d = Daemons(slurm, job, slurm.nodes, "share")
        r = slurm.run("srun", f"--jobid={job}", "-N3", "--ntasks-per-node=2", "hostname",
                      timeout=30)
        assert r.returncode == 0, r.stderr
        assert sorted(r.stdout.split()) == sorted(slurm.nodes * 2)
        assert all(d.alive().values())


def test_daemon_step_without_overlap_would_block_job_steps(slurm):
    """Why --overlap: without it the next step waits for CPUs the daemons hold."""
    with slurm.allocation(nodes=3) as job:
        argv = [a for a in srun_argv(slurm.nodes, ["sleep", "300"], f"--jobid={job}")
                if a != "--overlap"]
        slurm.popen(*argv)
        slurm.wait_for(lambda: [s for s in slurm.steps() if s.job_id == job], what="step")
        with pytest.raises(subprocess.TimeoutExpired):
            slurm.run("srun", f"--jobid={job}", "-N3", "hostname", timeout=5)


def test_squeue_shows_the_step_and_scancel_step_ends_it(slurm):
    with slurm.allocation(nodes=3) as job:
        d = Daemons(slurm, job, slurm.nodes, "cancel")
        assert (d.step.nodes, d.step.tasks) == ("sn[1-3]", 3)
        t0 = time.monotonic()
        slurm.run("scancel", d.step.id, check=True)
        slurm.wait_for(lambda: not any(d.alive().values()), timeout=10, what="tasks to end")
        gone = time.monotonic() - t0
        rc, err = d.finish()
        print(f"\nscancel {d.step.id}: tasks gone after {gone:.2f} s; srun exit {rc}")
        # SIGKILL at once: no task saw a signal it could catch
        assert all(d.got(n, "signal") == [] for n in slurm.nodes)
        assert slurm.jobs()[job] == "RUNNING"
        assert [s for s in slurm.steps() if s.job_id == job] == []
        assert slurm.run("srun", f"--jobid={job}", "-N3", "true", timeout=30).returncode == 0


def test_lost_daemon_leaves_the_others_running(slurm):
    """The recommended line: one daemon SIGKILLed, the other two and srun go on."""
    with slurm.allocation(nodes=3) as job:
        d = Daemons(slurm, job, slurm.nodes, "lost")
        for pid in d.pids("sn2"):
            slurm.in_node("sn2", "kill", "-KILL", str(pid))
        time.sleep(3)
        assert d.alive() == {"sn1": True, "sn2": False, "sn3": True}
        assert d.srun.poll() is None
        assert [s.tasks for s in slurm.steps() if s.id == d.step.id] == [3]
        assert all(d.got(n, "signal") == [] for n in ("sn1", "sn3"))
        slurm.run("scancel", d.step.id, check=True)
        rc, err = d.finish()
        assert "sn2: task 1: Killed" in err


def test_kill_on_bad_exit_ends_the_whole_step(slurm):
    """With --kill-on-bad-exit=1 one daemon's death ends all: SIGTERM, then SIGKILL."""
    with slurm.allocation(nodes=3) as job:
        d = Daemons(slurm, job, slurm.nodes, "badexit", kill_on_bad_exit=True)
        t0 = time.time()
        for pid in d.pids("sn2"):
            slurm.in_node("sn2", "kill", "-KILL", str(pid))
        slurm.wait_for(lambda: not any(d.alive().values()), timeout=slurm.kill_wait + 10,
                       what="the other tasks to be killed")
        gone = time.time() - t0
        rc, err = d.finish()
        for n in ("sn1", "sn3"):
            sigs = [e for _, e in d.got(n, "signal")]
            assert "signal SIGTERM" in sigs, (n, d.events(n))
        term = max(t for n in ("sn1", "sn3") for t, e in d.got(n, "signal SIGTERM")) - t0
        print(f"\n--kill-on-bad-exit: others got SIGTERM after {term:.2f} s, were gone after "
              f"{gone:.2f} s (KillWait={slurm.kill_wait}); srun exit {rc}")
        assert rc != 0
        assert slurm.jobs()[job] == "RUNNING"  # the step ended, not the allocation


def test_a_wait_limit_would_end_the_survivors(slurm):
    """Why --wait=0: with srun --wait=N (or a site WaitTime) the survivors are killed
    N seconds after the first task exits.  (User options come last and win.)"""
    with slurm.allocation(nodes=3) as job:
        d = Daemons(slurm, job, slurm.nodes, "waitlimit", extra="--wait=2")
        for pid in d.pids("sn2"):
            slurm.in_node("sn2", "kill", "-KILL", str(pid))
        slurm.wait_for(lambda: not any(d.alive().values()), timeout=20,
                       what="the survivors to be ended")
        rc, err = d.finish()
        assert "First task exited" in err


def test_srun_terminated_kills_tasks_at_once(slurm):
    """SIGTERM to srun (the master stopping it) ends the step with SIGKILL: the
    daemons get no signal they could act on, so a clean stop must be asked for
    over the DVM's own connection first."""
    with slurm.allocation(nodes=3) as job:
        d = Daemons(slurm, job, slurm.nodes, "srunterm")
        t0 = time.monotonic()
        d.srun.send_signal(signal.SIGTERM)
        rc, err = d.finish()
        slurm.wait_for(lambda: not any(d.alive().values()), timeout=10, what="tasks to end")
        print(f"\nSIGTERM to srun: srun exit {rc} after {time.monotonic() - t0:.2f} s; "
              f"stderr: {err.strip()!r}")
        assert all(d.got(n, "signal") == [] for n in slurm.nodes)
        assert slurm.jobs()[job] == "RUNNING"


def test_allocation_end(slurm):
    """scancel JOBID: every task gets SIGTERM (and SIGCONT) at once, SIGKILL after
    KillWait seconds; srun then exits."""
    with slurm.allocation(nodes=3) as job:
        d = Daemons(slurm, job, slurm.nodes, "allocend")
        t0 = time.time()
        slurm.run("scancel", str(job), check=True)
        slurm.wait_for(lambda: not any(d.alive().values()), timeout=slurm.kill_wait + 15,
                       what="tasks to end")
        gone = time.time() - t0
        rc, err = d.finish()
        srun_done = time.time() - t0
        terms = [t - t0 for n in slurm.nodes for t, _ in d.got(n, "signal SIGTERM")]
        conts = [t - t0 for n in slurm.nodes for t, _ in d.got(n, "signal SIGCONT")]
        print(f"\nscancel {job}: SIGTERM after {min(terms):.3f}-{max(terms):.3f} s, SIGCONT "
              f"after {min(conts):.3f}-{max(conts):.3f} s, tasks gone after {gone:.2f} s, "
              f"srun exit {rc} after {srun_done:.2f} s (KillWait={slurm.kill_wait})")
        assert len(terms) == 3 and max(terms) < 2
        assert slurm.kill_wait - 1 < gone < slurm.kill_wait + 5


# -- losing a node ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def fast_down(make_slurm_cluster_module):
    """A cluster (sy1..sy3) that declares a silent node DOWN after a few seconds."""
    return make_slurm_cluster_module(tag=9, prefix="sy", slurmd_timeout=5)


def _node_loss(c: SlurmCluster, job_no_kill: bool) -> tuple[dict, str, float]:
    args = ("--no-kill",) if job_no_kill else ()
    with c.allocation(nodes=3, args=args) as job:
        d = Daemons(c, job, c.nodes, f"nodeloss{int(job_no_kill)}")
        t0 = time.monotonic()
        c.kill_node("sy2")
        c.wait_for(lambda: c.run("sinfo", "-h", "-n", "sy2", "-o", "%t").stdout.strip()
                   .startswith("down"), timeout=60, what="sy2 to be DOWN")
        down = time.monotonic() - t0
        time.sleep(2)
        state = {"alive": d.alive(), "srun": d.srun.poll() is None,
                 "job": c.jobs().get(job, "gone")}
    c.restart_node("sy2")
    return state, d.srun.stderr.read() if d.srun.poll() is not None else "", down


def test_lost_node_with_no_kill_job(fast_down):
    """salloc --no-kill + the recommended srun line: the DVM loses sy2 only."""
    state, _, down = _node_loss(fast_down, job_no_kill=True)
    print(f"\nnode sy2 killed: DOWN after {down:.1f} s (SlurmdTimeout=5); then {state}")
    assert state == {"alive": {"sy1": True, "sy2": False, "sy3": True}, "srun": True,
                     "job": "RUNNING"}


def test_lost_node_without_no_kill_job_ends_the_allocation(fast_down):
    """Without --no-kill on the job Slurm revokes the allocation when a node fails,
    whatever srun's options: pydvm can only advise users to allocate with --no-kill."""
    state, _, down = _node_loss(fast_down, job_no_kill=False)
    print(f"\nnode sy2 killed, job without --no-kill: {state}")
    assert state["alive"]["sy2"] is False
    assert state["job"] in ("COMPLETING", "gone")
