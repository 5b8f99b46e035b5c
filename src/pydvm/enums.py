"""Ranges and persistences, with their PMIx numbers and command-line words.

These numbers travel on the wire and must never be compared as if they were
ordered by scope or lifetime: ``Persistence.INDEF`` is 0 and outlives
everything, ``Persistence.NSPACE`` is 5 and ends before ``SESSION`` (4).
Every rule that depends on them is a literal table (see
:mod:`pydvm.store.rules`).
"""

from __future__ import annotations

import enum


class Range(enum.IntEnum):
    """Who may see a published item / whom a lookup searches (SPEC 4)."""

    UNDEF = 0
    RM = 1
    LOCAL = 2
    NAMESPACE = 3
    SESSION = 4
    GLOBAL = 5
    CUSTOM = 6
    PROC_LOCAL = 7

    @property
    def word(self) -> str:
        return self.name.lower().replace("_", "-")

    @classmethod
    def from_word(cls, word: str) -> "Range":
        """Parse a command-line word (``session``, ``proc-local``, ...)."""
        try:
            return _RANGE_WORDS[word.lower()]
        except KeyError:
            raise ValueError(
                f"unknown range {word!r}; expected one of {', '.join(_RANGE_WORDS)}"
            ) from None


class Persistence(enum.IntEnum):
    """How long a published item lives (SPEC 5).

    ``INVALID`` on a publish means "not given" and reads as ``NSPACE``.  As a
    purge horizon it means "everything the target published" (the explicit
    ``unpublish()`` of a process).
    """

    INDEF = 0
    FIRST_READ = 1
    PROC = 2
    APP = 3
    SESSION = 4
    NSPACE = 5
    INVALID = 255

    @property
    def word(self) -> str:
        return self.name.lower().replace("_", "-")

    @classmethod
    def from_word(cls, word: str) -> "Persistence":
        """Parse a command-line word (``indef``, ``first-read``, ...)."""
        try:
            return _PERSIST_WORDS[word.lower()]
        except KeyError:
            raise ValueError(
                f"unknown persistence {word!r}; expected one of {', '.join(_PERSIST_WORDS)}"
            ) from None


_RANGE_WORDS = {r.word: r for r in Range}
_PERSIST_WORDS = {p.word: p for p in Persistence if p is not Persistence.INVALID}
