"""``pydvm.pmix`` imports one way: no module imports, even lazily, one that
imports it back.

Read from the source with ``ast`` (nothing is imported, libpmix is not
needed): every import counts -- at module level, inside functions, under
``if TYPE_CHECKING:``, and ``importlib.import_module`` / ``__import__`` of a
literal name.  The layers src/pydvm/pmix/DESIGN.md lists are checked against
the same graph, so the document cannot drift from the code.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PKG = "pydvm.pmix"
ROOT = Path(__file__).resolve().parents[2] / "src" / "pydvm" / "pmix"
DESIGN = ROOT / "DESIGN.md"


def _resolve(level: int, module: str | None) -> str:
    """An import's absolute module name, seen from a module of ``PKG``."""
    if level == 0:
        return module or ""
    base = PKG.split(".")
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _target(absname: str, mods: set[str]) -> str | None:
    """The module of ``PKG`` that importing ``absname`` names (None: outside)."""
    if absname == PKG:
        return "__init__"
    if not absname.startswith(PKG + "."):
        return None
    head = absname[len(PKG) + 1:].split(".")[0]
    return head if head in mods else "__init__"


def imports_of(source: str, mods: set[str]) -> list[tuple[str, int]]:
    """``(module of PKG, line)`` for every import in ``source``, wherever it sits."""
    out: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for a in node.names:
                t = _target(a.name, mods)
                if t:
                    out.append((t, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            absname = _resolve(node.level, node.module)
            if absname == PKG:
                # ``from . import x``: the submodule x, else a name of __init__
                out += [(a.name if a.name in mods else "__init__", node.lineno)
                        for a in node.names]
            else:
                t = _target(absname, mods)
                if t:
                    out.append((t, node.lineno))
        elif isinstance(node, ast.Call) and node.args and \
                isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name in ("import_module", "__import__"):
                arg = node.args[0].value
                absname = (_resolve(len(arg) - len(arg.lstrip(".")), arg.lstrip(".") or None)
                           if arg.startswith(".") else arg)
                t = _target(absname, mods)
                if t:
                    out.append((t, node.lineno))
    return out


def graph(root: Path = ROOT) -> dict[str, dict[str, list[int]]]:
    """module -> {imported module -> lines}, within the package."""
    mods = {p.stem for p in root.glob("*.py")}
    g: dict[str, dict[str, list[int]]] = {}
    for m in sorted(mods):
        edges: dict[str, list[int]] = {}
        for t, line in imports_of((root / f"{m}.py").read_text(), mods):
            if t != m:
                edges.setdefault(t, []).append(line)
        g[m] = edges
    return g


def find_cycle(g: dict[str, dict]) -> list[str] | None:
    """One cycle of ``g`` as ``[a, b, ..., a]``, or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = dict.fromkeys(g, WHITE)
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        colour[m] = GREY
        stack.append(m)
        for t in sorted(g.get(m, ())):
            if colour.get(t, BLACK) == GREY:
                return stack[stack.index(t):] + [t]
            if colour.get(t) == WHITE:
                found = visit(t)
                if found:
                    return found
        stack.pop()
        colour[m] = BLACK
        return None

    for m in sorted(g):
        if colour[m] == WHITE:
            found = visit(m)
            if found:
                return found
    return None


def _show(g, cycle: list[str]) -> str:
    return "\n".join(f"  {a} -> {b} (line {', '.join(map(str, g[a][b]))})"
                     for a, b in zip(cycle, cycle[1:]))


def test_the_pmix_package_has_no_import_cycle():
    g = graph()
    assert {"server", "replies", "requests", "values", "__init__"} <= set(g)
    assert "replies" in g["server"] and "values" in g["replies"]   # the reader reads
    cycle = find_cycle(g)
    assert cycle is None, "import cycle in pydvm.pmix:\n" + _show(g, cycle)


def test_lazy_and_type_checking_imports_count():
    """The reader sees what ``import`` at the top alone would miss."""
    src = ("from typing import TYPE_CHECKING\n"
           "if TYPE_CHECKING:\n    from .server import PmixServer\n"
           "def f():\n    from . import queries, Handler\n"
           "    import pydvm.pmix.tools\n"
           "    from pydvm.pmix.jobctl import upcalls\n"
           "    importlib.import_module('.clients', 'pydvm.pmix')\n"
           "from .. import protocol\nfrom ..runtime import x\n")
    mods = {"server", "queries", "tools", "jobctl", "clients", "__init__"}
    assert [t for t, _ in sorted(imports_of(src, mods), key=lambda e: e[1])] == [
        "server", "queries", "__init__", "tools", "jobctl", "clients"]


def test_a_cycle_is_found_and_shown():
    g = {"a": {"b": [3]}, "b": {"c": [4]}, "c": {"a": [9]}, "d": {}}
    assert find_cycle(g) == ["a", "b", "c", "a"]
    assert "c -> a (line 9)" in _show(g, find_cycle(g))
    assert find_cycle({"a": {"b": [1]}, "b": {}}) is None


def design_layers() -> dict[str, int]:
    """DESIGN.md's layer table (its ``layers`` block): module -> layer."""
    m = re.search(r"```layers\n(.*?)```", DESIGN.read_text(), re.S)
    assert m, "src/pydvm/pmix/DESIGN.md has no ```layers block"
    out: dict[str, int] = {}
    for line in m.group(1).splitlines():
        parts = line.split()
        if parts and parts[0].isdigit():
            for mod in parts[1:]:
                out[mod] = int(parts[0])
    return out


def test_design_md_layers_are_the_imports():
    """Every module is in DESIGN.md's table, and imports only from lower layers."""
    g = graph()
    layer = design_layers()
    assert set(layer) == set(g), f"listed {sorted(layer)}, modules {sorted(g)}"
    upward = [f"{a} (layer {layer[a]}) imports {b} (layer {layer[b]})"
              for a, edges in g.items() for b in edges if layer[b] >= layer[a]]
    assert not upward, "\n".join(upward)
