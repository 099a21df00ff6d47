"""A child process for the multi-process tests: its own RedisQuotaStore, many reservers.

    python -m tests.quota.worker hold  URL TENANT N TTL      reserve N concurrency slots, print
                                                            "ready", then sleep until killed
    python -m tests.quota.worker rpm   URL TENANT N TASKS START SECONDS
    python -m tests.quota.worker conc  URL TENANT C TASKS START SECONDS

``rpm``/``conc`` wait until the epoch time START so all processes begin together, hammer the
tenant for SECONDS and print one JSON line: admitted count, and (conc) the highest in-flight
count seen on a shared Redis counter that admitted requests increment and decrement.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid

from redis.asyncio import Redis

from gateway.quota import Limits, QuotaRequest, RedisQuotaStore, Scope


def _request(tenant: str, limits: Limits, ttl: float = 30.0) -> QuotaRequest:
    return QuotaRequest(
        request_id=uuid.uuid4().hex,
        tenant=tenant,
        scopes=(Scope("tenant", limits),),
        estimated_tokens=10,
        lease_ttl=ttl,
    )


async def hold(url: str, tenant: str, n: int, ttl: float) -> None:
    store = RedisQuotaStore.from_url(url, timeout=30.0, connect_timeout=30.0)
    for _ in range(n):
        decision = await store.reserve(_request(tenant, Limits(concurrency=n), ttl))
        assert decision.admitted
    print("ready", flush=True)
    await asyncio.sleep(3600)


async def hammer(
    mode: str, url: str, tenant: str, limit: int, tasks: int, start: float, seconds: float
) -> None:
    store = RedisQuotaStore.from_url(url, timeout=30.0, connect_timeout=30.0)
    counter = Redis.from_url(url)
    in_flight_key = f"gw:q:{{{tenant}}}:test:in_flight"
    limits = Limits(rpm=limit) if mode == "rpm" else Limits(concurrency=limit)
    admitted, peak = 0, 0
    await store.load_scripts()
    await asyncio.sleep(max(0.0, start - time.time()))
    stop_at = time.monotonic() + seconds

    async def one() -> None:
        nonlocal admitted, peak
        while time.monotonic() < stop_at:
            decision = await store.reserve(_request(tenant, limits))
            if decision.reservation is None:
                await asyncio.sleep(0.001)
                continue
            admitted += 1
            if mode == "conc":
                peak = max(peak, int(await counter.incr(in_flight_key)))
                await asyncio.sleep(0.002)
                await counter.decr(in_flight_key)
            await store.settle(decision.reservation, 10)

    await asyncio.gather(*(one() for _ in range(tasks)))
    print(json.dumps({"admitted": admitted, "peak": peak}), flush=True)
    await store.aclose()
    await counter.aclose()


def main(argv: list[str]) -> None:
    mode, url, tenant = argv[0], argv[1], argv[2]
    if mode == "hold":
        asyncio.run(hold(url, tenant, int(argv[3]), float(argv[4])))
    else:
        limit, tasks, start, seconds = int(argv[3]), int(argv[4]), float(argv[5]), float(argv[6])
        asyncio.run(hammer(mode, url, tenant, limit, tasks, start, seconds))


if __name__ == "__main__":
    main(sys.argv[1:])
