"""Layers that point one way.

What is loaded: a job process's ``import pydvm`` loads the client and the
protocol module, not the store, not the runtime, and not what only they need
(asyncio, dataclasses, logging) -- every process of a job that uses the
client pays for what it imports; the command line's fast path loads no
argparse or asyncio either.

What imports what (the rest of the file): :func:`import_graph` reads every
module under ``src/pydvm`` with :mod:`ast` -- every import, at a module's
top, inside a function, under ``TYPE_CHECKING`` -- and gives the graph of
modules; :func:`top_graph` folds it onto the top-level packages and modules
of ``pydvm`` (``cli``, ``client``, ``runtime``, ``wire``, ``protocol``...).
The checks here: the library (``client/``) imports neither the command line
nor the runtime; the codec and wire modules import neither; no two
top-level packages are in a circle; a package's modules do not import one
another in a circle.  More checks of the same graph go at the end.
"""

from __future__ import annotations

import ast
import functools
import json
import pathlib
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
# the import graph
# ----------------------------------------------------------------------


def source_root() -> pathlib.Path:
    """The directory of the ``pydvm`` package under test (``src/pydvm``)."""
    import importlib.util

    spec = importlib.util.find_spec("pydvm")
    assert spec is not None and spec.origin, "pydvm is not importable"
    return pathlib.Path(spec.origin).parent


def _modules(root: pathlib.Path) -> dict[str, tuple[pathlib.Path, bool]]:
    """Every module under ``root``: dotted name -> (its file, whether it is a
    package's ``__init__``)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        package = parts[-1] == "__init__"
        if package:
            parts.pop()
        out[".".join(parts)] = (path, package)
    return out


def _resolve(name: str, modules: dict) -> str:
    """``name`` (``pydvm.x.y`` or an attribute of one) as the module it is, or
    the nearest enclosing one."""
    while name not in modules and "." in name:
        name = name.rpartition(".")[0]
    return name


def _lazy_door(tree: ast.Module, package: str, modules: dict) -> set[str]:
    """The submodules a lazy door loads: a module that calls
    ``importlib.import_module`` (``pydvm.__getattr__``, ``pydvm.client``'s,
    ``pydvm.cli``'s) names the modules it loads in a dict at its top
    (``_LAZY``...); every string there that names a module of ``package``
    counts as an import of it."""
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr == "import_module"]
    if not calls:
        return set()
    out = set()
    for node in tree.body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if isinstance(value, ast.Dict):
            for c in ast.walk(value):
                if isinstance(c, ast.Constant) and isinstance(c.value, str) and \
                        f"{package}.{c.value}" in modules:
                    out.add(f"{package}.{c.value}")
    return out


def _imports(name: str, modules: dict) -> set[str]:
    """The modules of pydvm that module ``name`` imports, anywhere in it."""
    path, is_package = modules[name]
    package = name if is_package else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for a in node.names:  # ``from P import m``: the module P.m if it is one
                found.add(f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod)
    found |= _lazy_door(tree, package, modules)
    return {_resolve(m, modules) for m in found
            if m == "pydvm" or m.startswith("pydvm.")} - {name}


@functools.lru_cache(maxsize=None)
def import_graph() -> dict[str, frozenset[str]]:
    """Every module of pydvm -> the modules of pydvm it imports: at its top,
    inside functions, under ``TYPE_CHECKING``, in ``try`` blocks, and what a
    lazy door loads (:func:`_lazy_door`).  Relative imports resolved;
    ``from P import x`` is an import of ``P.x`` if that is a module, else of
    ``P``.  Loading a module loads its parent packages first: that is not an
    edge here (every module would import ``pydvm``)."""
    modules = _modules(source_root())
    return {m: frozenset(_imports(m, modules)) for m in modules}


#: Top-level modules that are a package's door from outside it, and so part
#: of its node: ``_torchrun`` is the ``torchrun.handlers`` entry point of
#: ``pydvm.torch``, kept out of the package so that torch's loading of entry
#: points imports nothing (``pydvm.torch`` registers its very function).
DOORS = {"_torchrun": "torch"}


def top_of(module: str) -> str:
    """The top-level node a module belongs to: ``pydvm.cli.run`` -> ``cli``,
    ``pydvm.wire`` -> ``wire``, the package's ``__init__`` -> ``pydvm`` (and a
    door to a package, :data:`DOORS`, -> that package)."""
    parts = module.split(".")
    return DOORS.get(parts[1], parts[1]) if len(parts) > 1 else "pydvm"


def top_graph(graph: dict[str, frozenset[str]] | None = None) -> dict[str, set[str]]:
    """:func:`import_graph` folded onto the top-level packages and modules of
    pydvm (imports inside one of them left out)."""
    graph = import_graph() if graph is None else graph
    out: dict[str, set[str]] = {top_of(m): set() for m in graph}
    for m, deps in graph.items():
        out[top_of(m)] |= {top_of(d) for d in deps} - {top_of(m)}
    return out


def find_cycle(graph: dict[str, set[str]] | dict[str, frozenset[str]]) -> list[str] | None:
    """A circle of ``graph`` (``[a, b, ..., a]``), or None if it has none."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                return path[path.index(d):] + [d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def show(graph: dict) -> str:
    return "\n".join(f"  {m} -> {', '.join(sorted(graph[m])) or '-'}" for m in sorted(graph))


def importers(graph: dict, of: str, prefixes: tuple[str, ...]) -> list[str]:
    """``module -> imported`` for every module ``of`` (a package or module
    name, e.g. ``pydvm.client``) that imports one under ``prefixes``."""
    return [f"{m} -> {d}" for m in sorted(graph) if m == of or m.startswith(of + ".")
            for d in sorted(graph[m]) if d.startswith(prefixes) or d in
            {p.rstrip(".") for p in prefixes}]


def test_the_graph_sees_every_kind_of_import():
    """The reader itself: top-level, function-level and TYPE_CHECKING imports,
    relative and absolute, and a lazy door."""
    g = import_graph()
    assert "pydvm.protocol" in g["pydvm"]  # the package's own top
    assert "pydvm.client" in g["pydvm"]  # its lazy door (Client, Dvm...)
    assert "pydvm.client.data" in g["pydvm.client"]  # the client's lazy door
    assert "pydvm.cli.run" in g["pydvm.cli"]  # inside main()
    assert "pydvm.runtime.master" in g["pydvm.cli.run"]  # inside _one_shot, through the door
    assert "pydvm.client.request" in g["pydvm.client.jobspec"]  # inside run_request
    assert "pydvm._trace" in g["pydvm.cli.submit"]  # from .. import _trace


# ----------------------------------------------------------------------
# the library, the command line, the wire
# ----------------------------------------------------------------------

CLI, CLIENT, RUNTIME = "pydvm.cli.", "pydvm.client.", "pydvm.runtime."


def test_the_library_imports_neither_the_command_line_nor_the_runtime():
    """How to reach a DVM and what a job may ask are the library's
    (``client/connect.py``, ``client/options.py``, ``client/request.py``): the
    command line parses argv into that model and calls it, never the other
    way round; and a program that uses the client never loads the runtime."""
    bad = importers(import_graph(), "pydvm.client", (CLI, RUNTIME))
    assert bad == [], "the client imports the command line or the runtime:\n" + "\n".join(bad)


@pytest.mark.parametrize("module", ["pydvm.wire", "pydvm.protocol", "pydvm.channel"])
def test_the_codec_and_the_channels_import_no_side(module):
    """What both sides use imports neither: not the client, not the command
    line, not the runtime (the blocking channel, :mod:`pydvm.channel`, is
    below both the client and the wire)."""
    bad = importers(import_graph(), module, (CLI, CLIENT, RUNTIME))
    assert bad == [], "\n".join(bad)


def test_no_two_top_level_packages_import_each_other_in_a_circle():
    """Each top-level package or module of pydvm (``cli``, ``client``,
    ``runtime``, ``store``, ``wire``, ``protocol``...) is a node; an import
    from one into another is an edge; there is no circle.

    The package itself (``pydvm/__init__.py``) is the node ``pydvm``: it may
    import its submodules (``enums``, ``errors``, ``protocol``, and the
    client through its lazy door), and a module that imports a name of the
    package (``from pydvm import Client``, ``from .. import __version__``)
    is an edge into it -- so nothing the package's ``__init__`` imports may
    import a name of the package back.  Loading a parent package before its
    module is no edge (every module would import ``pydvm``)."""
    top = top_graph()
    assert {"cli", "client", "runtime", "wire", "protocol", "pydvm"} <= set(top), sorted(top)
    cycle = find_cycle(top)
    assert cycle is None, ("import circle: " + " -> ".join(cycle or []) +
                           "\ntop-level graph:\n" + show(top))


def test_the_library_runs_without_the_command_line():
    """What the graph says, at run time: connecting and building a job's
    request (the library's own modules) load nothing of the command line or
    the runtime, nor asyncio."""
    mods = loaded_by("import pydvm.jobs\n"
                     "from pydvm.client import connect, options, request\n"
                     "from pydvm.client.jobspec import run_request\n"
                     "run_request('true', 2, map_by='node', inherit_env=False, cwd='/')")
    bad = [m for m in mods if m in ("pydvm.cli", "pydvm.runtime", "asyncio")
           or m.startswith(("pydvm.cli.", "pydvm.runtime.", "asyncio."))]
    assert bad == [], bad


# ----------------------------------------------------------------------
# a package's own modules
# ----------------------------------------------------------------------


@pytest.mark.parametrize("package,at_least", [("pydvm.cli", 12), ("pydvm.client", 6)])
def test_a_package_has_no_import_cycle(package, at_least):
    """Every import between a package's modules -- at the top of a module or
    inside a function -- points one way: no module can reach itself.  (Before
    the command-line package, the nine cli*/tool* modules were one circle.)"""
    graph = import_graph()
    names = {m for m in graph if m.startswith(package + ".") and "." not in m[len(package) + 1:]}
    assert len(names) >= at_least, sorted(names)
    # no module imports the package's __init__ (its door imports the others)
    for m in sorted(names):
        assert package not in graph[m], m
    inner = {m: {d for d in graph[m] if d in names} for m in names}
    cycle = find_cycle(inner)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
