"""The router's spill-over rules: borrowing headroom and overflowing an unhealthy pool."""

from __future__ import annotations

import time

import pytest

from gateway.config import Backend, Borrow, Health, Model, Pool, parse_policy
from gateway.routing.errors import NoHealthyBackend, PoolSaturated
from gateway.routing.router import Router


def _router(borrow: bool = True) -> Router:
    interactive = Pool(name="chat", request_class="interactive",
                       backends=[Backend(url="http://i0", max_in_flight=10)],
                       borrow=Borrow(max_share=0.5, ttft_p90_target=0.5) if borrow else None,
                       health=Health(panic_threshold=0))
    batch = Pool(name="bulk", request_class="batch",
                 backends=[Backend(url="http://b0", max_in_flight=2)],
                 health=Health(panic_threshold=0))
    policy = parse_policy({"auth": {"required": False}})
    policy = policy.__class__(
        auth=policy.auth, pools=[interactive, batch],
        models=[Model(name="m", pool="chat", pools={"batch": "bulk"})],
    )
    return Router(policy)


async def test_batch_borrows_interactive_headroom_when_its_pool_is_full() -> None:
    router = _router()
    model = router.policy.models[0]
    got = [await router.acquire(r := router.route(model, "batch"), r.pool, ()) for _ in range(2)]
    assert {p.name for p, _ in got} == {"bulk"}  # its own pool first
    pool, _ = await router.acquire(r := router.route(model, "batch"), r.pool, ())
    assert pool.name == "chat"  # bulk full, chat has headroom: borrowed
    for _ in range(4):  # chat now at 5/10 = its max_share: no more borrowing
        router.pools["chat"].try_pick(time.monotonic())
    route = router.route(model, "batch")
    route.deadline = time.monotonic() + 0.1
    with pytest.raises(PoolSaturated):  # waits in bulk's queue instead, then times out
        await router.acquire(route, route.pool, ())


async def test_no_borrowing_without_borrow_policy() -> None:
    router = _router(borrow=False)
    model = router.policy.models[0]
    for _ in range(2):
        await router.acquire(r := router.route(model, "batch"), r.pool, ())
    route = router.route(model, "batch")
    route.deadline = time.monotonic() + 0.1
    with pytest.raises(PoolSaturated):
        await router.acquire(route, route.pool, ())
    assert router.pools["chat"].in_flight == 0


async def test_interactive_overflows_only_without_healthy_capacity() -> None:
    router = _router()
    model = router.policy.models[0]
    pool, _ = await router.acquire(r := router.route(model, "interactive"), r.pool, ())
    assert pool.name == "chat"
    router.pools["chat"].backends[0].ejected_until = time.monotonic() + 60
    pool, _ = await router.acquire(r := router.route(model, "interactive"), r.pool, ())
    assert pool.name == "bulk"  # chat has no healthy capacity: overflow to the batch pool
    router.pools["bulk"].backends[0].ejected_until = time.monotonic() + 60
    with pytest.raises(NoHealthyBackend):
        await router.acquire(r := router.route(model, "interactive"), r.pool, ())
