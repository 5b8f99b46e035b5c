"""A connecting client is checked against the kernel's uid of its socket
(pmix/clients.py), not only against the uid it states -- which libpmix 4.2
believes over TCP.

One user is enough to show it: rank 1 is registered to a uid that is not
ours, and its process claims that uid through an ``LD_PRELOAD`` shim, so
libpmix lets it in; the binding must cut it before it can act, and leave
rank 0 of the same job alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

SHIM = r"""
#include <stdlib.h>
#include <sys/types.h>
static unsigned said(const char *n)
{ const char *s = getenv(n); return s ? (unsigned)strtoul(s, NULL, 10) : 0u; }
uid_t getuid(void) { return said("LIAR_UID"); }
uid_t geteuid(void) { return said("LIAR_UID"); }
gid_t getgid(void) { return said("LIAR_GID"); }
gid_t getegid(void) { return said("LIAR_GID"); }
"""


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    if not shutil.which("gcc"):
        pytest.skip("gcc is needed")
    d = tmp_path_factory.mktemp("liar")
    (d / "shim.c").write_text(SHIM)
    r = subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(d / "liar.so"), str(d / "shim.c")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return str(d / "liar.so")


def test_a_client_claiming_its_registered_uid_is_refused_unless_the_kernel_agrees(
        harness, pmix_ops, shim, tmp_path):
    other = os.getuid() + 4242
    go = tmp_path / "go"
    res = harness({"clients": [
        {"rank": 0, "argv": [pmix_ops, "pub:secret:string:s3cret", f"waitfile:{go}",
                             "look:secret", "look:stolen"]},
        {"rank": 1, "uid": other, "gid": other,
         # a cut client's PMIx_Init may wait for ever (libpmix's client): bounded
         "argv": ["sh", "-c", f'timeout -s KILL 10 {pmix_ops} look:secret pub:stolen:string:x; '
                  f'timeout -s KILL 10 {pmix_ops} pub:stolen2:string:x; touch {go}'],
         "env": {"LD_PRELOAD": shim, "LIAR_UID": str(other), "LIAR_GID": str(other)}},
    ]})
    guard = res.report["client_guard"]
    assert guard["state"] == "on", guard
    assert guard["refused"] == 2, (guard, res.clients)
    liar = res.clients[1]["stdout"]
    assert "s3cret" not in liar, liar
    assert "PUBLISH key=stolen status=0" not in liar, liar
    assert "PUBLISH key=stolen2 status=0" not in liar, liar
    # the host never heard from rank 1: no connection, no request
    assert not [r for r in res.requests if r.get("proc", "").endswith(":1")], res.requests
    assert "refused a client connecting as pydvm-test@1:1" in res.stderr, res.stderr
    assert f"registered to uid {other}, its socket is uid {os.geteuid()}'s" in res.stderr
    honest = res.clients[0]
    assert honest["rc"] == 0, honest
    assert "FOUND key=secret" in honest["stdout"], honest["stdout"]
    assert "FOUND key=stolen" not in honest["stdout"], honest["stdout"]
    assert honest["stdout"].count("LOOKUP status=") == 2, honest["stdout"]
    assert "FINALIZE status=0" in honest["stdout"], honest["stdout"]


def test_honest_clients_are_checked_and_let_in(harness, pmix_ops):
    res = harness({"clients": [{"rank": r, "argv": [pmix_ops, f"pub:k{r}:string:v",
                                                    "fence:1"]} for r in (0, 1)]}).ok()
    assert res.report["client_guard"] == {"state": "on", "refused": 0}
    assert "connection record" not in res.stderr, res.stderr
    assert len(res.kinds("client_connected")) == 2


def test_the_check_is_off_with_a_warning_on_a_libpmix_whose_records_are_unknown(caplog):
    from pydvm.pmix.clients import ClientGuard
    from pydvm.pmix.values import Proc
    g = ClientGuard(object(), (4, 2, 5))
    assert g.state.startswith("off: libpmix 4.2.5"), g.state
    assert "not checked against the kernel's" in caplog.text
    assert g.check(Proc("ns", 0)) is True        # as libpmix decided
    g.registered(Proc("ns", 0), 1, 1)
    g.release("ns")
    g.close()
