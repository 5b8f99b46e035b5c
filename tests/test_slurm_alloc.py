"""Unit tests of pydvm.runtime.master.slurm: Slurm allocation parsing and the srun line.

The environments here are the shapes Slurm 22.05 writes (checked on the test
cluster of tests/slurm, where test_srun_launch.py feeds real ones through the
same functions).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pydvm.runtime.shared.jobs import HostSpec, parse_hosts
from pydvm.runtime.master.slurm import (
    Allocation,
    SlurmEnvError,
    allocation_from_env,
    compress_hosts,
    expand_hosts,
    in_allocation,
    node_from_env,
    parse_tasks_per_node,
    select_hosts,
    srun_argv,
)


def env(**kw: str) -> dict[str, str]:
    base = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "sn[1-3]",
            "SLURM_TASKS_PER_NODE": "1(x3)", "SLURM_JOB_NUM_NODES": "3"}
    base.update(kw)
    return {k: v for k, v in base.items() if v is not None}


# -- in_allocation ----------------------------------------------------------------------

def test_in_allocation():
    assert in_allocation(env())
    assert in_allocation({"SLURM_JOBID": "7"})
    assert not in_allocation({})
    assert not in_allocation({"SLURM_JOB_ID": "  "})
    assert not in_allocation({"SLURM_NODELIST": "sn1", "SLURMD_NODENAME": "sn1"})


# -- host lists -------------------------------------------------------------------------

@pytest.mark.parametrize("text, names", [
    ("sn[1-3]", ["sn1", "sn2", "sn3"]),
    ("n[01-04,07]", ["n01", "n02", "n03", "n04", "n07"]),
    ("n[01-04,07],login2", ["n01", "n02", "n03", "n04", "n07", "login2"]),
    ("c3,c1,c2", ["c3", "c1", "c2"]),  # allocation order is kept
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("node-a.example", ["node-a.example"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
])
def test_expand_hosts(text, names):
    assert expand_hosts(text) == names


@pytest.mark.parametrize("text, why", [
    ("n[1-3", "unbalanced"), ("n]1", "unbalanced"), ("n[3-1]", "start > stop"),
    ("n[a-c]", "bad range"), ("", "no host names"), ("n1,n1", "twice"),
    ("n[1-2],n2", "twice"),
])
def test_expand_hosts_errors(text, why):
    with pytest.raises(SlurmEnvError, match=why):
        expand_hosts(text)


def test_compress_hosts():
    assert compress_hosts(["sn1", "sn2", "sn3"]) == "sn[1-3]"
    assert compress_hosts(["n07", "n01", "n02", "n03", "n04"]) == "n[01-04,07]"
    assert compress_hosts(["login", "sn2"]) == "login,sn2"


# -- tasks per node ---------------------------------------------------------------------

@pytest.mark.parametrize("text, counts", [
    ("1(x3)", [1, 1, 1]),
    ("2(x3),1", [2, 2, 2, 1]),
    ("4", [4]),
    ("2,1(x2),3", [2, 1, 1, 3]),
    ("16(x1)", [16]),
    (" 2(x2) , 1", [2, 2, 1]),
])
def test_parse_tasks_per_node(text, counts):
    assert parse_tasks_per_node(text) == counts


@pytest.mark.parametrize("text", [
    "", "x", "0", "2(x0)", "2(3)", "2(x3", "-1", "2(x-1)", "1,,2", "2 (x3)", "1.5", "2(X3)",
    "1(x2000000)",
])
def test_parse_tasks_per_node_errors(text):
    with pytest.raises(SlurmEnvError, match="SLURM_TASKS_PER_NODE"):
        parse_tasks_per_node(text)


def _slurm_format(counts: list[int]) -> str:
    """Write counts the way Slurm does: runs of equal counts as COUNT(xN)."""
    out, i = [], 0
    while i < len(counts):
        j = i
        while j < len(counts) and counts[j] == counts[i]:
            j += 1
        out.append(f"{counts[i]}(x{j - i})" if j - i > 1 else str(counts[i]))
        i = j
    return ",".join(out)


@given(st.lists(st.integers(1, 128), min_size=1, max_size=50))
def test_parse_tasks_per_node_round_trip(counts):
    assert parse_tasks_per_node(_slurm_format(counts)) == counts


# -- allocation_from_env ----------------------------------------------------------------

def test_allocation_basic():
    a = allocation_from_env(env())
    assert a == Allocation("42", (HostSpec("sn1"), HostSpec("sn2"), HostSpec("sn3")),
                           "Slurm job 42 (SLURM_JOB_NODELIST=sn[1-3], "
                           "SLURM_TASKS_PER_NODE=1(x3))", 1)
    assert a.names == ["sn1", "sn2", "sn3"]
    assert a.slots("sn2") == 1


def test_allocation_uneven_slots_in_allocation_order():
    # salloc -n5 on three 2-CPU nodes
    a = allocation_from_env(env(SLURM_TASKS_PER_NODE="2(x2),1", SLURM_NTASKS="5"))
    assert a.nodes == (HostSpec("sn1", 2), HostSpec("sn2", 2), HostSpec("sn3", 1))
    a = allocation_from_env(env(SLURM_JOB_NODELIST="n[01-04,07]", SLURM_JOB_NUM_NODES="5",
                                SLURM_TASKS_PER_NODE="4,2(x3),1"))
    assert [(h.name, h.slots) for h in a.nodes] == [
        ("n01", 4), ("n02", 2), ("n03", 2), ("n04", 2), ("n07", 1)]


def test_allocation_old_variable_names():
    a = allocation_from_env({"SLURM_JOBID": "9", "SLURM_NODELIST": "b,a",
                             "SLURM_TASKS_PER_NODE": "3,1"})
    assert a.job_id == "9" and a.nodes == (HostSpec("b", 3), HostSpec("a", 1))
    assert a.source == "Slurm job 9 (SLURM_NODELIST=b,a, SLURM_TASKS_PER_NODE=3,1)"


def test_cpus_per_task_does_not_divide_task_counts():
    # salloc -N3 -c2 on 2-CPU nodes: Slurm already wrote one task per node
    a = allocation_from_env(env(SLURM_CPUS_PER_TASK="2", SLURM_JOB_CPUS_PER_NODE="2(x3)"))
    assert [h.slots for h in a.nodes] == [1, 1, 1]
    assert a.cpus_per_task == 2
    assert a.source.endswith("SLURM_CPUS_PER_TASK=2)")
    # salloc -N2 --ntasks-per-node=4 -c2 on 8-CPU nodes
    a = allocation_from_env(env(SLURM_JOB_NODELIST="n[1-2]", SLURM_JOB_NUM_NODES="2",
                                SLURM_TASKS_PER_NODE="4(x2)", SLURM_CPUS_PER_TASK="2"))
    assert [h.slots for h in a.nodes] == [4, 4]


def test_slots_from_cpus_divided_by_cpus_per_task():
    base = env(SLURM_JOB_NODELIST="n[1-3]", SLURM_JOB_CPUS_PER_NODE="8,4,1")
    a = allocation_from_env(base, slots="cpus")
    assert [h.slots for h in a.nodes] == [8, 4, 1]
    assert a.source == "Slurm job 42 (SLURM_JOB_NODELIST=n[1-3], SLURM_JOB_CPUS_PER_NODE=8,4,1)"
    a = allocation_from_env({**base, "SLURM_CPUS_PER_TASK": "3"}, slots="cpus")
    assert [h.slots for h in a.nodes] == [2, 1, 1]  # rounded down, at least one
    with pytest.raises(SlurmEnvError, match="SLURM_JOB_CPUS_PER_NODE is not set"):
        allocation_from_env(env(), slots="cpus")
    with pytest.raises(ValueError, match="slots must be"):
        allocation_from_env(env(), slots="cores")


def test_inside_a_job_step():
    # what a master started by `srun -N1` inside `salloc -N3 -n5` sees
    step = env(SLURM_STEP_ID="0", SLURM_TASKS_PER_NODE="1", SLURM_NODELIST="sn[1-3]",
               SLURM_STEP_NODELIST="sn1", SLURM_JOB_CPUS_PER_NODE="2(x2),1", SLURM_NNODES="1")
    with pytest.raises(SlurmEnvError, match=r"inside job step 42\.0.*the salloc command"):
        allocation_from_env(step)
    a = allocation_from_env(step, slots="cpus")
    assert [h.slots for h in a.nodes] == [2, 2, 1]


def test_more_counts_than_nodes_is_tolerated():
    a = allocation_from_env(env(SLURM_JOB_NODELIST="sn1", SLURM_JOB_NUM_NODES=None,
                                SLURM_TASKS_PER_NODE="4(x30)"))
    assert a.nodes == (HostSpec("sn1", 4),)


@pytest.mark.parametrize("kw, message", [
    ({"SLURM_JOB_ID": None}, "not inside a Slurm job: SLURM_JOB_ID is not set"),
    ({"SLURM_JOB_ID": "abc"}, "bad SLURM_JOB_ID 'abc': expected a job number"),
    ({"SLURM_JOB_ID": "12_3"}, "bad SLURM_JOB_ID"),
    ({"SLURM_JOB_NODELIST": None}, "Slurm job 42: SLURM_JOB_NODELIST is not set"),
    ({"SLURM_JOB_NODELIST": ""}, "SLURM_JOB_NODELIST is not set"),
    ({"SLURM_JOB_NODELIST": "sn[1-3"}, "bad SLURM_JOB_NODELIST 'sn\\[1-3': unbalanced"),
    ({"SLURM_TASKS_PER_NODE": None}, "Slurm job 42: SLURM_TASKS_PER_NODE is not set"),
    ({"SLURM_TASKS_PER_NODE": "1(x2)"},
     ("SLURM_TASKS_PER_NODE=1\\(x2\\) covers 2 node\\(s\\) but SLURM_JOB_NODELIST=sn\\[1-3\\] "
      "lists 3")),
    ({"SLURM_TASKS_PER_NODE": "one"}, "bad SLURM_TASKS_PER_NODE 'one'"),
    ({"SLURM_CPUS_PER_TASK": "0"}, "bad SLURM_CPUS_PER_TASK '0': expected a positive integer"),
    ({"SLURM_CPUS_PER_TASK": "two"}, "bad SLURM_CPUS_PER_TASK"),
    ({"SLURM_JOB_NUM_NODES": "4"},
     "SLURM_JOB_NUM_NODES=4 but SLURM_JOB_NODELIST=sn\\[1-3\\] lists 3"),
    ({"SLURM_JOB_NUM_NODES": "x"}, "bad SLURM_JOB_NUM_NODES"),
])
def test_allocation_errors(kw, message):
    with pytest.raises(SlurmEnvError, match=message):
        allocation_from_env(env(**kw))


def test_errors_are_value_errors():
    assert issubclass(SlurmEnvError, ValueError)


# -- select_hosts -----------------------------------------------------------------------

ALLOC = allocation_from_env(env(SLURM_JOB_NODELIST="n[01-04,07]", SLURM_JOB_NUM_NODES="5",
                                SLURM_TASKS_PER_NODE="2(x4),1"))


def test_select_hosts_subset_keeps_requested_order_and_slots():
    assert select_hosts(ALLOC, parse_hosts("n07,n02:2,n01")) == [
        HostSpec("n07", 1), HostSpec("n02", 2), HostSpec("n01", 1)]
    assert select_hosts(ALLOC, list(ALLOC.nodes)) == list(ALLOC.nodes)


def test_select_hosts_outside_the_allocation():
    with pytest.raises(SlurmEnvError, match=r"^host n05 is not in Slurm job 42 \("):
        select_hosts(ALLOC, parse_hosts("n01,n05"))
    with pytest.raises(SlurmEnvError, match=r"^hosts n05, login are not in Slurm job 42"):
        select_hosts(ALLOC, parse_hosts("n05,n01,login"))


def test_select_hosts_slots_and_duplicates():
    with pytest.raises(SlurmEnvError,
                       match="host n07 asks for 2 slots but Slurm job 42 allocated 1 there"):
        select_hosts(ALLOC, parse_hosts("n01:2,n07:2"))
    with pytest.raises(SlurmEnvError, match="host listed twice: n01"):
        select_hosts(ALLOC, [HostSpec("n01"), HostSpec("n01")])
    with pytest.raises(SlurmEnvError, match="no hosts requested"):
        select_hosts(ALLOC, [])


# -- srun_argv --------------------------------------------------------------------------

DAEMON = ["/venv/bin/python", "-m", "pydvm", "daemon", "--master", "tcp://10.251.7.1:5000"]


def test_srun_argv_exact():
    argv = srun_argv([HostSpec("sn1"), HostSpec("sn2", 2), HostSpec("sn3")], DAEMON)
    assert argv == [
        "srun", "--nodes=3", "--ntasks=3", "--nodelist=sn[1-3]",
        "--ntasks-per-node=1", "--mpi=none", "--cpu-bind=none", "--overlap", "--input=all",
        "--export=ALL", "--kill-on-bad-exit=0", "--no-kill", "--wait=0",
        "--job-name=pydvm-daemons", *DAEMON]


def test_srun_argv_options():
    argv = srun_argv(["n07", "n01", "n02"], DAEMON, "--mem=0 --comment='pydvm DVM'",
                     kill_on_bad_exit=True, job_name="", external_launcher=True,
                     srun="/opt/slurm/bin/srun")
    assert argv[0] == "/opt/slurm/bin/srun"
    assert "--nodelist=n[01-02,07]" in argv
    assert "--kill-on-bad-exit=1" in argv and "--no-kill" not in argv and "--wait=0" not in argv
    assert "--external-launcher" in argv
    assert not [a for a in argv if a.startswith("--job-name")]
    # user options come last before the command, so they can override ours
    assert argv[-len(DAEMON) - 2:] == ["--mem=0", "--comment=pydvm DVM", *DAEMON]


@pytest.mark.parametrize("nodes, cmd, extra, message", [
    ([], DAEMON, "", "no nodes"),
    (["a", "a"], DAEMON, "", "node listed twice: a"),
    (["a"], [], "", "empty daemon command"),
    (["a"], DAEMON, "--comment='x", "bad extra srun arguments"),
])
def test_srun_argv_errors(nodes, cmd, extra, message):
    with pytest.raises(ValueError, match=message):
        srun_argv(nodes, cmd, extra)


def test_srun_argv_is_one_step_for_every_node():
    """The command part is the same for every task: no node name in it."""
    argv = srun_argv(ALLOC.nodes, node_from_env(DAEMON))
    assert not any(name in arg for name in ALLOC.names for arg in argv[argv.index("/bin/sh"):])


# -- node_from_env ----------------------------------------------------------------------

ECHO_ARGS = [sys.executable, "-c", "import sys; print(sys.argv[1:])", "x y"]


def test_node_from_env_appends_the_node_name_where_it_runs():
    argv = node_from_env(ECHO_ARGS)
    r = subprocess.run(argv, check=False, capture_output=True, text=True, env={"SLURMD_NODENAME": "sn2"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "['x y', '--node', 'sn2']"
    r = subprocess.run(node_from_env(ECHO_ARGS, option="-n", variable="HOSTX"),
                       check=False, capture_output=True, text=True, env={"HOSTX": "a b"})
    assert r.stdout.strip() == "['x y', '-n', 'a b']"


def test_node_from_env_without_the_variable_fails():
    r = subprocess.run(node_from_env(ECHO_ARGS), check=False, capture_output=True, text=True, env={})
    assert r.returncode != 0 and "SLURMD_NODENAME" in r.stderr
    with pytest.raises(ValueError):
        node_from_env([])
    with pytest.raises(ValueError):
        node_from_env(ECHO_ARGS, variable="A-B")


# -- the slurm launcher's reading of srun's stderr, and the start command's choices -------

def test_srun_label_option():
    argv = srun_argv(["sn1"], ["d"], label=True)
    assert "--label" in argv and argv.index("--label") < argv.index("d")
    assert "--label" not in srun_argv(["sn1"], ["d"])


def test_slurm_launcher_maps_task_lines_to_nodes_from_srun_end_lines():
    """``srun --label`` prefixes task lines with the task number; srun's own end-of-task
    lines (one node, or a compressed list with a task range) say which node it was."""
    import asyncio

    from pydvm.runtime.master.launchers import SlurmLauncher

    async def scenario():
        sl = SlurmLauncher("test")
        sl._nodes = ["sn1", "sn2", "sn3"]
        for line in ["1: slurmstepd-sn2: error: execve(): /x: No such file or directory",
                     "0: hello from sn1",
                     "srun: error: sn2: task 1: Exited with exit code 2"]:
            sl._on_line(line)
        assert sl.gone("sn2").done() and not sl.gone("sn1").done()
        assert sl.gone("sn2").result() == "ended (Exited with exit code 2)"
        assert sl.stderr_tail("sn2") == [
            "slurmstepd-sn2: error: execve(): /x: No such file or directory"]
        sl._on_line("1: later")
        assert sl.stderr_tail("sn2")[-1] == "later"
        sl._on_line("srun: error: sn[1,3]: tasks 0,2: Killed")
        assert sl.gone("sn1").done() and sl.gone("sn3").done()
        assert sl.stderr_tail("sn1") == ["hello from sn1"]

    asyncio.run(scenario())


def test_start_inside_an_allocation_defaults_to_slurm_and_its_nodes():
    from pydvm.cli import _start_hosts

    hosts, launcher = _start_hosts(None, None, env())
    assert (launcher.name, [h.name for h in hosts]) == ("slurm", ["sn1", "sn2", "sn3"])
    assert launcher.source.startswith("Slurm job 42 (SLURM_JOB_NODELIST=sn[1-3]")
    hosts, launcher = _start_hosts("sn2", None, env())
    assert hosts == [HostSpec("sn2")] and launcher.source.endswith(", --hosts sn2")
    with pytest.raises(ValueError, match="host sn9 is not in Slurm job 42"):
        _start_hosts("sn1,sn9", None, env())
    hosts, launcher = _start_hosts("x,y", "local", env())  # explicitly local: as outside
    assert launcher.name == "local" and [h.name for h in hosts] == ["x", "y"]
    with pytest.raises(ValueError, match="--launcher slurm needs a Slurm allocation"):
        _start_hosts(None, "slurm", {})
    with pytest.raises(ValueError, match="unknown launcher 'pbs'"):
        _start_hosts(None, "pbs", {})
    assert _start_hosts(None, None, {})[1].name == "local"


def test_mca_values_that_look_like_options_reach_the_parameter():
    from pydvm.cli import _mca_values_verbatim, _resolve_params, build_parser

    argv = _mca_values_verbatim(["start", "--mca", "plm_slurm_args", "--exclusive",
                                 "--mca", "prte_data_server_timeout", "5", "--daemonize"])
    a = build_parser().parse_args(argv)
    assert a.daemonize
    resolved = _resolve_params(a.mca)
    assert resolved["plm_slurm_args"].value == "--exclusive"
    assert resolved["prte_data_server_timeout"].value == 5.0
    with pytest.raises(ValueError, match="plm_slurm_args"):
        _resolve_params([["plm_slurm_args", "--comment='unbalanced"]])


def test_daemon_without_node_name_or_slurmd_nodename_is_refused():
    import os

    env = {k: v for k, v in os.environ.items() if k != "SLURMD_NODENAME"}
    r = subprocess.run([sys.executable, "-m", "pydvm", "daemon", "--master",
                        "tcp://127.0.0.1:1/x"], env=env, capture_output=True, text=True,
                       input="", timeout=30)
    assert r.returncode == 2
    assert "no node name: give --node NAME (SLURMD_NODENAME" in r.stderr
