"""PMI-1's wire: the lines a process and its process manager exchange.

A request is one line, ``cmd=NAME key=value key=value\\n``; a value ends at
the first unescaped space (newer MPICH escapes a space or a backslash in a
value with a backslash, older releases never send either).  Spawn is the
one exception, a block of lines ``mcmd=spawn\\n`` ... ``endcmd\\n``, one
``key=value`` a line, the value running to the end of its line.  A reply
is a line of the same form, ``rc=0`` for success, a non-zero ``rc`` with a
``msg`` for failure.

:class:`Reader` turns the bytes of one connection into :class:`Command`
objects; :func:`encode` makes a reply line.  Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: The longest request line (or spawn block) taken; a longer one is a
#: protocol error.  MPICH's own limit is 1,024 bytes a line (PMIU_MAXLINE);
#: a spawn block with many arguments is longer.
MAX_LINE = 64 * 1024

#: What this server tells a client in ``maxes``: the limits MPICH's own
#: launcher gives (a value longer than ``VALLEN_MAX`` is refused).
KVSNAME_MAX = 256
KEYLEN_MAX = 64
VALLEN_MAX = 1024


class ProtocolError(ValueError):
    """Bytes that are not PMI-1: the connection is closed, its reason logged."""


@dataclass
class Command:
    """One request: ``name`` (the value of ``cmd=`` or ``mcmd=``) and its
    fields in order (``pairs``; a key may repeat in a spawn block)."""

    name: str
    pairs: list[tuple[str, str]] = field(default_factory=list)
    #: a ``mcmd=`` block (spawn) rather than a ``cmd=`` line.
    multi: bool = False

    def get(self, key: str, default: str | None = None) -> str | None:
        """The last value given for ``key``."""
        for k, v in reversed(self.pairs):
            if k == key:
                return v
        return default

    def int(self, key: str, default: int | None = None) -> int:
        """``key``'s value as an integer; ProtocolError if it is missing or not one."""
        v = self.get(key)
        if v is None:
            if default is not None:
                return default
            raise ProtocolError(f"{self.name}: no {key}")
        try:
            return int(v)
        except ValueError:
            raise ProtocolError(f"{self.name}: {key}={v!r} is not an integer") from None


def _key_ok(k: str) -> bool:
    return bool(k) and all(c.isalnum() or c in "_-/" for c in k)


def unescape(v: str) -> str:
    if "\\" not in v:
        return v
    out = []
    i = 0
    while i < len(v):
        c = v[i]
        if c == "\\" and i + 1 < len(v):
            out.append(v[i + 1])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def escape(v: str) -> str:
    """A value as it may stand in a reply line (space and backslash escaped)."""
    if " " not in v and "\\" not in v:
        return v
    return v.replace("\\", "\\\\").replace(" ", "\\ ")


def parse_line(line: str) -> Command:
    """One ``cmd=`` line (without its newline) as a :class:`Command`."""
    if not line.startswith("cmd="):
        raise ProtocolError(f"expected cmd=..., got {line[:40]!r}")
    pairs: list[tuple[str, str]] = []
    name = ""
    i, n = 0, len(line)
    while i < n:
        while i < n and line[i] == " ":
            i += 1
        if i >= n:
            break
        j = i
        while j < n and line[j] not in "= ":
            j += 1
        key = line[i:j]
        if not _key_ok(key):
            raise ProtocolError(f"bad key {key!r}")
        value = ""
        if j < n and line[j] == "=":
            k = j + 1
            while k < n and line[k] != " ":
                k += 2 if line[k] == "\\" and k + 1 < n else 1
            value = unescape(line[j + 1:k])
            j = k
        if key == "cmd":
            name = value
        else:
            pairs.append((key, value))
        i = j
    if not name:
        raise ProtocolError("empty cmd=")
    return Command(name, pairs)


def parse_block(lines: list[str]) -> Command:
    """A ``mcmd=`` block (its lines, ``endcmd`` excluded) as a :class:`Command`."""
    first = lines[0]
    name = first[len("mcmd="):].strip()
    if not name:
        raise ProtocolError("empty mcmd=")
    pairs = []
    for ln in lines[1:]:
        if not ln.strip():
            continue
        key, sep, value = ln.partition("=")
        if not sep or not _key_ok(key):
            raise ProtocolError(f"bad line in {name} block: {ln[:40]!r}")
        pairs.append((key, value))
    return Command(name, pairs, multi=True)


class Reader:
    """The commands in a connection's bytes, as they arrive (:meth:`feed`).

    Invariant: ``_buf`` never holds a complete line that is not part of an
    unfinished ``mcmd`` block, and never more than :data:`MAX_LINE` bytes."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._block: list[str] | None = None
        self._block_size = 0

    def feed(self, data: bytes) -> list[Command]:
        """The commands ``data`` completes; ProtocolError for what is not PMI-1."""
        self._buf += data
        out: list[Command] = []
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                if len(self._buf) > MAX_LINE:
                    raise ProtocolError(f"a line longer than {MAX_LINE} bytes")
                return out
            raw = bytes(self._buf[:nl])
            del self._buf[:nl + 1]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                line = raw.decode("latin-1")
            line = line.rstrip("\r")
            if self._block is not None:
                self._block_size += len(raw) + 1
                if self._block_size > MAX_LINE:
                    raise ProtocolError(f"a spawn block longer than {MAX_LINE} bytes")
                if line.strip() == "endcmd":
                    block, self._block = self._block, None
                    out.append(parse_block(block))
                else:
                    self._block.append(line)
                continue
            if not line.strip():
                continue
            if line.startswith("mcmd="):
                self._block = [line]
                self._block_size = len(raw) + 1
                continue
            out.append(parse_line(line))


def encode(name: str, **fields) -> bytes:
    """A reply line: ``cmd=NAME`` then each field (in order; values escaped)."""
    parts = [f"cmd={name}"]
    for k, v in fields.items():
        parts.append(f"{k}={escape(str(v))}")
    return (" ".join(parts) + "\n").encode()
