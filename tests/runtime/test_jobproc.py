"""Starting and reaping job processes (pydvm.runtime.shared.jobproc), with real processes."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess

import pytest

from pydvm.runtime.shared import jobproc


@pytest.fixture
def no_setpriv(monkeypatch):
    monkeypatch.setattr(jobproc, "_setpriv", [None])


def test_the_command_goes_through_setpriv_with_the_death_signal_after_the_user_switch(
        monkeypatch):
    monkeypatch.setattr(jobproc, "_setpriv", ["/usr/bin/setpriv"])
    assert jobproc.command_line(["prog", "-x"], None) == [
        "/usr/bin/setpriv", "--pdeathsig", "KILL", "--", "prog", "-x"]
    assert jobproc.command_line(["prog"], (1000, 100, [100, 27])) == [
        "/usr/bin/setpriv", "--reuid=1000", "--regid=100", "--groups=100,27",
        "--pdeathsig", "KILL", "--", "prog"]
    assert "--clear-groups" in jobproc.command_line(["prog"], (1000, 100, []))


def test_without_the_death_signal_only_a_user_switch_goes_through_setpriv(monkeypatch):
    monkeypatch.setattr(jobproc, "_setpriv", ["/usr/bin/setpriv"])
    assert jobproc.command_line(["prog", "-x"], None, death_signal=False) == ["prog", "-x"]
    # a switch needs setpriv anyway: the signal comes with it
    assert jobproc.command_line(["prog"], (1000, 100, []), death_signal=False) == [
        "/usr/bin/setpriv", "--reuid=1000", "--regid=100", "--clear-groups",
        "--pdeathsig", "KILL", "--", "prog"]


def test_without_setpriv_the_command_is_run_as_given(no_setpriv):
    assert jobproc.command_line(["prog", "-x"], (1, 2, [2])) == ["prog", "-x"]
    assert not jobproc.death_signal_available()


def _run(argv, switch=None, stdin=jobproc.DEVNULL):
    async def go():
        r, w = os.pipe()
        try:
            p = jobproc.start(argv, env={"PATH": os.defpath}, cwd="/", stdin=stdin,
                              stdout=w, stderr=w, switch=switch)
        finally:
            os.close(w)
        code = await p.wait()
        assert p.returncode == code
        with os.fdopen(r, "rb") as f:
            return p.pid, code, f.read().decode()
    return asyncio.run(go())


@pytest.mark.parametrize("setpriv", [True, False])
def test_a_process_runs_in_its_own_session_and_is_reaped_with_its_status(monkeypatch, setpriv):
    if not setpriv:
        monkeypatch.setattr(jobproc, "_setpriv", [None])
    elif not jobproc.death_signal_available():
        pytest.skip("setpriv (util-linux) is not installed")
    pid, code, out = _run(["sh", "-c", "echo $$ $(ps -o sid= -p $$); exit 7"])
    shown_pid, sid = out.split()
    assert int(shown_pid) == pid == int(sid)  # same pid through setpriv; a new session
    assert code == 7
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped already, by the process object


def test_a_killed_process_reports_minus_the_signal():
    async def go():
        p = jobproc.start(["sleep", "30"], env={"PATH": os.defpath}, cwd=None,
                          stdin=jobproc.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, switch=None)
        os.kill(p.pid, 9)
        return await p.wait()
    assert asyncio.run(go()) == -9


@pytest.mark.skipif(os.getuid() != 0, reason="switching users needs root")
@pytest.mark.parametrize("setpriv", [True, False])
def test_the_process_runs_as_the_jobs_user_and_groups(monkeypatch, setpriv):
    if not setpriv:
        monkeypatch.setattr(jobproc, "_setpriv", [None])
    _, code, out = _run(["sh", "-c", "id -u; id -g; id -G"], switch=(65534, 65534, [65534, 100]))
    assert code == 0
    uid, gid, groups = out.splitlines()
    assert (uid, gid, sorted(groups.split())) == ("65534", "65534", ["100", "65534"])


@pytest.fixture(params=[True, False], ids=["fork_exec", "popen"])
def spawn_path(request, monkeypatch):
    """Each test using it runs through both ways of starting a process."""
    if request.param and not jobproc.FAST_SPAWN:
        pytest.skip("no fork_exec path on this Python")
    monkeypatch.setattr(jobproc, "FAST_SPAWN", request.param)
    return request.param


def _start(argv, program=None, cwd="/", env=None, **kw):
    async def go():
        r, w = os.pipe()
        try:
            p = jobproc.start(argv, env=env if env is not None else {"PATH": os.defpath},
                              cwd=cwd, stdin=jobproc.DEVNULL, stdout=w, stderr=w, switch=None,
                              death_signal=False, program=program, **kw)
        finally:
            os.close(w)
        code = await p.wait()
        with os.fdopen(r, "rb") as f:
            return p, code, f.read().decode()
    return asyncio.run(go())


def test_both_spawn_paths_start_the_same_process(spawn_path, tmp_path):
    """argv (argv[0] kept when the program is given by path), environment,
    working directory, a session of its own, /dev/null as stdin, status,
    reaped; nothing of ours leaks but the three streams."""
    sh = shutil.which("sh")
    script = ('echo "$(tr "\\0" " " < /proc/$$/cmdline | cut -d" " -f1)|$1|$FOO|$(pwd)|$$|'
              '$(ps -o sid= -p $$ | tr -d " ")"; '
              'set -- /proc/$$/fd/*; echo $#; read x && echo read; exit 5')
    p, code, out = _start(["sh", "-c", script, "zero", "arg1"], program=sh, cwd=str(tmp_path),
                          env={"PATH": os.defpath, "FOO": "bär=1"})
    first, nfds = out.splitlines()[:2]
    name, arg, foo, cwd, pid, sid = first.split("|")
    assert (name, arg, foo, cwd) == ("sh", "arg1", "bär=1", str(tmp_path))
    assert int(pid) == p.pid == int(sid) and code == 5 and "read" not in out
    # 0, 1, 2 (and the directory the glob reads); counted by the shell itself:
    # 'ls | wc' raced the shell's closing of its copies of the pipe (5, once)
    assert int(nfds) <= 4
    with pytest.raises(ChildProcessError):
        os.waitpid(p.pid, os.WNOHANG)


def test_both_spawn_paths_refuse_what_cannot_run(spawn_path, tmp_path):
    plain = tmp_path / "plain"
    plain.write_text("data\n")
    with pytest.raises(PermissionError):
        _start(["plain"], program=str(plain))
    with pytest.raises(FileNotFoundError):
        _start(["gone"], program=str(tmp_path / "gone"))
    with pytest.raises(FileNotFoundError):
        _start(["true"], program=shutil.which("true"), cwd=str(tmp_path / "no-such-dir"))
    with pytest.raises(ValueError):
        _start(["true"], program=shutil.which("true"), env={"A=B": "1"})


def test_a_script_found_in_path_is_named_as_a_path_search_names_it(spawn_path, tmp_path):
    """The name a program is executed by is what its interpreter gets as
    ``$0``: a script found through an absolute PATH entry is that entry
    joined with its name, through a relative entry it stays relative (the
    process starts in its working directory), one named with a ``/`` is run
    as written -- as by a shell, and as by Popen's own search."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "work" / "rel").mkdir(parents=True)
    for d in (tmp_path / "bin", tmp_path / "work" / "rel"):
        for name in ("s1", "s2"):
            f = d / name
            f.write_text('#!/bin/sh\necho "$0"\n')
            f.chmod(0o755)
    work = str(tmp_path / "work")
    cases = [("s1", f"{tmp_path}/bin:/bin:/usr/bin", f"{tmp_path}/bin/s1"),
             ("s2", "rel:/bin:/usr/bin", "rel/s2"),
             ("./rel/s1", "/bin:/usr/bin", "./rel/s1")]
    for exe, path, want in cases:
        assert jobproc.find_program(exe, path, work) == ("", 0)
        _, code, out = _start([exe], program=jobproc.resolved(exe, path, work), cwd=work,
                              env={"PATH": path})
        assert (code, out.strip()) == (0, want), (exe, path)
