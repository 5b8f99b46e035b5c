"""Layers that point one way: a job process's ``import pydvm`` loads the
client and the protocol module, not the store, not the runtime, and not what
only they need (asyncio, dataclasses, logging) -- every process of a job that
uses the client pays for what it imports."""

from __future__ import annotations

import json
import subprocess
import sys

#: Modules ``import pydvm`` must not load.
NOT_FOR_CLIENTS = ("pydvm.store", "pydvm.runtime", "pydvm.wire", "pydvm.pmix", "pydvm.cli",
                   "asyncio", "dataclasses", "logging", "uvloop")


def loaded_by(code: str) -> list[str]:
    p = subprocess.run([sys.executable, "-c", code + "\nimport sys, json\n"
                        "print(json.dumps(sorted(sys.modules)))"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.splitlines()[-1])


def test_import_pydvm_loads_neither_the_store_nor_the_runtime():
    mods = loaded_by("import pydvm")
    bad = [m for m in mods if m in NOT_FOR_CLIENTS or m.startswith(
        tuple(p + "." for p in NOT_FOR_CLIENTS))]
    assert bad == [], f"import pydvm loads {bad}"
    assert "pydvm.protocol" in mods and "pydvm.client" in mods


def test_a_client_call_path_loads_nothing_of_the_runtime_either():
    """Building requests and reading answers (what a call does besides the socket)."""
    mods = loaded_by("import pydvm\nfrom pydvm import _proto\n"
                     "_proto.publish_msg({'k': 'v'}, 4, 5, [], [], False)\n"
                     "_proto.lookup_result({'t': 'reply', 'id': 1, 'status': 0, "
                     "'found': [['k', 'v', 'ns', 0]]})")
    assert not [m for m in mods if m.startswith(("pydvm.store", "pydvm.runtime", "asyncio"))]


def test_the_runtime_and_the_client_share_one_protocol():
    """The names the runtime uses are the protocol module's own objects, so the
    two sides cannot drift apart."""
    from pydvm import protocol, wire
    from pydvm.runtime import auth, credential, dataops
    from pydvm.store import model
    assert wire.pack is protocol.pack and wire.FrameDecoder is protocol.FrameDecoder
    assert auth.DvmUri is protocol.DvmUri and credential.Credential is protocol.Credential
    assert dataops.stores_for is protocol.stores_for and model.Typed is protocol.Typed
