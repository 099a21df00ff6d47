"""Backend choice: least outstanding per unit of weight, latency-penalised, never a full one."""

from __future__ import annotations

import random

from gateway.config import Affinity, Backend, Pool
from gateway.routing.pick import PREFILL_BOUND, cost, pick_affine, pick_least_loaded
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


def test_prefill_aware_takes_the_backend_with_no_prefill_pending() -> None:
    """Equal load, one backend with a streamed request still awaiting its first chunk: the
    prefill-aware pick always takes the other; the plain pick ties and goes either way."""
    pool = _pool((1, 100), (1, 100))
    busy, idle = pool.backends
    busy.in_flight = idle.in_flight = 4
    busy.prefilling = 1
    assert all(pick_least_loaded(pool.backends, random.Random(i), prefill_aware=True) is idle
               for i in range(50))
    assert {pick_least_loaded(pool.backends, random.Random(i)) for i in range(50)} == {busy, idle}


def test_prefill_aware_tie_goes_to_the_older_pending_prefills() -> None:
    """As many prefills pending on both (equal load): the backend whose pending requests were
    sent earlier wins (they are nearer their first chunk), through the counters the forwarder
    keeps; once they end, neither is preferred."""
    pool = _pool((1, 100), (1, 100))
    old, new = pool.backends
    old.in_flight = new.in_flight = 4
    old.prefill_started(100.0)
    old.prefill_started(100.2)
    new.prefill_started(100.1)
    new.prefill_started(100.3)
    assert (old.prefilling, new.prefilling) == (2, 2)
    assert all(pick_least_loaded(pool.backends, random.Random(i), prefill_aware=True) is old
               for i in range(50))
    old.prefill_ended(100.0)
    new.prefill_ended(100.3)  # 100.2 against 100.1: the other is older now
    assert all(pick_least_loaded(pool.backends, random.Random(i), prefill_aware=True) is new
               for i in range(50))
    old.prefill_ended(100.2)
    new.prefill_ended(100.1)
    assert (old.prefilling, new.prefilling, old.prefill_since, new.prefill_since) == (0, 0, 0, 0)
    assert {pick_least_loaded(pool.backends, random.Random(i), prefill_aware=True)
            for i in range(50)} == {old, new}


def test_prefill_aware_only_within_the_load_bound() -> None:
    """Fewer prefills win only while their backend's load is at most PREFILL_BOUND x the
    other's; beyond it the cost decides, and a nearly full KV cache is never preferred."""
    pool = _pool((1, 100), (1, 100))
    busy, idle = pool.backends
    busy.prefilling = 1
    busy.in_flight, idle.in_flight = 4, 5  # loads 5 and 6: within 1.25x
    assert all(pick_least_loaded(pool.backends, random.Random(i), prefill_aware=True) is idle
               for i in range(20))
    idle.in_flight = 6  # 7 > 1.25 x 5
    assert PREFILL_BOUND < 7 / 5
    assert all(pick_least_loaded(pool.backends, random.Random(i), prefill_aware=True) is busy
               for i in range(20))
    idle.in_flight = 4
    idle.engine_kv_usage = 0.97
    assert all(pick_least_loaded(pool.backends, random.Random(i), prefill_aware=True) is busy
               for i in range(20))


def test_pool_picks_are_prefill_aware_by_default_also_on_the_headroom() -> None:
    """Through the pool: a free slot and a ``fair_headroom`` slot both go to the backend
    with no prefill pending; with ``prefill_aware: false`` either backend gets them."""
    for aware in (True, False):
        pool = _pool((1, 2), (1, 2), prefill_aware=aware)
        busy, idle = pool.backends
        busy.prefilling = 1
        for spare in (False, True):
            busy.in_flight = idle.in_flight = 2 if spare else 1
            seen = set()
            for _ in range(40):
                picked = pool.try_pick(0.0, tenant="b", spare=spare)
                assert picked is not None
                seen.add(picked)
                pool.release(picked, "b")
            assert seen == ({idle} if aware else {busy, idle}), (aware, spare)
