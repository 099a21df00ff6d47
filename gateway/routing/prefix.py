"""Which backend of a pool recently served which prompt prefixes: an approximate, bounded index.

The engines behind a pool (vLLM, SGLang) keep a prefix cache; a prompt sent to the engine that
already holds its prefix skips that part of the prefill. The gateway cannot see those caches, so
it remembers what it sent where. A prompt is read as the gateway sees it: the JSON of the
request's prompt fields (tools, instructions, system, messages, input, prompt), in that order,
cut into fixed-size chunks of ``block_bytes``; chunk ``i``'s hash covers the chunk and the hash
of chunk ``i - 1``, so equal hashes mean equal prefixes. A chat client re-sends the conversation
every turn, and turn n+1's message list encodes to turn n's bytes (less the closing bracket) plus
the new messages, so it shares all of turn n's full chunks.

The index maps a chunk hash to a bit set of the backends that were sent a prompt holding it,
least recently used first; beyond ``max_entries`` hashes the oldest go. A prompt's chunks are
recorded last chunk first, so its head is the most recent and a prefix loses its tail before its
head (as the engines evict); what a backend holds of a prompt is then a prefix of it, and the
lookup finds each backend's depth by bisection, O(backends x log chunks). Nothing tells the
index when an engine evicts, so it is a guess: a stale entry costs one request a cache miss,
never an error.
Hashes are Python's ``hash`` of ``(parent, bytes)``: fast (SipHash), 64 bits, salted per process,
never leaving it.

Cost (``loadtest/bench/prefix_cost_bench.py``): encoding, hashing, lookup and recording take a
few microseconds per 1,000 prompt tokens.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from gateway.routing.backend import BackendState

__all__ = ["PROMPT_FIELDS", "PrefixIndex", "prompt_hashes"]

#: the request fields that make up a prompt, in the order an engine's template renders them
PROMPT_FIELDS = ("tools", "instructions", "system", "messages", "input", "prompt")

_encode = msgspec.json.Encoder().encode
_ROOT = 0x9E3779B97F4A7C15  # parent hash of a prompt's first chunk


def prompt_hashes(payload: Mapping[str, Any], block_bytes: int,
                  salt: str | None = None) -> list[int]:
    """The chained hash of every full ``block_bytes`` chunk of the request's prompt fields.

    ``salt``, the tenant's prompt-cache salt, enters the first chunk's hash: the index then
    holds one tenant's prefixes apart from another's, so routing never sends a tenant to the
    backend that holds another's prompt for being that prompt (as the engine, given the same
    salt, keeps their cache blocks apart)."""
    parts = [_encode(payload[k]) for k in PROMPT_FIELDS if payload.get(k) is not None]
    data = parts[0] if len(parts) == 1 else b"".join(parts)
    out: list[int] = []
    parent = _ROOT if salt is None else hash((_ROOT, salt))
    for i in range(0, len(data) - block_bytes + 1, block_bytes):
        parent = hash((parent, data[i : i + block_bytes]))
        out.append(parent)
    return out


class PrefixIndex:
    """Chunk hash -> bit set of the pool's backends that were sent it, bounded, LRU.

    One per pool and process, touched only from the event loop. Backends are bits by their
    position in the pool (a reloaded pool starts a fresh index).
    """

    __slots__ = ("_bits", "_entries", "max_entries")

    def __init__(self, backends: Sequence[BackendState], max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        self.max_entries = max_entries
        self._bits = {id(b): 1 << i for i, b in enumerate(backends)}
        self._entries: OrderedDict[int, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"<PrefixIndex [{len(self._entries)}/{self.max_entries} chunks]>"

    def depths(self, hashes: Sequence[int]) -> dict[int, int]:
        """Backend bit -> how many leading chunks of ``hashes`` it was sent (absent: none).

        Takes what a backend holds of the prompt to be a prefix of it (see the module's
        docstring) and bisects: the deepest chunk any remaining backend holds, those backends
        get that depth, and the rest are searched above it. Reads only (the pick's
        :meth:`record` refreshes what is used).
        """
        get = self._entries.get
        out: dict[int, int] = {}
        remaining = -1  # every backend
        top = len(hashes)  # search chunks [0, top)
        while top and get(hashes[0], 0) & remaining:
            lo, hi = 0, top - 1  # chunk lo is held by one of ``remaining``; find the last one
            while lo < hi:
                mid = (lo + hi + 1) >> 1
                if get(hashes[mid], 0) & remaining:
                    lo = mid
                else:
                    hi = mid - 1
            held = get(hashes[lo], 0) & remaining
            _assign(out, held, lo + 1)
            remaining &= ~held
            top = lo
        return out

    def depth_of(self, depths: Mapping[int, int], backend: BackendState) -> int:
        """``backend``'s entry in a :meth:`depths` answer."""
        bit = self._bits.get(id(backend))
        return 0 if bit is None else depths.get(bit, 0)

    def record(self, backend: BackendState, hashes: Sequence[int]) -> None:
        """``backend`` was sent a prompt with these chunks: mark them most recently used, the
        first chunk last (the most recent of all)."""
        bit = self._bits.get(id(backend))
        if bit is None:
            return
        entries = self._entries
        pop = entries.pop
        for h in reversed(hashes):
            entries[h] = pop(h, 0) | bit
        excess = len(entries) - self.max_entries
        for _ in range(excess):
            entries.popitem(last=False)


def _assign(out: dict[int, int], bits: int, depth: int) -> None:
    """Give every backend bit set in ``bits`` the depth ``depth``."""
    while bits:
        low = bits & -bits
        out[low] = depth
        bits ^= low
