"""Borrowing both ways: interactive into a lending batch pool when its own would miss the
target; batch into the interactive pool only when it would not delay interactive."""

from __future__ import annotations

import asyncio
import time

from gateway.config import Backend, Borrow, Health, Lend, Model, Pool, RequestClass, parse_policy
from gateway.routing.router import Router

SPT = 1e-3  # seconds per prompt token the tests' backends are taken to have learned


def _router(lend: bool = True, borrow: bool = False, batch_cap: int = 8) -> Router:
    interactive = Pool(name="chat", request_class="interactive",
                       backends=[Backend(url="http://i0", max_in_flight=32)],
                       borrow=Borrow(max_share=0.5, ttft_p90_target=0.5) if borrow else None,
                       health=Health(panic_threshold=0))
    batch = Pool(name="bulk", request_class="batch",
                 backends=[Backend(url="http://b0", max_in_flight=batch_cap)],
                 lend=Lend(own_share=0.25, window=5.0) if lend else None,
                 health=Health(panic_threshold=0))
    policy = parse_policy({"auth": {"required": False}})
    policy = policy.__class__(
        auth=policy.auth, pools=[interactive, batch],
        models=[Model(name="m", pool="chat", pools={"batch": "bulk"})],
        classes=[RequestClass(name="interactive", priority=0, start_deadline=30.0,
                              ttft_target=0.5),
                 RequestClass(name="batch", priority=10, start_deadline=600.0)],
    )
    router = Router(policy)
    for pool in router.pools.values():
        for b in pool.backends:
            pool.predictor.load(b).seconds_per_token = SPT
    return router


def _backlog(router: Router, pool: str, tokens: int) -> None:
    state = router.pools[pool]
    for b in state.backends:
        state.predictor.start(b, tokens, time.monotonic())


async def _acquire(router: Router, cls: str, tokens: int) -> str:
    route = router.route(router.policy.models[0], cls)
    route.prompt_tokens = tokens
    pool, _ = await router.acquire(route, route.pool, ())
    return pool.name


async def test_interactive_borrows_the_batch_pool_above_its_target() -> None:
    """2 s of prefill queued on the interactive engine, the batch engine idle: the next
    interactive request goes to the batch pool."""
    router = _router()
    assert await _acquire(router, "interactive", 300) == "chat"  # under target: its own
    _backlog(router, "chat", 2000)
    assert await _acquire(router, "interactive", 300) == "bulk"


async def test_interactive_stays_when_the_lender_is_no_better() -> None:
    router = _router()
    _backlog(router, "chat", 2000)
    _backlog(router, "bulk", 5000)
    assert await _acquire(router, "interactive", 300) == "chat"


async def test_interactive_needs_a_lending_pool() -> None:
    router = _router(lend=False)
    _backlog(router, "chat", 2000)
    assert await _acquire(router, "interactive", 300) == "chat"


async def test_lending_throttles_batch_and_puts_interactive_ahead() -> None:
    """While interactive borrows, batch holds at most own_share of the batch pool (2 of 8)
    and waits; a borrowed request takes a slot ahead of the waiting batch."""
    router = _router(batch_cap=8)
    bulk = router.pools["bulk"]
    assert [await _acquire(router, "batch", 100) for _ in range(3)] == ["bulk"] * 3
    _backlog(router, "chat", 2000)
    assert await _acquire(router, "interactive", 300) == "bulk"  # lending from now on
    route = router.route(router.policy.models[0], "batch")
    waiting = asyncio.create_task(router.acquire(route, route.pool, ()))
    await asyncio.sleep(0.05)
    assert not waiting.done() and bulk.queued == 1  # throttled: 4 in flight >= 2
    assert await _acquire(router, "interactive", 300) == "bulk"  # ahead of the batch waiter
    waiting.cancel()


async def test_batch_does_not_borrow_when_it_would_delay_interactive() -> None:
    """The interactive pool is idle by share and p90, but a 1,000-token batch prompt (1 s
    of prefill) would push the typical interactive request past 0.5 s: refused; a short one
    fits."""
    router = _router(lend=False, borrow=True, batch_cap=1)
    assert await _acquire(router, "interactive", 200) == "chat"  # typical interactive: 200
    assert await _acquire(router, "batch", 1000) == "bulk"  # fills the batch pool
    chat = router.pools["chat"]
    assert not chat.has_headroom(time.monotonic(), 1000)
    assert chat.has_headroom(time.monotonic(), 50)
    route = router.route(router.policy.models[0], "batch")
    route.prompt_tokens = 50
    pool, _ = await router.acquire(route, route.pool, ())
    assert pool.name == "chat"  # the short one borrows


async def test_batch_does_not_borrow_while_the_engine_queues() -> None:
    router = _router(lend=False, borrow=True, batch_cap=1)
    chat = router.pools["chat"]
    assert chat.has_headroom(time.monotonic(), 10)
    chat.backends[0].engine_waiting = 2  # scraped: the engine has a queue of its own
    assert not chat.has_headroom(time.monotonic(), 10)


async def test_a_lending_pool_keeps_a_reserve_for_borrowers() -> None:
    """Even before anyone borrows, batch leaves lend.reserve (10% of 10 slots) free, so the
    first interactive borrower starts at once instead of waiting for a batch to finish."""
    router = _router(batch_cap=10)
    bulk = router.pools["bulk"]
    assert [await _acquire(router, "batch", 100) for _ in range(9)] == ["bulk"] * 9
    route = router.route(router.policy.models[0], "batch")
    waiting = asyncio.create_task(router.acquire(route, route.pool, ()))
    await asyncio.sleep(0.05)
    assert not waiting.done() and bulk.in_flight == 9
    _backlog(router, "chat", 2000)
    assert await _acquire(router, "interactive", 300) == "bulk"
    assert bulk.in_flight == 10
    waiting.cancel()
