"""Every program in examples/ runs the way its docstring says, and does what it says.

The commands are read from the docstring's "Run it" block, so the docstring
cannot drift from what works.  A new example is picked up as it is added; it
must have such a block.
"""

from __future__ import annotations

import ast
import re

import pytest

from snippets import REPO, Scratch

pytestmark = pytest.mark.e2e

EXAMPLES = sorted((REPO / "examples").glob("*.py"))

#: What each example must print, beyond running without a failure.
EXPECTED = {
    "rendezvous.py": [rf"^rank {r} heard from rank {(r - 1) % 4}: hello from rank {(r - 1) % 4}$"
                      for r in range(4)],
    "handover.py": [r"^produced job-result = 42",
                    r"^consumed job-result = 42, handed over by rank 0 of pydvm-\w+@1$",
                    r"^nothing to consume: job-result was already taken$"],
    "parsl_config.py": [r"^42 from a worker on DVM node \S+$"],
    "aio_client.py": [rf"^rank {r}: all 3 ranks ready; gave up waiting for 'never' after 0.5 s$"
                      for r in range(3)],
}


def run_block(path) -> str:
    """The indented block after the docstring's line that ends in 'Run it ...::'."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    m = re.search(r"^Run it[^\n]*::\n\n((?:    .*\n|\n)+)", doc + "\n", re.M)
    assert m, f"{path.name}: its docstring has no 'Run it ...::' block"
    return "\n".join(ln[4:] for ln in m.group(1).splitlines()).strip() + "\n"


def test_there_are_examples_and_each_is_checked():
    """At least the three the guide lists, and an expectation for each one."""
    names = {p.name for p in EXAMPLES}
    assert {"rendezvous.py", "handover.py", "aio_client.py"} <= names
    assert names == set(EXPECTED), "add the new example's expected output to EXPECTED"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_runs_as_its_docstring_says(tmp_path, path):
    """Run the docstring's commands in a fresh shell: no unexpected failure, no DVM
    left behind, and the output the docstring promises."""
    out = Scratch(tmp_path).run_shell(run_block(path))
    assert not out.problems(), f"{path.name}: {out.report()}"
    for pattern in EXPECTED.get(path.name, []):
        assert re.search(pattern, out.stdout, re.M), f"{path.name}: no {pattern!r} in\n{out.stdout}"
