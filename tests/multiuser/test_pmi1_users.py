"""PMI-1 for every user of a multi-user DVM (real uids, root-started DVM):
an MPICH job of a non-root user runs as that user over both nodes, and its
names are its own."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

FAMILY = Path(__file__).parents[1] / "mpifamily" / "programs"
NAMES = Path(__file__).parents[1] / "pmi1" / "programs" / "names.c"


@pytest.fixture(scope="module")
def mpich_progs():
    """hello and names built with Debian's MPICH where every test user can run them."""
    cc = shutil.which("mpicc.mpich")
    if cc is None:
        pytest.skip("Debian's MPICH is not installed (apt-get install mpich libmpich-dev)")
    d = Path(tempfile.mkdtemp(prefix="pydvm-mu-pmi1-"))
    os.chmod(d, 0o755)
    out = {}
    for src in (FAMILY / "hello.c", NAMES):
        exe = d / src.stem
        r = subprocess.run([cc, "-O1", "-o", str(exe), str(src)], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        os.chmod(exe, 0o755)
        out[src.stem] = str(exe)
    yield out
    shutil.rmtree(d, ignore_errors=True)


def test_a_users_mpich_job_runs_over_both_nodes_as_that_user(mudvm, users, mpich_progs):
    p = mudvm.as_user("pdvmtesta", "run", "--host", "a:2,b:2", "-n", "4", "--tag-output",
                      mpich_progs["hello"])
    assert p.returncode == 0, p.stderr
    assert sorted(ln.split("]", 1)[1].split(" on ")[0].strip() for ln in p.stdout.splitlines()
                  if " of " in ln) == [f"rank {r} of 4" for r in range(4)]
    assert "sum ok" in p.stdout
    who = mudvm.as_user("pdvmtesta", "run", "--mpi", "pmi1", "--host", "a:1,b:1", "-n", "2",
                        "id", "-u")
    assert who.stdout.split() == [str(users["pdvmtesta"])] * 2


def test_a_users_published_name_is_theirs(mudvm, users, mpich_progs):
    # stdin a pipe: the publisher holds its name until it reads a line
    server = subprocess.Popen(mudvm._as("pdvmtesta", mudvm._env(), "run", "--host", "a:1",
                                        "-n", "1", mpich_progs["names"], "publish", "mu-svc",
                                        "port-a"),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              cwd="/tmp")
    try:
        assert server.stdout.readline().strip() == "published mu-svc"
        mine = mudvm.as_user("pdvmtesta", "run", "--host", "b:1", "-n", "1",
                             mpich_progs["names"], "lookup", "mu-svc")
        assert mine.stdout.strip() == "found mu-svc port-a", mine.stderr
        other = mudvm.as_user("pdvmtestb", "run", "--host", "b:1", "-n", "1",
                              mpich_progs["names"], "lookup", "mu-svc")
        assert other.stdout.strip() == "missing mu-svc", other.stdout + other.stderr
        server.stdin.write("\n")
        server.stdin.flush()
        assert server.stdout.readline().strip() == "unpublished mu-svc"
        assert server.wait(timeout=60) == 0
    finally:
        server.kill()
        server.wait(timeout=30)
