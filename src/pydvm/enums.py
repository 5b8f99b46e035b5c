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
    """No restriction (as SESSION)."""
    RM = 1
    """Only the DVM itself (a tool of the host)."""
    LOCAL = 2
    """Processes behind the same daemon (node); served by that node's store."""
    NAMESPACE = 3
    """Processes of the same job."""
    SESSION = 4
    """Every process (the default)."""
    GLOBAL = 5
    """Every process (as SESSION)."""
    CUSTOM = 6
    """Publish: only those the accessor lists admit.  Lookup: refused."""
    PROC_LOCAL = 7
    """Only the publishing process itself."""

    @property
    def word(self) -> str:
        """The command-line word (``proc-local`` for PROC_LOCAL)."""
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
    """No lifetime: until unpublished, evicted or idle too long."""
    FIRST_READ = 1
    """Until the first lookup that returns it (key by key), or idle too long."""
    PROC = 2
    """Until the publishing process ends."""
    APP = 3
    """Until the publisher's application has ended on every node."""
    SESSION = 4
    """Until the publisher's session is ended."""
    NSPACE = 5
    """Until the publisher's job ends (the default)."""
    INVALID = 255
    """Not given: NSPACE on a publish; a purge horizon meaning "everything"."""

    @property
    def word(self) -> str:
        """The command-line word (``first-read`` for FIRST_READ)."""
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
