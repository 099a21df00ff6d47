"""Redis SIGKILLed and restarted under load: fail-closed answers fast, fail-open goes local,
and both return to Redis when it answers again."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid

import pytest

from gateway.quota import (
    Decision,
    FailoverMode,
    FailoverQuotaStore,
    Limits,
    QuotaRequest,
    QuotaUnavailable,
    RedisQuotaStore,
    Scope,
)
from tests.redis_servers import RedisProc

SCOPES = (Scope("tenant", Limits(rpm=10, concurrency=100)),)


def request(tenant: str) -> QuotaRequest:
    return QuotaRequest(
        request_id=uuid.uuid4().hex, tenant=tenant, scopes=SCOPES, estimated_tokens=10
    )


def failover(url: str, mode: FailoverMode, changes: list[bool]) -> FailoverQuotaStore:
    primary = RedisQuotaStore.from_url(url, timeout=0.25, connect_timeout=0.2)
    return FailoverQuotaStore(
        primary,
        mode=mode,
        local_share=0.5,
        on_change=changes.append,
        probe_interval=0.2,
        probe_max_interval=0.5,
    )


async def timed_reserve(store: FailoverQuotaStore, tenant: str) -> tuple[float, object]:
    """(seconds taken, Decision or the QuotaUnavailable raised)."""
    started = time.monotonic()
    try:
        outcome: object = await store.reserve(request(tenant))
    except QuotaUnavailable as exc:
        outcome = exc
    return time.monotonic() - started, outcome


async def wait_until(predicate: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_fail_closed_raises_fast_and_recovers(own_redis: RedisProc, tenant: str) -> None:
    changes: list[bool] = []
    store = failover(own_redis.url, "closed", changes)
    try:
        assert (await store.reserve(request(tenant))).admitted
        own_redis.kill()
        # concurrent load while Redis is gone: every call ends within 0.5 s, all refused
        results = await asyncio.gather(*(timed_reserve(store, tenant) for _ in range(32)))
        for _ in range(10):
            results.append(await timed_reserve(store, tenant))
        assert max(took for took, _ in results) < 0.5
        assert all(isinstance(outcome, QuotaUnavailable) for _, outcome in results)
        assert store.degraded and store.outages == 1 and changes == [True]

        own_redis.start()
        await wait_until(lambda: not store.degraded)
        assert changes == [True, False]
        decision = await store.reserve(request(tenant))
        assert decision.reservation is not None and decision.reservation.origin == "redis"
    finally:
        await store.aclose()


async def test_fail_open_uses_local_share_and_returns(own_redis: RedisProc, tenant: str) -> None:
    """rpm=10 with local_share=0.5: during the outage this process admits 5, then refuses."""
    changes: list[bool] = []
    store = failover(own_redis.url, "open", changes)
    try:
        assert (await store.reserve(request(tenant))).admitted
        own_redis.kill()
        results = await asyncio.gather(*(timed_reserve(store, tenant) for _ in range(20)))
        assert max(took for took, _ in results) < 0.5
        decisions = [d for _, d in results]
        assert all(isinstance(d, Decision) for d in decisions)
        admitted = [d for d in decisions if isinstance(d, Decision) and d.admitted]
        assert len(admitted) == 5
        assert all(d.reservation and d.reservation.origin == "memory" for d in admitted)
        refused = [d for d in decisions if isinstance(d, Decision) and not d.admitted]
        assert {d.limit for d in refused} == {"rpm"}
        assert store.outages == 1 and changes == [True]
        # a local reservation settles locally
        local = admitted[0].reservation
        assert local is not None and await store.settle(local, 3)

        own_redis.start()
        await wait_until(lambda: not store.degraded)
        assert changes == [True, False]
        decision = await store.reserve(request(tenant))
        assert decision.reservation is not None and decision.reservation.origin == "redis"
    finally:
        await store.aclose()


@pytest.mark.parametrize("mode", ["open", "closed"])
async def test_load_across_kill_and_restart(own_redis: RedisProc, mode: FailoverMode) -> None:
    """16 reserve/settle loops run while Redis is killed and restarted: no call takes 0.5 s,
    no redis-py exception escapes, and Redis decides again at the end."""
    changes: list[bool] = []
    store = failover(own_redis.url, mode, changes)
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    scopes = (Scope("tenant", Limits(concurrency=1000)),)
    stop = False
    slowest = 0.0
    origins: set[str] = set()
    unavailable = 0

    async def loop() -> None:
        nonlocal slowest, unavailable
        while not stop:
            await asyncio.sleep(0)  # the memory store never suspends: let the test run
            started = time.monotonic()
            try:
                decision = await store.reserve(
                    QuotaRequest(
                        request_id=uuid.uuid4().hex,
                        tenant=tenant,
                        scopes=scopes,
                        estimated_tokens=5,
                    )
                )
                slowest = max(slowest, time.monotonic() - started)
                if decision.reservation is not None:
                    origins.add(decision.reservation.origin)
                    await store.settle(decision.reservation, 5)
            except QuotaUnavailable:
                slowest = max(slowest, time.monotonic() - started)
                unavailable += 1
                await asyncio.sleep(0.01)

    tasks = [asyncio.create_task(loop()) for _ in range(16)]
    try:
        await asyncio.sleep(0.3)
        own_redis.kill()
        await asyncio.sleep(0.8)
        own_redis.start()
        await wait_until(lambda: not store.degraded)
        origins.clear()
        await asyncio.sleep(0.3)
    finally:
        stop = True
        await asyncio.gather(*tasks)
        await store.aclose()
    assert slowest < 0.5
    assert changes[:2] == [True, False]
    assert origins == {"redis"}
    if mode == "closed":
        assert unavailable > 0
    else:
        assert unavailable == 0


async def test_settle_during_a_stall_is_replayed_once(own_redis: RedisProc, tenant: str) -> None:
    """A settle that times out (Redis stopped) is queued and replayed; idempotency by request id
    means the tokens are charged exactly once even if the first attempt also landed."""
    changes: list[bool] = []
    store = failover(own_redis.url, "open", changes)
    scopes = (Scope("tenant", Limits(tpm=10_000, concurrency=5)),)
    try:
        decision = await store.reserve(
            QuotaRequest(request_id="r1", tenant=tenant, scopes=scopes, estimated_tokens=1000)
        )
        assert decision.reservation is not None
        assert own_redis.proc is not None
        os.kill(own_redis.proc.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            assert await store.settle(decision.reservation, 250)  # queued
            assert time.monotonic() - started < 0.5 and store.degraded
        finally:
            os.kill(own_redis.proc.pid, signal.SIGCONT)
        await wait_until(lambda: not store.degraded)
        used = await store.usage(tenant, "tenant")
        assert (used.tokens, used.in_flight) == (250, 0)
        assert not await store.settle(decision.reservation, 250)
    finally:
        await store.aclose()


async def test_fail_open_local_decisions_carry_no_ratelimit(own_redis: RedisProc,
                                                            tenant: str) -> None:
    """Redis decides: the x-ratelimit figures are the tenant's. Redis away (fail-open): the
    local decisions, admitted or refused, carry none (they are this process's share)."""
    store = failover(own_redis.url, "open", [])
    try:
        decision = await store.reserve(request(tenant))
        assert decision.ratelimit is not None
        assert (decision.ratelimit.limit_requests, decision.ratelimit.remaining_requests) == (
            10, 9)
        own_redis.kill()
        decisions = [await store.reserve(request(tenant)) for _ in range(8)]
        assert store.degraded
        assert {d.admitted for d in decisions} == {True, False}  # 5 local admissions, then 429
        assert all(d.ratelimit is None for d in decisions)
        assert all(d.reservation is None or d.reservation.origin == "memory" for d in decisions)
    finally:
        await store.aclose()
