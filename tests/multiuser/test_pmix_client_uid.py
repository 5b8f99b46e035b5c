"""A PMIx client is the kernel's uid, not the uid it claims (real uids).

libpmix 4.2 compares a connecting client's *stated* uid/gid with the ones
registered for the process it says it is (TCP handshake, ``psec/native``).
A local user whose ``geteuid`` lies -- here an ``LD_PRELOAD`` shim built in
the test -- and who copies the PMIx variables of another user's running
rank must not get in as that rank: no lookup of that job's data, no
publish into it.  The victim's job runs on unharmed.
"""

from __future__ import annotations

import os
import pwd
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

SHIM = r"""
#include <stdlib.h>
#include <sys/types.h>
static unsigned said(const char *name)
{
    const char *s = getenv(name);
    return s ? (unsigned)strtoul(s, NULL, 10) : 0u;
}
uid_t getuid(void) { return said("LIAR_UID"); }
uid_t geteuid(void) { return said("LIAR_UID"); }
gid_t getgid(void) { return said("LIAR_GID"); }
gid_t getegid(void) { return said("LIAR_GID"); }
"""


@pytest.fixture(scope="module")
def built():
    """pmix_ops and the lying shim, where every test user can run them."""
    require_libpmix()
    if not shutil.which("gcc"):
        pytest.skip("gcc is needed (apt-get install gcc)")
    d = Path(tempfile.mkdtemp(prefix="pydvm-mu-liar-"))
    os.chmod(d, 0o755)
    src = HERE.parent / "pmix" / "clients" / "pmix_ops.c"
    r = subprocess.run(["gcc", "-O1", "-o", str(d / "pmix_ops"), str(src), *pmix_cflags()],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    (d / "shim.c").write_text(SHIM)
    r = subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(d / "liar.so"), str(d / "shim.c")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for f in ("pmix_ops", "liar.so"):
        os.chmod(d / f, 0o755)
    yield {"ops": str(d / "pmix_ops"), "shim": str(d / "liar.so"), "dir": d}
    shutil.rmtree(d, ignore_errors=True)


#: a cut client's PMIx_Init may wait for ever (libpmix's client): bounded
BOUND = ["timeout", "-s", "KILL", "10"]


def _read_until(bg: subprocess.Popen, marker: str) -> str:
    out = ""
    while marker not in out:
        line = bg.stdout.readline()
        assert line, out
        out += line
    return out


def test_a_client_lying_about_its_uid_cannot_act_as_another_users_rank(
        mudvm, users, built):
    """B, with geteuid/getegid made to return A's ids and the PMIx variables
    of A's connected rank 0, neither finds A's published key nor publishes
    into A's job; A's rank then looks up, fences and finalizes as before."""
    a = pwd.getpwnam("pdvmtesta")
    share = Path(tempfile.mkdtemp(prefix="pydvm-mu-liar-env-"))
    os.chmod(share, 0o777)
    envfile, go = share / "a-env", share / "go"
    bg = mudvm.popen_as(
        "pdvmtesta", "run", "--pmix", "--host", "a", "-n", "1", "sh", "-c",
        f"env | grep ^PMIX_ > {envfile}.tmp; mv {envfile}.tmp {envfile}; "
        f"exec {built['ops']} pub:secret:string:s3cret waitfile:{go} "
        "look:secret,stolen fence:0")
    try:
        _read_until(bg, "PUBLISH key=secret status=0")
        os.chmod(envfile, 0o644)
        env = [ln for ln in envfile.read_text().splitlines() if ln]
        assert any(ln.startswith("PMIX_NAMESPACE=") for ln in env), env
        lie = [f"LD_PRELOAD={built['shim']}", f"LIAR_UID={a.pw_uid}", f"LIAR_GID={a.pw_gid}"]
        # the shim does lie: B's `id` says A's uid
        p = subprocess.run([RUNUSER, "-u", "pdvmtestb", "--", "env", *lie, "id", "-u"],
                           capture_output=True, text=True, timeout=30)
        assert p.stdout.strip() == str(a.pw_uid), p.stdout + p.stderr
        p = subprocess.run([RUNUSER, "-u", "pdvmtestb", "--", "env", *env, *lie, *BOUND,
                            built["ops"], "look:secret", "pub:stolen:string:x"],
                           capture_output=True, text=True, timeout=60)
        liar = p.stdout + p.stderr
        assert "s3cret" not in liar, liar
        assert "PUBLISH key=stolen status=0" not in liar, liar
        init = re.search(r"INIT status=(-?\d+)", p.stdout)
        assert init is None or init.group(1) != "0" or "LOOKUP status=0" not in liar, liar
        # the server that cut it said who and why (A's agent logs to its node's log)
        from dvmkit import wait_for
        b_uid = pwd.getpwnam("pdvmtestb").pw_uid

        def logged():
            for f in Path(mudvm.log_dir).rglob("*"):
                if f.is_file() and "refused a client connecting as" in f.read_text(
                        errors="replace"):
                    return f.read_text(errors="replace")
            return ""
        wait_for(logged, what="the refusal in the DVM's logs")
        assert f"registered to uid {a.pw_uid}, its socket is uid {b_uid}'s" in logged()
        go.touch()
        out, _ = bg.communicate(timeout=60)
        assert bg.returncode == 0, out
        assert "FOUND key=secret" in out and "s3cret" in out, out
        assert "FOUND key=stolen" not in out, out
        assert "FENCE status=0" in out, out
        assert "FINALIZE status=0" in out, out
    finally:
        if bg.poll() is None:
            bg.kill()
            bg.wait(timeout=30)
        shutil.rmtree(share, ignore_errors=True)


def test_a_liar_cut_before_the_rank_connects_leaves_the_rank_its_place(mudvm, users, built):
    """The liar comes first, before A's rank has called PMIx_Init: it is cut,
    and the rank then connects, publishes, looks up, fences and finalizes;
    nothing the liar tried is in A's job."""
    a = pwd.getpwnam("pdvmtesta")
    share = Path(tempfile.mkdtemp(prefix="pydvm-mu-liar-env-"))
    os.chmod(share, 0o777)
    envfile, go = share / "a-env", share / "go"
    bg = mudvm.popen_as(
        "pdvmtesta", "run", "--pmix", "--host", "a", "-n", "1", "sh", "-c",
        f"env | grep ^PMIX_ > {envfile}.tmp; mv {envfile}.tmp {envfile}; "
        f"while [ ! -e {go} ]; do sleep 0.05; done; "
        f"exec {built['ops']} pub:mine:string:v1 look:mine look:stolen fence:0")
    try:
        from dvmkit import wait_for
        wait_for(envfile.exists, what="A's job to write its PMIx variables")
        os.chmod(envfile, 0o644)
        env = [ln for ln in envfile.read_text().splitlines() if ln]
        lie = [f"LD_PRELOAD={built['shim']}", f"LIAR_UID={a.pw_uid}", f"LIAR_GID={a.pw_gid}"]
        p = subprocess.run([RUNUSER, "-u", "pdvmtestb", "--", "env", *env, *lie, *BOUND,
                            built["ops"], "pub:stolen:string:x"],
                           capture_output=True, text=True, timeout=60)
        assert "PUBLISH key=stolen status=0" not in p.stdout, p.stdout + p.stderr
        go.touch()
        out, _ = bg.communicate(timeout=60)
        assert bg.returncode == 0, out
        assert "PUBLISH key=mine status=0" in out, out
        assert "FOUND key=mine" in out and "FOUND key=stolen" not in out, out
        assert "FENCE status=0" in out and "FINALIZE status=0" in out, out
    finally:
        if bg.poll() is None:
            bg.kill()
            bg.wait(timeout=30)
        shutil.rmtree(share, ignore_errors=True)
