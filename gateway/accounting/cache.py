"""A bounded cache of per-message token counts, so history is tokenised once, not every turn.

A chat client re-sends the whole conversation on every call; without a cache the gateway would
tokenise turn 1 fifty times by turn 50. Counts are keyed by a 64-bit hash of the message (see
``messages.message_key``), so the cache holds integers only, never message text.

Eviction is the two-generation scheme (a cheap approximation of LRU): entries go into a young
dict; when it is full it becomes the old dict and the previous old dict is dropped; a hit in the
old dict moves the entry back to the young one. Every operation is one or two plain dict
operations, and at most ``capacity`` entries are held. Not thread-safe: one per event loop.
"""

from __future__ import annotations

from typing import Generic, TypeVar

__all__ = ["CountCache"]

V = TypeVar("V")


class CountCache(Generic[V]):
    """Bounded key -> value map, approximately least-recently used (per process, per encoding)."""

    __slots__ = ("_half", "_old", "_young", "hits", "misses")

    def __init__(self, capacity: int = 100_000) -> None:
        if capacity < 2:
            raise ValueError(f"capacity must be at least 2, got {capacity}")
        self._half = capacity // 2
        self._young: dict[int, V] = {}
        self._old: dict[int, V] = {}
        self.hits = 0
        self.misses = 0

    def get(self, key: int) -> V | None:
        """The cached value, or None; a hit keeps the entry alive for another generation."""
        value = self._young.get(key)
        if value is None:
            value = self._old.pop(key, None)
            if value is None:
                self.misses += 1
                return None
            self._insert(key, value)
        self.hits += 1
        return value

    def put(self, key: int, value: V) -> None:
        """Remember a value; may drop the oldest generation to stay within capacity."""
        self._insert(key, value)

    def _insert(self, key: int, value: V) -> None:
        young = self._young
        if len(young) >= self._half and key not in young:
            self._old = young
            self._young = young = {}
        young[key] = value

    def __len__(self) -> int:
        return len(self._young) + len(self._old)

    def __repr__(self) -> str:
        return (
            f"<CountCache [{len(self)} of {2 * self._half} entries | "
            f"{self.hits} hits, {self.misses} misses]>"
        )
