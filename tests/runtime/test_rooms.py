"""The runtime's rooms stay rooms: who may import whom, checked on the source.

``pydvm.runtime`` is four rooms (runtime/DESIGN.md): ``master`` above
``node`` above ``pmixhost`` above ``shared``.  Every import is read with
``ast`` -- at module level, inside functions, under ``if TYPE_CHECKING:`` --
and held to these rules:

* a room imports only rooms below it (type-only imports too);
* a module outside a room reaches ``master``, ``node`` or ``pmixhost`` only
  through the room's door (its package, names listed in ``_DOOR``);
  ``shared`` is a toolbox, imported module by module;
* inside a room, the imports that run form no circle; a type-only reference
  back to an owner (``if TYPE_CHECKING:``) is allowed where the room's
  DESIGN.md names it;
* every name a door lists exists.
"""

from __future__ import annotations

import ast
import importlib
import re
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
RUNTIME = SRC / "pydvm" / "runtime"
#: The rooms, lowest first: a room may import those before it.
ROOMS = ("shared", "pmixhost", "node", "master")


def _modules() -> dict[str, Path]:
    mods = {}
    for p in (SRC / "pydvm").rglob("*.py"):
        name = ".".join(p.relative_to(SRC).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = p
    return mods


MODULES = _modules()


def _type_only_nodes(tree: ast.AST) -> set[int]:
    """ids of the import nodes under an ``if TYPE_CHECKING:``."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) \
                and node.test.id == "TYPE_CHECKING":
            out.update(id(n) for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom)))
    return out


def imports(module: str) -> list[tuple[str, str | None, int, bool]]:
    """What ``module`` imports of pydvm: (module, name or None, line, type_only)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    pkg = module if path.name == "__init__.py" else module.rpartition(".")[0]
    typed = _type_only_nodes(tree)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = pkg.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            pairs = [(f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target, a.name)
                     for a in node.names]
        elif isinstance(node, ast.Import):
            pairs = [(a.name, None) for a in node.names]
        else:
            continue
        for t, name in pairs:
            if not t.startswith("pydvm"):
                continue
            while t not in MODULES and "." in t:
                t = t.rpartition(".")[0]
            out.append((t, name, node.lineno, id(node) in typed))
    return out


def room_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["pydvm", "runtime"] else None


def _short(module: str) -> str:
    return module.removeprefix("pydvm.")


def test_every_runtime_module_is_in_a_room():
    loose = [m for m in MODULES if m.startswith("pydvm.runtime.") and room_of(m) not in ROOMS]
    assert not loose, f"runtime modules outside the rooms {ROOMS}: {loose}"


def test_a_room_imports_only_rooms_below_it():
    bad = []
    for m in MODULES:
        r = room_of(m)
        if r is None:
            continue
        for t, name, line, _typed in imports(m):
            rt = room_of(t)
            if rt is not None and ROOMS.index(rt) > ROOMS.index(r):
                bad.append(f"{_short(m)}:{line} imports {_short(t)} ({name}): {r} is below {rt}")
    assert not bad, "\n".join(bad)


def test_other_rooms_and_the_library_come_in_through_the_door():
    bad = []
    for m in MODULES:
        here = room_of(m)
        for t, name, line, _typed in imports(m):
            rt = room_of(t)
            if rt in (None, "shared") or rt == here:
                continue
            if t != f"pydvm.runtime.{rt}":
                bad.append(f"{_short(m)}:{line} imports {_short(t)}: use pydvm.runtime.{rt}'s door")
    assert not bad, "\n".join(bad)


def test_no_module_of_a_room_imports_its_own_door():
    bad = [f"{_short(m)}:{line}" for m in MODULES if room_of(m) not in (None, "shared")
           and m != f"pydvm.runtime.{room_of(m)}"
           for t, _n, line, _ty in imports(m) if t == f"pydvm.runtime.{room_of(m)}"]
    assert not bad, "a room's module imports its own door (a half-made package): " + ", ".join(bad)


@pytest.mark.parametrize("room", ROOMS[1:])
def test_every_name_of_a_door_exists(room):
    door = importlib.import_module(f"pydvm.runtime.{room}")
    for name in door.__all__:
        assert getattr(door, name) is not None, name
    with pytest.raises(AttributeError):
        getattr(door, "no_such_name")


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One circle of ``edges`` (a list of nodes), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def go(v: str) -> list[str] | None:
        state[v] = 1
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if state.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in state:
                found = go(w)
                if found:
                    return found
        stack.pop()
        state[v] = 2
        return None

    for v in sorted(edges):
        if v not in state:
            found = go(v)
            if found:
                return found
    return None


def test_cycle_finder_finds_a_circle_and_accepts_a_tree():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


@pytest.mark.parametrize("room", ROOMS)
def test_inside_a_room_the_imports_that_run_make_no_circle(room):
    edges: dict[str, set[str]] = defaultdict(set)
    for m in MODULES:
        if room_of(m) == room:
            edges[m] |= {t for t, _n, _l, typed in imports(m) if room_of(t) == room and not typed}
    found = _cycle(edges)
    assert found is None, " -> ".join(_short(m) for m in found)


def _reaches(edges: dict[str, set[str]], a: str, b: str) -> bool:
    seen, todo = set(), [a]
    while todo:
        v = todo.pop()
        if v == b:
            return True
        if v not in seen:
            seen.add(v)
            todo.extend(edges.get(v, ()))
    return False


@pytest.mark.parametrize("room", ROOMS)
def test_type_only_references_back_are_named_in_the_rooms_design_notes(room):
    """A part naming its owner's type (``if TYPE_CHECKING:``) where the owner
    imports the part is the one circle a room may keep; its DESIGN.md says
    which, as "`part.py` -> `owner.py`" -- and names no more than there are."""
    design = (RUNTIME / room / "DESIGN.md").read_text()
    run: dict[str, set[str]] = defaultdict(set)
    typed_edges = set()
    for m in MODULES:
        if room_of(m) == room:
            for t, _n, _l, typed in imports(m):
                if room_of(t) == room and t != m:
                    (typed_edges.add((m, t)) if typed else run[m].add(t))
    pairs = {(m.rpartition(".")[2] + ".py", t.rpartition(".")[2] + ".py")
             for m, t in typed_edges if _reaches(run, t, m)}
    written = set(re.findall(r"`(\w+\.py)` -> `(\w+\.py)`", design))
    assert pairs <= written, f"{room}/DESIGN.md does not name: {sorted(pairs - written)}"
    assert written <= pairs, f"{room}/DESIGN.md names references that are gone: " \
                             f"{sorted(written - pairs)}"
