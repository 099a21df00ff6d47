"""The count cache stays within its capacity and keeps what is in use."""

from __future__ import annotations

import pytest

from gateway.accounting.cache import CountCache


def test_bounded() -> None:
    """However many keys go in, at most ``capacity`` are held."""
    cache: CountCache[int] = CountCache(100)
    for key in range(10_000):
        cache.put(key, key)
        assert len(cache) <= 100


def test_recently_used_survive() -> None:
    """A key read every round survives while a stream of new keys passes through."""
    cache: CountCache[int] = CountCache(10)
    cache.put(-1, 7)
    for key in range(1000):
        cache.put(key, key)
        assert cache.get(-1) == 7


def test_hits_and_misses_counted() -> None:
    cache: CountCache[int] = CountCache(4)
    assert cache.get(1) is None
    cache.put(1, 5)
    assert cache.get(1) == 5
    assert (cache.hits, cache.misses) == (1, 1)
    assert repr(cache) == "<CountCache [1 of 4 entries | 1 hits, 1 misses]>"


def test_rejects_tiny_capacity() -> None:
    with pytest.raises(ValueError):
        CountCache(1)
