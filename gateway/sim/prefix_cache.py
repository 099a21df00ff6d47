"""Automatic prefix caching as vLLM does it: chained block hashes over a prompt's token ids.

The prompt's tokens are cut into full blocks of ``block_tokens``; block ``i``'s hash covers its
own tokens and the hash of block ``i - 1``, so a block hash names the whole prefix up to it and
two prompts share a cached block only if they share everything before it. A partial last block
is never cached.

The engine's KV pool holds the cached blocks. A cached block is either *in use* (held by one or
more running requests, reference counted) or *evictable* (no running request holds it: it sits
in the free part of the pool and keeps its contents until the space is needed). When an
admission needs more free blocks than the uncached free space, evictable blocks go least
recently used first, as vLLM's free-block queue does. This class keeps only hashes and counts;
the engine (``engine.py``) keeps the block arithmetic of its pool and calls it at admission,
after each prefill chunk and at release.

Hashes are Python's ``hash`` of ``(parent, tokens)`` tuples: deterministic for ints, 64 bits,
never leaving the process.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

__all__ = ["PrefixCache", "block_hashes"]

_ROOT = 0x5EED  # parent hash of a prompt's first block


def block_hashes(token_ids: Sequence[int], block_tokens: int,
                 salt: str | None = None) -> list[int]:
    """The chained hash of every full block of ``token_ids``, in prompt order. A ``salt``
    (the request's ``cache_salt``) enters the first block's hash, as vLLM's does, so a salted
    prompt shares no block with the same prompt under another salt or none."""
    out: list[int] = []
    parent = _ROOT if salt is None else hash((_ROOT, salt))
    end = len(token_ids) - len(token_ids) % block_tokens
    for i in range(0, end, block_tokens):
        parent = hash((parent, tuple(token_ids[i : i + block_tokens])))
        out.append(parent)
    return out


class PrefixCache:
    """Which prefix blocks the KV pool holds: in use (reference counted) or evictable (LRU).

    Single-threaded: the engine's step loop and its ``submit`` run on one event loop. The
    counters are in tokens, as vLLM's ``prefix_cache_queries`` / ``prefix_cache_hits`` are.
    """

    __slots__ = ("_evictable", "_in_use", "block_tokens", "evictions", "hits", "queries")

    def __init__(self, block_tokens: int) -> None:
        if block_tokens < 1:
            raise ValueError("block_tokens must be >= 1")
        self.block_tokens = block_tokens
        self._in_use: dict[int, int] = {}  # hash -> running requests holding the block
        self._evictable: OrderedDict[int, None] = OrderedDict()  # least recently used first
        #: prompt tokens looked up, and those found cached (vLLM's two counters)
        self.queries = 0
        self.hits = 0
        #: cached blocks dropped to make room
        self.evictions = 0

    def __repr__(self) -> str:
        return (
            f"<PrefixCache [in use: {len(self._in_use)} | evictable: {len(self._evictable)}"
            f" | hits {self.hits}/{self.queries} tokens]>"
        )

    @property
    def evictable(self) -> int:
        """Cached blocks no running request holds (they occupy free KV space)."""
        return len(self._evictable)

    @property
    def cached_blocks(self) -> int:
        """Every block whose hash the pool holds, in use or evictable."""
        return len(self._in_use) + len(self._evictable)

    def match(self, hashes: Sequence[int], prompt_tokens: int) -> tuple[int, int]:
        """(blocks of the longest cached prefix, how many of them are evictable now).

        At most ``(prompt_tokens - 1) // block_tokens`` blocks: a prompt whose every token is
        cached still computes its last one, so the hit stops at the block boundary before it
        (vLLM's rule). Changes nothing.
        """
        limit = min(len(hashes), max(prompt_tokens - 1, 0) // self.block_tokens)
        in_use, evictable = self._in_use, self._evictable
        n = free = 0
        while n < limit:
            h = hashes[n]
            if h in in_use:
                pass
            elif h in evictable:
                free += 1
            else:
                break
            n += 1
        return n, free

    def count_query(self, prompt_tokens: int, hit_blocks: int) -> None:
        """Count one admission's lookup, in tokens."""
        self.queries += prompt_tokens
        self.hits += hit_blocks * self.block_tokens

    def acquire(self, hashes: Iterable[int]) -> None:
        """A running request now holds these cached blocks (they leave the evictable set)."""
        in_use, evictable = self._in_use, self._evictable
        for h in hashes:
            if h in in_use:
                in_use[h] += 1
            else:
                del evictable[h]
                in_use[h] = 1

    def register(self, h: int) -> bool:
        """A running request filled a block with this hash: cache it, held by that request.

        False when the hash is already cached (another request computed the same block at the
        same time); the caller then keeps its copy as a private block, as vLLM does.
        """
        if h in self._in_use or h in self._evictable:
            return False
        self._in_use[h] = 1
        return True

    def release(self, hashes: Sequence[int]) -> int:
        """A request holding these blocks (in prompt order) ended; returns how many are now
        held by nobody.

        Those become evictable as the most recently used, the prompt's last block first (vLLM
        frees a request's blocks in reverse), so under pressure a prefix loses its tail before
        its head.
        """
        freed = 0
        in_use, evictable = self._in_use, self._evictable
        for h in reversed(hashes):
            refs = in_use[h] - 1
            if refs:
                in_use[h] = refs
            else:
                del in_use[h]
                evictable[h] = None
                freed += 1
        return freed

    def evict_to(self, free_blocks: int) -> None:
        """Drop least recently used evictable blocks until they fit in ``free_blocks``."""
        evictable = self._evictable
        while len(evictable) > free_blocks:
            evictable.popitem(last=False)
            self.evictions += 1
