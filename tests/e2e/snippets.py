"""Running the documentation's code as a reader would: fenced snippets and examples.

What counts as a snippet (:func:`blocks`): a fenced block tagged ``sh``,
``bash``, ``shell`` or ``python`` in a Markdown file.  Untagged blocks and
other tags (synopses, diagrams, output) are text.  A block right after an
HTML comment ``<!-- no-test: REASON -->`` is not run; the reason is
required (see ``test_snippets.py``).

How a document's snippets run (:class:`Scratch`):

* In a scratch directory of their own, in which ``examples/`` and ``bench/``
  of the repository appear as in a checkout, with ``pydvm`` and ``python3``
  of the interpreter running the tests first on ``PATH``, no
  ``PYDVM_URI``, and a private ``PYDVM_STATE_DIR`` (so every DVM a snippet
  starts can be found afterwards).
* A Python block whose first line is a comment naming a file (``#
  hello.py ...``) is that file: it is written to the scratch directory, and a
  shell block of the same document runs it.  Any other Python block runs as
  a one-process job on a one-shot DVM (``pydvm run -n 1 python3 FILE``).
  A C block whose first line is a comment naming a file (``// prog.c``) is
  written the same way, for a shell block to compile; a shell block that
  needs a compiler or MPI library this machine lacks is skipped, naming it.
* Each shell block runs in a fresh ``bash``; nothing carries over from one
  block to the next but the files.  A command that fails fails the
  snippet -- unless the command's own trailing comment shows the failure
  the reader should expect: a PMIx error status (``# STATUS
  PMIX_ERR_NOT_FOUND``) or an exit status (``# exits 1``).  A failure inside
  ``$(...)`` counts too.  Status 141 does not: it is a command whose reader
  closed the pipe (``pydvm info | head -1``), as harmless as in a terminal.
* Comment lines right below a command (no blank line between) show lines it
  prints, on standard output or standard error (:func:`shown_output`);
  ``…`` or ``...`` stands for any text (a DVM id, a path), and a line that
  is only that means "and more".  Each shown line must match a whole line
  the snippet printed (:func:`unshown`).  A trailing comment on the command
  itself is prose and is not checked.
* Afterwards no DVM may be left running: one that is, is killed and the
  snippet fails.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from dvmkit import pid_alive, wait_for

REPO = Path(__file__).resolve().parents[2]
#: What a snippet may reach in its scratch directory, as in a checkout.
LINKED = ("examples", "bench")
SHELL_TAGS = frozenset({"sh", "bash", "shell"})
RUN_TAGS = SHELL_TAGS | {"python"}

_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)")
_NO_TEST = re.compile(r"^\s*<!--\s*no-test:(?P<reason>.*?)-->\s*$")
_FILE_LINE = re.compile(r"^#\s*(?P<name>[\w.-]+\.py)\b")
#: A C block that is a file names it in a comment on its first line.
_C_FILE_LINE = re.compile(r"^(?://|/\*)\s*(?P<name>[\w.-]+\.c)\b")
#: The status of a command whose output pipe was closed early (128 + SIGPIPE).
SIGPIPE_STATUS = 128 + signal.SIGPIPE
#: A trailing comment that says the command is expected to fail.
_EXPECTED_FAILURE = re.compile(r"#.*(\bPMIX_ERR_[A-Z_]+|\bexits? [1-9][0-9]*\b)")


@dataclass
class Block:
    """One fenced block of a Markdown file."""

    path: Path
    #: 1-based line of the opening fence.
    line: int
    lang: str
    text: str
    #: the reason given by a ``no-test`` marker, or None.
    no_test: str | None = None

    @property
    def filename(self) -> str | None:
        """For a Python or C block that names its file on its first line: that name."""
        pattern = {"python": _FILE_LINE, "c": _C_FILE_LINE}.get(self.lang)
        if pattern is None:
            return None
        first = self.text.lstrip("\n").splitlines()[0] if self.text.strip() else ""
        m = pattern.match(first)
        return m.group("name") if m else None

    @property
    def runnable(self) -> bool:
        """Run (a shell or Python block), or written for a shell block to use
        (a Python or C file); a C block that is not a file is text."""
        if self.no_test is not None:
            return False
        return self.lang in RUN_TAGS or (self.lang == "c" and self.filename is not None)

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}-{self.lang}"


def blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path``, with the no-test marker before it, if any."""
    out: list[Block] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, start = m.group("fence"), i
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        prev = next((ln for ln in reversed(lines[:start]) if ln.strip()), "")
        marker = _NO_TEST.match(prev)
        text = textwrap.dedent("\n".join(body)) + "\n"
        out.append(Block(path, start + 1, m.group("info").lower(), text,
                         marker.group("reason").strip() if marker else None))
        i += 1
    return out


def no_test_markers(path: Path) -> list[tuple[int, str, bool]]:
    """``(line, reason, precedes_a_block)`` of every no-test marker in ``path``."""
    lines = path.read_text().splitlines()
    out = []
    for n, ln in enumerate(lines):
        m = _NO_TEST.match(ln)
        if m:
            nxt = next((x for x in lines[n + 1:] if x.strip()), "")
            out.append((n + 1, m.group("reason").strip(), bool(_FENCE.match(nxt))))
    return out


def logical_spans(text: str) -> dict[int, tuple[int, int]]:
    """Map each line (1-based) to the first and last line of its command
    (backslash continuations joined)."""
    spans: dict[int, tuple[int, int]] = {}
    lines = text.splitlines()
    start = 0
    for n, ln in enumerate(lines):
        if not ln.rstrip().endswith("\\") or n == len(lines) - 1:
            for k in range(start, n + 1):
                spans[k + 1] = (start + 1, n + 1)
            start = n + 1
    return spans


#: A comment line that is a whole line of output: ``# TEXT``; ``…`` or ``...`` in
#: TEXT stands for any text.
_SHOWN = re.compile(r"^\s*#\s?(?P<text>.*)$")
_ANY = re.compile(r"…|\.\.\.")


def shown_output(text: str) -> list[tuple[int, str]]:
    """``(line, TEXT)`` of each output line a shell snippet shows: the comment
    lines right below a command (no blank line between), each one line the
    command prints -- on standard output or standard error, as a terminal
    shows both.  A comment line that starts a snippet or follows a blank line
    is prose, not output; so is one that is only ``...``."""
    out = []
    after_command = False
    for n, ln in enumerate(text.splitlines(), 1):
        if not ln.strip():
            after_command = False
            continue
        m = _SHOWN.match(ln)
        if not m:
            after_command = True
            continue
        if after_command and _ANY.sub("", m.group("text")).strip():
            out.append((n, m.group("text").strip()))
    return out


def output_pattern(shown: str) -> re.Pattern:
    """The regular expression an output line must match in full to be ``shown``
    (a trailing `` ...`` also matches nothing more: "2.0 ..." matches "2.0")."""
    shown = re.sub(r"\s*(…|\.\.\.)$", "…", shown)
    return re.compile(".*".join(re.escape(part) for part in _ANY.split(shown)))


def unshown(text: str, outcome: "Outcome") -> list[str]:
    """The output lines ``text`` shows that nothing printed, as problems."""
    printed = [ln.strip() for ln in (outcome.stdout + outcome.stderr).splitlines()]
    return [f"line {n}: shows output nothing printed: {shown!r}"
            for n, shown in shown_output(text)
            if not any(output_pattern(shown).fullmatch(p) for p in printed)]


@dataclass
class Outcome:
    """What running one shell text did."""

    returncode: int
    stdout: str
    stderr: str
    #: ``(line, status)`` of commands that failed and were not expected to.
    unexpected: list[tuple[int, int]]
    #: master pids of DVMs the snippet left running (they are killed).
    leftovers: list[int]

    def problems(self) -> list[str]:
        out = [f"line {line}: command failed with status {st}" for line, st in self.unexpected]
        out += [f"left a DVM running (master pid {pid}; killed)" for pid in self.leftovers]
        return out

    def report(self) -> str:
        return ("; ".join(self.problems()) or "ok") + \
            f"\n--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr}"


class Scratch:
    """A scratch directory and environment for one document's snippets."""

    PROLOGUE = "set -E -o pipefail\ntrap 'echo \"$LINENO $?\" >> \"$SNIPPET_FAILURES\"' ERR\n"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.state = root / ".pydvm-state"
        for name in LINKED:
            (root / name).symlink_to(REPO / name)
        bindir = str(Path(sys.executable).parent)
        env = dict(os.environ)
        env.pop("PYDVM_URI", None)
        env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
        env["PYDVM_STATE_DIR"] = str(self.state)
        # Open MPI between local nodes over loopback only: other tests'
        # network namespaces come and go while a snippet's ranks connect.
        env.setdefault("OMPI_MCA_btl_tcp_if_include", "lo")
        self.env = env

    def write_files(self, doc_blocks: list[Block]) -> None:
        for b in doc_blocks:
            if b.filename and b.no_test is None:
                (self.root / b.filename).write_text(b.text)

    def run_shell(self, text: str, timeout: float = 240) -> Outcome:
        """Run ``text`` in bash as a reader would paste it; see the module docstring."""
        failures = self.root / ".snippet-failures"
        failures.unlink(missing_ok=True)
        env = dict(self.env, SNIPPET_FAILURES=str(failures))
        offset = self.PROLOGUE.count("\n")
        try:
            p = subprocess.run(["bash", "-c", self.PROLOGUE + text, "snippet"], cwd=self.root,
                               env=env, capture_output=True, text=True, timeout=timeout,
                               stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            leftovers = self.kill_leftovers()
            raise AssertionError(f"snippet did not finish within {timeout}s "
                                 f"(left DVMs {leftovers}); output so far: {exc.stdout!r}")
        lines = text.splitlines()
        spans = logical_spans(text)
        unexpected = []
        for rec in failures.read_text().splitlines() if failures.exists() else ():
            lineno, status = (int(x) for x in rec.split())
            if status == SIGPIPE_STATUS:
                continue
            line = lineno - offset
            first, last = spans.get(line, (line, line))
            span = lines[max(first, 1) - 1:last] if 1 <= line <= len(lines) else []
            if any(_EXPECTED_FAILURE.search(ln) for ln in span):
                continue
            if (line, status) not in unexpected:
                unexpected.append((line, status))
        return Outcome(p.returncode, p.stdout, p.stderr, unexpected, self.kill_leftovers())

    def run_python(self, block: Block, timeout: float = 120) -> Outcome:
        """An unnamed Python block: a one-process job on a one-shot DVM."""
        path = self.root / f"snippet_{block.line}.py"
        path.write_text(block.text)
        return self.run_shell(f"pydvm run -n 1 python3 {path.name}\n", timeout)

    def kill_leftovers(self) -> list[int]:
        """Master pids of DVMs still running from our state directory, killed."""
        left = []
        for record in self.state.glob("*.json") if self.state.is_dir() else ():
            try:
                pid = json.loads(record.read_text())["pid"]
            except (OSError, ValueError, KeyError):
                continue
            if isinstance(pid, int) and pid_alive(pid):
                left.append(pid)
                os.kill(pid, signal.SIGTERM)
                try:
                    wait_for(lambda: not pid_alive(pid), timeout=15, what=f"DVM {pid} to stop")
                except AssertionError:
                    os.kill(pid, signal.SIGKILL)
        return left
