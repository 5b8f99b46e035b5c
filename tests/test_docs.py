"""The API reference keeps building, and the public API it shows is documented.

The reference is generated with pdoc by the command the guide gives (its
"API reference" section); this runs that command as written and checks
what comes out.  The docstring rule: every public module, class, function,
method and property of the client API, the errors, the enums and the store
has a docstring -- an empty entry in the reference is a bug.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "e2e"))

from snippets import REPO, blocks, logical_spans  # noqa: E402

#: Modules whose public names make up the documented API.
PUBLIC = ["pydvm", "pydvm.client", "pydvm.aio", "pydvm.client.aiojobs", "pydvm.jobs", "pydvm.errors",
          "pydvm.enums", "pydvm.store", "pydvm.store.rules"]
if importlib.util.find_spec("torch") is not None:  # an optional integration
    PUBLIC += ["pydvm.torch", "pydvm.torch.rendezvous", "pydvm.torch.elastic"]
if importlib.util.find_spec("psij") is not None:  # the PSI/J executor
    PUBLIC += ["pydvm.psij", "pydvm.psij.executor", "pydvm.psij.spec"]
if importlib.util.find_spec("parsl") is not None:  # the Parsl provider
    PUBLIC += ["pydvm.parsl"]


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
    """The guide's command, run as written, writes a page per public module without a
    warning (an annotation pdoc cannot resolve is shown as a bare string), and the
    pages name the client calls, the exceptions and the store's operations."""
    pytest.importorskip("pdoc")
    cmd = pdoc_command()
    assert "python3 -m pdoc -o build/api" in cmd, cmd
    bindir = str(Path(sys.executable).parent)
    p = subprocess.run(["bash", "-c", f'PATH="{bindir}:$PATH"\n{cmd}'], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    warned = [ln for ln in (p.stdout + p.stderr).splitlines() if "warn" in ln.lower()]
    assert not warned, "\n".join(warned)
    api = tmp_path / "build" / "api"
    pages = {str(f.relative_to(api)) for f in api.rglob("*.html")}
    assert {"index.html", "pydvm.html", "pydvm/client.html", "pydvm/aio.html", "pydvm/jobs.html",
            "pydvm/errors.html", "pydvm/enums.html", "pydvm/store.html",
            "pydvm/store/rules.html"} <= pages, pages
    text = {name: (api / name).read_text() for name in pages}
    for page, names in {
        "pydvm/client.html": ["publish", "lookup", "unpublish", "LookupResult"],
        "pydvm/aio.html": ["connect", "publish", "lookup", "unpublish"],
        "pydvm/jobs.html": ["submit", "submit_many", "Executor", "JobResult", "returncode",
                            "on_event"],
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


# ----------------------------------------------------------------------
# what `pip install .` brings is what the documented commands need
# ----------------------------------------------------------------------


def _norm(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    import re

    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(req: str) -> str:
    import re

    return _norm(re.match(r"\s*([A-Za-z0-9._-]+)", req).group(1))


def _pyproject() -> dict:
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())


#: Subpackages that integrate pydvm with an optional package: they may import
#: what the extra of the same name declares, and only they may.
OPTIONAL_INTEGRATIONS = {"torch": REPO / "src" / "pydvm" / "torch",
                         "psij": REPO / "src" / "pydvm" / "psij",
                         "parsl": REPO / "src" / "pydvm" / "parsl"}


def _third_party_imports(under: Path | None = None,
                         skip: tuple[Path, ...] = ()) -> set[str]:
    """Top-level modules outside the standard library that pydvm's code (or
    the files ``under`` a directory of it) imports, however lazily (inside a
    function, after a flag); files under ``skip`` are left out."""
    import ast

    mods: set[str] = set()
    for f in (under or REPO / "src" / "pydvm").rglob("*.py"):
        if any(d in f.parents for d in skip):
            continue
        for n in ast.walk(ast.parse(f.read_text())):
            if isinstance(n, ast.Import):
                mods |= {a.name.split(".")[0] for a in n.names}
            elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
                mods.add(n.module.split(".")[0])
    return {m for m in mods if m not in sys.stdlib_module_names and m != "pydvm"}


def test_every_package_pydvm_imports_is_an_ordinary_dependency():
    """`pip install .` (the README's set-up) brings whatever any command needs:
    the Slurm launcher's python-hostlist and --metrics' prometheus_client
    included, so no documented command stops on a missing extra.  The old
    extras stay as aliases, so `pip install 'pydvm[slurm]'` keeps working."""
    import importlib.metadata as md

    project = _pyproject()["project"]
    base = {_requirement_name(r) for r in project["dependencies"]}
    owners = md.packages_distributions()
    core = _third_party_imports(skip=tuple(OPTIONAL_INTEGRATIONS.values()))
    needed = {m: {_norm(d) for d in owners.get(m, [m])} for m in core}
    assert {"hostlist", "prometheus_client"} <= set(needed), needed
    missing = {m: d for m, d in needed.items() if not d & base}
    assert not missing, f"imported by pydvm but only in an extra, or not declared: {missing}"
    extras = project["optional-dependencies"]
    for extra, where in OPTIONAL_INTEGRATIONS.items():  # pydvm.torch: base + its extra
        allowed = base | {_requirement_name(r) for r in extras[extra]}
        wanted = {m: {_norm(d) for d in owners.get(m, [m])} for m in
                  _third_party_imports(where)}
        missing = {m: d for m, d in wanted.items() if not d & allowed}
        assert not missing, f"pydvm.{extra} imports what neither the base nor [{extra}] has: " \
                            f"{missing}"
    assert {"slurm", "metrics"} <= set(extras)
    for name in ("slurm", "metrics"):
        assert {_requirement_name(r) for r in extras[name]} <= base, name


#: The README and the pages that hold what the README used to (the command
#: line, clusters, MPI, PyTorch), the guide and the contributors' page.
FRONT_DOCS = [REPO / "README.md", REPO / "CONTRIBUTING.md"] + [
    REPO / "docs" / f"{name}.md" for name in ("guide", "cli", "clusters", "mpi", "torch")]


def test_the_docs_name_only_extras_that_exist_and_files_that_exist():
    """Every `pydvm[EXTRA]` the README, the pages it sends readers to or
    pyproject.toml mention is an extra pyproject.toml defines, and every
    docs/*.md file they cite exists."""
    import re

    extras = set(_pyproject()["project"]["optional-dependencies"])
    for path in (*FRONT_DOCS, REPO / "pyproject.toml"):
        text = path.read_text()
        for m in re.finditer(r"pydvm\[([^\]]*)\]", text):
            named = {e.strip() for e in m.group(1).split(",")}
            assert named <= extras, f"{path.name}: {m.group(0)} names an unknown extra"
        for m in re.finditer(r"(?<![\w/])docs/[\w.-]+\.md", text):
            assert (REPO / m.group(0)).exists(), f"{path.name} cites {m.group(0)}, which is missing"


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown page (outside code blocks)."""
    import re

    out: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for ln in page.read_text().splitlines():
        if ln.lstrip().startswith("```"):
            fenced = not fenced
        m = None if fenced else re.match(r"#{1,6}\s+(.*)", ln)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_every_link_between_the_docs_resolves():
    """A relative link of the README, CONTRIBUTING.md or a docs/ page names a file
    that exists and, with ``#anchor``, a heading of that page: moving a section
    from one page to another must move the links to it too."""
    import re

    broken = []
    for page in [REPO / "README.md", REPO / "CONTRIBUTING.md",
                 *sorted((REPO / "docs").glob("*.md"))]:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for m in re.finditer(r"\]\(([^)\s]+)\)", text):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, broken


def test_the_guide_says_where_a_daemonized_dvm_logs():
    """A --daemonize'd DVM without --log-dir logs to $PYDVM_STATE_DIR/logs/<id>
    (runtime.launch.default_log_dir); the guide's "Where the logs are" says so (its
    snippet, run by tests/e2e/test_snippets.py, lists the files there)."""
    text = (REPO / "docs" / "guide.md").read_text()
    section = text.split("### Where the logs are", 1)[1].split("\n### ", 1)[0]
    flat = " ".join(section.split())
    assert "`$PYDVM_STATE_DIR/logs/<dvm id>`" in flat, flat
    assert "keeps nothing" not in flat and "pydvm info" in flat, flat


def test_the_readme_says_to_make_a_venv_before_its_two_set_up_commands():
    """Debian 12's Python refuses `pip install .` outside a virtual environment
    (PEP 668): the line before the README's set-up commands says to make one,
    and the two commands stay the set-up."""
    lines = (REPO / "README.md").read_text().splitlines()
    first_cmd = next(i for i, ln in enumerate(lines) if ln.startswith("    pip install"))
    before = [ln for ln in lines[1:first_cmd] if ln.strip()]
    assert len(before) == 1, before
    assert "python3 -m venv .venv && . .venv/bin/activate" in before[0]
    assert "externally-managed-environment" in before[0]
    assert lines[first_cmd].strip().startswith("pip install . && pydvm run ")
    assert lines[first_cmd + 1].strip() == "pip install -e '.[test]' && python -m pytest -q"
