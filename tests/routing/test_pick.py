"""Backend choice: least outstanding per unit of weight, latency-penalised, never a full one."""

from __future__ import annotations

import random

from gateway.config import Affinity, Backend, Pool
from gateway.routing.pick import cost, pick_affine, pick_least_loaded
from gateway.routing.pool import PoolState


def _pool(*specs: tuple[float, int], **kw: object) -> PoolState:
    return PoolState(Pool(name="p", backends=[
        Backend(url=f"http://b{i}", weight=w, max_in_flight=m) for i, (w, m) in enumerate(specs)
    ], **kw))  # type: ignore[arg-type]


def test_never_picks_a_full_backend() -> None:
    pool = _pool((1, 1), (1, 1))
    assert pool.try_pick(0.0) is not None
    assert pool.try_pick(0.0) is not None
    assert pool.try_pick(0.0) is None
    assert all(b.in_flight == 1 for b in pool.backends)


def test_load_follows_weights() -> None:
    """Holding requests open, a 3:1 weighted pair carries about 3:1 of them."""
    pool = _pool((3, 10_000), (1, 10_000))
    for _ in range(4000):
        assert pool.try_pick(0.0) is not None
    a, b = (x.in_flight for x in pool.backends)
    assert 2.8 < a / b < 3.2


def test_prefers_less_loaded() -> None:
    pool = _pool((1, 100), (1, 100))
    pool.backends[0].in_flight = 50
    assert pick_least_loaded(pool.backends, random.Random(0)) is pool.backends[1]


def test_slow_backend_is_penalised() -> None:
    """Equal load: the backend with 4x the TTFT costs 2x and loses the comparison."""
    pool = _pool((1, 100), (1, 100))
    fast, slow = pool.backends
    fast.observe(0.05, 0.01)
    slow.observe(0.2, 0.01)
    assert cost(slow, 0.05, 0.01) == 2 * cost(fast, 0.05, 0.01)
    assert all(pick_least_loaded(pool.backends) is fast for _ in range(20))


def test_engine_signals_count_as_load() -> None:
    pool = _pool((1, 100), (1, 100))
    pool.backends[0].engine_waiting = 30
    assert all(pick_least_loaded(pool.backends) is pool.backends[1] for _ in range(20))


def test_affinity_sticks_within_bound() -> None:
    """The same conversation key lands on the same backend until it is overloaded."""
    pool = _pool((1, 100), (1, 100), (1, 100), affinity=Affinity(bounded_load=1.5))
    first = pick_affine(pool.backends, b"conv-1", 1.5)
    assert first is not None
    assert all(pick_affine(pool.backends, b"conv-1", 1.5) is first for _ in range(10))
    first.in_flight = 10  # far above the mean: the next in its order takes it
    other = pick_affine(pool.backends, b"conv-1", 1.5)
    assert other is not None and other is not first
    first.in_flight = 0
    keys = {pick_affine(pool.backends, f"c{i}".encode(), 1.5) for i in range(50)}
    assert len(keys) == 3  # different conversations spread over the pool


def test_labels_hide_urls() -> None:
    pool = _pool((1, 1))
    assert pool.backends[0].label == "p#0"
    assert "in flight: 0/1" in repr(pool.backends[0])
