"""Layers that point one way: a job process's ``import pydvm`` loads the
client and the protocol module, not the store, not the runtime, and not what
only they need (asyncio, dataclasses, logging) -- every process of a job that
uses the client pays for what it imports."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

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
    assert "pydvm.protocol" in mods
    # the client is loaded when first asked for (the command line never is)
    assert "pydvm.client" not in mods
    mods = loaded_by("from pydvm import Client, Found, LookupResult")
    assert "pydvm.client.data" in mods and "pydvm.client.proto" in mods
    assert not [m for m in mods if m in NOT_FOR_CLIENTS or m.startswith(
        tuple(p + "." for p in NOT_FOR_CLIENTS))]


def test_a_client_call_path_loads_nothing_of_the_runtime_either():
    """Building requests and reading answers (what a call does besides the socket)."""
    mods = loaded_by("import pydvm\nfrom pydvm.client import proto as _proto\n"
                     "_proto.publish_msg({'k': 'v'}, 4, 5, [], [], False)\n"
                     "_proto.lookup_result({'t': 'reply', 'id': 1, 'status': 0, "
                     "'found': [['k', 'v', 'ns', 0]]})")
    assert not [m for m in mods if m.startswith(("pydvm.store", "pydvm.runtime", "asyncio"))]


def test_the_runtime_and_the_client_share_one_protocol():
    """The names the runtime uses are the protocol module's own objects, so the
    two sides cannot drift apart."""
    from pydvm import protocol, wire
    from pydvm.runtime.shared import auth
    from pydvm.runtime.shared import credential
    from pydvm.runtime.shared import dataops
    from pydvm.store import model
    assert wire.pack is protocol.pack and wire.FrameDecoder is protocol.FrameDecoder
    assert auth.DvmUri is protocol.DvmUri and credential.Credential is protocol.Credential
    assert dataops.stores_for is protocol.stores_for and model.Typed is protocol.Typed


# ----------------------------------------------------------------------
# the command line's fast path
# ----------------------------------------------------------------------

#: What the commands a job runs most must not load: ``pydvm run`` against a
#: persistent DVM, ``publish``, ``lookup``, ``unpublish``, ``--version``.
NOT_ON_THE_FAST_PATH = ("asyncio", "argparse", "pydvm.store", "pydvm.runtime", "uvloop")


def imported_by(argv: list[str], env: dict | None = None) -> tuple[subprocess.CompletedProcess,
                                                                   list[str]]:
    """Run ``python -X importtime ARGV`` (``-m pydvm ...`` or the console
    script); its result and every module it imported, as ``-X importtime``
    reports them on stderr."""
    p = subprocess.run([sys.executable, "-X", "importtime", *argv], capture_output=True,
                       text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)
    mods = [ln.split("|")[-1].strip() for ln in p.stderr.splitlines()
            if ln.startswith("import time:") and "|" in ln]
    assert "pydvm" in mods, p.stderr  # -X importtime did report
    return p, mods


def slow(mods: list[str]) -> list[str]:
    return [m for m in mods if m in NOT_ON_THE_FAST_PATH or m.startswith(
        tuple(p + "." for p in NOT_ON_THE_FAST_PATH))]


def console_script() -> str:
    """The ``pydvm`` console script of this interpreter's environment."""
    import os
    import shutil

    path = shutil.which("pydvm", path=os.path.dirname(sys.executable)) or shutil.which("pydvm")
    assert path, "the pydvm console script is not installed"
    return path


def test_version_loads_nothing_but_the_package():
    for argv in (["-m", "pydvm", "--version"], [console_script(), "--version"]):
        p, mods = imported_by(argv)
        assert p.returncode == 0 and p.stdout.startswith("pydvm "), p
        assert slow(mods) == [], f"{argv}: {slow(mods)}"
        assert not [m for m in mods if m.startswith("pydvm.cli.")
                    and m != "pydvm.cli.common"], mods


def test_in_job_commands_parse_without_argparse():
    """Outside a job they fail at once (UNREACH) -- after parsing, which is what is checked."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("PYDVM_")}
    for args in (["publish", "--range", "namespace", "k=v", "k2=v2"],
                 ["lookup", "--wait", "--timeout", "0.5", "k"], ["lookup", "k", "--json"],
                 ["unpublish", "k"], ["unpublish"]):
        for argv in (["-m", "pydvm", *args], [console_script(), *args]):
            p, mods = imported_by(argv, env)
            assert p.returncode == 1 and "PMIX_ERR_UNREACH" in p.stdout, (argv, p)
            assert slow(mods) == [], f"{argv}: {slow(mods)}"


def test_a_usage_error_or_help_still_goes_through_argparse():
    """What the light parser does not take is argparse's to word: the check above
    would pass vacuously if every command went to argparse, this one would not."""
    p, mods = imported_by(["-m", "pydvm", "lookup", "--range", "nowhere", "k"])
    assert p.returncode == 2 and "invalid choice: 'nowhere'" in p.stderr, p
    assert "argparse" in mods


# ----------------------------------------------------------------------
# the command line as a package
# ----------------------------------------------------------------------


def _imports_of(path, package: str) -> set[str]:
    """Modules of ``package`` that the module at ``path`` imports, at its top
    or inside a function (relative imports resolved)."""
    import ast

    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                base = package
            elif node.level == 0:
                base = ""
            else:
                continue  # a module above the package
            mod = f"{base}.{node.module}" if node.module and base else (node.module or base)
            if mod == package:
                out.update(f"{package}.{a.name}" for a in node.names)
            elif mod.startswith(package + "."):
                out.add(mod)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith(package + "."))
    return out


@pytest.mark.parametrize("package,at_least", [("pydvm.cli", 12), ("pydvm.client", 6)])
def test_a_package_has_no_import_cycle(package, at_least):
    """Every import between a package's modules -- at the top of a module or
    inside a function -- points one way: no module can reach itself.  (Before
    the command-line package, the nine cli*/tool* modules were one circle.)"""
    import importlib
    import pathlib

    root = pathlib.Path(importlib.import_module(package).__file__).parent
    names = {f"{package}.{p.stem}": p for p in root.glob("*.py") if p.stem != "__init__"}
    assert len(names) >= at_least, sorted(names)
    graph = {m: {d for d in _imports_of(p, package) if d in names} for m, p in names.items()}
    # no module imports the package's __init__ (its door imports the others)
    for m, p in names.items():
        assert package not in _imports_of(p, package) - set(names), m
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph[m]):
            assert state.get(d) != 1, "import cycle: " + " -> ".join(path + [m, d])
            if d not in state:
                visit(d, path + [m])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
