"""mpirun's command lines under ``pydvm run``: the output, environment, file,
input and control options (cli/runopts.py), each run under Open MPI 4.1's
``mpirun`` and under ``pydvm run`` in the same test and compared on what a
user would compare -- what the processes print and see, the files written,
the exit status, the gist of an error.  Where pydvm differs on purpose, the
test pins the difference (docs/mpirun.md says why).

Placement and binding options are tested in test_placement_cli.py and
test_binding.py; the rank environment in test_rank_env.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dvmkit import PYDVM

TIMEOUT = 120


#: A CPU-load registry of these tests' own: pydvm binds a new rank to the
#: least-used cores of the machine (runtime/node/cpubind.py), so ranks of other
#: tests running at the same time would move ours off the cores mpirun takes.
CPULOAD = ""


@pytest.fixture(autouse=True, scope="module")
def _private_cpu_load(tmp_path_factory):
    global CPULOAD
    CPULOAD = str(tmp_path_factory.mktemp("cpuload"))
    yield


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYDVM_", "PMIX_", "OMPI_", "SLURM_", "MPIEXEC_"))}
    env["PYDVM_CPULOAD_DIR"] = CPULOAD
    env.update(extra)
    return env


def mpirun(*args: str, cwd: Path, env: dict[str, str] | None = None,
           stdin: str | None = None) -> subprocess.CompletedProcess:
    if not shutil.which("mpirun"):
        pytest.skip("mpirun not installed (apt-get install openmpi-bin)")
    return subprocess.run(["mpirun", "--allow-run-as-root", *args], cwd=cwd,
                          env=env or _env(), capture_output=True, text=True, timeout=TIMEOUT,
                          input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL)


def pydvm(*args: str, cwd: Path, env: dict[str, str] | None = None,
          stdin: str | None = None) -> subprocess.CompletedProcess:
    """``pydvm run ARGS`` on a one-shot DVM of this machine."""
    return subprocess.run([*PYDVM, "run", *args], cwd=cwd, env=env or _env(),
                          capture_output=True, text=True, timeout=TIMEOUT, input=stdin,
                          stdin=None if stdin is not None else subprocess.DEVNULL)


def both(*args: str, cwd: Path, **kw) -> tuple[subprocess.CompletedProcess,
                                                 subprocess.CompletedProcess]:
    return mpirun(*args, cwd=cwd, **kw), pydvm(*args, cwd=cwd, **kw)


def test_x_gives_a_variable_its_value_or_this_shells_as_mpirun(tmp_path):
    """`-x FOO=bar` sets it, `-x HOME2` exports this shell's value, and an
    unset `-x NOPE` is a warning naming it, the job running anyway."""
    env = _env(HOME2="from-the-shell")
    args = ("-x", "FOO=bar baz", "-x", "HOME2", "-x", "NOPE_UNSET", "-n", "2", "sh", "-c",
            'echo "FOO=$FOO HOME2=$HOME2 NOPE=${NOPE_UNSET-unset}"')
    ref, ours = both(*args, cwd=tmp_path, env=env)
    assert ref.returncode == ours.returncode == 0, (ref, ours)
    assert sorted(ours.stdout.splitlines()) == sorted(ref.stdout.splitlines()) == [
        "FOO=bar baz HOME2=from-the-shell NOPE=unset"] * 2
    assert 'could not find environment variable "NOPE_UNSET"' in ref.stderr
    assert 'could not find environment variable "NOPE_UNSET"' in ours.stderr


def test_x_belongs_to_its_app_context(tmp_path):
    """MPMD: each context's -x reaches its own processes only, as under mpirun."""
    args = ("-n", "1", "-x", "A=one", "sh", "-c", 'echo "0:${A-}:${B-}"', ":",
            "-n", "1", "-x", "B=two", "sh", "-c", 'echo "1:${A-}:${B-}"')
    ref, ours = both(*args, cwd=tmp_path)
    assert ref.returncode == ours.returncode == 0, (ref, ours)
    assert sorted(ours.stdout.split()) == sorted(ref.stdout.split()) == ["0:one:", "1::two"]


def test_wdir_sets_the_working_directory_and_a_missing_one_is_an_error(tmp_path):
    d = tmp_path / "work dir"
    d.mkdir()
    for opt in ("--wdir", "-wdir", "-wd"):
        ref, ours = both(opt, str(d), "-n", "1", "pwd", cwd=tmp_path)
        assert ref.returncode == ours.returncode == 0, (ref, ours)
        assert ours.stdout.strip() == ref.stdout.strip() == str(d)
    ref, ours = both("--wdir", str(tmp_path / "nowhere"), "-n", "1", "pwd", cwd=tmp_path)
    assert ref.returncode != 0 and ours.returncode != 0, (ref, ours)
    assert "nowhere" in ours.stderr and "no such directory" in ours.stderr, ours.stderr


def test_mca_passes_open_mpis_parameters_to_the_processes_as_mpirun(tmp_path):
    args = ("--mca", "btl_tcp_if_include", "lo", "-mca", "pml", "ob1", "-n", "1", "sh", "-c",
            'echo "$OMPI_MCA_btl_tcp_if_include $OMPI_MCA_pml"')
    ref, ours = both(*args, cwd=tmp_path)
    assert ref.returncode == ours.returncode == 0, (ref, ours)
    assert ours.stdout.strip() == ref.stdout.strip() == "lo ob1"


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_output_filename_writes_mpiruns_layout(tmp_path):
    """DIR/1/rank.N/stdout and stderr for every rank -- empty ones too -- with
    the output still shown."""
    script = 'if [ "$OMPI_COMM_WORLD_RANK" = 0 ]; then echo "out"; echo "err" >&2; fi'
    ref = mpirun("--output-filename", "ref", "-n", "2", "sh", "-c", script, cwd=tmp_path)
    ours = pydvm("--output-filename", "ours", "-n", "2", "sh", "-c", script, cwd=tmp_path)
    assert ref.returncode == ours.returncode == 0, (ref, ours)
    assert _tree(tmp_path / "ours") == _tree(tmp_path / "ref") == {
        "1/rank.0/stdout": "out\n", "1/rank.0/stderr": "err\n",
        "1/rank.1/stdout": "", "1/rank.1/stderr": ""}
    assert ours.stdout == ref.stdout == "out\n"
    assert ours.stderr == ref.stderr == "err\n"


def test_output_filename_is_job_1_for_every_run_of_a_persistent_dvm(dvm, tmp_path):
    """Each `mpirun` is job 1 of its own: two runs into one directory both
    write DIR/1/, the second replacing the files of the ranks it has and
    leaving the others.  `pydvm run` on a persistent DVM does the same,
    whatever the job's number in the DVM."""
    runs = [("-n", "2", "sh", "-c", 'echo "first $OMPI_COMM_WORLD_RANK"'),
            ("-n", "1", "sh", "-c", 'echo "second $OMPI_COMM_WORLD_RANK"')]
    for args in runs:
        ref = mpirun("--output-filename", "ref", *args, cwd=tmp_path)
        ours = dvm.run("--output-filename", str(tmp_path / "ours"), *args, cwd=tmp_path)
        assert ref.returncode == ours.returncode == 0, (ref, ours)
    assert _tree(tmp_path / "ours") == _tree(tmp_path / "ref") == {
        "1/rank.0/stdout": "second 0\n", "1/rank.0/stderr": "",
        "1/rank.1/stdout": "first 1\n", "1/rank.1/stderr": ""}


def test_merge_stderr_with_output_filename_writes_one_file_per_rank_as_mpirun(tmp_path):
    """`--merge-stderr-to-stdout --output-filename DIR`: DIR/1/rank.N/stdout
    holds both streams of rank N, and there is no stderr file."""
    script = 'echo "out $OMPI_COMM_WORLD_RANK"; echo "err $OMPI_COMM_WORLD_RANK" >&2'
    ref = mpirun("--merge-stderr-to-stdout", "--output-filename", "ref", "-n", "2", "sh", "-c",
                 script, cwd=tmp_path)
    ours = pydvm("--merge-stderr-to-stdout", "--output-filename", "ours", "-n", "2", "sh",
                 "-c", script, cwd=tmp_path)
    assert ref.returncode == ours.returncode == 0, (ref, ours)

    def lines(root: Path) -> dict[str, list[str]]:
        return {k: sorted(v.splitlines()) for k, v in _tree(root).items()}
    assert lines(tmp_path / "ours") == lines(tmp_path / "ref") == {
        "1/rank.0/stdout": ["err 0", "out 0"], "1/rank.1/stdout": ["err 1", "out 1"]}


def test_timestamp_output_prefixes_each_line_as_mpirun(tmp_path):
    stamp = r"[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}"
    ref, ours = both("--timestamp-output", "-n", "1", "sh", "-c", "echo out; echo err >&2",
                     cwd=tmp_path)
    assert ref.returncode == ours.returncode == 0, (ref, ours)
    for p in (ref, ours):
        assert re.fullmatch(stamp + r"<stdout>:out\n", p.stdout), p.stdout
        assert re.fullmatch(stamp + r"<stderr>:err\n", p.stderr), p.stderr


def test_tag_output_differs_on_purpose(tmp_path):
    """pydvm's tag names the job's namespace (a persistent DVM runs many jobs):
    '[pydvm-...@1,0] out'; mpirun 4.1 writes '[1,0]<stdout>:out'."""
    ref, ours = both("--tag-output", "-n", "2", "echo", "out", cwd=tmp_path)
    assert ref.returncode == ours.returncode == 0, (ref, ours)
    assert sorted(ref.stdout.splitlines()) == ["[1,0]<stdout>:out", "[1,1]<stdout>:out"]
    assert sorted(re.sub(r"\[pydvm-[^@]+@1,", "[NS,", ln) for ln in ours.stdout.splitlines()) \
        == ["[NS,0] out", "[NS,1] out"], ours.stdout


def test_merge_stderr_to_stdout_merges_where_mpirun_does_not(tmp_path):
    """mpirun 4.1.4 merges only onto a terminal: into a pipe its ranks' stderr
    stays on stderr.  pydvm merges always (what the option says)."""
    ref, ours = both("--merge-stderr-to-stdout", "-n", "1", "sh", "-c",
                     "echo out; echo err >&2", cwd=tmp_path)
    assert ref.returncode == ours.returncode == 0, (ref, ours)
    assert (ref.stdout, ref.stderr) == ("out\n", "err\n")  # pinned: mpirun's
    assert sorted(ours.stdout.splitlines()) == ["err", "out"] and ours.stderr == "", ours


def test_stdin_goes_to_the_rank_named_or_to_none(tmp_path):
    ref, ours = both("--stdin", "1", "-n", "2", "sh", "-c",
                     'read -r line || line=EOF; echo "$OMPI_COMM_WORLD_RANK:$line"',
                     cwd=tmp_path, stdin="hello\n")
    assert ref.returncode == ours.returncode == 0, (ref, ours)
    assert sorted(ours.stdout.split()) == sorted(ref.stdout.split()) == ["0:EOF", "1:hello"]
    ref, ours = both("--stdin", "none", "-n", "1", "sh", "-c",
                     'read -r line || line=EOF; echo "$line"', cwd=tmp_path, stdin="hello\n")
    assert ours.stdout.split() == ref.stdout.split() == ["EOF"]
    p = pydvm("--stdin", "5", "-n", "2", "cat", cwd=tmp_path, stdin="x\n")
    assert p.returncode != 0 and "--stdin 5" in p.stderr, p.stderr


def test_stdin_all_gives_every_rank_the_input_and_its_end(tmp_path):
    """`--stdin all` on a one-shot DVM of two named nodes, one running two
    ranks: every rank reads every line, then end of file.  (mpirun 4.1.4
    does the same where its ranks run on other nodes -- tests/multinode --
    and hangs where one runs on its own: docs/mpirun.md.)"""
    p = pydvm("--stdin", "all", "--host", "a:2,b:1", "-n", "3", "sh", "-c",
              'echo "$OMPI_COMM_WORLD_RANK:$(tr "\\n" ,)"', cwd=tmp_path,
              stdin="hello\nworld\n")
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.split()) == ["0:hello,world,", "1:hello,world,",
                                        "2:hello,world,"], p.stdout


@pytest.mark.parametrize("how", ["option", "env"])
def test_timeout_ends_the_job_naming_what_ran_and_exits_110(tmp_path, how):
    args = ("--timeout", "1") if how == "option" else ()
    env = _env(MPIEXEC_TIMEOUT="1") if how == "env" else None
    t0 = time.monotonic()
    ref = mpirun(*args, "-n", "2", "sleep", "30", cwd=tmp_path, env=env)
    t1 = time.monotonic()
    ours = pydvm(*args, "-n", "2", "sleep", "30", cwd=tmp_path, env=env)
    t2 = time.monotonic()
    assert ref.returncode == ours.returncode == 110, (ref, ours)
    assert "time limit" in ref.stderr and "time limit" in ours.stderr, ours.stderr
    assert "--timeout" in ours.stderr and "2 of its 2 processes still running" in ours.stderr
    assert re.search(r"\[pydvm-[^@]+@1,0\] on node \S+, \[pydvm-[^@]+@1,1\] on node",
                     ours.stderr), ours.stderr
    assert t1 - t0 < 25 and t2 - t1 < 25  # neither waited for sleep 30


def test_timeout_that_is_not_reached_changes_nothing(tmp_path):
    ref, ours = both("--timeout", "60", "-n", "1", "sh", "-c", "exit 3", cwd=tmp_path)
    assert ref.returncode == ours.returncode == 3, (ref, ours)


def test_quiet_drops_the_failure_report_but_keeps_the_status(tmp_path):
    loud = pydvm("-n", "1", "sh", "-c", "exit 3", cwd=tmp_path)
    quiet = pydvm("-q", "-n", "1", "sh", "-c", "exit 3", cwd=tmp_path)
    assert loud.returncode == quiet.returncode == 3
    assert "exited with status 3" in loud.stderr and quiet.stderr == "", quiet.stderr


def test_an_appfile_runs_its_contexts_as_mpirun(tmp_path):
    (tmp_path / "apps").write_text(
        "# two app contexts\n"
        "-n 1 -x WHO=first printenv WHO OMPI_COMM_WORLD_RANK OMPI_MCA_orte_app_num\n"
        "\n"
        "-np 1 -x WHO=second printenv WHO OMPI_COMM_WORLD_RANK OMPI_MCA_orte_app_num\n")
    ref, ours = both("--app", "apps", cwd=tmp_path)
    assert ref.returncode == ours.returncode == 0, (ref, ours)
    assert sorted(ours.stdout.split()) == sorted(ref.stdout.split()) == sorted(
        ["first", "0", "0", "second", "1", "1"])
    p = pydvm("--app", "apps", "-n", "1", "true", cwd=tmp_path)
    assert p.returncode == 2 and "--app FILE names the app contexts" in p.stderr, p.stderr


def test_an_appfile_line_is_split_as_a_shell_would_where_mpirun_does_not(tmp_path):
    """mpirun 4.1 splits an appfile line at blanks, quotes and all (sh then
    sees an unterminated string); pydvm splits it as a shell does."""
    (tmp_path / "apps").write_text("-n 1 sh -c 'echo \"two words\"'\n")
    ref, ours = both("--app", "apps", cwd=tmp_path)
    assert ref.returncode != 0 and "Unterminated quoted string" in ref.stdout + ref.stderr
    assert ours.returncode == 0 and ours.stdout == "two words\n", ours


def test_path_finds_the_program_in_the_directory_given(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    prog = bindir / "only-here"
    prog.write_text("#!/bin/sh\necho found\n")
    prog.chmod(0o755)
    ref, ours = both("--path", str(bindir), "-n", "1", "only-here", cwd=tmp_path)
    assert ref.returncode == ours.returncode == 0, (ref, ours)
    assert ours.stdout == ref.stdout == "found\n"


def test_allow_run_as_root_is_accepted(tmp_path):
    p = pydvm("--allow-run-as-root", "-n", "1", "echo", "ok", cwd=tmp_path)
    assert p.returncode == 0 and p.stdout == "ok\n", p


@pytest.mark.parametrize("opt,advice", [
    (["--rankfile", "rf"], "--map-by"), (["--preload-binary"], "shared filesystem"),
    (["-xterm", "0"], "--output-filename"), (["--report-pid", "-"], "pydvm ps"),
    (["--enable-recovery"], "--no-abort-on-failure"), (["--prefix", "/opt"], "pydvm start")])
def test_an_mpirun_option_pydvm_lacks_is_refused_with_what_to_use(tmp_path, opt, advice):
    p = pydvm(*opt, "-n", "1", "true", cwd=tmp_path)
    assert p.returncode == 2, p
    first = p.stderr.splitlines()[0]
    assert first.startswith(f"pydvm run: {opt[0]} (an mpirun option) is not supported")
    assert advice in first, first


def test_a_job_option_in_a_later_context_is_refused_naming_it(tmp_path):
    p = pydvm("-n", "1", "true", ":", "--timeout", "5", "-n", "1", "true", cwd=tmp_path)
    assert p.returncode == 2 and "--timeout applies to the whole job" in p.stderr, p.stderr


#: Placement and binding options, one host: which ranks run and on which CPUs.
#: (Several hosts: tests/multinode/test_placement_hosts.py; binding's every
#: policy: test_binding_e2e.py.)
PLACED = [
    ["--bynode", "-n", "2"], ["--byslot", "-n", "2"], ["--bycore", "-n", "2"],
    ["--pernode"], ["-N", "2"], ["--npernode", "1"], ["--npersocket", "2"],
    ["--ppr", "1:core"], ["--map-by", "ppr:2:node"],
    ["--map-by", "core", "-n", "2"], ["--map-by", "socket", "-n", "2"],
    ["--rank-by", "core", "-n", "2"], ["--cpus-per-proc", "2", "-n", "1"],
    ["--use-hwthread-cpus", "-n", "2"], ["--bind-to-core", "-n", "2"],
    ["--bind-to-socket", "-n", "2"], ["--bind-to", "none", "-n", "2"],
    ["--cpu-list", "1", "-n", "1"], ["--oversubscribe", "-n", "3"],
]
SHOW = 'echo "R$OMPI_COMM_WORLD_RANK $(grep Cpus_allowed_list /proc/self/status | cut -f2)"'


@pytest.mark.skipif((os.cpu_count() or 1) != 2, reason="the cases are written for 2 CPUs")
@pytest.mark.parametrize("args", PLACED, ids=[" ".join(a) for a in PLACED])
def test_placement_options_on_one_host_as_mpirun(tmp_path, args):
    """Each placement option -- mpirun's older spellings too, which pydvm takes
    without mpirun's deprecation notice -- runs as many ranks, on the same
    CPUs, as under mpirun."""
    ref, ours = both(*args, "sh", "-c", SHOW, cwd=tmp_path)
    assert ref.returncode == 0, ref.stderr[-2000:]
    assert ours.returncode == 0, ours.stderr
    assert sorted(ours.stdout.splitlines()) == sorted(ref.stdout.splitlines()), (
        ref.stdout, ours.stdout)


@pytest.mark.skipif((os.cpu_count() or 1) != 2, reason="the case is written for 2 CPUs")
def test_ppr_over_cores_without_n_differs_on_purpose(tmp_path):
    """``--map-by ppr:2:core`` without -n: pydvm runs what it says, 2 per core
    (4 here, oversubscribing the 2 slots: none bound); mpirun 4.1.4 runs one
    per slot, bound (docs/placement.md)."""
    ref, ours = both("--map-by", "ppr:2:core", "sh", "-c", SHOW, cwd=tmp_path)
    assert ref.returncode == ours.returncode == 0, (ref, ours)
    assert sorted(ref.stdout.splitlines()) == ["R0 0", "R1 1"]
    assert sorted(ours.stdout.splitlines()) == ["R0 0-1", "R1 0-1", "R2 0-1", "R3 0-1"]


def test_display_allocation_and_map_come_before_the_output(tmp_path):
    """Both tables on stdout, before any rank's output, as mpirun prints them
    (pydvm's name the job by its namespace: see docs/placement.md)."""
    ref, ours = both("--display-allocation", "--display-map", "-n", "1", "echo", "OUT",
                     cwd=tmp_path)
    assert ref.returncode == ours.returncode == 0, (ref, ours)
    for p in (ref, ours):
        out = p.stdout
        assert "ALLOCATED NODES" in out and "JOB MAP" in out, out
        assert out.index("ALLOCATED NODES") < out.index("JOB MAP") < out.index("OUT"), out
