"""PMIx for every user of a multi-user DVM (real uids, root-started DVM).

A non-root user's C PMIx job and Open MPI job run without a word from
libpmix on stderr and read their job data; identity is the registered one
whatever a client claims in its directives; and a user's process cannot
connect to another user's job's PMIx server with that job's variables.
"""

from __future__ import annotations

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

HERE = Path(__file__).parent
CLIENTS = [HERE.parent / "pmix" / "clients", HERE.parent / "pmix_e2e" / "clients"]


@pytest.fixture(scope="module")
def progs():
    """pmix_ops, pmix_keys and mpi_allreduce, built where every test user can run them."""
    require_libpmix()
    if not shutil.which("gcc") or not shutil.which("mpicc"):
        pytest.skip("gcc and mpicc are needed (apt-get install gcc libopenmpi-dev)")
    d = Path(tempfile.mkdtemp(prefix="pydvm-mu-pmix-"))
    os.chmod(d, 0o755)
    out = {}
    for name, cc in (("pmix_ops", "gcc"), ("pmix_keys", "gcc"), ("mpi_allreduce", "mpicc")):
        src = next(c / f"{name}.c" for c in CLIENTS if (c / f"{name}.c").exists())
        flags = pmix_cflags() if cc == "gcc" else []
        r = subprocess.run([cc, "-O1", "-o", str(d / name), str(src), *flags],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        os.chmod(d / name, 0o755)
        out[name] = str(d / name)
    out["dir"] = str(d)
    yield out
    shutil.rmtree(d, ignore_errors=True)


def test_a_users_pmix_and_mpi_jobs_run_without_library_errors_and_read_their_data(
        mudvm, users, progs):
    """As pdvmtesta, on a root multi-user DVM: a C PMIx job reads universe, job and
    local sizes on both nodes, and an Open MPI allreduce runs -- nothing from
    libpmix on stderr (it used to print a PMIX ERROR per process)."""
    p = mudvm.as_user("pdvmtesta", "run", "--pmix", "--host", "a:1,b:2", "-n", "3",
                      progs["pmix_keys"])
    assert p.returncode == 0, p.stdout + p.stderr
    assert "PMIX ERROR" not in p.stderr and p.stderr == "", p.stderr
    for r, local in ((0, "1"), (1, "2"), (2, "2")):
        assert f"R{r} JOB pmix.univ.size=3" in p.stdout, p.stdout
        assert f"R{r} JOB pmix.job.size=3" in p.stdout
        assert f"R{r} JOB pmix.local.size={local}" in p.stdout
        assert f"R{r} PROC pmix.hname={'a' if r == 0 else 'b'}" in p.stdout
    p = mudvm.as_user("pdvmtesta", "run", "--pmix", "--host", "a:2,b:2", "-n", "4",
                      progs["mpi_allreduce"])
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("size=4 sum=6") == 4, p.stdout
    assert p.stderr == "", p.stderr


def test_a_pmix_claim_of_another_uid_neither_publishes_nor_unpublishes_as_them(
        mudvm, users, progs):
    """B's PMIx publish carrying PMIX_USERID = A's uid is recorded as B's (and goes
    with B's job); B's PMIx_Unpublish of A's key claiming A's uid leaves it."""
    a, b = users["pdvmtesta"], users["pdvmtestb"]
    ops = progs["pmix_ops"]
    p = mudvm.as_user("pdvmtesta", "run", "--pmix", "-n", "1", ops,
                      "pubd:persist=persist/4:akey:string:of-a")
    assert "PUBLISH key=akey status=0" in p.stdout, p.stdout + p.stderr
    bg = mudvm.popen_as("pdvmtestb", "run", "--pmix", "-n", "1", ops,
                        f"pubd:pmix.euid=uint32/{a}:bkey:string:of-b", "sleep:3000")
    try:
        from dvmkit import wait_for
        wait_for(lambda: str(b) in mudvm.store()["master"]["bytes_by_uid"],
                 what="B's item in the master store")
        by_uid = mudvm.store()["master"]["bytes_by_uid"]
        assert str(b) in by_uid and by_uid[str(a)] > 0
    finally:
        assert bg.wait(timeout=60) == 0
    assert str(b) not in mudvm.store()["master"]["bytes_by_uid"]  # went with B's job
    p = mudvm.as_user("pdvmtestb", "run", "--pmix", "-n", "1", ops,
                      f"unpubd:pmix.euid=uint32/{a}:akey")
    assert "UNPUBLISH status=0" in p.stdout, p.stdout + p.stderr
    p = mudvm.as_user("pdvmtesta", "run", "--pmix", "-n", "1", ops, "look:akey")
    assert re.search(r"LOOKUP .*status=0", p.stdout), p.stdout + p.stderr
    assert "value=of-a" in p.stdout


def test_a_users_process_cannot_connect_to_another_users_jobs_pmix_server(
        mudvm, users, progs):
    """B takes the PMIx variables of A's running job (server address, namespace,
    rank) and starts a PMIx client with them: libpmix refuses it at PMIx_Init,
    since the registered process is A's uid."""
    share = Path(tempfile.mkdtemp(prefix="pydvm-mu-env-"))
    os.chmod(share, 0o777)
    envfile = share / "a-env"
    bg = mudvm.popen_as("pdvmtesta", "run", "--pmix", "--host", "a", "-n", "1", "sh", "-c",
                        f"env | grep ^PMIX_ > {envfile}.tmp; mv {envfile}.tmp {envfile}; "
                        "sleep 20")
    try:
        from dvmkit import wait_for
        wait_for(envfile.exists, what="A's job to write its PMIx variables")
        os.chmod(envfile, 0o644)
        env = [ln for ln in envfile.read_text().splitlines() if ln]
        assert any(ln.startswith("PMIX_NAMESPACE=") for ln in env), env
        p = subprocess.run([RUNUSER, "-u", "pdvmtestb", "--", "env", *env, progs["pmix_ops"],
                            "pub:stolen:string:x"], capture_output=True, text=True, timeout=60)
        init = re.search(r"INIT status=(-?\d+)", p.stdout)
        assert init is None or init.group(1) != "0", p.stdout + p.stderr
        assert "PUBLISH key=stolen status=0" not in p.stdout
    finally:
        bg.kill()
        bg.wait(timeout=30)
        shutil.rmtree(share, ignore_errors=True)
