"""The job API on a multi-user DVM: a user's connection runs jobs as that user.

A user without the DVM's secret connects on its tool socket, where the
master reads the uid from the socket -- as ``pydvm run`` does.
"""

from __future__ import annotations

import subprocess

from conftest import RUNUSER

A, B = "pdvmtesta", "pdvmtestb"

HOLDER = """
import sys, threading, pydvm.jobs
with pydvm.jobs.connect(sys.argv[1]) as dvm:
    r = dvm.submit("id -u", stdout="capture").result(60)
    print("UID", r.stdout.decode().strip(), flush=True)
    ready = threading.Event()
    job = dvm.submit(["sh", "-c", "echo READY; exec sleep 120"],
                     stdout=lambda rank, line: ready.set())
    assert ready.wait(60)
    (row,) = [i for i in dvm.jobs() if i.nspace == job.nspace]
    print("JOB", job.nspace, row.uid, flush=True)
    sys.stdin.readline()           # until told to go
    job.kill()
    print("KILLED", job.result(60).killed, flush=True)
"""

KILLER = """
import sys, pydvm.jobs
from pydvm.errors import NoPermissionsError
with pydvm.jobs.connect(sys.argv[1]) as dvm:
    try:
        dvm.kill(sys.argv[2])
    except NoPermissionsError as exc:
        print("REFUSED", exc)
    for what, call in (("signal", lambda: dvm.kill(sys.argv[2], signal="USR1")),
                       ("procs", lambda: dvm.processes(sys.argv[2]))):
        try:
            call()
        except NoPermissionsError as exc:
            print("REFUSED", what, exc)
"""


def test_a_users_jobs_run_as_that_user_and_others_cannot_kill_them(mudvm, users,
                                                                     readable_script):
    holder = subprocess.Popen([RUNUSER, "-u", A, "--", mudvm.python, readable_script(HOLDER),
                               mudvm.uri], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd="/tmp")
    try:
        assert holder.stdout.readline().split() == ["UID", str(users[A])]
        _, ns, uid = holder.stdout.readline().split()
        assert int(uid) == users[A]
        p = mudvm.as_user_python(B, readable_script(KILLER), mudvm.uri, ns)
        assert p.returncode == 0, p.stderr
        assert p.stdout.startswith("REFUSED PMIX_ERR_NO_PERMISSIONS") and "not your job" in \
            p.stdout, p.stdout
        assert "REFUSED signal PMIX_ERR_NO_PERMISSIONS" in p.stdout, p.stdout
        assert "REFUSED procs PMIX_ERR_NO_PERMISSIONS" in p.stdout, p.stdout
        out, err = holder.communicate("go\n", timeout=60)
        assert holder.returncode == 0, err
        assert out.split() == ["KILLED", "1"]
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(10)
