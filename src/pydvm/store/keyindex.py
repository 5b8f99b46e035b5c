"""The store's keys in sorted order, for questions asked by prefix.

``DataStore.keys`` counts and lists the keys under a prefix (a torch store's
``getNumKeys``, ``pydvm store --prefix``) without walking the whole store:
:class:`KeyIndex` keeps every key held by at least one live item in sorted
order, so the keys under a prefix are one contiguous run, found by bisection.

It is a list of sorted chunks, each at most ``2 * LOAD`` keys long, with
the last key of each chunk kept in ``_maxes``: adding or removing a key
costs a bisection over the chunks, one inside a chunk, and moving at most
``2 * LOAD`` references (a plain sorted list would move up to all of them),
and the keys under a prefix cost ``O(log n + matches)``.  A chunk that
grows past ``2 * LOAD`` is split in halves; one that shrinks below
``LOAD // 2`` is merged into a neighbour when the two fit in one, so the
number of chunks stays about ``n / LOAD`` however keys come and go.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from typing import Iterator

#: Target chunk length: chunks hold between LOAD // 2 (but the last, or a
#: lone one) and 2 * LOAD keys.
LOAD = 256


class KeyIndex:
    """Sorted, duplicate-free set of keys (str), queried by prefix."""

    __slots__ = ("_chunks", "_maxes", "_len")

    def __init__(self) -> None:
        self._chunks: list[list[str]] = []
        self._maxes: list[str] = []
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __contains__(self, key: str) -> bool:
        i = bisect_left(self._maxes, key)
        if i == len(self._maxes):
            return False
        chunk = self._chunks[i]
        j = bisect_left(chunk, key)
        return j < len(chunk) and chunk[j] == key

    def add(self, key: str) -> None:
        """Add ``key``, which must not be present (the store adds a key
        when its first holder arrives)."""
        maxes = self._maxes
        if not maxes:
            self._chunks.append([key])
            maxes.append(key)
            self._len = 1
            return
        i = bisect_left(maxes, key)
        if i == len(maxes):
            i -= 1  # beyond every key: the last chunk
        chunk = self._chunks[i]
        insort(chunk, key)
        maxes[i] = chunk[-1]
        self._len += 1
        if len(chunk) > 2 * LOAD:
            half = chunk[LOAD:]
            del chunk[LOAD:]
            self._chunks.insert(i + 1, half)
            maxes[i] = chunk[-1]
            maxes.insert(i + 1, half[-1])

    def discard(self, key: str) -> None:
        """Remove ``key``, which must be present (the store removes a key
        when its last holder leaves)."""
        maxes = self._maxes
        i = bisect_left(maxes, key)
        chunk = self._chunks[i]
        j = bisect_left(chunk, key)
        assert chunk[j] == key, f"{key!r} is not in the key index"
        del chunk[j]
        self._len -= 1
        if not chunk:
            del self._chunks[i]
            del maxes[i]
            return
        maxes[i] = chunk[-1]
        if len(chunk) < LOAD // 2 and len(self._chunks) > 1:
            k = i + 1 if i + 1 < len(self._chunks) else i - 1
            lo, hi = min(i, k), max(i, k)
            if len(self._chunks[lo]) + len(self._chunks[hi]) <= 2 * LOAD:
                self._chunks[lo].extend(self._chunks[hi])
                del self._chunks[hi]
                del maxes[hi]
                maxes[lo] = self._chunks[lo][-1]

    def prefixed(self, prefix: str) -> Iterator[str]:
        """The keys starting with ``prefix``, in sorted order.  The index
        must not change while the iterator is in use."""
        maxes = self._maxes
        i = bisect_left(maxes, prefix)
        if i == len(maxes):
            return
        chunks = self._chunks
        j = bisect_left(chunks[i], prefix)
        while i < len(chunks):
            chunk = chunks[i]
            while j < len(chunk):
                key = chunk[j]
                if not key.startswith(prefix):
                    return
                yield key
                j += 1
            i += 1
            j = 0

    def __iter__(self) -> Iterator[str]:
        for chunk in self._chunks:
            yield from chunk

    def check_invariants(self) -> None:
        """Assert order, uniqueness, the chunk bounds and the bookkeeping."""
        assert len(self._chunks) == len(self._maxes)
        flat: list[str] = []
        for chunk, top in zip(self._chunks, self._maxes):
            assert chunk, "empty chunk in the key index"
            assert len(chunk) <= 2 * LOAD, f"chunk of {len(chunk)} keys"
            assert chunk[-1] == top, "a chunk's recorded last key is stale"
            flat.extend(chunk)
        assert all(a < b for a, b in zip(flat, flat[1:])), "key index not strictly sorted"
        assert len(flat) == self._len, "key index length is off"
