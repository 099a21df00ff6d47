"""Backend choice: least outstanding per unit of weight, never a full backend."""

from __future__ import annotations

import random

from gateway.config import Backend, Pool
from gateway.routing.pool import PoolState, pick_backend


def _pool(*specs: tuple[float, int]) -> PoolState:
    return PoolState(
        Pool(
            name="p",
            backends=[
                Backend(url=f"http://b{i}", weight=w, max_in_flight=m)
                for i, (w, m) in enumerate(specs)
            ],
        )
    )


def test_never_picks_a_full_backend() -> None:
    pool = _pool((1, 1), (1, 1))
    pool.backends[0].in_flight = 1
    assert all(pick_backend(pool.backends) is pool.backends[1] for _ in range(50))
    pool.backends[1].in_flight = 1
    assert pick_backend(pool.backends) is None


def test_load_follows_weights() -> None:
    """Holding requests open, a 3:1 weighted pair carries about 3:1 of them."""
    pool = _pool((3, 10_000), (1, 10_000))
    rng = random.Random(1)
    for _ in range(4000):
        pick_backend(pool.backends, rng).acquire()  # type: ignore[union-attr]
    a, b = (x.in_flight for x in pool.backends)
    assert 2.8 < a / b < 3.2


def test_prefers_less_loaded() -> None:
    pool = _pool((1, 100), (1, 100))
    pool.backends[0].in_flight = 50
    assert pick_backend(pool.backends, random.Random(0)) is pool.backends[1]


def test_labels_hide_urls() -> None:
    pool = _pool((1, 1))
    assert pool.backends[0].label == "p#0"
    assert "in flight: 0/1" in repr(pool.backends[0])
