"""PydvmExecutor's parts that need no DVM: the job of a resource
specification, which commands run as the program itself, how a bash app
is told from a python app, the executor future's cancel, and the task
runner of python apps (Parsl loaded bare, the whole of it when a function
needs it, results and exceptions sent back)."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import CancelledError
from pathlib import Path

import pytest

pytest.importorskip("parsl")

from parsl.app.app import bash_app, python_app  # noqa: E402
from parsl.executors.errors import InvalidResourceSpecification  # noqa: E402
from parsl.serialize import deserialize, pack_apply_message  # noqa: E402

from pydvm.parsl import task  # noqa: E402
from pydvm.parsl.executor import (_TaskFuture, bash_function, job_env, job_shape,  # noqa: E402
                                  plain_argv, shell_mpi)

HERE = Path(__file__).parent


@pytest.mark.parametrize("spec, shape", [
    ({}, (1, None)),
    (None, (1, None)),
    ({"num_ranks": 4}, (4, None)),
    ({"num_ranks": "4"}, (4, None)),
    ({"ranks_per_node": 2}, (2, 2)),
    ({"num_ranks": 4, "ranks_per_node": 2}, (4, 2)),
    ({"num_ranks": 2, "ranks_per_node": 1}, (2, 1)),
    ({"num_nodes": 2}, (2, 1)),
    ({"num_nodes": 2, "ranks_per_node": 3}, (6, 3)),
    ({"num_nodes": 2, "num_ranks": 4}, (4, 2)),
    ({"num_nodes": "2", "num_ranks": "4", "ranks_per_node": "2.0"}, (4, 2)),
])
def test_the_job_of_a_resource_specification(spec, shape):
    assert job_shape(spec) == shape


@pytest.mark.parametrize("spec, says", [
    ({"num_ranks": 0}, "whole number >= 1"),
    ({"num_ranks": 1.5}, "whole number >= 1"),
    ({"ranks_per_node": "two"}, "is a number"),
    ({"num_nodes": 2, "num_ranks": 3}, "evenly"),
    ({"num_nodes": 2, "num_ranks": 3, "ranks_per_node": 2}, "is not num_nodes 2 x"),
    ({"num_ranks": 2, "launcher_options": "-x"}, "launcher_options are mpiexec's"),
    ({"priority": 1}, "PydvmExecutor takes num_nodes, num_ranks, ranks_per_node"),
])
def test_a_specification_the_dvm_cannot_honour_is_refused(spec, says):
    with pytest.raises(InvalidResourceSpecification) as e:
        job_shape(spec)
    assert says in str(e.value)


def test_the_environment_of_an_apps_job():
    assert job_env(1, None) == {"PARSL_MPI_PREFIX": "", "PARSL_NUM_RANKS": "1"}
    assert job_env(4, 2) == {"PARSL_MPI_PREFIX": "", "PARSL_NUM_RANKS": "4",
                             "PARSL_RANKS_PER_NODE": "2", "PARSL_NUM_NODES": "2"}


def test_which_commands_run_as_the_program_itself(tmp_path):
    prog = tmp_path / "prog"
    prog.write_text("#!/bin/sh\n")
    prog.chmod(0o755)
    (tmp_path / "data").write_text("not executable")
    cwd = str(tmp_path)
    assert plain_argv("./prog -n 3 a=b x,y", cwd=cwd) == ["./prog", "-n", "3", "a=b", "x,y"]
    assert plain_argv("$PARSL_MPI_PREFIX ./prog", cwd=cwd) == ["./prog"]
    assert plain_argv("${PARSL_MPI_PREFIX}  ./prog  1", cwd=cwd) == ["./prog", "1"]
    assert plain_argv("hostname") == ["hostname"]
    for shell_only in ("./prog > out", "./prog | cat", "./prog; ./prog", "./prog $X",
                       "./prog 'a b'", "./prog *", "X=1 ./prog", "echo hi", "true",
                       "cd /tmp", "./data", "./missing", "no-such-program-here", "",
                       "$PARSL_MPI_PREFIX", "$PARSL_MPI_PREFIXED ./prog", "~/prog"):
        assert plain_argv(shell_only, cwd=cwd) is None, shell_only


def test_the_mpi_of_a_shell_command_is_read_off_its_program(tmp_path, monkeypatch):
    """Under bash the DVM cannot read the MPI off the program; the executor
    does, for the program the command starts with."""
    from pydvm.pmi1 import detect

    seen = []

    def interface_of(path, env):
        seen.append(path)
        return "pmi1"

    monkeypatch.setattr(detect, "interface_of", interface_of)
    prog = tmp_path / "prog"
    prog.write_text("")
    cwd = str(tmp_path)
    assert shell_mpi("$PARSL_MPI_PREFIX ./prog | cat", "auto", cwd=cwd) == "pmi1"
    assert seen == [os.path.join(cwd, "./prog")]
    assert shell_mpi("./prog | cat", "pmix", cwd=cwd) == "pmix"  # as asked
    assert shell_mpi("X=1 ./prog", "auto", cwd=cwd) == "auto"  # cannot tell: the DVM's way
    assert shell_mpi("no-such-program-here | cat", "auto", cwd=cwd) == "auto"


@bash_app
def a_bash_app(x, stdout=None):
    return f"echo {x}"


@python_app
def a_python_app(x):
    return x


def test_a_bash_app_is_told_from_a_python_app():
    assert bash_function(a_bash_app.wrapped_remote_function) is a_bash_app.func
    assert bash_function(a_python_app.func) is None
    assert bash_function(len) is None


class _FakeJob:
    def __init__(self):
        self.kills = 0
        self.state = "running"

    def kill(self):
        self.kills += 1

    def running(self):
        return self.state == "running"


def test_the_executor_future_kills_its_job_once_when_cancelled():
    f = _TaskFuture(7)
    f.job = job = _FakeJob()
    assert f.running() and f.parsl_executor_task_id == 7
    assert f.cancel() is True and f.cancel() is True  # twice: one kill
    assert job.kills == 1 and f.cancelled()
    with pytest.raises(CancelledError):
        f.result(0)
    f._settle(5)  # the job's end, after: ignored
    assert f.cancelled()
    done = _TaskFuture(8)
    done.job = job
    done._settle(5)
    assert done.cancel() is False and done.result(0) == 5 and job.kills == 1


# -- the task runner -----------------------------------------------------------------

RUNNER_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(
    [str(HERE)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}


def run_task(tmp_path, func, *args, rank=0, **kwargs):
    """Run ``func`` packed as the executor packs it through the task runner,
    as the executor runs it; what it sent back, or None when it wrote nothing."""
    inp, out = tmp_path / "in.pkl", tmp_path / "out.pkl"
    inp.write_bytes(pack_apply_message(func, args, kwargs))
    out.unlink(missing_ok=True)
    p = subprocess.run([sys.executable, task.__file__, str(inp), str(out),
                        str(tmp_path / "log")],
                       env={**RUNNER_ENV, "PYDVM_RANK": str(rank)}, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return deserialize(out.read_bytes()) if out.exists() else None


def _modules_loaded():
    import sys

    return sorted(m for m in sys.modules if m == "parsl" or m.startswith("parsl."))


def _whole_parsl():
    import parsl  # noqa: F401 -- the package, then one of its own names
    from parsl.app.app import python_app as pa

    return parsl.python_app is pa, parsl.__version__


def _fails():
    raise KeyError("nope")


def _unpicklable():
    return (x for x in range(3))  # a generator: neither pickle nor dill takes one


def test_the_runner_loads_only_parsls_serializer_for_a_function_that_needs_no_more(
        tmp_path):
    """A function from this module, which imports Parsl whole: here the
    runner has run parsl/__init__ before the module's imports, as they need."""
    ok, mods = run_task(tmp_path, _modules_loaded)
    assert ok and "parsl.dataflow.dflow" in mods  # this module imported parsl.app.app
    code = ("import sys\nfrom pydvm.parsl.task import bare_parsl\nbare_parsl()\n"
            "import parsl.serialize, parsl.app.errors\n"
            "print(sorted(m for m in sys.modules if m.startswith('parsl.')))\n"
            "from parsl.app.app import python_app\nimport parsl\n"
            "print(parsl.python_app is python_app, 'parsl.dataflow.dflow' in sys.modules)\n"
            "import parsl.app.python as p\n"
            "print(p.wrap_error is sys.modules['parsl.app.errors'].wrap_error)\n")
    p = subprocess.run([sys.executable, "-c", code], env=RUNNER_ENV, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    light, whole, modules = p.stdout.splitlines()
    assert "parsl.dataflow.dflow" not in light and "parsl.serialize.facade" in light
    assert whole == "True True" and modules == "True"  # one of each module


def test_the_runner_sends_back_a_value_an_exception_or_what_went_wrong(tmp_path):
    import parsl

    assert run_task(tmp_path, _whole_parsl) == (True, (True, parsl.__version__))
    ok, exc = run_task(tmp_path, _fails)
    assert not ok and isinstance(exc, KeyError)
    ok, exc = run_task(tmp_path, sys.exit, 3)
    assert not ok and isinstance(exc, SystemExit)
    ok, exc = run_task(tmp_path, _unpicklable)
    assert not ok and "could not be serialized" in str(exc)
    # run by its path: no pydvm, and its own directory not first on sys.path
    from parsl_apps import runner_context

    ok, (pydvm_loaded, first) = run_task(tmp_path, runner_context)
    assert ok and not pydvm_loaded and first != os.path.dirname(task.__file__)
    # what it prints goes to LOG.out and LOG.err, appended to
    from parsl_apps import chatty

    assert run_task(tmp_path, chatty) == (True, 1)
    assert (tmp_path / "log.out").read_text().endswith("to stdout\n")
    assert (tmp_path / "log.err").read_text().endswith("to stderr\n")
    # ranks other than 0 run the function and send nothing back
    assert run_task(tmp_path, _whole_parsl, rank=1) is None
