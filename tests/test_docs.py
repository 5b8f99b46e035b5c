"""The API reference keeps building, and the public API it shows is documented.

The reference is generated with pdoc by the command the guide gives (its
"API reference" section); this runs that command as written and checks
what comes out.  The docstring rule: every public module, class, function,
method and property of the client API, the errors, the enums and the store
has a docstring -- an empty entry in the reference is a bug.
"""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "e2e"))

from snippets import REPO, blocks, logical_spans  # noqa: E402

#: Modules whose public names make up the documented API.
PUBLIC = ["pydvm", "pydvm.client", "pydvm.aio", "pydvm.errors", "pydvm.enums", "pydvm.store",
          "pydvm.store.rules"]


def pdoc_command() -> str:
    """The guide's pdoc command, continuation lines joined, as a shell would read it."""
    for b in blocks(REPO / "docs" / "guide.md"):
        if b.lang == "sh" and "pdoc" in b.text:
            lines = b.text.splitlines()
            for n, ln in enumerate(lines, 1):
                if "pdoc" in ln:
                    first, last = logical_spans(b.text)[n]
                    return "\n".join(lines[first - 1:last])
    raise AssertionError("docs/guide.md has no sh snippet running pdoc")


def test_the_api_reference_builds_with_the_documented_command(tmp_path):
    """The guide's command, run as written, writes a page per public module, and the
    pages name the client calls, the exceptions and the store's operations."""
    pytest.importorskip("pdoc")
    cmd = pdoc_command()
    assert "python3 -m pdoc -o build/api" in cmd, cmd
    bindir = str(Path(sys.executable).parent)
    p = subprocess.run(["bash", "-c", f'PATH="{bindir}:$PATH"\n{cmd}'], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    api = tmp_path / "build" / "api"
    pages = {str(f.relative_to(api)) for f in api.rglob("*.html")}
    assert {"index.html", "pydvm.html", "pydvm/client.html", "pydvm/aio.html",
            "pydvm/errors.html", "pydvm/enums.html", "pydvm/store.html",
            "pydvm/store/rules.html"} <= pages, pages
    text = {name: (api / name).read_text() for name in pages}
    for page, names in {
        "pydvm/client.html": ["publish", "lookup", "unpublish", "LookupResult"],
        "pydvm/aio.html": ["connect", "publish", "lookup", "unpublish"],
        "pydvm/errors.html": ["LookupTimeoutError", "NotFoundError", "DuplicateKeyError",
                              "ERR_PARTIAL_SUCCESS"],
        "pydvm/enums.html": ["FIRST_READ", "PROC_LOCAL", "from_word"],
        "pydvm/store.html": ["DataStore", "StoreStats", "removed_keys", "purge", "sweep"],
    }.items():
        missing = [n for n in names if n not in text[page]]
        assert not missing, f"{page} does not mention {missing}"


def _undocumented() -> list[str]:
    missing = []

    def check(qual: str, obj) -> None:
        if not (inspect.getdoc(obj) or "").strip():
            missing.append(qual)

    for modname in PUBLIC:
        mod = importlib.import_module(modname)
        check(modname, mod)
        names = getattr(mod, "__all__", None) or [n for n in vars(mod) if not n.startswith("_")]
        for name in names:
            obj = getattr(mod, name)
            if not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            if not getattr(obj, "__module__", "").startswith("pydvm"):
                continue  # re-exported from the standard library
            check(f"{modname}.{name}", obj)
            if not inspect.isclass(obj):
                continue
            for attr, value in vars(obj).items():
                if attr.startswith("_"):
                    continue
                if isinstance(value, (staticmethod, classmethod)):
                    value = value.__func__
                if inspect.isfunction(value) or isinstance(value, property):
                    if not (value.__doc__ or "").strip():
                        missing.append(f"{modname}.{name}.{attr}")
    return sorted(set(missing))


def test_every_public_name_of_the_api_has_a_docstring():
    """Modules, classes, functions, methods and properties of the public API."""
    assert _undocumented() == []
