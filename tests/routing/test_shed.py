"""Load shedding: refuse at once what would start too late; never when the pool has room."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import pytest

from gateway.config import Backend, Health, Model, Pool, RequestClass, Shed, parse_policy
from gateway.routing.errors import PoolSaturated, RequestShed
from gateway.routing.predict import Prediction
from gateway.routing.router import Router
from gateway.routing.shed import retry_after, shed_reason
from gateway.telemetry.metrics import Metrics

SPT = 1e-3  # seconds per prompt token the tests' backends are taken to have learned


def _router(shed: bool = True, backends: int = 1) -> Router:
    pool = Pool(name="chat", request_class="interactive",
                backends=[Backend(url=f"http://i{i}", max_in_flight=64) for i in range(backends)],
                shed=Shed(margin=0.8) if shed else None, health=Health(panic_threshold=0))
    policy = parse_policy({"auth": {"required": False}})
    policy = policy.__class__(
        auth=policy.auth, pools=[pool], models=[Model(name="m", pool="chat")],
        classes=[RequestClass(name="interactive", priority=0, start_deadline=2.0,
                              ttft_target=0.5),
                 RequestClass(name="batch", priority=10, start_deadline=600.0)],
    )
    router = Router(policy)
    for b in router.pools["chat"].backends:
        router.pools["chat"].predictor.load(b).seconds_per_token = SPT
    return router


def _backlog(router: Router, tokens: int) -> None:
    """Prompt tokens already sent to every backend of the pool (the engine's prefill queue)."""
    pool = router.pools["chat"]
    for b in pool.backends:
        pool.predictor.start(b, tokens, time.monotonic())


def test_shed_reason_never_refuses_with_nothing_ahead() -> None:
    """However long the request's own prefill, an empty pool is room: send it."""
    assert shed_reason(Prediction(ttft=50.0, ahead=0.0), left=1.0, margin=0.8) is None
    assert shed_reason(Prediction(ttft=50.0, ahead=49.0), left=1.0, margin=0.8) == "deadline"
    assert shed_reason(Prediction(ttft=0.6, ahead=0.1), left=600, margin=0.8,
                       pressure=0.5) == "priority"
    assert retry_after(Prediction(ttft=50.0, ahead=49.0)) == 49
    assert retry_after(Prediction(ttft=1.0, ahead=0.01)) == 1


@pytest.mark.parametrize("backends", [1, 3])
async def test_never_refuses_when_the_pool_has_room(backends: int) -> None:
    """Seeded random prompts and classes into a pool with free slots and nothing ahead: all
    are sent, even prompts whose own prefill alone exceeds the deadline."""
    rng = random.Random(18)
    for _ in range(200):
        router = _router(backends=backends)
        model = router.policy.models[0]
        route = router.route(model, rng.choice(["interactive", "batch"]))
        route.prompt_tokens = rng.choice([0, 10, 2300, 10_000, 100_000])
        pool, backend = await router.acquire(route, route.pool, ())
        assert pool.name == "chat" and backend.in_flight == 1


async def test_refuses_at_once_when_the_backlog_misses_the_deadline() -> None:
    router = _router()
    model = router.policy.models[0]
    _backlog(router, 5000)  # 5 s of prefill ahead, deadline 2 s
    route = router.route(model, "interactive")
    route.prompt_tokens = 1000
    started = time.monotonic()
    with pytest.raises(RequestShed) as info:
        await router.acquire(route, route.pool, ())
    assert time.monotonic() - started < 1.0  # at once, not at the deadline
    assert info.value.reason == "deadline" and info.value.retry_after >= 4
    assert isinstance(info.value, PoolSaturated)  # mapped to 503 + Retry-After as before
    assert router.pools["chat"].in_flight == 0


async def test_batch_is_shed_before_interactive() -> None:
    """With 1 s ahead, interactive (deadline 2 s) still fits; batch is refused because the
    interactive class using the pool targets 0.5 s."""
    router = _router()
    model = router.policy.models[0]
    interactive = router.route(model, "interactive")
    interactive.prompt_tokens = 200
    await router.acquire(interactive, interactive.pool, ())  # the class uses the pool
    _backlog(router, 1000)
    batch = router.route(model, "batch")
    batch.prompt_tokens = 200
    with pytest.raises(RequestShed) as info:
        await router.acquire(batch, batch.pool, ())
    assert info.value.reason == "priority"
    again = router.route(model, "interactive")
    again.prompt_tokens = 200
    pool, _ = await router.acquire(again, again.pool, ())
    assert pool.name == "chat"


async def test_without_shed_policy_nothing_is_refused() -> None:
    router = _router(shed=False)
    model = router.policy.models[0]
    _backlog(router, 50_000)
    route = router.route(model, "interactive")
    route.prompt_tokens = 1000
    pool, _ = await router.acquire(route, route.pool, ())
    assert pool.name == "chat"


def test_shed_counter_by_class_and_reason() -> None:
    metrics = Metrics()
    metrics.shed_request("m", "chat", "batch", "priority")
    metrics.shed_request("m", "chat", "interactive", "deadline")
    text = metrics.render()[0].decode()
    assert 'gateway_shed_total{class="batch",model="m",pool="chat",reason="priority"} 1.0' in text
    assert ('gateway_shed_total{class="interactive",model="m",pool="chat",reason="deadline"} 1.0'
            in text)


async def test_a_tenant_below_its_share_is_not_shed_behind_a_flood() -> None:
    """A flood fills the pool and queues prompts worth far more than the deadline: its next
    request is shed, but another tenant's, which the fair headroom starts at once, is not
    judged by the flood's queue: it gets a slot above the full backend's limit."""
    pool_config = Pool(name="chat", request_class="interactive",
                       backends=[Backend(url="http://i0", max_in_flight=2)],
                       shed=Shed(margin=0.8), health=Health(panic_threshold=0))
    policy = parse_policy({"auth": {"required": False}})
    policy = policy.__class__(
        auth=policy.auth, pools=[pool_config], models=[Model(name="m", pool="chat")],
        classes=[RequestClass(name="interactive", priority=0, start_deadline=2.0,
                              ttft_target=0.5)])
    router = Router(policy)
    pool = router.pools["chat"]
    (backend,) = pool.backends
    pool.predictor.load(backend).seconds_per_token = SPT
    model = router.policy.models[0]

    def route(tenant: str) -> Any:
        r = router.route(model, "interactive")
        r.tenant, r.prompt_tokens = tenant, 100
        return r

    for _ in range(2):  # the flood holds every slot
        await router.acquire(route("a"), pool, ())
    waiters = [asyncio.create_task(pool.acquire(  # and queues 3 x 2,000 prompt tokens
        0, time.monotonic() + 60, (), None, None, prompt_tokens=2_000, tenant="a",
        tokens=2_100)) for _ in range(3)]  # (~6 s of prefill ahead, deadline 2 s)
    await asyncio.sleep(0)
    assert pool.queued == 3
    with pytest.raises(RequestShed):
        await router.acquire(route("a"), pool, ())
    got, slot = await router.acquire(route("b"), pool, ())
    assert (got, slot) == (pool, backend) and backend.in_flight == 3  # on the headroom
    for task in waiters:
        task.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
