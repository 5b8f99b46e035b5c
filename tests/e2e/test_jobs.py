"""Jobs end to end (SPEC 2, SPEC 9 `pydvm run`): exit statuses, one-shot DVMs,
Ctrl-C, output forwarding, environment and rank mapping."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dvmkit import PYDVM, LineReader, finish, job_script, lines, pid_alive, wait_for

pytestmark = pytest.mark.e2e


def test_job_exit_status_is_the_process_status_or_128_plus_the_signal(dvm):
    """exit 3 -> run exits 3; a process killed by SIGKILL -> 137; all zero -> 0."""
    p = dvm.run("-n", "1", "sh", "-c", "exit 3")
    assert p.returncode == 3, p.stderr
    p = dvm.run("--host", "b", "-n", "1", "sh", "-c", "kill -9 $$")
    assert p.returncode == 137, p.stderr
    p = dvm.run("-n", "3", "true")
    assert p.returncode == 0, p.stderr


def test_job_status_is_the_first_nonzero_exit_in_time_order(dvm):
    """Rank F exits 5 first; the other rank exits 7 after F's end was accounted: run exits 5."""
    for first in (0, 1):  # 5 is neither the highest status nor always rank 0's
        p = dvm.run("--host", "a,b", "-n", "2", *job_script("exit_order"), str(first), "5", "7")
        assert lines(p, "FIRST ") == ["FIRST ACCOUNTED"], p.stdout + p.stderr
        assert p.returncode == 5, f"first={first}: exit {p.returncode}\n{p.stdout}{p.stderr}"


def test_missing_executable_exits_127_naming_it_and_the_dvm_runs_the_next_job(dvm):
    """`run no-such-exe`: a message naming it on stderr, exit 127; the next job runs normally."""
    exe = "no-such-exe-e2e-4711"
    p = dvm.run("--host", "b", "-n", "1", exe)
    assert p.returncode == 127, p.stdout + p.stderr
    assert exe in p.stderr, p.stderr
    q = dvm.run("-n", "3", "sh", "-c", 'echo "ok $PYDVM_RANK"')
    assert q.returncode == 0, q.stderr
    assert sorted(q.stdout.splitlines()) == ["ok 0", "ok 1", "ok 2"]
    info = dvm.cmd("info", check=True).stdout
    assert info.count(" up") >= 3, info


def test_a_relative_program_path_is_resolved_in_the_jobs_working_directory(dvm, tmp_path):
    """`pydvm run ./prog` from a directory the DVM was not started in runs
    ./prog of that directory, on the head node and on daemon nodes; so does a
    bare name found through a relative PATH entry."""
    work = tmp_path / "work"
    (work / "bin").mkdir(parents=True)
    for path in (work / "prog", work / "bin" / "tool"):
        path.write_text('#!/bin/sh\necho "$0 ran in $(pwd) as rank $PYDVM_RANK"\n')
        path.chmod(0o755)
    assert Path.cwd() != work
    p = dvm.run("--host", "a,b", "-n", "2", "./prog", cwd=work)
    assert p.returncode == 0, p.stdout + p.stderr
    assert sorted(p.stdout.splitlines()) == [f"./prog ran in {work} as rank 0",
                                             f"./prog ran in {work} as rank 1"]
    p = dvm.run("--host", "c", "-n", "1", "tool", cwd=work,
                env={"PATH": "bin" + os.pathsep + os.environ["PATH"]})
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip().endswith(f"ran in {work} as rank 0")


def test_a_program_that_exists_but_cannot_be_run_exits_126_saying_why(dvm, tmp_path):
    """Not executable, or a directory: a message saying so and exit 126, as a shell
    gives; a name found nowhere stays 127."""
    (tmp_path / "data.txt").write_text("not a program\n")
    (tmp_path / "adir").mkdir()
    p = dvm.run("--host", "b", "-n", "1", "./data.txt", cwd=tmp_path)
    assert p.returncode == 126, p.stdout + p.stderr
    assert "./data.txt" in p.stderr and "not executable" in p.stderr, p.stderr
    p = dvm.run("-n", "1", "./adir", cwd=tmp_path)
    assert p.returncode == 126, p.stdout + p.stderr
    assert "is a directory" in p.stderr, p.stderr
    p = dvm.run("-n", "1", "./missing", cwd=tmp_path)
    assert p.returncode == 127, p.stdout + p.stderr
    assert "./missing" in p.stderr and str(tmp_path) in p.stderr, p.stderr


def _dvm_processes(dvmid: str) -> list[str]:
    """Command lines of live `pydvm daemon` processes belonging to DVM ``dvmid``."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        text = " ".join(a.decode(errors="replace") for a in argv)
        if b"daemon" in argv and dvmid in text and pid_alive(int(d.name)):
            found.append(f"{d.name}: {text}")
    return found


def test_one_shot_run_without_a_dvm_runs_the_job_and_leaves_nothing_running(tmp_path):
    """`pydvm run -n 2` without a DVM: runs, exits with the job status, leaves nothing running."""
    env = dict(os.environ)
    env.pop("PYDVM_URI", None)
    env["PYDVM_STATE_DIR"] = str(tmp_path / "state")
    # Output to files, not pipes: a daemon left behind holding a pipe would hang the run.
    with open(tmp_path / "out", "w+") as fo, open(tmp_path / "err", "w+") as fe:
        rc = subprocess.run(PYDVM + ["run", "-n", "2", *job_script("oneshot")], env=env,
                            stdout=fo, stderr=fe, timeout=60, cwd=tmp_path).returncode
        fo.seek(0)
        fe.seek(0)
        p = subprocess.CompletedProcess([], rc, fo.read(), fe.read())
    got = lines(p, "DAEMON ")
    assert len(got) == 2, p.stdout + p.stderr
    assert sorted(ln.split()[-1] for ln in got) == ["0", "1"]
    assert p.returncode == 4, p.stdout + p.stderr  # rank 1's exit status
    daemon_pids = {int(ln.split()[1]) for ln in got}
    nspace = got[0].split()[3]
    m = re.fullmatch(r"pydvm-(\w+)@\d+", nspace)
    assert m, nspace
    dvmid = m.group(1)
    try:
        wait_for(lambda: not any(pid_alive(pid) for pid in daemon_pids), timeout=15,
                 what=f"one-shot daemons {daemon_pids} to exit")
        wait_for(lambda: not _dvm_processes(dvmid), timeout=15,
                 what=f"no pydvm daemon of DVM {dvmid} left")
    finally:  # leave nothing of a failed one-shot behind
        for pid in daemon_pids | {int(x.split(":")[0]) for x in _dvm_processes(dvmid)}:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_ctrl_c_on_run_kills_the_job_and_exits_130(dvm):
    """SIGINT to `pydvm run` of a long job: run exits 130 promptly and the job process is gone."""
    bg = dvm.run_bg("--host", "b", "-n", "1", sys.executable, "-c",
                    "import os, time; print('PID', os.getpid(), flush=True); time.sleep(120)")
    out = LineReader(bg.stdout)
    try:
        pid = int(out.wait_line("PID ", timeout=30).split()[1])
        assert pid_alive(pid)
        t0 = time.monotonic()
        os.kill(bg.pid, signal.SIGINT)
        rc = finish(bg, 30)
        elapsed = time.monotonic() - t0
    finally:
        if bg.poll() is None:
            bg.kill()
            bg.wait(10)
    assert rc == 130, bg.stderr.read()
    assert elapsed < 20, elapsed
    wait_for(lambda: not pid_alive(pid), timeout=15, what=f"job process {pid} to be gone")
    q = dvm.run("--host", "b", "-n", "1", "true")
    assert q.returncode == 0, q.stderr


def test_stdout_and_stderr_are_forwarded_line_by_line_tagged_with_nspace_and_rank(dvm):
    """Lines written in pieces arrive whole, per stream in order; --tag-output adds `[ns,rank] `."""
    p = dvm.run("--tag-output", "-n", "2", *job_script("output_lines"))
    assert p.returncode == 0, p.stderr
    out, err = p.stdout.splitlines(), p.stderr.splitlines()
    m = re.match(r"\[(pydvm-\w+@\d+),[01]\] ", out[0] if out else "")
    assert m, p.stdout
    ns = m.group(1)
    for r in (0, 1):
        tag = f"[{ns},{r}] "
        assert [ln for ln in out if ln.startswith(tag)] == \
            [f"{tag}out {r} {i} tail" for i in range(20)], p.stdout
        assert [ln for ln in err if ln.startswith(tag)] == \
            [f"{tag}err {r} {i}" for i in range(20)], p.stderr
    assert len(out) == 40 and len(err) == 40, (p.stdout, p.stderr)

    q = dvm.run("-n", "1", *job_script("output_lines"))  # untagged by default
    assert q.stdout.splitlines() == [f"out 0 {i} tail" for i in range(20)], q.stdout
    assert q.stderr.splitlines() == [f"err 0 {i}" for i in range(20)], q.stderr


def test_job_output_is_forwarded_live_while_the_job_runs(dvm, tmp_path):
    """A job's first line reaches `pydvm run`'s stdout before the job goes on to end."""
    go = tmp_path / "go"
    bg = dvm.run_bg("--host", "c", "-n", "1", *job_script("live_output"), str(go))
    out = LineReader(bg.stdout)
    try:
        out.wait_line("FIRST", timeout=30)
        assert bg.poll() is None, "the job ended before the go file existed"
        go.touch()
        assert finish(bg, 30) == 0, bg.stderr.read()
    finally:
        if bg.poll() is None:
            bg.kill()
            bg.wait(10)
    assert out.join() == ["FIRST", "SECOND"]


def test_run_environment_is_passed_to_the_job_processes(dvm):
    """A variable set in `pydvm run`'s environment is seen by every job process."""
    p = dvm.run("-n", "2", "sh", "-c", 'echo "MARK=$E2E_MARK rank=$PYDVM_RANK"',
                env={"E2E_MARK": "marked value 42"})
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == ["MARK=marked value 42 rank=0",
                                             "MARK=marked value 42 rank=1"]


def test_mpmd_app_contexts_have_their_app_idx_hosts_and_ranks_numbered_across_the_job(dvm):
    """`--host c -n 2 X : -n 2 Y`: app_idx 0,0,1,1; ranks 0-3; app 1 maps over all hosts anew."""
    show = 'echo "$0 $PYDVM_RANK $PYDVM_APP_IDX $PYDVM_JOB_SIZE $PYDVM_NODE"'
    p = dvm.run("--host", "c", "-n", "2", "sh", "-c", show, "X", ":",
                "-n", "2", "sh", "-c", show, "Y")
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == ["X 0 0 4 c", "X 1 0 4 c", "Y 2 1 4 a", "Y 3 1 4 b"]


def test_host_slots_fill_in_order_one_slot_at_a_time_wrapping_around(dvm):
    """`--host a:2,b -n 4` maps ranks 0,1 to a, 2 to b, and 3 wraps around to a."""
    p = dvm.run("--host", "a:2,b", "-n", "4", "sh", "-c", 'echo "$PYDVM_RANK $PYDVM_NODE"')
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == ["0 a", "1 a", "2 b", "3 a"]


def test_a_line_longer_than_the_forwarding_limit_arrives_whole(dvm):
    """A 200 KB output line (over the 64 KiB read limit) is forwarded intact, tagged once."""
    p = dvm.run("--tag-output", "-n", "1", sys.executable, "-c",
                'print("x" * 200000); print("end")')
    assert p.returncode == 0, p.stderr
    first, second = p.stdout.splitlines()
    prefix = first[: first.index("]") + 2]
    assert first == prefix + "x" * 200000
    assert second == prefix + "end"
