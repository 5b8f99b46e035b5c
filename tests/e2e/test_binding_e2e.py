"""Binding on real DVMs, side by side with ``mpirun`` on this machine.

Each case runs the same command line under ``mpirun`` (Open MPI 4.1.4) and
``pydvm run`` -- a one-shot DVM, whose node is named like this machine --
and compares what a user compares: each rank's ``Cpus_allowed_list`` (read
by the rank itself from /proc), the ``--report-bindings`` lines (host
included, pid cut), the exit status and the refusal's gist.  A persistent
DVM (``pydvm start --hosts a:2,b:2``) adds what only it has: concurrent
jobs taking the least-loaded cores, co-located nodes spreading their ranks.

Options the ``pydvm run`` command line does not take yet go through the
run request's ``placement`` (tests/e2e/placed.py): the tests need no change
when the CLI lands.  Every DVM here keeps its own machine-wide load registry
(``PYDVM_CPULOAD_DIR``), so that other tests' bound processes do not move
its ranks.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess

import pytest

from dvmkit import LineReader, PYDVM, finish, start_dvm
from placed import CPUS, cpus_allowed, mpirun, pydvm_run, report

pytestmark = pytest.mark.skipif(shutil.which("mpirun") is None,
                                reason="mpirun not installed (apt-get install openmpi-bin)")

#: the cases: mpirun's options (pydvm's where they differ: --oversubscribe is
#: pydvm's default, SPEC 9), -n, and what each rank's Cpus_allowed_list is on
#: this 2-core VM (checked against mpirun in the same test; None: refused).
CASES = {
    "default -n 1 (core)": (["-n", "1"], ["0"]),
    "default -n 2 (core)": (["-n", "2"], ["0", "1"]),
    "default oversubscribed (none)": (["--oversubscribe", "-n", "3"], ["0-1"] * 3),
    "core": (["--bind-to", "core", "-n", "2"], ["0", "1"]),
    "core:overload-allowed": (["--bind-to", "core:overload-allowed", "--oversubscribe",
                               "-n", "3"], ["0", "0", "1"]),
    "core oversubscribed (still bound)": (["--bind-to", "core", "--oversubscribe",
                                           "--host", "{host}:1", "-n", "2"], ["0", "1"]),
    "core overloaded (refused)": (["--bind-to", "core", "--oversubscribe", "-n", "3"], None),
    "hwthread": (["--bind-to", "hwthread", "-n", "2"], ["0", "1"]),
    "socket": (["--bind-to", "socket", "-n", "2"], ["0-1", "0-1"]),
    "numa": (["--bind-to", "numa", "-n", "2"], ["0-1", "0-1"]),
    "l3cache": (["--bind-to", "l3cache", "-n", "2"], ["0-1", "0-1"]),
    "none": (["--bind-to", "none", "-n", "2"], ["0-1", "0-1"]),
    "cpu-set 1": (["--cpu-set", "1", "-n", "2"], ["1", "1"]),
    "cpu-list 1 with bind-to core": (["--cpu-list", "1", "--bind-to", "core", "-n", "1"],
                                     ["1"]),
    "map-by slot:PE=2": (["--map-by", "slot:PE=2", "-n", "1"], ["0-1"]),
    "map-by core:PE=2 (refused)": (["--map-by", "core:PE=2", "-n", "1"], None),
}


@pytest.fixture
def env(tmp_path):
    e = dict(os.environ)
    e["PYDVM_STATE_DIR"] = str(tmp_path / "state")
    e["PYDVM_CPULOAD_DIR"] = str(tmp_path / "cpuload")
    e.pop("PYDVM_URI", None)
    return e


def host_part(p: subprocess.CompletedProcess) -> set[str]:
    return set(re.findall(r"^\[([^\]:]+):\d{5,}\] MCW rank", p.stderr, re.M))


@pytest.mark.parametrize("case", list(CASES))
def test_one_shot_binds_as_mpirun_does(case, env):
    import socket
    args, expected = CASES[case]
    host = socket.gethostname()
    args = [a.replace("{host}", host) for a in args]
    mp_args = [a.replace(f"{host}:", "localhost:") for a in args]
    ref = mpirun(["--report-bindings", *mp_args, "sh", "-c", CPUS])
    got = pydvm_run(["--report-bindings", *[a for a in args if a != "--oversubscribe"],
                     "sh", "-c", CPUS], env)
    if expected is None:
        assert ref.returncode != 0 and got.returncode != 0, got.stdout + got.stderr
        gist = ("binding more processes than cpus" if "overload" in case
                else "multiple cpus-per-proc")
        assert gist in " ".join(ref.stdout.split() + ref.stderr.split())
        assert gist in " ".join(got.stderr.split()), got.stderr
        assert not cpus_allowed(got)  # nothing started
        return
    assert ref.returncode == 0, ref.stdout + ref.stderr
    assert got.returncode == 0, got.stdout + got.stderr
    assert cpus_allowed(ref) == expected, ref.stdout + ref.stderr
    assert cpus_allowed(got) == expected, got.stdout + got.stderr
    # the same lines, from a host of the same name ([host:pid], pid 5+ digits)
    assert report(got) == report(ref), got.stderr
    assert host_part(got) == host_part(ref)


def test_a_bound_rank_is_told_so_as_under_mpirun(env):
    """OMPI_MCA_orte_bound_at_launch=1 for a bound rank, nothing for an unbound one."""
    show = "env | grep '^OMPI_MCA_orte_bound_at_launch=' || echo unset"
    for args, want in ((["-n", "1"], "OMPI_MCA_orte_bound_at_launch=1"),
                       (["--bind-to", "none", "-n", "1"], "unset")):
        ref = mpirun([*args, "sh", "-c", show])
        got = pydvm_run([*args, "sh", "-c", show], env)
        assert ref.stdout.split() == got.stdout.split() == [want], (ref.stdout, got.stdout)


def test_report_bindings_is_not_tagged_with_tag_output(env):
    got = pydvm_run(["--tag-output", "--report-bindings", "-n", "1", "true"], env)
    assert got.returncode == 0, got.stderr
    assert re.search(r"^\[[^\],]+:\d{5,}\] MCW rank 0 bound to ", got.stderr, re.M), got.stderr


def start_private(tmp_path, name: str, hosts: str, cpuload: str):
    old = os.environ.get("PYDVM_CPULOAD_DIR")
    os.environ["PYDVM_CPULOAD_DIR"] = cpuload
    try:
        return start_dvm(tmp_path / name, hosts)
    finally:
        if old is None:
            os.environ.pop("PYDVM_CPULOAD_DIR", None)
        else:
            os.environ["PYDVM_CPULOAD_DIR"] = old


def test_persistent_dvm_binds_as_mpirun_and_spreads_concurrent_jobs(tmp_path):
    """On ``pydvm start --hosts a:2,b:2``: ``--host a:2 -n 2`` as ``mpirun -n 2``
    (core 0, core 1); a job's rank bound while another job's rank runs takes
    the other core (two concurrent ``mpirun -n 1`` both take core 0: pydvm
    deliberately does better), and once that job ended core 0 is free again;
    ``-n 2`` over a and b -- two node processes on one machine -- spreads too."""
    dvm = start_private(tmp_path, "d", "a:2,b:2", str(tmp_path / "cpuload"))
    try:
        ref = mpirun(["--report-bindings", "-n", "2", "sh", "-c", CPUS])
        got = pydvm_run(["--report-bindings", "--host", "a:2", "-n", "2", "sh", "-c", CPUS],
                        dvm.env, dvm.uri)
        assert got.returncode == 0, got.stderr
        assert cpus_allowed(got) == cpus_allowed(ref) == ["0", "1"]
        assert report(got) == report(ref)
        assert host_part(got) == {"a"}
        # two mpiruns at once: both on core 0
        e = {k: v for k, v in os.environ.items() if not k.startswith(("PYDVM_", "OMPI_"))}
        hold = subprocess.Popen(["mpirun", "--allow-run-as-root", "-n", "1", "sh", "-c",
                                 f"{CPUS}; read x || true"], env=e, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        try:
            first = LineReader(hold.stdout).wait_line("Cpus_allowed_list")
            second = mpirun(["-n", "1", "sh", "-c", CPUS])
            assert first.split()[-1] == cpus_allowed(second)[0] == "0"
        finally:
            hold.stdin.close()
            finish(hold)
        # the same under pydvm: the second job takes core 1
        e = dict(dvm.env, PYDVM_URI=dvm.uri)
        hold = subprocess.Popen(PYDVM + ["run", "--host", "a", "-n", "1", "sh", "-c",
                                         f"{CPUS}; read x || true"], env=e, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            first = LineReader(hold.stdout).wait_line("Cpus_allowed_list").split()[-1]
            second = dvm.run("--host", "a", "-n", "1", "sh", "-c", CPUS)
            assert second.returncode == 0, second.stderr
            assert (first, cpus_allowed(second)) == ("0", ["1"])
            other_node = dvm.run("--host", "b", "-n", "1", "sh", "-c", CPUS)
            assert cpus_allowed(other_node) == ["1"]  # node b sees a's rank on core 0
        finally:
            hold.stdin.close()
            assert finish(hold) == 0
        again = dvm.run("--host", "a", "-n", "1", "sh", "-c", CPUS)
        assert cpus_allowed(again) == ["0"]  # released when reaped
        spread = dvm.run("--host", "a:1,b:1", "-n", "2", "sh", "-c", CPUS)
        assert cpus_allowed(spread) == ["0", "1"], spread.stdout + spread.stderr
        # an explicit overload is refused with mpirun's wording, nothing started
        refused = pydvm_run(["--bind-to", "core", "--host", "a:3", "-n", "3", "sh", "-c",
                             CPUS], dvm.env, dvm.uri)
        assert refused.returncode == 1 and not cpus_allowed(refused)
        assert "#processes:  2" in refused.stderr and "overload-allowed" in refused.stderr
    finally:
        dvm.stop()
    assert not os.listdir(tmp_path / "cpuload") or os.listdir(tmp_path / "cpuload") == [
        ".lock"]  # the stopped nodes left no count behind


def test_a_job_that_fits_stays_bound_however_other_jobs_loaded_the_node(tmp_path):
    """Another job holds two processes on core 0 (``--cpu-set 0``); a 2-rank
    job then gets one core per rank, as a lone ``mpirun -n 2`` -- not both
    ranks on the idler core 1 and then left unbound as overloaded (nor
    refused with ``--bind-to core``)."""
    dvm = start_private(tmp_path, "d", "a:4", str(tmp_path / "cpuload"))
    gate = tmp_path / "gate"   # held exclusively here: the held ranks wait on it
    gate_fd = os.open(gate, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(gate_fd, fcntl.LOCK_EX)
    try:
        e = dict(dvm.env, PYDVM_URI=dvm.uri)
        # both held ranks wait for the gate (only rank 0 would have stdin)
        hold = subprocess.Popen(PYDVM + ["run", "--cpu-set", "0", "-n", "2", "sh", "-c",
                                         f"{CPUS}; flock -s {gate} true"], env=e,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            lines = LineReader(hold.stdout)
            assert [lines.wait_line("Cpus_allowed_list").split()[-1] for _ in range(2)] == [
                "0", "0"]
            ref = mpirun(["--report-bindings", "-n", "2", "sh", "-c", CPUS])
            for extra in ([], ["--bind-to", "core"]):
                got = pydvm_run(["--report-bindings", *extra, "-n", "2", "sh", "-c", CPUS],
                                dvm.env, dvm.uri)
                assert got.returncode == 0, got.stderr
                assert sorted(cpus_allowed(got)) == cpus_allowed(ref) == ["0", "1"], got.stderr
                assert len(report(got)) == 2, got.stderr
        finally:
            os.close(gate_fd)  # the gate opens, whenever the ranks reach it
            assert finish(hold) == 0
    finally:
        dvm.stop()
