"""At one connection, a request's reserve must not wait behind the previous request's settle.

The gateway settles a request in the background once its response has ended; at a client's
next request the reserve goes to the same Redis connection. It must be written at once (one
round trip), beside the settle if that is still unanswered, and Redis must still run the settle
first, so that a slot the settle frees is free for the reserve behind it.
"""

from __future__ import annotations

import asyncio
import uuid

import redis

from gateway.quota import Limits, QuotaRequest, RedisQuotaStore, Scope
from gateway.redis.pipelined import PipelinedRedis
from tests.redis_servers import RedisProc


def _request(tenant: str, scopes: tuple[Scope, ...]) -> QuotaRequest:
    return QuotaRequest(request_id=uuid.uuid4().hex, tenant=tenant, scopes=scopes,
                        estimated_tokens=100, lease_ttl=30.0)


def _writes(client: PipelinedRedis) -> int:
    return int(repr(client).split("writes=")[1].rstrip(">"))


async def test_a_reserve_is_written_beside_the_last_settle_and_sees_its_slot(
    redis_proc: RedisProc,
) -> None:
    client = PipelinedRedis.from_url(redis_proc.url, connect_timeout=30.0)
    store = RedisQuotaStore(client, deadline=30.0)
    other = redis.Redis.from_url(redis_proc.url)
    tenant = f"t-{uuid.uuid4().hex[:12]}"
    scopes = (Scope("tenant", Limits(concurrency=1, rpm=1000, tpm=10**9)),)
    try:
        first = await store.reserve(_request(tenant, scopes))
        assert first.admitted and first.reservation is not None
        before = _writes(client)
        other.execute_command("CLIENT", "PAUSE", 400, "ALL")  # Redis holds both replies
        # the response has ended: its settle runs in the background (``settle_later``)
        settle = asyncio.ensure_future(store.settle(first.reservation, 80))
        for _ in range(3):
            await asyncio.sleep(0)
        assert _writes(client) == before + 1, "the settle waited at an idle connection"
        # the client's next request
        reserve = asyncio.ensure_future(store.reserve(_request(tenant, scopes)))
        for _ in range(3):
            await asyncio.sleep(0)
        assert not settle.done()
        assert _writes(client) == before + 2, "the reserve waited for the settle's reply"
        second = await asyncio.wait_for(reserve, 10.0)
        assert await asyncio.wait_for(settle, 10.0)
        # Redis ran the settle first: the one concurrency slot was free again
        assert second.admitted, second
    finally:
        other.close()
        await store.aclose()
        await client.aclose()
