"""Every shell and Python snippet of the README and the pages in ``DOCS`` runs as written.

The blocks are found when the tests are collected, so a snippet added to
one of these files is tested from then on, with no change here.  How a snippet is
run, and how one that cannot run here is marked, is in ``snippets.py``.
"""

from __future__ import annotations

import re
import shutil

import pytest

from snippets import REPO, Block, Scratch, blocks, no_test_markers, shown_output, unshown

pytestmark = pytest.mark.e2e

DOCS = [REPO / "README.md", REPO / "docs" / "guide.md", REPO / "docs" / "mpirun.md",
        REPO / "docs" / "mpiexec.md", REPO / "docs" / "workflows.md",
        REPO / "docs" / "clusters.md", REPO / "docs" / "mpi.md", REPO / "docs" / "torch.md"]
ALL_BLOCKS = {doc: blocks(doc) for doc in DOCS}
RUNNABLE = [b for doc in DOCS for b in ALL_BLOCKS[doc] if b.runnable and not b.filename]
#: Programs a snippet may need that are system packages: without them here,
#: the snippet is skipped saying which (CI installs them; there a skip fails).
NEEDS = (("mpicc", "libopenmpi-dev openmpi-bin"), ("gcc", "gcc"))


#: Python packages a snippet may need: (module, name, what shows it in a
#: snippet, what shows it in a Python file of the document that the snippet
#: runs, how to install it).  Without the package here the snippet is skipped
#: saying so (the ``test`` extra and .ci/run install them; there a skip fails).
PACKAGES = (
    ("torch", "PyTorch", r"import torch|torchrun|pydvm\.torch", r"import torch|pydvm\.torch",
     "pip install 'pydvm[torch]'"),
    ("distributed", "Dask", r"\bdask (scheduler|worker)\b|\b(import|from) (dask|distributed)\b",
     r"\b(import|from) (dask|distributed)\b|\bdask_setup\b",
     "pip install 'dask[distributed]==2026.8.0', as the 'test' extra does"),
    ("parsl", "Parsl", r"\b(import|from) parsl\b|pydvm\.parsl", r"\b(import|from) parsl\b",
     "pip install 'pydvm[parsl]'"),
)


def needs(block: Block, in_block: str, in_file: str) -> bool:
    """The snippet uses a package: its own text shows it (``in_block``), or it
    runs a Python file of its document whose text shows it (``in_file``)."""
    if re.search(in_block, block.text, re.M):
        return True
    return any(b.filename and b.filename in block.text and re.search(in_file, b.text, re.M)
               for b in ALL_BLOCKS[block.path])


def missing(module: str) -> bool:
    """``module`` cannot be imported here -- or, for Dask, its ``dask`` command
    is not on PATH."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        return True
    return module == "distributed" and shutil.which("dask") is None


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """One scratch directory per document, holding that document's Python files."""
    made: dict = {}

    def get(doc) -> Scratch:
        if doc not in made:
            s = made[doc] = Scratch(tmp_path_factory.mktemp(doc.stem))
            s.write_files(ALL_BLOCKS[doc])
        return made[doc]

    return get


@pytest.mark.timeout(300)
@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: b.id)
def test_snippet_runs_as_written(scratch, block: Block):
    """The snippet runs in a fresh shell (Python: as a one-process job) without an
    unexpected failure, prints every output line it shows, and leaves no DVM running."""
    for tool, package in NEEDS:
        if re.search(rf"(^|\s){re.escape(tool)}\s", block.text) and not shutil.which(tool):
            pytest.skip(f"{block.id} needs {tool} (apt-get install {package})")
    for module, name, in_block, in_file, install in PACKAGES:
        if needs(block, in_block, in_file) and missing(module):
            pytest.skip(f"{block.id} needs {name} ({install})")
    s = scratch(block.path)
    out = s.run_python(block) if block.lang == "python" else s.run_shell(block.text)
    problems = out.problems() + (unshown(block.text, out) if block.lang != "python" else [])
    assert not problems, f"{block.id}: {'; '.join(problems)}\n{out.report()}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_every_python_file_of_a_document_is_run_by_one_of_its_shell_snippets(doc):
    """A snippet that is a file (``# name.py`` first line) is only tested if a shell
    snippet of the same document runs it."""
    shell = "\n".join(b.text for b in ALL_BLOCKS[doc] if b.lang in ("sh", "bash", "shell")
                      and b.runnable)
    named = [b.filename for b in ALL_BLOCKS[doc] if b.filename and b.runnable]
    assert [n for n in named if n not in shell] == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_every_no_test_marker_gives_a_reason_and_marks_a_block(doc):
    """``<!-- no-test: REASON -->`` needs its reason and must stand right before a fence."""
    for line, reason, marks_block in no_test_markers(doc):
        assert reason, f"{doc.name}:{line}: no-test marker without a reason"
        assert marks_block, f"{doc.name}:{line}: no-test marker not followed by a code block"


def test_the_documents_have_snippets_to_run():
    """Guard against a parser change that silently finds nothing."""
    for doc in DOCS:
        assert any(b.runnable for b in ALL_BLOCKS[doc]), doc


# ----------------------------------------------------------------------
# the harness itself: a snippet test that cannot fail proves nothing
# ----------------------------------------------------------------------


def test_a_failing_command_fails_the_snippet_at_its_line(tmp_path):
    """Any command that fails is reported with its line, even if later ones succeed."""
    out = Scratch(tmp_path).run_shell("echo one\nfalse\necho three\n")
    assert out.unexpected == [(2, 1)], out.report()


def test_a_failure_inside_a_command_substitution_fails_the_snippet(tmp_path):
    """``X=$(failing)`` succeeds as an assignment; the failure inside still counts."""
    out = Scratch(tmp_path).run_shell('X=$(sh -c "exit 3")\necho "$X"\n')
    assert out.unexpected == [(1, 3)], out.report()


def test_a_failure_its_comment_announces_is_expected(tmp_path):
    """A trailing comment showing a PMIx error or an exit status makes that command's
    failure the expected outcome -- on any line of a continued command."""
    text = ("sh -c 'exit 1'   # STATUS PMIX_ERR_NOT_FOUND (consumed)\n"
            "sh -c 'exit 2' \\\n  --ignored   # exits 2\n"
            "sh -c 'exit 4'   # a plain comment\n")
    out = Scratch(tmp_path).run_shell(text)
    assert out.unexpected == [(4, 4)], out.report()


def test_output_a_snippet_shows_must_be_printed(tmp_path):
    """Comment lines right below a command are lines it prints (stdout or stderr,
    ``…``/``...`` standing for any text); one that nothing printed is a problem."""
    text = ("echo 'rank 0 of pydvm-1f2e@3'; echo oops >&2\n"
            "# rank 0 of pydvm-…@3\n"
            "# oops\n"
            "# rank 1 of ...\n"
            "# ...\n")
    out = Scratch(tmp_path).run_shell(text)
    assert shown_output(text) == [(2, "rank 0 of pydvm-…@3"), (3, "oops"),
                                  (4, "rank 1 of ...")]
    assert unshown(text, out) == ["line 4: shows output nothing printed: 'rank 1 of ...'"]
    assert unshown("echo 'rank 0 and more'\n# rank 0\n", out) != []  # whole lines only
    assert unshown("echo x\n# oops ...\n", out) == []  # a trailing ' ...' may be nothing


def test_comments_that_open_a_snippet_or_follow_a_blank_line_are_prose(tmp_path):
    text = "# start here\necho hi\n\n# then this, which prints nothing\necho bye\n"
    assert shown_output(text) == []


def test_a_dvm_left_running_fails_the_snippet_and_is_stopped(tmp_path):
    """A snippet that starts a DVM and does not stop it is reported; the DVM is stopped."""
    from dvmkit import pid_alive

    s = Scratch(tmp_path)
    out = s.run_shell("pydvm start --daemonize --hosts a > uri\n")
    assert out.unexpected == [] and len(out.leftovers) == 1, out.report()
    assert not pid_alive(out.leftovers[0])
    assert s.kill_leftovers() == []


def test_snippets_are_skipped_for_a_package_only_if_they_use_it():
    """The Dask snippet of the workflows page needs Dask (through the files it
    runs, too); its sweep does not; the guide's PyTorch snippet needs PyTorch
    (its file imports ``pydvm.torch``, not ``torch``)."""
    def users(doc, module):
        _, _, in_block, in_file, _ = next(p for p in PACKAGES if p[0] == module)
        return [b for b in ALL_BLOCKS[doc] if b in RUNNABLE and needs(b, in_block, in_file)]

    workflows, guide = REPO / "docs" / "workflows.md", REPO / "docs" / "guide.md"
    dask = users(workflows, "distributed")
    assert len(dask) == 1 and "dask scheduler" in dask[0].text
    assert users(workflows, "torch") == []
    assert needs(Block(workflows, 1, "sh", "python3 dask_sum.py\n"), *PACKAGES[1][2:4])
    assert not needs(Block(workflows, 1, "sh", "python3 sweep.py  # as dask would\n"),
                     *PACKAGES[1][2:4])
    assert any("elect.py" in b.text for b in users(guide, "torch"))
