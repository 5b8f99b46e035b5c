"""The PSI/J executor's mapping of a job onto a DVM job (pure: no DVM), and
its registration with PSI/J (``psij-descriptors``)."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from psij import InvalidJobException, JobAttributes, JobSpec, ResourceSpecV1

from pydvm.psij.spec import exit_state, launcher_kind, nodefile_text, plan_job

NODES = [("a", 2), ("b", 2), ("c", 1)]
ENV = {"PATH": "/usr/bin", "HOME": "/home/u"}


def plan(spec: JobSpec, nodes=NODES, cwd: str = "/work"):
    return plan_job(spec, nodes=nodes, environ=ENV, cwd=cwd)


def test_a_plain_job_is_one_process_anywhere_with_no_streams():
    p = plan(JobSpec("/bin/date"))
    assert p.argv == ["/bin/date"] and p.n == 1
    assert p.hosts is None and p.npernode is None
    assert p.stdin == p.stdout == p.stderr == os.devnull
    assert p.cwd == "/work" and p.env == ENV
    assert p.timeout == 600.0  # JobAttributes' default duration, 10 minutes
    assert nodefile_text(p) is None


def test_arguments_follow_the_executable():
    assert plan(JobSpec("/bin/echo", ["-n", "x y"])).argv == ["/bin/echo", "-n", "x y"]


def test_node_count_and_processes_per_node_pick_the_first_nodes():
    p = plan(JobSpec("/bin/hostname",
                     resources=ResourceSpecV1(node_count=2, processes_per_node=2)))
    assert (p.n, p.npernode, p.hosts) == (4, 2, ["a", "b"])
    assert nodefile_text(p) == "a\na\nb\nb\n"


@pytest.mark.parametrize("res, n, ppn, hosts", [
    (ResourceSpecV1(node_count=3), 3, 1, ["a", "b", "c"]),
    (ResourceSpecV1(process_count=4, node_count=2), 4, 2, ["a", "b"]),
    (ResourceSpecV1(process_count=6, processes_per_node=2), 6, 2, ["a", "b", "c"]),
    (ResourceSpecV1(processes_per_node=3), 3, 3, ["a"]),
])
def test_the_computed_values_of_psij_decide(res, n, ppn, hosts):
    p = plan(JobSpec("x", resources=res))
    assert (p.n, p.npernode, p.hosts) == (n, ppn, hosts)
    assert p.nodefile == [h for h in hosts for _ in range(ppn)]


def test_a_process_count_alone_is_placed_as_the_dvm_places_it():
    """By the nodes' slots in turn (SPEC 9), wrapping around: the nodefile
    says where each rank goes, computed by the master's own mapper."""
    p = plan(JobSpec("x", resources=ResourceSpecV1(process_count=7)))
    assert (p.n, p.npernode, p.hosts) == (7, None, None)
    assert p.nodefile == ["a", "a", "b", "b", "c", "a", "a"]


def test_more_nodes_than_the_dvm_has_is_refused_naming_them():
    with pytest.raises(InvalidJobException, match=r"4 nodes; the DVM has 3 up \(a, b, c\)"):
        plan(JobSpec("x", resources=ResourceSpecV1(node_count=4)))
    with pytest.raises(InvalidJobException, match="no node up"):
        plan(JobSpec("x", resources=ResourceSpecV1(process_count=2)), nodes=[])


def test_the_single_launcher_runs_one_process_on_the_first_node_of_the_allocation():
    p = plan(JobSpec("x", launcher="single",
                     resources=ResourceSpecV1(node_count=2, processes_per_node=2)))
    assert (p.n, p.npernode, p.hosts) == (1, None, ["a"])
    assert nodefile_text(p) == "a\na\nb\nb\n"  # the allocation, as PSI/J's single gives it


@pytest.mark.parametrize("name", [None, "pydvm", "multiple", "mpirun", "srun", "aprun"])
def test_parallel_launchers_all_mean_the_dvm_starts_every_process(name):
    assert launcher_kind(name) == "parallel"
    assert plan(JobSpec("x", launcher=name, resources=ResourceSpecV1(process_count=3))).n == 3


def test_an_unknown_launcher_is_refused_with_the_accepted_ones():
    with pytest.raises(InvalidJobException, match="launcher 'bogus'.*mpirun.*single"):
        plan(JobSpec("x", launcher="bogus"))


def test_environment_inherited_or_alone():
    p = plan(JobSpec("x", environment={"A": "1", "B": 2}))
    assert p.env == {**ENV, "A": "1", "B": "2"}
    p = plan(JobSpec("x", environment={"A": "1"}, inherit_environment=False))
    assert p.env == {"A": "1"}
    assert plan(JobSpec("x", inherit_environment=False)).env == {}


def test_relative_paths_resolve_against_the_directory_then_the_submitter():
    p = plan(JobSpec("x", directory="sub", stdout_path="o.txt", stderr_path="/abs/e",
                     stdin_path="../in"), cwd="/work")
    assert p.cwd == "/work/sub"
    assert (p.stdout, p.stderr, p.stdin) == ("/work/sub/o.txt", "/abs/e", "/work/in")
    p = plan(JobSpec("x", stdout_path=Path("o.txt")), cwd="/w")
    assert p.stdout == "/w/o.txt" and p.cwd == "/w"


def test_duration_is_the_walltime_and_queueing_a_custom_attribute():
    p = plan(JobSpec("x", attributes=JobAttributes(duration=timedelta(seconds=3700.5),
                                                   queue_name="fast", account="acct")))
    assert p.timeout == 3700.5 and p.queue is None  # the DVM's default; queue_name: ignored
    p = plan(JobSpec("x", attributes=JobAttributes(custom_attributes={"pydvm.queue": True})))
    assert p.queue is True and p.options == {}


def test_custom_attributes_with_our_prefix_are_placement_options():
    attrs = JobAttributes(custom_attributes={"pydvm.map_by": "node", "pydvm.bind_to": "core",
                                             "pydvm.hosts": "b,c", "slurm.constraint": "x"})
    p = plan(JobSpec("x", attributes=attrs, resources=ResourceSpecV1(process_count=3)))
    assert p.options == {"map_by": "node", "bind_to": "core"}
    assert p.hosts == ["b", "c"] and p.nodefile == ["b", "c", "b"]  # by node, round robin


def test_the_nodefile_follows_a_custom_mapping():
    attrs = JobAttributes(custom_attributes={"pydvm.map_by": "node"})
    p = plan(JobSpec("x", attributes=attrs, resources=ResourceSpecV1(process_count=4)))
    assert p.nodefile == ["a", "b", "c", "a"]
    attrs = JobAttributes(custom_attributes={"pydvm.rank_by": "node"})
    p = plan(JobSpec("x", attributes=attrs, resources=ResourceSpecV1(process_count=4)))
    assert p.nodefile == ["a", "b", "a", "b"]
    # over objects the master alone knows the topology: SPEC 9's order, the DVM decides
    attrs = JobAttributes(custom_attributes={"pydvm.map_by": "ppr:1:socket"})
    p = plan(JobSpec("x", attributes=attrs, resources=ResourceSpecV1(process_count=2)))
    assert p.nodefile == ["a", "a"] and p.options == {"map_by": "ppr:1:socket"}


@pytest.mark.parametrize("attrs, match", [
    ({"pydvm.colour": "red"}, "unknown custom attribute 'pydvm.colour'"),
    ({"pydvm.map_by": "sideways"}, "sideways"),
    ({"pydvm.map_by": 3}, "'pydvm.map_by': 3 is not a str"),
    ({"pydvm.hosts": ["a", "zz"]}, "zz not among the DVM's nodes"),
])
def test_bad_custom_attributes_are_refused(attrs, match):
    with pytest.raises(InvalidJobException, match=match):
        plan(JobSpec("x", attributes=JobAttributes(custom_attributes=attrs)))


def test_what_no_dvm_runs_is_refused():
    with pytest.raises(InvalidJobException, match="no executable"):
        plan(JobSpec())
    with pytest.raises(InvalidJobException, match="cannot be combined"):
        plan(JobSpec("x", resources=ResourceSpecV1(node_count=2),
                     attributes=JobAttributes(custom_attributes={"pydvm.map_by": "node"})))


def test_exit_states():
    assert exit_state(0, False) == "COMPLETED" and exit_state(0, True) == "COMPLETED"
    assert exit_state(1, False) == "FAILED" and exit_state(143, True) == "CANCELED"
    assert exit_state(None, False) == "FAILED"


# ----------------------------------------------------------------------
# registration
# ----------------------------------------------------------------------


def test_psij_finds_the_executor_by_its_name():
    """In a fresh interpreter, as a program would: importing psij reads the
    ``psij-descriptors`` namespace package on sys.path."""
    code = ("import psij\n"
            "ex = psij.JobExecutor.get_instance('pydvm', url='tcp://127.0.0.1:1/x')\n"
            "from pydvm.psij.executor import PydvmJobExecutor\n"
            "print(type(ex) is PydvmJobExecutor, ex.name, ex.version)\n"
            "la = psij.Launcher.get_instance('pydvm')\n"
            "from pydvm.psij.launcher import PydvmLauncher\n"
            "print(type(la) is PydvmLauncher)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["True", "pydvm", "0.1.0", "True"]


def test_the_launcher_passes_counts_and_this_python_to_its_script():
    from psij import Job

    from pydvm.psij.launcher import SCRIPT, PydvmLauncher

    assert SCRIPT.exists()
    la = PydvmLauncher()
    args = la.get_additional_args(Job(JobSpec("x", resources=ResourceSpecV1(
        node_count=2, processes_per_node=3))))
    assert args == ["6", "3", sys.executable]
    assert la.get_additional_args(Job(JobSpec("x")))[:2] == ["1", "0"]
    assert la.get_additional_args(Job(JobSpec(
        "x", resources=ResourceSpecV1(process_count=4))))[:2] == ["4", "0"]


def test_the_descriptor_carries_pydvms_version():
    import pydvm

    text = (Path(__file__).parents[1] / "src" / "psij-descriptors" / "pydvm_psij.py").read_text()
    assert f'Version("{pydvm.__version__}")' in text
    assert not (Path(__file__).parents[1] / "src" / "psij-descriptors" / "__init__.py").exists()


def test_importing_pydvm_psij_loads_neither_psij_nor_the_job_api():
    code = "import pydvm.psij, sys; print(sorted(m for m in sys.modules if 'psij' in m " \
           "or m.startswith('pydvm.client')))"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "['pydvm.psij']"


def test_the_nodes_are_asked_for_only_when_the_plan_depends_on_them():
    def no_nodes():
        raise AssertionError("asked")

    assert plan(JobSpec("x", environment={"A": "1"}), nodes=no_nodes).hosts is None
    asked = []
    p = plan(JobSpec("x", resources=ResourceSpecV1(process_count=2)),
             nodes=lambda: asked.append(1) or NODES)
    assert asked == [1] and p.nodefile == ["a", "a"]
