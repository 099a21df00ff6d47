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
    ``fair: false`` it is served last. (The queue's own order: no headroom, which would let
    both tenants past the slot held by a third; see the headroom tests below.)"""
    for fair, position in ((True, 1), (False, 50)):
        pool = _pool(fair=fair, fair_headroom=0)
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
    tenant of weight 0.01 with a huge one (the queue's order: no headroom)."""
    pool = _pool(fair_headroom=0)
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
    cost their tenant nothing: its next request is served next to B's, not after B's. (No
    headroom: A, below its share of the slot held by a third, would take one.)"""
    pool = _pool(fair_headroom=0)
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
        pool = _pool(fair=fair, fair_headroom=1)  # one of A's takes it: the pool is full
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


# --- headroom: slots above max_in_flight for a tenant below its share (``fair_headroom``)
async def _flood(pool: PoolState, waiting: int, tenant: str = "a"
                 ) -> tuple[list[BackendState], list[asyncio.Task[BackendState]]]:
    """``tenant`` holds every slot and keeps ``waiting`` more requests queued."""
    held = [await pool.acquire(0, time.monotonic() + 30, tenant=tenant, tokens=500)
            for _ in range(pool.capacity(time.monotonic()))]
    queued = [asyncio.create_task(pool.acquire(0, time.monotonic() + 30, tenant=tenant,
                                               tokens=500)) for _ in range(waiting)]
    await asyncio.sleep(0.01)
    return held, queued


async def _cancel(tasks: list[asyncio.Task[BackendState]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_tenant_below_share_takes_headroom_flood_does_not() -> None:
    """A holds all 4 slots of 2 backends with 6 more waiting: none of A's gets a headroom
    slot (alone, its share is the whole pool, and it holds it). B's requests, each sent
    after the last is served, are served at once on a full backend's headroom, one per
    backend (``fair_headroom: 1``); B's third waits, and takes the headroom one of B's
    frees though A's waiters are before it in fair order (B was charged for its two)."""
    pool = _pool(n=2, max_in_flight=2, fair_headroom=1)
    held, flood = await _flood(pool, 6)
    assert pool.in_flight == 4 and pool.queued == 6
    assert not any(task.done() for task in flood)
    got = [await asyncio.wait_for(pool.acquire(0, time.monotonic() + 30, tenant="b",
                                               tokens=500), 0.5) for _ in range(2)]
    assert sorted(b.label for b in got) == ["p#0", "p#1"]
    assert [b.in_flight for b in pool.backends] == [3, 3]
    assert pool.headroom_in_use == pool.headroom_started == 2
    third = asyncio.create_task(pool.acquire(0, time.monotonic() + 30, tenant="b", tokens=500))
    await asyncio.sleep(0.01)
    assert not third.done() and pool.queued == 7
    pool.release(got[0], "b")
    assert (await asyncio.wait_for(third, 0.5)) is got[0] and got[0].in_flight == 3
    assert not any(task.done() for task in flood)
    # an A request ends on a backend over its limit: that backend is at max_in_flight, so
    # no A waiter starts (B's request now holds a slot of A's); a second one frees a slot
    assert held.count(held[0]) == 2  # A holds both of its max_in_flight slots
    pool.release(held[0], "a")
    await asyncio.sleep(0.01)
    assert pool.in_flight == 5 and not any(task.done() for task in flood)
    pool.release(held[0], "a")
    await asyncio.sleep(0.01)
    assert sum(task.done() for task in flood) == 1 and pool.in_flight == 5
    await _cancel(flood)


async def test_headroom_only_below_the_weighted_share() -> None:
    """4 backends of one slot, all A's: B (weight 1) may take headroom while it holds fewer
    than its share, 4 x 1/2 = 2 slots, so its third request waits though two headroom slots
    are left; C, of weight 3 beside A, may hold up to 3 (4 x 3/4; B's share shrinks when C
    holds slots, which the test does not need). One headroom slot per backend, so C's three
    are on three backends."""
    pool = _pool(n=4, max_in_flight=1, fair_headroom=1)
    _, flood = await _flood(pool, 3)
    b = [await asyncio.wait_for(pool.acquire(0, time.monotonic() + 30, tenant="b"), 0.5)
         for _ in range(2)]
    third = asyncio.create_task(pool.acquire(0, time.monotonic() + 30, tenant="b"))
    await asyncio.sleep(0.01)
    assert not third.done() and pool.in_flight == 6
    assert not pool.below_share("b", 1.0, time.monotonic())
    await _cancel([third])
    for backend in b:
        pool.release(backend, "b")
    assert pool.in_flight == 4 and pool.queued == 3  # B's release went to nobody: A's stay
    c = [await asyncio.wait_for(pool.acquire(0, time.monotonic() + 30, tenant="c",
                                             weight=3.0), 0.5) for _ in range(3)]
    assert pool.in_flight == 7
    assert not pool.below_share("c", 3.0, time.monotonic())
    assert len({backend.label for backend in c}) == 3
    await _cancel(flood)


async def test_headroom_freed_on_release() -> None:
    """B's headroom slot is given back when B's request ends: the backend is at its
    max_in_flight again, so A's waiters still get nothing, and B's next request takes the
    headroom again."""
    pool = _pool(n=1, max_in_flight=2)
    _, flood = await _flood(pool, 4)
    for _ in range(3):
        b = await asyncio.wait_for(pool.acquire(0, time.monotonic() + 30, tenant="b"), 0.5)
        assert b.in_flight == 3
        pool.release(b, "b")
        await asyncio.sleep(0)
        assert b.in_flight == 2 and pool.queued == 4 and pool.headroom_in_use == 0
    assert not any(task.done() for task in flood)
    await _cancel(flood)


@pytest.mark.parametrize(("kw", "at_once"), [
    pytest.param({}, 2, id="default"),
    pytest.param({"fair_headroom": 1}, 1, id="headroom-1"),
])
async def test_default_headroom_starts_two_light_requests_in_one_completion_gap(
        kw: dict[str, object], at_once: int) -> None:
    """One backend of 4 slots, all A's, more of A's waiting: B sends two requests before any
    request ends. The default headroom (2) starts both at once; with 1, B's second waits for
    the flood's next completion, which is the wait the default is sized to avoid."""
    pool = _pool(n=1, max_in_flight=4, **kw)
    held, flood = await _flood(pool, 4)
    asks = [asyncio.create_task(pool.acquire(0, time.monotonic() + 30, tenant="b"))
            for _ in range(2)]
    await asyncio.sleep(0.01)
    assert sum(ask.done() for ask in asks) == at_once
    assert pool.in_flight == 4 + at_once and not any(task.done() for task in flood)
    pool.release(held[0], "a")  # the flood's next completion: B's waiting one starts
    await asyncio.sleep(0.01)
    assert all(ask.done() for ask in asks) and not any(task.done() for task in flood)
    await _cancel(flood)


async def test_tenant_alone_never_takes_headroom() -> None:
    """A tenant alone fills the pool and then waits: it holds its whole share, so it never
    goes past max_in_flight (a slot freed goes to its next waiter, as without headroom)."""
    pool = _pool(n=2, max_in_flight=2)
    held, flood = await _flood(pool, 5)
    assert pool.in_flight == 4 and not any(task.done() for task in flood)
    pool.release(held[0], "a")
    await asyncio.sleep(0.01)
    assert pool.in_flight == 4 and sum(task.done() for task in flood) == 1
    await _cancel(flood)


@pytest.mark.parametrize("kw", [
    pytest.param({"fair_headroom": 0}, id="headroom-0"),
    pytest.param({"fair": False}, id="fifo"),
])
async def test_no_headroom_without_the_key_or_fair_queuing(kw: dict[str, object]) -> None:
    """With ``fair_headroom: 0``, or ``fair: false`` (one flow: no shares to judge), B waits
    like A's requests: nothing goes past max_in_flight."""
    pool = _pool(n=2, max_in_flight=2, **kw)
    _, flood = await _flood(pool, 2)
    ask = asyncio.create_task(pool.acquire(0, time.monotonic() + 30, tenant="b"))
    await asyncio.sleep(0.01)
    assert not ask.done() and pool.in_flight == 4
    await _cancel([ask, *flood])


async def test_headroom_never_on_an_ejected_or_cooling_backend() -> None:
    """Of 3 full backends, one ejected (kept in the pool: panic mode is below half healthy)
    and one cooling down after a Retry-After: B's headroom slot is on the third; once that
    is taken, B's next waits."""
    pool = _pool(n=3, max_in_flight=1)
    _, flood = await _flood(pool, 2)
    now = time.monotonic()
    ejected, cooling, good = pool.backends
    for _ in range(pool.config.health.eject_after):
        ejected.on_failure(pool.config.health, now)
    cooling.on_retry_after(30, now)
    assert ejected.ejected_until > now
    b = await asyncio.wait_for(pool.acquire(0, time.monotonic() + 30, tenant="b"), 0.5)
    assert b is good and good.in_flight == 2
    ask = asyncio.create_task(pool.acquire(0, time.monotonic() + 30, tenant="b"))
    await asyncio.sleep(0.01)
    assert not ask.done() and ejected.in_flight == cooling.in_flight == 1
    await _cancel([ask, *flood])


async def test_headroom_keeps_class_priority() -> None:
    """A batch tenant below its share gets no headroom while an interactive request waits
    before it (no waiter jumps the queue's order); an interactive tenant below its share
    does, and the batch waiter takes the headroom once nothing of a higher class waits."""
    pool = _pool(n=1, max_in_flight=1)
    held, flood = await _flood(pool, 1)
    batch = asyncio.create_task(pool.acquire(10, time.monotonic() + 30, tenant="c"))
    await asyncio.sleep(0.01)
    assert not batch.done()
    b = await asyncio.wait_for(pool.acquire(0, time.monotonic() + 30, tenant="b"), 0.5)
    assert b.in_flight == 2 and not batch.done()
    pool.release(b, "b")  # the headroom is free, but A's interactive waiter is first
    await asyncio.sleep(0.01)
    assert not batch.done() and not flood[0].done()
    pool.release(held[0], "a")  # to A's waiter; then nothing interactive waits
    assert (await asyncio.wait_for(batch, 0.5)).in_flight == 2
    assert flood[0].done()


async def test_cancelled_waiter_gives_its_slot_back_to_its_tenant() -> None:
    """A waiter served a headroom slot and cancelled before it runs (its request gone) gives
    the slot back as its tenant's: the tenant is not left counted as holding it."""
    pool = _pool(n=1, max_in_flight=1)
    _, flood = await _flood(pool, 0)
    first = await asyncio.wait_for(pool.acquire(0, time.monotonic() + 30, tenant="b"), 0.5)
    ask = asyncio.create_task(pool.acquire(0, time.monotonic() + 30, tenant="b"))
    await asyncio.sleep(0.01)
    assert not ask.done()  # B holds its share (1 of 2 slots in flight, share 1/2)
    pool.release(first, "b")  # B below its share again: its waiter gets the headroom...
    assert pool.in_flight == 2
    ask.cancel()  # ... and leaves before it runs
    await asyncio.gather(ask, return_exceptions=True)
    assert pool.in_flight == 1
    # B holds nothing: it lingers (``fair_linger``) with no slot counted
    assert repr(pool._shares) == "<SlotShares [a: 1] lingering [b]>"
    await _cancel(flood)
