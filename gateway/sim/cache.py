"""The prompt cache of Anthropic's ``cache_control`` breakpoints: a small LRU of prefix hashes.

A breakpoint (a block carrying ``cache_control``) writes the prompt up to and including that
block. A later request reads the longest prefix it shares with one written before, if that
prefix ends at or before its own last breakpoint: the read is reported as
``cache_read_input_tokens``, what its breakpoints add beyond the read as
``cache_creation_input_tokens``. Only hashes are kept (32 bytes an entry), no tokens or text,
and there is no time-to-live: the same requests in the same order always give the same figures.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["PrefixHasher", "PromptCache"]


class PrefixHasher:
    """Hashes of every prefix of a sequence of elements (canonical bytes each), in one pass."""

    __slots__ = ("_hash", "digests")

    def __init__(self, scope: bytes) -> None:
        self._hash = hashlib.blake2b(scope, digest_size=32)
        #: ``digests[i]``: the hash of the scope and elements ``0..i``
        self.digests: list[bytes] = []

    def add(self, element: bytes) -> None:
        """Append one element; its length goes first, so element boundaries are unambiguous."""
        self._hash.update(len(element).to_bytes(8, "little"))
        self._hash.update(element)
        self.digests.append(self._hash.copy().digest())


class PromptCache:
    """Prefix hashes written by earlier requests, the least recently used dropped first.

    Thread-safe (one lock), though the simulator uses it from its one event loop.
    """

    def __init__(self, entries: int = 256) -> None:
        if entries < 0:
            raise ValueError("entries must be >= 0")
        self.entries = entries
        self._keys: OrderedDict[bytes, None] = OrderedDict()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<PromptCache {len(self._keys)}/{self.entries} prefixes>"

    def __len__(self) -> int:
        return len(self._keys)

    def longest(self, digests: list[bytes], last: int) -> int:
        """The index of the longest prefix ``digests[0..last]`` written before (-1: none);
        marks it used."""
        with self._lock:
            for i in range(last, -1, -1):
                if digests[i] in self._keys:
                    self._keys.move_to_end(digests[i])
                    return i
        return -1

    def write(self, keys: Iterable[bytes]) -> None:
        """Remember these prefixes (as most recently used), dropping the oldest beyond the cap."""
        with self._lock:
            for key in keys:
                self._keys[key] = None
                self._keys.move_to_end(key)
            while len(self._keys) > self.entries:
                self._keys.popitem(last=False)
