"""Fair queuing in a real pool queue: tenants' token shares, a tenant alone, class priority
and start deadlines, with ``fair: false`` beside it to show what the order would be without."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from gateway.config import Backend, Pool
from gateway.routing.backend import BackendState
from gateway.routing.errors import PoolSaturated
from gateway.routing.pool import PoolState


def _pool(n: int = 1, max_in_flight: int = 1, **kw: object) -> PoolState:
    return PoolState(Pool(name="p", backends=[
        Backend(url=f"http://b{i}", max_in_flight=max_in_flight) for i in range(n)
    ], **kw))  # type: ignore[arg-type]


async def _hold_all(pool: PoolState) -> list[BackendState]:
    capacity = pool.capacity(time.monotonic())
    return [await pool.acquire(0, time.monotonic() + 5) for _ in range(capacity)]


async def _backlogged_run(pool: PoolState, weights: dict[str, float], dispatches: int,
                          seed: int) -> dict[str, int]:
    """Every tenant keeps 8 requests waiting (each re-queues once served); one slot is freed
    at a time, ``dispatches`` times. Returns the tokens dispatched per tenant."""
    rng = random.Random(seed)
    held = await _hold_all(pool)
    served = dict.fromkeys(weights, 0)

    async def client(tenant: str) -> None:
        while True:
            tokens = rng.randint(50, 1500)
            # a far deadline: the completion-rate estimate starts low, and refusals would
            # take clients out of the run
            backend = await pool.acquire(0, time.monotonic() + 3600, tenant=tenant,
                                         weight=weights[tenant], tokens=tokens)
            served[tenant] += tokens
            held.append(backend)

    tasks = [asyncio.create_task(client(t)) for t in weights for _ in range(8)]
    await asyncio.sleep(0.01)
    assert pool.queued == 8 * len(weights)
    for _ in range(dispatches):
        while not held:
            await asyncio.sleep(0)
        pool.release(held.pop(0))
        await asyncio.sleep(0)
    assert not any(task.done() for task in tasks)  # every client stayed backlogged
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return served


def _shares(served: dict[str, int]) -> dict[str, float]:
    total = sum(served.values())
    return {t: n / total for t, n in served.items()}


@pytest.mark.parametrize("weights", [
    pytest.param({"a": 1.0, "b": 1.0}, id="equal"),
    pytest.param({"a": 1.0, "b": 3.0}, id="one-to-three"),
    pytest.param({"a": 2.0, "b": 1.0, "c": 1.0}, id="three-tenants"),
])
async def test_backlogged_tenants_get_their_weight_share(weights: dict[str, float]) -> None:
    """Over 3,000 dispatches with seeded random sizes, each backlogged tenant is dispatched
    tokens within 10% of its weight's share of the pool."""
    served = await _backlogged_run(_pool(n=2, max_in_flight=2), weights, 3000, seed=7)
    total_weight = sum(weights.values())
    for tenant, share in _shares(served).items():
        want = weights[tenant] / total_weight
        assert abs(share - want) <= 0.1 * want, served


async def test_without_fair_queuing_weights_mean_nothing() -> None:
    """The same run with ``fair: false``: the queue is FIFO, so B's weight of 3 buys it no
    more than A's half (what the test above would catch if fair queuing broke)."""
    served = await _backlogged_run(_pool(n=2, max_in_flight=2, fair=False),
                                   {"a": 1.0, "b": 3.0}, 3000, seed=7)
    assert abs(_shares(served)["b"] - 0.75) > 0.075, served


async def test_tenant_alone_gets_the_whole_pool() -> None:
    """A tenant of tiny weight alone in the queue takes every slot that frees up."""
    pool = _pool(n=3, max_in_flight=2)
    held = await _hold_all(pool)
    waiters = [asyncio.create_task(pool.acquire(0, time.monotonic() + 5, tenant="a",
                                                weight=0.01, tokens=100_000))
               for _ in range(6)]
    await asyncio.sleep(0.01)
    for backend in held:
        pool.release(backend)
    got = await asyncio.gather(*waiters)
    assert pool.in_flight == pool.capacity(time.monotonic()) == 6
    assert sorted(b.label for b in got) == sorted(b.label for b in held)
    assert pool.queued == 0


async def test_flooding_tenant_does_not_take_the_queue() -> None:
    """A queued 50 requests first; B's one request, queued last, is served second - with
    ``fair: false`` it is served last."""
    for fair, position in ((True, 1), (False, 50)):
        pool = _pool(fair=fair)
        held = await _hold_all(pool)
        order: list[str] = []

        async def wait(tenant: str, pool: PoolState = pool, order: list[str] = order) -> None:
            backend = await pool.acquire(0, time.monotonic() + 30, tenant=tenant, tokens=500)
            order.append(tenant)
            pool.release(backend)

        tasks = [asyncio.create_task(wait("a")) for _ in range(50)]
        await asyncio.sleep(0.01)
        tasks.append(asyncio.create_task(wait("b")))
        await asyncio.sleep(0.01)
        pool.release(held[0])
        await asyncio.gather(*tasks)
        assert order.index("b") == position, (fair, order)


async def test_class_priority_wins_over_shares() -> None:
    """A batch tenant of weight 100 with tiny requests still waits behind an interactive
    tenant of weight 0.01 with a huge one."""
    pool = _pool()
    held = await _hold_all(pool)
    order: list[str] = []

    async def wait(name: str, priority: int, weight: float, tokens: int) -> None:
        backend = await pool.acquire(priority, time.monotonic() + 5, tenant=name,
                                     weight=weight, tokens=tokens)
        order.append(name)
        await asyncio.sleep(0.005)
        pool.release(backend)

    tasks = [asyncio.create_task(wait("batch", 10, 100.0, 1)) for _ in range(3)]
    await asyncio.sleep(0.01)
    tasks.append(asyncio.create_task(wait("interactive", 0, 0.01, 100_000)))
    await asyncio.sleep(0.01)
    pool.release(held[0])
    await asyncio.gather(*tasks)
    assert order[0] == "interactive"


async def test_deadline_still_ends_the_wait() -> None:
    """Waiters of a tenant whose deadline passes get PoolSaturated at it, leave the queue, and
    cost their tenant nothing: its next request is served next to B's, not after B's."""
    pool = _pool()
    held = await _hold_all(pool)
    t0 = time.monotonic()
    late = [asyncio.create_task(pool.acquire(0, t0 + 0.2, tenant="a", tokens=1000))
            for _ in range(20)]
    for task in late:
        with pytest.raises(PoolSaturated, match="before the request's deadline"):
            await task
    assert 0.15 < time.monotonic() - t0 < 2.0
    assert pool.queued == 0
    order: list[str] = []

    async def wait(tenant: str) -> None:
        backend = await pool.acquire(0, time.monotonic() + 5, tenant=tenant, tokens=1000)
        order.append(tenant)
        pool.release(backend)

    tasks = [asyncio.create_task(wait("b")) for _ in range(3)]
    await asyncio.sleep(0.01)
    tasks.append(asyncio.create_task(wait("a")))
    await asyncio.sleep(0.01)
    pool.release(held[0])
    await asyncio.gather(*tasks)
    assert order.index("a") <= 1, order


async def test_start_deadline_judged_on_fair_position() -> None:
    """With a known completion rate (~10/s after ten completions 0.1 s apart) and 20 of A's
    requests waiting, B's request with 1 s left is queued (about one request is ahead of it:
    ~0.2 s), while A's own is refused at once (~2.1 s); without fair queuing B's is refused
    too."""
    for fair in (True, False):
        pool = _pool(fair=fair)
        b = await pool.acquire(0, time.monotonic() + 5)
        for _ in range(10):
            await asyncio.sleep(0.1)
            pool.release(b)
            b = await pool.acquire(0, time.monotonic() + 5)
        waiters = [asyncio.create_task(pool.acquire(0, time.monotonic() + 60, tenant="a",
                                                    tokens=500)) for _ in range(20)]
        await asyncio.sleep(0)
        with pytest.raises(PoolSaturated, match="before its deadline"):
            await pool.acquire(0, time.monotonic() + 1, tenant="a", tokens=500)
        ask = asyncio.create_task(pool.acquire(0, time.monotonic() + 1, tenant="b",
                                               tokens=500))
        await asyncio.sleep(0.01)
        if fair:
            assert not ask.done()
            releases = 0
            while not ask.done():  # free the one slot until B has it: at most one A first
                pool.release(b)
                releases += 1
                await asyncio.sleep(0)
            assert releases <= 2
        else:
            with pytest.raises(PoolSaturated, match="before its deadline"):
                await ask
        for w in waiters:
            w.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
