"""MPICH's command line (Hydra's ``mpiexec``) under ``pydvm run``, beside
``mpiexec.hydra`` itself.

Each test runs the same command line under both launchers with one MPICH
program (``programs/probe.c``: each rank prints its rank, its node, its
working directory and the variables it is asked for) and compares what
every rank saw.  Hydra runs every host on this machine (``-launcher fork``,
the one word only it is given: pydvm refuses it, its daemons are started
by ``pydvm start``); a rank's host under Hydra is the host its proxy stands
for (``proxy:I``, the I-th host listed), under pydvm its node (``a``,
``b`` of a DVM of local nodes).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HYDRA_TIMEOUT = 60
PROBE = re.compile(r"rank (\d+) of (\d+) on (\S+) cwd (\S+)(.*)")


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> str:
    cc = shutil.which("mpicc.mpich")
    if cc is None or shutil.which("mpiexec.hydra") is None:
        pytest.skip("Debian's MPICH is not installed (apt-get install mpich libmpich-dev)")
    exe = tmp_path_factory.mktemp("probe") / "probe"
    subprocess.run([cc, "-O1", "-o", str(exe), str(Path(__file__).parent / "programs" /
                                                     "probe.c")],
                   check=True, timeout=120, capture_output=True)
    return str(exe)


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYDVM_URI"}
    env.update(extra or {})
    return env


def seen(p: subprocess.CompletedProcess, hosts: list[str] | None = None) -> dict[int, tuple]:
    """rank -> (size, host, cwd, variables) as the probe printed them; a
    Hydra proxy's index is replaced by the name of the host it stands for."""
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    out = {}
    for line in p.stdout.splitlines():
        m = PROBE.fullmatch(line.strip())
        assert m, line
        rank, size, node, cwd, rest = m.groups()
        if node.startswith("proxy:") and hosts is not None:
            node = hosts[int(node[len("proxy:"):])]
        out[int(rank)] = (int(size), node, cwd, rest.split())
    assert sorted(out) == list(range(len(out))), p.stdout
    return out


def hydra(*args: str, env: dict[str, str] | None = None,
          cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["mpiexec.hydra", "-launcher", "fork", *args], capture_output=True,
                          text=True, timeout=HYDRA_TIMEOUT, env=_env(env), cwd=cwd,
                          stdin=subprocess.DEVNULL)


def one_shot(*args: str, env: dict[str, str] | None = None,
             cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    """``pydvm run`` with no DVM given: its one-shot DVM's daemons run on
    this machine with this environment, as Hydra's proxies do."""
    return subprocess.run([sys.executable, "-m", "pydvm", "run", *args], capture_output=True,
                          text=True, timeout=HYDRA_TIMEOUT, env=_env(env), cwd=cwd,
                          stdin=subprocess.DEVNULL)


def hosts_by_rank(s: dict[int, tuple]) -> list[str]:
    return [s[r][1] for r in sorted(s)]


# ----------------------------------------------------------------------
# placement: -hosts, -ppn, -f, -n, contexts
# ----------------------------------------------------------------------


def test_parsl_mpi_mode_line_places_ranks_as_mpiexec(dvm2, probe):
    """What Parsl's MPI mode writes: ``mpiexec -n 4 -ppn 2 -hosts N1,N2 ./app``."""
    line = ["-n", "4", "-ppn", "2", "-hosts", "a,b"]
    theirs = seen(hydra(*line, probe), ["a", "b"])
    ours = seen(dvm2.run(*line, probe))
    assert hosts_by_rank(ours) == hosts_by_rank(theirs) == ["a", "a", "b", "b"]
    assert {s[0] for s in ours.values()} == {4}


@pytest.mark.parametrize("line,hosts,expect", [
    # one slot per host unless :N; wrapping around past the slots
    (["-n", "4", "-hosts", "a,b"], ["a", "b"], "abab"),
    (["-n", "4", "-hosts", "a:2,b:2"], ["a", "b"], "aabb"),
    (["-n", "3", "-hosts", "b,a"], ["b", "a"], "bab"),
    # without -n: one per slot of the hosts; -ppn N on each
    (["-hosts", "a:2,b"], ["a", "b"], "aab"),
    (["-hosts", "a,b", "-ppn", "2"], ["a", "b"], "aabb"),
    # -ppn overrides the hosts' slots, and wraps
    (["-n", "6", "-ppn", "2", "-hosts", "a:3,b"], ["a", "b"], "aabbaa"),
    (["-ppn", "1", "-n", "3", "-hosts", "a:2,b:2"], ["a", "b"], "aba"),
    # global options after the first option of a context
    (["-n", "4", "-hosts", "a,b", "-ppn", "2"], ["a", "b"], "aabb"),
], ids=lambda v: " ".join(v) if isinstance(v, list) and v and v[0].startswith("-") else None)
def test_hosts_and_ppn_place_ranks_as_mpiexec(dvm2, probe, line, hosts, expect):
    theirs = seen(hydra(*line, probe), hosts)
    ours = seen(dvm2.run(*line, probe))
    assert "".join(hosts_by_rank(theirs)) == expect, hosts_by_rank(theirs)  # what Hydra did
    assert hosts_by_rank(ours) == hosts_by_rank(theirs)


@pytest.mark.parametrize("text,hosts,n,expect", [
    ("a\nb\n", ["a", "b"], 3, "aba"),
    ("# two hosts\na:2\n\n  b:1   # one\n", ["a", "b"], 5, "aabaa"),
    ("a\na\nb\n", ["a", "b"], 4, "aaba"),  # a host on consecutive lines adds its slots
    ("b:2\na:2\n", ["b", "a"], None, "bbaa"),  # no -n: one rank per slot
], ids=["plain", "slots-comments", "repeated", "no-n"])
def test_a_host_file_in_mpiexecs_format_places_ranks_as_mpiexec(dvm2, probe, tmp_path, text,
                                                                  hosts, n, expect):
    f = tmp_path / "hosts"
    f.write_text(text)
    line = ["-f", str(f)] + (["-n", str(n)] if n else [])
    theirs = seen(hydra(*line, probe), hosts)
    ours = seen(dvm2.run(*line, probe))
    assert "".join(hosts_by_rank(theirs)) == expect
    assert hosts_by_rank(ours) == hosts_by_rank(theirs)


def test_contexts_go_on_where_the_previous_one_ended_as_under_mpiexec(dvm2, probe):
    """Hydra places an MPMD job's contexts as one sequence over the hosts."""
    for line, hosts in [
            (["-hosts", "a,b", "-n", "1", probe, ":", "-n", "2", probe, ":", "-n", "1", probe],
             ["a", "b"]),
            (["-hosts", "a:2,b", "-n", "1", probe, ":", "-n", "3", probe], ["a", "b"]),
            (["-n", "3", "-ppn", "1", "-hosts", "b,a", probe, ":", "-n", "2", probe],
             ["b", "a"])]:
        theirs = seen(hydra(*line), hosts)
        ours = seen(dvm2.run(*line))
        assert hosts_by_rank(ours) == hosts_by_rank(theirs), line


# ----------------------------------------------------------------------
# environment: -genv, -genvlist, -genvnone, -genvall, -env...
# ----------------------------------------------------------------------

SHELL_ENV = {"PROBE_A": "from-shell", "PROBE_B": "shell-b"}
VARS = ["PROBE_A", "PROBE_B", "PROBE_G", "PROBE_L"]


@pytest.mark.parametrize("line", [
    ["-genv", "PROBE_G", "g", "-n", "2"],
    ["-genv", "PROBE_G=g2", "-genv", "PROBE_A", "over", "-n", "1"],
    ["-n", "1", "-env", "PROBE_L", "l"],
    ["-n", "1", "-env", "PROBE_L=l2", "-env", "PROBE_G", "local-wins", "-genv", "PROBE_G", "g"],
    ["-genvall", "-genv", "PROBE_G", "g", "-n", "1"],
    ["-genvnone", "-genv", "PROBE_G", "g", "-n", "1"],
    ["-genvlist", "PROBE_A,NO_SUCH_VAR", "-n", "1", "-env", "PROBE_L", "l"],
    ["-n", "1", "-envnone", "-env", "PROBE_L", "l"],
    ["-genvnone", "-n", "1", "-envall"],
    ["-n", "1", "-envlist", "PROBE_B"],
], ids=lambda v: " ".join(v))
def test_environment_options_give_each_rank_what_mpiexec_gives_it(probe, tmp_path, line):
    """On one machine Hydra's processes start from its proxy's environment,
    which is mpiexec's own; pydvm's (-genvnone, -genvlist) from their
    daemon's, which a one-shot DVM's daemons share with pydvm run: each rank
    must see the same variables under both."""
    theirs = seen(hydra("-hosts", "a", *line, probe, *VARS, env=SHELL_ENV), ["a"])
    ours = seen(one_shot("-hosts", "a", *line, probe, *VARS, env=SHELL_ENV, cwd=tmp_path))
    assert {r: s[3] for r, s in ours.items()} == {r: s[3] for r, s in theirs.items()}


def test_an_environment_option_of_a_second_context_as_under_mpiexec(probe, tmp_path):
    """-genv is global wherever it is written; -env is its context's."""
    line = ["-hosts", "a", "-n", "1", probe, *VARS, ":", "-genv", "PROBE_G", "late", "-n", "1",
            "-env", "PROBE_L", "second", probe, *VARS]
    theirs = seen(hydra(*line), ["a"])
    ours = seen(one_shot(*line, cwd=tmp_path))
    assert {r: s[3] for r, s in ours.items()} == {r: s[3] for r, s in theirs.items()}
    assert theirs[0][3] == ["PROBE_A", "unset", "PROBE_B", "unset", "PROBE_G=late", "PROBE_L",
                            "unset"]


def test_genvnone_starts_from_the_nodes_environment_not_the_callers(dvm2, probe):
    """On a persistent DVM the node's environment is its daemon's: a
    variable of pydvm run's environment alone reaches the ranks by default
    and by -genvlist, not with -genvnone; the daemon's HOME is theirs then."""
    env = {"PROBE_A": "caller", "HOME": "/callers-home"}
    line = ["-hosts", "a,b", "-n", "2"]
    default = seen(dvm2.run(*line, probe, "PROBE_A", "HOME", env=env))
    none = seen(dvm2.run("-genvnone", *line, probe, "PROBE_A", "HOME", env=env))
    listed = seen(dvm2.run("-genvlist", "PROBE_A", *line, probe, "PROBE_A", "HOME", env=env))
    dvm_home = dvm2.env["HOME"]
    assert dvm_home != "/callers-home"
    for r in range(2):
        assert default[r][3] == ["PROBE_A=caller", "HOME=/callers-home"]
        assert none[r][3] == ["PROBE_A", "unset", f"HOME={dvm_home}"]
        assert listed[r][3] == ["PROBE_A=caller", f"HOME={dvm_home}"]


# ----------------------------------------------------------------------
# -wdir, -configfile
# ----------------------------------------------------------------------


def test_wdir_is_each_contexts_relative_to_the_callers(dvm2, probe, tmp_path):
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    line = ["-hosts", "a,b", "-wdir", "one", "-n", "1", probe, ":", "-n", "1", probe, ":",
            "-wdir", str(tmp_path / "two"), "-n", "1", probe]
    theirs = seen(hydra(*line, cwd=tmp_path), ["a", "b"])
    ours = seen(dvm2.run(*line, cwd=tmp_path))
    assert [s[2] for _, s in sorted(ours.items())] == [s[2] for _, s in sorted(theirs.items())] \
        == [str(tmp_path / "one"), str(tmp_path), str(tmp_path / "two")]


def test_configfile_holds_the_contexts_as_under_mpiexec(dvm2, probe, tmp_path):
    conf = tmp_path / "conf"
    conf.write_text(f"# an MPMD job\n-n 2 -env PROBE_L one {probe} PROBE_L PROBE_G\n"
                    f"-genv PROBE_G g -n 1 -env PROBE_L two {probe} PROBE_L PROBE_G\n")
    theirs = seen(hydra("-hosts", "a,b", "-configfile", str(conf)), ["a", "b"])
    ours = seen(dvm2.run("-hosts", "a,b", "-configfile", str(conf)))
    assert ours == theirs
    assert [s[3][0] for _, s in sorted(ours.items())] == ["PROBE_L=one"] * 2 + ["PROBE_L=two"]


# ----------------------------------------------------------------------
# what both refuse
# ----------------------------------------------------------------------


@pytest.mark.parametrize("line", [
    ["-genvnone", "-genvall"],
    ["-genvlist", "A", "-genvlist", "B"],
    ["-hosts", "a", "-hosts", "b"],
    ["-n", "1", "-envnone", "-envall"],
], ids=lambda v: " ".join(v))
def test_what_mpiexec_refuses_pydvm_refuses_before_running_anything(dvm2, probe, line):
    theirs = hydra(*line, "-n", "1", probe)
    ours = dvm2.run(*line, "-n", "1", probe)
    assert theirs.returncode != 0 and "rank 0" not in theirs.stdout
    assert ours.returncode == 2 and ours.stdout == "", ours.stdout
    assert line[-1 if line[-1].startswith("-") else -2] in ours.stderr.splitlines()[0], \
        ours.stderr


def test_another_users_job_gets_a_logins_basics_never_the_daemons_variables(monkeypatch):
    """-genvnone on a shared DVM: a job of another user than the daemon's
    starts from PATH and that user's own HOME, USER, LOGNAME, SHELL."""
    import pwd

    from pydvm.runtime.node.launch import node_environment

    monkeypatch.setenv("OWNERS_SECRET", "s3cret")
    monkeypatch.setenv("PYDVM_STATE_DIR", "/owner/state")
    own = node_environment()
    assert own["OWNERS_SECRET"] == "s3cret" and "PYDVM_STATE_DIR" not in own
    nobody = pwd.getpwnam("nobody")
    other = node_environment(nobody.pw_uid)
    assert other == {"PATH": os.environ["PATH"], "HOME": nobody.pw_dir, "USER": "nobody",
                     "LOGNAME": "nobody", "SHELL": nobody.pw_shell}
