"""The direct-data credential: minted by a daemon, checked by the master."""

from __future__ import annotations

import os

import pytest

from pydvm.runtime.shared import credential as C
from pydvm.runtime.shared import dataops
from pydvm.enums import Range

SECRET = bytes(range(32))


def minted(ns="pydvm-x@1", rank=3, uid=1000, gid=1000, app=1, session=2):
    v = C.Voucher(SECRET, "x", "nodeb", "tcp://127.0.0.1:1/x")
    return C.Credential.parse(v.environment(ns, rank, uid, gid, app, session)[C.ENV])


def answer(cred, challenge, ns="pydvm-x@1", rank=3):
    return {"t": "auth", **cred.answer(challenge, ns, rank)}


def test_a_minted_credential_verifies_against_the_challenge_it_answers():
    cred = minted()
    challenge = os.urandom(32)
    got = C.verify(C.domain_key(SECRET), "x", challenge, answer(cred, challenge))
    assert got == ("pydvm-x@1", 3, "nodeb", 1000, 1000, 1, 2)


@pytest.mark.parametrize("field,value", [("uid", 0), ("gid", 0), ("rank", 4), ("app", 0),
                                         ("session", 0), ("node", "nodea"),
                                         ("nspace", "pydvm-x@2"), ("nonce", b"\0" * 16)])
def test_any_edited_field_fails_verification(field, value):
    cred = minted()
    challenge = os.urandom(32)
    msg = answer(cred, challenge)
    msg[field] = value
    assert C.verify(C.domain_key(SECRET), "x", challenge, msg) is None


def test_a_proof_for_one_challenge_or_dvm_or_secret_does_not_verify_for_another():
    cred = minted()
    msg = answer(cred, b"a" * 32)
    assert C.verify(C.domain_key(SECRET), "x", b"b" * 32, msg) is None
    assert C.verify(C.domain_key(SECRET), "y", b"a" * 32, msg) is None
    assert C.verify(C.domain_key(b"\1" * 32), "x", b"a" * 32, msg) is None


def test_the_key_never_travels_and_each_launch_gets_its_own_nonce():
    a, b = minted(), minted()
    assert a.nonce != b.nonce and a.key != b.key
    msg = answer(a, b"c" * 32)
    assert a.key not in [v for v in msg.values() if isinstance(v, bytes)]


def test_malformed_tokens_are_refused_by_the_parser():
    for bad in ("", "v2:1:1:0:0:00:00:n", "v1:1:1:0:0:zz:00:n", "v1:1:1:0:0:00:0011:n"):
        with pytest.raises(ValueError):
            C.Credential.parse(bad)


def test_the_routing_table_gives_local_to_the_node_and_unpublish_to_both():
    assert dataops.stores_for("publish", int(Range.LOCAL)) == (dataops.NODE,)
    assert dataops.stores_for("lookup", int(Range.LOCAL)) == (dataops.NODE,)
    for rng in (Range.SESSION, Range.NAMESPACE, Range.RM, Range.UNDEF):
        assert dataops.stores_for("publish", int(rng)) == (dataops.MASTER,)
    assert dataops.stores_for("unpublish", None) == (dataops.NODE, dataops.MASTER)


# -- the same-host direct-data socket offer ----------------------------------

from pydvm.runtime.shared.auth import host_identity  # noqa: E402
from pydvm.runtime.shared.sockdir import same_host_socket  # noqa: E402


def test_host_identity_names_the_kernel_and_this_processs_namespaces():
    ident = host_identity()
    boot = open("/proc/sys/kernel/random/boot_id").read().strip()
    assert ident.startswith(boot + "/")
    assert f"net:{os.stat('/proc/self/ns/net').st_ino}" in ident
    assert f"mnt:{os.stat('/proc/self/ns/mnt').st_ino}" in ident


@pytest.mark.parametrize("offer,expected", [
    ({"path": "/x/direct.sock", "host": "SAME"}, "/x/direct.sock"),
    ({"path": "/x/direct.sock", "host": "another-boot/mnt:1/net:2"}, ""),
    ({"path": "/x/direct.sock", "host": ""}, ""),
    ({"path": 5, "host": "SAME"}, ""),
    ({"host": "SAME"}, ""),
    ("/x/direct.sock", ""),
    (None, ""),
])
def test_a_daemon_takes_the_masters_socket_only_on_the_masters_machine(offer, expected):
    if isinstance(offer, dict) and offer.get("host") == "SAME":
        offer = {**offer, "host": host_identity()}
    assert same_host_socket(offer) == expected
