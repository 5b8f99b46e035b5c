"""The command line's help and usage errors (issue 11), without a DVM.

Every option of every subcommand has a help text; ``--version`` works; a bad
argument is a usage error (exit 2, a message naming the option) before the
command does anything -- shown by running each with nowhere to send
anything: no DVM, no daemon socket.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from pydvm import __version__
from pydvm.cli import build_parser
from pydvm.cli.helptext import PERSISTENCE_MEANINGS, RANGE_MEANINGS
from pydvm.cli.runopts import run_help

RUN_HELP = run_help()
from pydvm.enums import Persistence, Range

PYDVM = [sys.executable, "-m", "pydvm"]


def _subparsers(parser: argparse.ArgumentParser, path=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from _subparsers(sub, (*path, name))


def _pydvm(*args: str, tmp_path, stdin: str = "",
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    extra = env or {}
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYDVM_URI", "PYDVM_SERVER", "PYDVM_NSPACE", "PYDVM_RANK")
           and not k.startswith("PRTE_MCA_")}
    env.update(extra)
    env["PYDVM_STATE_DIR"] = str(tmp_path / "state")
    return subprocess.run(PYDVM + list(args), env=env, capture_output=True, text=True,
                          timeout=60, input=stdin, cwd=tmp_path)


def test_every_option_of_every_subcommand_has_a_help_text():
    """Walk the parser: no option or argument is left undescribed."""
    missing = []
    for path, sub in _subparsers(build_parser()):
        if path == ("run",):
            continue  # pydvm run has its own parser and help (checked below)
        for action in sub._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if not action.help:
                missing.append(f"pydvm {' '.join(path)} {action.dest}")
    assert not missing, missing


def test_run_help_describes_every_option_it_parses():
    """`pydvm run --help` names each option parse_run accepts."""
    for opt in ("--dvm", "--session", "--mca", "--tag-output", "--abort-on-failure", "-n",
                "--np", "--host", "--"):
        assert f"  {opt} " in RUN_HELP or f", {opt} " in RUN_HELP, opt


def test_publish_and_lookup_help_list_every_range_and_persistence_with_its_meaning(tmp_path):
    """Each word appears in --help next to its meaning."""
    assert set(RANGE_MEANINGS) == set(Range)
    assert set(PERSISTENCE_MEANINGS) == set(Persistence) - {Persistence.INVALID}
    pub = _pydvm("publish", "--help", tmp_path=tmp_path)
    look = _pydvm("lookup", "--help", tmp_path=tmp_path)
    assert pub.returncode == 0 and look.returncode == 0
    for r in Range:
        assert any(ln.split()[:1] == [r.word] for ln in pub.stdout.splitlines()), r
        assert any(ln.split()[:1] == [r.word] for ln in look.stdout.splitlines()), r
    for p in PERSISTENCE_MEANINGS:
        assert any(ln.split()[:1] == [p.word] for ln in pub.stdout.splitlines()), p


@pytest.mark.parametrize("cmd", ["start", "dvms", "ps", "kill", "stop", "store", "info",
                                 "session", "daemon", "publish", "lookup", "unpublish", "run"])
def test_every_subcommand_answers_help_with_exit_0(cmd, tmp_path):
    p = _pydvm(cmd, "--help", tmp_path=tmp_path)
    assert p.returncode == 0 and p.stdout.startswith(f"usage: pydvm {cmd}"), p.stderr


def test_version_prints_the_package_version(tmp_path):
    p = _pydvm("--version", tmp_path=tmp_path)
    assert p.returncode == 0 and p.stdout.strip() == f"pydvm {__version__}"


@pytest.mark.parametrize("args,option", [
    (("publish", "k=v", "--hold", "-1"), "--hold"),
    (("publish", "k=v", "--hold", "nan"), "--hold"),
    (("publish", "k=v", "--access-uid", "-3"), "--access-uid"),
    (("publish", "k=v", "--range", "everywhere"), "--range"),
    (("lookup", "k", "--timeout", "-2"), "--timeout"),
    (("lookup", "k", "--wait-count", "-1"), "--wait-count"),
    (("start", "--port", "99999"), "--port"),
    (("start", "--port", "-1"), "--port"),
    (("start", "--dvm-id", "a/b"), "--dvm-id"),
    (("start", "--mca", "prte_data_server_verbose", "3"), "prte_data_server_verbose"),
    (("start", "--mca", "prte_data_server_verbose", "-1"), "prte_data_server_verbose"),
    (("start", "--mca", "no_such_param", "1"), "no_such_param"),
    (("start", "--hosts", "a,a"), "host listed twice"),
    (("run", "-n", "0", "true"), "-n"),
    (("run", "--mca", "prte_data_server_verbose", "9", "-n", "1", "true"),
     "prte_data_server_verbose"),
    (("session", "end", "notanumber"), "session id"),
])
def test_bad_arguments_are_usage_errors_before_anything_happens(args, option, tmp_path):
    """Exit 2 and a message naming the option; no publish reached a daemon (there is none:
    a publish that went ahead would fail with STATUS), no DVM started (no state written)."""
    p = _pydvm(*args, tmp_path=tmp_path)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert option in p.stderr, p.stderr
    assert "STATUS" not in p.stdout and "tcp://" not in p.stdout
    assert not (tmp_path / "state").exists() or not any((tmp_path / "state").iterdir())


def test_verbose_range_is_0_to_2_and_documented_in_its_help():
    from pydvm import params as P

    assert P.resolve([("prte_data_server_verbose", "2")])["prte_data_server_verbose"].value == 2
    with pytest.raises(P.ParamError, match="between 0 and 2"):
        P.resolve([("prte_data_server_verbose", "3")])
    assert "(0..2)" in P.REGISTRY["prte_data_server_verbose"].help


# ----------------------------------------------------------------------
# parameters: what a bad one looks like, and names that are not pydvm's
# ----------------------------------------------------------------------


def _one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("cmd", [("start",), ("run", "-n", "1", "true")])
def test_a_malformed_size_says_what_a_size_looks_like(cmd, tmp_path):
    """`--mca prte_data_server_max_size 10x`: one line naming the parameter and the
    form of a size, not Python's int() complaint."""
    args = (*cmd[:1], "--mca", "prte_data_server_max_size", "10x", *cmd[1:])
    p = _pydvm(*args, tmp_path=tmp_path)
    assert p.returncode == 2, p.stderr
    line = _one_line(p.stderr)
    assert "prte_data_server_max_size" in line and "'10x'" in line, line
    assert "k, m or g" in line and "16m" in line, line
    assert "invalid literal" not in line and "base 0" not in line, line


def test_an_open_mpi_parameter_on_run_reaches_the_processes_as_mpirun_passes_it(tmp_path):
    """`pydvm run --mca btl self,tcp` is Open MPI's parameter, not pydvm's: every
    process gets OMPI_MCA_btl=self,tcp, as under mpirun; a pydvm parameter beside
    it still sets the one-shot DVM (and a misspelt one is still refused)."""
    p = _pydvm("run", "--mca", "btl", "self,tcp", "--mca", "prte_data_server_timeout", "9",
               "-n", "2", "sh", "-c", 'echo "btl=$OMPI_MCA_btl"', tmp_path=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["btl=self,tcp"] * 2, p.stdout
    p = _pydvm("run", "--mca", "prte_data_server_timeuot", "9", "-n", "1", "true",
               tmp_path=tmp_path)
    assert p.returncode == 2 and "did you mean prte_data_server_timeout?" in p.stderr, p.stderr


@pytest.mark.parametrize("cmd", [("start",)])
def test_an_open_mpi_parameter_on_mca_is_pointed_at_its_environment_variable(cmd, tmp_path):
    """`pydvm start --mca btl self,tcp` is not pydvm's: the error says where Open
    MPI's own parameters go (the job inherits pydvm run's environment, and
    `pydvm run --mca` passes them on)."""
    args = (*cmd[:1], "--mca", "btl", "self,tcp", *cmd[1:])
    p = _pydvm(*args, tmp_path=tmp_path)
    assert p.returncode == 2, p.stderr
    line = _one_line(p.stderr)
    assert "unknown parameter 'btl'" in line and "OMPI_MCA_btl=self,tcp" in line, line


def test_a_misspelt_mca_name_gets_the_name_it_is_close_to(tmp_path):
    p = _pydvm("start", "--mca", "prte_data_server_timeuot", "9", tmp_path=tmp_path)
    assert p.returncode == 2, p.stderr
    line = _one_line(p.stderr)
    assert "did you mean prte_data_server_timeout?" in line and "OMPI_MCA" not in line, line


def test_a_misspelt_prte_mca_variable_is_warned_about_and_prrte_ones_are_not(tmp_path):
    """PRTE_MCA_prte_data_server_timeuot (a typo) is ignored, and says so in one
    stderr line naming the closest name; PRTE_MCA_ras_base_verbose -- one of
    PRRTE's own many parameters -- is left alone, silently."""
    env = {"PRTE_MCA_prte_data_server_timeuot": "9", "PRTE_MCA_ras_base_verbose": "5"}
    p = _pydvm("info", tmp_path=tmp_path, env=env)
    assert p.returncode == 0, p.stderr
    line = _one_line(p.stderr)
    assert "PRTE_MCA_prte_data_server_timeuot" in line and "ignored" in line, line
    assert "did you mean PRTE_MCA_prte_data_server_timeout?" in line, line
    assert any(ln.split()[:3] == ["prte_data_server_timeout", "300.0", "(default)"]
               for ln in p.stdout.splitlines()), p.stdout  # indeed not taken
    q = _pydvm("info", tmp_path=tmp_path, env={"PRTE_MCA_ras_base_verbose": "5"})
    assert q.returncode == 0 and q.stderr == "", q.stderr


# ----------------------------------------------------------------------
# commands that need a DVM, given none; pydvm run given nothing to run
# ----------------------------------------------------------------------


@pytest.mark.parametrize("args", [("ps",), ("stop",), ("store",), ("kill", "pydvm-x@1"),
                                  ("session", "new"), ("session", "end", "1")])
def test_a_command_that_needs_a_dvm_says_how_to_find_or_start_one(args, tmp_path):
    """No --dvm, no PYDVM_URI: one line naming both, 'pydvm dvms' and how to start one."""
    p = _pydvm(*args, tmp_path=tmp_path)
    assert p.returncode == 1, p.stderr
    line = _one_line(p.stderr)
    assert line.startswith("pydvm: no DVM given:") and "--dvm URI" in line, line
    assert "PYDVM_URI" in line and "'pydvm dvms'" in line and "pydvm start" in line, line


def test_run_with_nothing_to_run_says_so_before_the_usage(tmp_path):
    p = _pydvm("run", tmp_path=tmp_path)
    assert p.returncode == 2 and p.stdout == ""
    first, *rest = p.stderr.splitlines()
    assert first.startswith("pydvm run: nothing to run: give a command"), first
    assert rest and rest[0].startswith("usage: pydvm run"), p.stderr


# ----------------------------------------------------------------------
# the command line page's synopsis against the parsers
# ----------------------------------------------------------------------


def _cli_synopsis() -> dict[str, str]:
    """docs/cli.md's "Command line" synopsis: each subcommand's entry (its line and
    continuation lines), by the names it covers (``stop | store ...`` covers four)."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    block = text.split("## Command line", 1)[1].split("```", 2)[1]
    entries: list[str] = []
    for ln in block.splitlines():
        if ln.startswith("pydvm "):
            entries.append(ln)
        elif ln.startswith(" ") and entries:
            entries[-1] += " " + ln.strip()
    out: dict[str, str] = {}
    for e in entries:
        body = e.split("  (")[0]  # drop a trailing explanation
        for part in body[len("pydvm "):].split(" | "):
            words = part.split()
            if words and re.fullmatch(r"[a-z]+", words[0]):
                name = words[0] if words[0] != "session" else " ".join(words[:2])
                out[name] = body
    return out


def test_the_cli_synopsis_shows_every_option_of_every_command():
    """Each subcommand's options (long or short form) appear in its docs/cli.md entry."""
    syn = _cli_synopsis()
    missing = []
    for path, sub in _subparsers(build_parser()):
        name = " ".join(path)
        if name in ("run", "session"):
            continue  # run: below; session: its two actions have entries
        assert name in syn, f"no docs/cli.md synopsis entry for pydvm {name}"
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction) or not action.option_strings:
                continue
            if not any(o in syn[name].replace("[", " ").replace("]", " ").split()
                       for o in action.option_strings):
                missing.append(f"pydvm {name} {'/'.join(action.option_strings)}")
    assert not missing, missing


def test_run_synopsis_shows_every_option_and_n_as_optional():
    """`-n` defaults to 1: docs/cli.md and `pydvm run --help` show it in brackets."""
    import re

    run = _cli_synopsis()["run"]
    for opt in ("--dvm", "--session", "--mca", "--tag-output", "--abort-on-failure", "--pmix",
                "--host"):
        assert f"[{opt}" in run, opt
    assert re.search(r"\[-n N\] CMD", run) and " -n N CMD" not in run, run
    usage = RUN_HELP.split("\n\n", 1)[0]
    assert "[-n N] CMD" in usage and " -n N CMD" not in usage, usage
    assert "number of processes (default 1;" in RUN_HELP


def test_the_mpirun_page_lists_every_mpirun_option_as_declared():
    """docs/mpirun.md's table is the one the declarations make, and it covers
    every option of ``mpirun --help all`` (Open MPI 4.1.4) that pydvm mirrors
    or refuses; no spelling is both accepted and refused."""
    from pathlib import Path

    from pydvm.cli.mpirunopts import NOT_SUPPORTED, mpirun_table
    from pydvm.client.options import BY_NAME, OPTIONS

    doc = (Path(__file__).parent.parent / "docs" / "mpirun.md").read_text()
    start = "<!-- table: pydvm.cli.mpirunopts.mpirun_table() -->\n"
    body = doc[doc.index(start) + len(start):doc.index("<!-- end of table -->")]
    assert body == mpirun_table(), "regenerate the table: python -c 'from pydvm.cli.mpirunopts " \
                                   "import mpirun_table; print(mpirun_table())'"
    assert not set(BY_NAME) & set(NOT_SUPPORTED)
    for o in OPTIONS:
        if o.mirrors:
            assert o.mirrors in o.names, o.names
            assert f"| `{o.mirrors}` |" in body
    for name in NOT_SUPPORTED:
        if name.startswith("--"):
            assert f"| `{name}` | refused |" in body, name


def test_run_help_shows_every_declared_option():
    from pydvm.cli.runopts import OPTIONS

    for o in OPTIONS:
        assert o.help and any(f"  {n}" in RUN_HELP or f", {n}" in RUN_HELP for n in o.names), \
            o.names


# ----------------------------------------------------------------------
# MPICH's mpiexec (Hydra): its options, its clashes with mpirun's
# ----------------------------------------------------------------------


def _hydra_help_options() -> list[str]:
    """Every option ``mpiexec.hydra --help`` (MPICH 4.0.2) lists."""
    import re
    import shutil

    if shutil.which("mpiexec.hydra") is None:
        pytest.skip("Debian's MPICH is not installed (apt-get install mpich)")
    p = subprocess.run(["mpiexec.hydra", "--help"], capture_output=True, text=True, timeout=30)
    names = []
    for ln in p.stdout.splitlines():
        m = re.match(r"\s{4}(-[\w-]+(?:/-[\w-]+)*)\s", ln)
        if m:
            names += m.group(1).split("/")
    assert len(names) > 30, p.stdout
    return names


def test_the_mpiexec_page_lists_every_mpiexec_option_as_declared():
    """docs/mpiexec.md's table is the one the declarations make; every
    option ``mpiexec.hydra --help`` lists is either taken or refused with
    advice (one of mpirun's refusals for the two it shares), and no
    spelling is both."""
    from pathlib import Path

    from pydvm.cli.hydraopts import HYDRA_NOT_SUPPORTED, mpiexec_table
    from pydvm.cli.mpirunopts import NOT_SUPPORTED
    from pydvm.client.options import BY_NAME

    doc = (Path(__file__).parent.parent / "docs" / "mpiexec.md").read_text()
    start = "<!-- table: pydvm.cli.hydraopts.mpiexec_table() -->\n"
    body = doc[doc.index(start) + len(start):doc.index("<!-- end of table -->")]
    assert body == mpiexec_table(), "regenerate the table: python -c 'from pydvm.cli.hydraopts " \
                                    "import mpiexec_table; print(mpiexec_table())'"
    assert "\n## Command line\n" in doc
    assert not set(BY_NAME) & set(HYDRA_NOT_SUPPORTED)
    assert not set(NOT_SUPPORTED) & set(HYDRA_NOT_SUPPORTED)
    for name in _hydra_help_options():
        assert name in BY_NAME or name in HYDRA_NOT_SUPPORTED or name in NOT_SUPPORTED, name
        assert f"| `{name}` |" in body or name == "-np", name


@pytest.mark.parametrize("args,advice", [
    (("-launcher", "fork"), "'pydvm start'"),
    (("-l",), "--tag-output"),
    (("--prepend-rank",), "--tag-output"),
    (("-bootstrap", "ssh"), "'pydvm start'"),
    (("-outfile-pattern", "out.%r"), "--output-filename"),
    (("-gpus-per-proc", "1"), "CUDA_VISIBLE_DEVICES"),
])
def test_an_mpiexec_option_pydvm_has_not_is_refused_with_advice(args, advice, tmp_path):
    p = _pydvm("run", *args, "-n", "1", "true", tmp_path=tmp_path)
    assert p.returncode == 2, p.stderr
    first = p.stderr.splitlines()[0]
    assert f"{args[0]} (an mpiexec option) is not supported" in first and advice in first, first
    assert not (tmp_path / "state").exists() or not any((tmp_path / "state").iterdir())


@pytest.mark.parametrize("text,option,says", [
    ("a slots=2\n", "-f", "give this file with --hostfile, or write 'a:N'"),
    ("a binding=core\n", "-f", "--bind-to"),
    ("a:2\nb\na\n", "-f", "listed again after other hosts"),
    ("a:x\n", "-f", "bad slot count"),
    ("# none\n", "-f", "names no host"),
    ("a:2\n", "--hostfile", "mpiexec's host:SLOTS form: give this file with -f"),
    ("a:2\n", "-machinefile", "give this file with -f, or write 'a slots=N'"),
])
def test_a_host_file_in_the_other_launchers_format_is_pointed_at_its_option(text, option, says,
                                                                              tmp_path):
    f = tmp_path / "hosts"
    f.write_text(text)
    p = _pydvm("run", option, str(f), "-n", "1", "true", tmp_path=tmp_path)
    assert p.returncode == 2, p.stderr
    first = p.stderr.splitlines()[0]
    assert says in first and f"{f}:" in first or "names no host" in first, first


@pytest.mark.parametrize("args,says", [
    (("-genv",), "-genv needs NAME VALUE"),
    (("-genv", "A"), "-genv A needs a value"),
    (("-genv", "=x", "-n", "1", "true"), "needs a variable name"),
    (("-ppn", "0", "-n", "1", "true"), "-ppn must be at least 1"),
    (("-genvlist", "A=1", "-n", "1", "true"), "a list of variable names"),
    (("-hosts", "a", "-f", "/dev/null", "-n", "1", "true"), "give the hosts once"),
    (("-hosts", "a", "--hostfile", "/dev/null", "true"), "give the hosts once"),
    (("-configfile", "/nonexistent"), "-configfile /nonexistent: cannot read it"),
    (("-configfile", "/dev/null", "-n", "1", "true"), "-configfile FILE names the app"),
])
def test_a_malformed_mpiexec_option_is_a_usage_error(args, says, tmp_path):
    p = _pydvm("run", *args, tmp_path=tmp_path)
    assert p.returncode == 2, p.stderr
    assert says in p.stderr.splitlines()[0], p.stderr
