"""Memory and Redis agree on the x-ratelimit figures of random reserve/settle/cancel sequences.

The same sequence is played step by step against a ``MemoryQuotaStore`` and a
``RedisQuotaStore`` (the pipelined client, redis-py, Redis Cluster). Requests come from two keys
and two models, so the tightest scope moves between tenant, key and model, and ties happen.
Every decision must match: admitted or not, the refusing limit, and limit and remaining of both
trios exactly; the resets come from two clocks (the process's and Redis's), so they match
within a generous margin.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.quota import (
    Decision,
    Limits,
    MemoryQuotaStore,
    QuotaRequest,
    QuotaStore,
    RedisQuotaStore,
    Reservation,
    build_scopes,
)
from tests.process_marker import starts_process

TENANT = Limits(rpm=9, tpm=4000, concurrency=6)
KEYS = {"k1": Limits(rpm=4), "k2": Limits(rpm=6, tpm=2500)}
MODELS = {"m1": Limits(tpm=1500), "m2": None}
CLOCK_MARGIN = 5.0  # seconds between the two stores' clocks, on a loaded box

SCOPES = {(k, m): build_scopes(TENANT, key_id=k, key=KEYS[k], model=m, per_model=MODELS[m])
          for k in KEYS for m in MODELS}

Op = tuple[str, int, int]  # ("reserve", scope set index, estimate) | ("settle"|"cancel", i, n)
ops_strategy = st.lists(
    st.one_of(
        st.tuples(st.just("reserve"), st.integers(0, len(SCOPES) - 1), st.integers(0, 1200)),
        st.tuples(st.sampled_from(["settle", "cancel"]), st.integers(0, 30),
                  st.integers(0, 2000)),
    ),
    max_size=40,
)


def assert_agree(memory: Decision, redis: Decision) -> None:
    assert (memory.admitted, memory.scope, memory.limit) == (
        redis.admitted, redis.scope, redis.limit), (memory, redis)
    a, b = memory.ratelimit, redis.ratelimit
    assert (a is None) == (b is None), (a, b)
    if a is None or b is None:
        return
    assert (a.limit_requests, a.remaining_requests, a.limit_tokens, a.remaining_tokens) == (
        b.limit_requests, b.remaining_requests, b.limit_tokens, b.remaining_tokens), (a, b)
    assert a.reset_requests_s == pytest.approx(b.reset_requests_s, abs=CLOCK_MARGIN)
    assert a.reset_tokens_s == pytest.approx(b.reset_tokens_s, abs=CLOCK_MARGIN)


async def play(stores: tuple[QuotaStore, QuotaStore], ops: list[Op]) -> None:
    tenant = f"t-{uuid.uuid4().hex[:12]}"
    scope_sets = list(SCOPES.values())
    held: list[tuple[Reservation, Reservation]] = []
    try:
        for kind, a, b in ops:
            if kind == "reserve":
                rid = uuid.uuid4().hex
                decisions = [await s.reserve(QuotaRequest(
                    request_id=rid, tenant=tenant, scopes=scope_sets[a], estimated_tokens=b))
                    for s in stores]
                assert_agree(*decisions)
                first, second = (d.reservation for d in decisions)
                if first is not None and second is not None:
                    held.append((first, second))
            elif held:
                pair = held[a % len(held)]
                actual = b if kind == "settle" else 0
                done = [await store.settle(res, actual)
                        for store, res in zip(stores, pair, strict=True)]
                assert done[0] == done[1]
    finally:
        for store in stores:
            await store.aclose()


@pytest.fixture(scope="module", params=["redis", "redis-py", "cluster"])
@starts_process
def redis_kind(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(kind, url): the pipelined client and redis-py on one node, and Redis Cluster."""
    kind: str = request.param
    server = request.getfixturevalue("redis_cluster" if kind == "cluster" else "redis_proc")
    url: str = server.url
    return kind, url


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ops=ops_strategy)
def test_memory_and_redis_report_the_same_figures(redis_kind: tuple[str, str],
                                                  ops: list[Op]) -> None:
    kind, url = redis_kind  # a generous call bound: the box is shared; results, not speed
    redis = RedisQuotaStore.from_url(url, cluster=kind == "cluster", timeout=30.0,
                                     connect_timeout=30.0,
                                     pipelined=kind == "redis")
    asyncio.run(play((MemoryQuotaStore(), redis), ops))
