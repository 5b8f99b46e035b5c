"""PMIx tools from outside any job on a multi-user DVM, with real uids.

A tool's identity is its uid as the kernel knows it (runtime/pmixhost/tools.py):
a user's ``pps`` lists that user's jobs only, root's every job; a user's
tool finds its own user's keys and not another's.  The tools attach to the
head node's server (``pydvm_head_node`` names node ``a``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import RUNUSER

sys.path.insert(0, str(Path(__file__).parents[1] / "pmix"))
from cbuild import pmix_cflags, require_libpmix  # noqa: E402

CLIENTS = Path(__file__).parents[1] / "pmix_e2e" / "clients"


@pytest.fixture(scope="module")
def progs():
    """pmix_tool and pmix_events, built where every test user can run them."""
    require_libpmix()
    if not shutil.which("gcc") or not shutil.which("pps") or not shutil.which("pevent"):
        pytest.skip("gcc, pps and pevent are needed (apt-get install gcc libpmix-bin)")
    d = Path(tempfile.mkdtemp(prefix="pydvm-mu-tool-"))
    os.chmod(d, 0o755)
    out = {}
    for name in ("pmix_tool", "pmix_events"):
        r = subprocess.run(["gcc", "-O1", "-o", str(d / name), str(CLIENTS / f"{name}.c"),
                            *pmix_cflags()], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        os.chmod(d / name, 0o755)
        out[name] = str(d / name)
    yield out
    shutil.rmtree(d, ignore_errors=True)


def _as(user: str | None, *argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    e = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", **(env or {})}
    cmd = list(argv)
    if user is not None:
        cmd = [RUNUSER, "-u", user, "--", "env", *[f"{k}={v}" for k, v in e.items()], *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd="/tmp",
                          env=e)


def _bg_job(d, user: str, script: str) -> tuple[subprocess.Popen, str]:
    bg = d.popen_as(user, "run", "--pmix", "--host", "b", "-n", "1", "sh", "-c",
                    f'echo "NS=$PMIX_NAMESPACE"; {script}')
    out = ""
    while "NS=" not in out:
        line = bg.stdout.readline()
        assert line, out
        out += line
    return bg, out.split("NS=", 1)[1].split()[0]


# "on": tools attach to the head node's tool server process (a `pydvm start`
# DVM's default); "off": to the head node's own server, in the master
@pytest.mark.parametrize("isolate", ["on", "off"])
def test_a_users_tool_sees_and_finds_only_that_users_jobs_and_keys(make_mudvm, progs, isolate):
    tool_exe = progs["pmix_tool"]
    d = make_mudvm(pydvm_head_node="a", pydvm_pmix_isolate=isolate)
    p = d.as_user("pdvmtesta", "info", "--pmix-uri")
    assert p.returncode == 0, p.stderr
    uri = p.stdout.strip()
    key = "mutoolkey"
    bg, a_ns = _bg_job(d, "pdvmtesta",
                       f"exec pydvm publish {key}=secret-of-a --range global --hold 600")
    try:
        while True:  # the key is published once the job printed so
            line = bg.stdout.readline()
            assert line, "the publisher ended"
            if line.startswith("PUBLISHED"):
                break
        seen = {}
        # a user cannot search root's directories: PMIX_SERVER_URI41 (queries
        # only, docs/pmix.md); root searches the directory --pmix-dir names
        pmix_dir = d.as_user(None, "info", "--pmix-dir").stdout.strip()
        for user in ("pdvmtesta", "pdvmtestb", None):
            env = {"PMIX_SERVER_URI41": uri} if user else {"TMPDIR": pmix_dir}
            p = _as(user, "pps", env=env)
            m = re.search(r"^Active nspaces: (.*)$", p.stderr, re.M)
            assert m, (user, p.stderr)
            seen[user] = {n for n in m.group(1).split(",") if n}
        assert seen == {"pdvmtesta": {a_ns}, "pdvmtestb": set(), None: {a_ns}}, seen
        p = _as("pdvmtesta", tool_exe, f"uri:{uri}", f"lookup:{key}")
        assert f"LOOKUP status=0 key={key} value=secret-of-a publisher={a_ns}:0" in p.stdout, \
            p.stdout + p.stderr
        p = _as("pdvmtestb", tool_exe, f"uri:{uri}", f"lookup:{key}", f"unpublish:{key}",
                "publish:bkey=fromb:5")
        assert re.search(r"^INIT status=0 nspace=pydvm-\w+-tool\.\d+", p.stdout, re.M), p.stdout
        assert f"LOOKUP status=-23 key={key}" in p.stdout, p.stdout    # NO_PERMISSIONS
        assert "PUBLISH status=0" in p.stdout, p.stdout
        # B's unpublish removed nothing of A's
        p = _as("pdvmtesta", tool_exe, f"uri:{uri}", f"lookup:{key}")
        assert f"LOOKUP status=0 key={key}" in p.stdout, p.stdout
    finally:
        if bg.poll() is None:
            d.as_user(None, "kill", a_ns)
        bg.wait(timeout=60)


def _wait_no_tools(d, timeout: float = 60.0) -> None:
    """Until the head node's server says no tool is connected."""
    import time
    deadline = time.monotonic() + timeout
    while True:
        m = re.search(r"PMIx tools attach .*; (\d+) connected", d.as_user(None, "info").stdout)
        assert m, "pydvm info names where tools attach"
        if int(m.group(1)) == 0:
            return
        assert time.monotonic() < deadline, "a tool stayed connected"
        time.sleep(0.1)


# "on": tools attach to the head node's tool server process (a `pydvm start`
# DVM's default); "off": to the head node's own server, in the master
@pytest.mark.parametrize("isolate", ["on", "off"])
def test_a_users_pevent_reaches_that_users_processes_only(make_mudvm, progs, isolate):
    """A's and B's jobs on node b register for one code; A's pevent reaches A's
    process, and B's process's first event is B's own tool's, not A's."""
    d = make_mudvm(pydvm_head_node="a", pydvm_pmix_isolate=isolate)
    uri = d.as_user("pdvmtesta", "info", "--pmix-uri").stdout.strip()
    code = "-23456"
    jobs = {}
    try:
        for user in ("pdvmtesta", "pdvmtestb"):
            bg, ns = _bg_job(d, user, f"exec {progs['pmix_events']} register:{code} "
                             "wait:1:60000")
            out = ""
            while "REGISTER status=0" not in out:
                line = bg.stdout.readline()
                assert line, out
                out += line
            jobs[user] = (bg, ns)
        events = {}
        for user in ("pdvmtesta", "pdvmtestb"):
            # a tool found through PMIX_SERVER_URI41 is told from others by
            # being its user's only one connected (docs/pmix.md): A's pevent
            # must be gone before B's comes (a loaded run once overlapped them)
            _wait_no_tools(d)
            p = _as(user, "pevent", "--event", code, "--range", "5",
                    env={"PMIX_SERVER_URI41": uri})
            assert p.returncode == 0, p.stderr
            bg, _ns = jobs[user]
            out = bg.stdout.read()
            assert bg.wait(timeout=60) == 0, out
            events[user] = re.findall(rf"EVENT code={code} source=(\S+):0", out)
        a_tool, b_tool = events["pdvmtesta"], events["pdvmtestb"]
        assert len(a_tool) == 1 and len(b_tool) == 1, events
        assert a_tool[0] != b_tool[0] and re.fullmatch(r"pydvm-\w+-tool\.\d+", b_tool[0])
    finally:
        for bg, ns in jobs.values():
            if bg.poll() is None:
                d.as_user(None, "kill", ns)
            bg.wait(timeout=60)


def test_a_users_debugger_spawns_as_that_user_and_touches_no_other_users_job(make_mudvm):
    """A's debugger tool spawns a job stopped in PMIx_Init: it runs as A (the
    kernel's uid of the tool, not a claim).  B can neither release it nor
    place debugger daemons next to it; A releases it and it runs to its end."""
    import pwd
    require_libpmix()
    if not shutil.which("gcc"):
        pytest.skip("gcc is needed")
    d = make_mudvm(pydvm_head_node="a")
    work = Path(tempfile.mkdtemp(prefix="pydvm-mu-dbg-"))
    try:
        os.chmod(work, 0o777)
        for name in ("pmix_debugger", "pmix_dbg_client"):
            r = subprocess.run(["gcc", "-O1", "-o", str(work / name),
                                str(CLIENTS / f"{name}.c"), *pmix_cflags()],
                               capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            os.chmod(work / name, 0o755)
        uri = d.as_user("pdvmtesta", "info", "--pmix-uri").stdout.strip()
        dbg = str(work / "pmix_debugger")
        p = _as("pdvmtesta", dbg, f"uri:{uri}", f"launch:1:{work / 'pmix_dbg_client'}:{work}",
                "table:1")
        m = re.search(r"^SPAWN status=0 nspace=(\S+)", p.stdout, re.M)
        assert m, p.stdout + p.stderr
        ns = m.group(1)
        assert re.search(r"^PROC rank=0 .* state=5$", p.stdout, re.M), p.stdout
        jobs = {j["nspace"]: j for j in json.loads(d.as_user(None, "ps", "--json").stdout)["jobs"]}
        assert jobs[ns]["uid"] == pwd.getpwnam("pdvmtesta").pw_uid
        assert jobs[ns]["state"] == "stopped"
        r = d.as_user("pdvmtestb", "release", ns)
        assert r.returncode == 1 and "PMIX_ERR_NO_PERMISSIONS" in r.stderr, r.stderr
        p = _as("pdvmtestb", dbg, f"uri:{uri}", f"attach:{ns}", "daemons:1:/bin/true")
        assert "DAEMONS status=-23 " in p.stdout, p.stdout + p.stderr   # NO_PERMISSIONS
        assert not (work / "init.0").exists()
        r = d.as_user("pdvmtesta", "release", ns)
        assert r.returncode == 0, r.stderr
        p = _as("pdvmtesta", dbg, f"uri:{uri}", f"attach:{ns}", "waitend")
        assert "ENDED status=0 yes" in p.stdout, p.stdout
        assert (work / "init.0").stat().st_uid == pwd.getpwnam("pdvmtesta").pw_uid
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _master_pid(d) -> int:
    code = ("import asyncio; from pydvm.cli.tool import call, resolve_uri;"
            "print(asyncio.run(call(resolve_uri(None), {'t': 'info'}))['pid'])")
    q = subprocess.run([d.python, "-c", code], capture_output=True, text=True, timeout=30,
                       env={**d.root_env, "PYDVM_URI": d.uri}, cwd="/tmp")
    assert q.returncode == 0, q.stderr
    return int(q.stdout)


# the same tools against a DVM with a head node (a) and one without (nodes a
# and b are not this machine's name): the tool server beside the master
@pytest.mark.parametrize("head", ["a", "auto"])
def test_a_users_plain_tools_find_a_multi_user_dvm_by_themselves(make_mudvm, progs, head):
    """A multi-user DVM started by root is the machine's PMIx system server:
    a user's plain ``pps``, ``pattrs``, ``pevent``, and a program naming the
    master's pid (``PMIX_SERVER_PIDINFO``, what ``--pid`` does) reach it with
    nothing but the ``TMPDIR`` they share with it -- each user seeing only
    that user's jobs.  A second such DVM does not take the file over, and
    says why."""
    shared = tempfile.mkdtemp(prefix="pydvm-mu-sys-")
    os.chmod(shared, 0o1777)
    try:
        d = make_mudvm(env={"TMPDIR": shared}, pydvm_head_node=head)
        info = d.as_user("pdvmtestb", "info").stdout
        sysfile = os.path.join(shared, f"pmix.sys.{os.uname().nodename}")
        assert f"PMIx system server: {sysfile} " in info, info
        assert os.stat(sysfile).st_mode & 0o777 == 0o644
        code = "-23457"
        bg, a_ns = _bg_job(d, "pdvmtesta", f"exec {progs['pmix_events']} register:{code} "
                           "wait:1:60000")
        try:
            out = ""
            while "REGISTER status=0" not in out:
                line = bg.stdout.readline()
                assert line, out
                out += line
            env = {"TMPDIR": shared}
            for user, want in (("pdvmtesta", {a_ns}), ("pdvmtestb", set()), (None, {a_ns})):
                p = _as(user, "pps", env=env)
                m = re.search(r"^Active nspaces: (.*)$", p.stderr, re.M)
                assert m, (user, p.returncode, p.stderr)
                assert {n for n in m.group(1).split(",") if n} == want, (user, p.stderr)
            pid = _master_pid(d)
            for how in ([], ["--pid", str(pid)]):
                p = _as("pdvmtestb", "pattrs", *how, "--host-fns", env=env)
                assert "HOST SUPPORTED FUNCTIONS:" in p.stdout + p.stderr, (how, p.stderr)
            for user, want in (("pdvmtesta", a_ns), ("pdvmtestb", "")):
                p = _as(user, progs["pmix_tool"], f"pid:{pid}", "query:pmix.qry.ns", env=env)
                assert f"QUERY status=0 key=pmix.qry.ns value={want}\n" in p.stdout, \
                    (user, p.stdout, p.stderr)
            p = _as("pdvmtesta", "pevent", "--event", code, "--range", "5", env=env)
            assert p.returncode == 0, p.stderr
            out = bg.stdout.read()
            assert bg.wait(timeout=60) == 0, out
            assert re.search(rf"EVENT code={code} source=pydvm-\w+-tool\.\d+:0", out), out
        finally:
            if bg.poll() is None:
                d.as_user(None, "kill", a_ns)
            bg.wait(timeout=60)
        # another multi-user DVM sharing that TMPDIR leaves the file to the first
        d2 = make_mudvm(env={"TMPDIR": shared}, pydvm_head_node=head)
        info = d2.as_user("pdvmtestb", "info").stdout
        assert re.search(rf"PMIx system server: not this DVM \({re.escape(sysfile)} is "
                         r"another running server's \(pid \d+\)\)", info), info
        with open(sysfile) as f:
            assert f.readline().strip() == d.as_user(None, "info", "--pmix-uri").stdout.strip()
    finally:
        shutil.rmtree(shared, ignore_errors=True)
