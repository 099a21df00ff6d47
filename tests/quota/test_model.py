"""Random reserve/settle/cancel sequences against a plain Python model: totals match exactly.

Two scopes (tenant: every limit; key: tpm and concurrency). The window is 60 s and an example
takes milliseconds, so nothing expires and the model needs no clock.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.quota import (
    LIMIT_NAMES,
    Limits,
    MemoryQuotaStore,
    QuotaRequest,
    QuotaStore,
    RedisQuotaStore,
    Reservation,
    Scope,
    Usage,
)
from tests.redis_servers import RedisProc

SCOPES = (
    Scope(
        "tenant",
        Limits(rpm=12, tpm=3000, concurrency=4, tokens_per_day=5000, tokens_per_month=6000),
    ),
    Scope("key:k", Limits(tpm=2500, concurrency=3)),
)


@dataclass
class Counters:
    requests: int = 0
    tokens: int = 0
    in_flight: int = 0
    day: int = 0
    month: int = 0

    def fits(self, limits: Limits, est: int) -> bool:
        used = (
            self.requests + 1,
            self.tokens + est,
            self.in_flight + 1,
            self.day + est,
            self.month + est,
        )
        return all(lim is None or u <= lim for u, lim in zip(used, limits.values(), strict=True))

    def usage(self, limits: Limits) -> Usage:
        def tracked(name: str, value: int) -> int:
            return value if getattr(limits, name) is not None else 0

        values = (self.requests, self.tokens, self.in_flight, self.day, self.month)
        r, t, c, d, m = (tracked(n, v) for n, v in zip(LIMIT_NAMES, values, strict=True))
        return Usage(requests=r, tokens=t, in_flight=c, tokens_today=d, tokens_this_month=m)


@dataclass
class Model:
    scopes: dict[str, Counters] = field(
        default_factory=lambda: {s.name: Counters() for s in SCOPES}
    )

    def reserve(self, est: int) -> bool:
        if not all(self.scopes[s.name].fits(s.limits, est) for s in SCOPES):
            return False
        for c in self.scopes.values():
            c.requests += 1
            c.tokens += est
            c.in_flight += 1
            c.day += est
            c.month += est
        return True

    def settle(self, est: int, actual: int) -> None:
        for c in self.scopes.values():
            c.tokens += actual - est
            c.day += actual - est
            c.month += actual - est
            c.in_flight -= 1


Op = tuple[str, int, int]  # ("reserve", estimate, _) | ("settle", index, actual) | ("cancel", ..)
ops_strategy = st.lists(
    st.one_of(
        st.tuples(st.just("reserve"), st.integers(0, 1500), st.just(0)),
        st.tuples(st.sampled_from(["settle", "cancel"]), st.integers(0, 30), st.integers(0, 2500)),
    ),
    max_size=40,
)


async def play(store: QuotaStore, ops: list[Op]) -> None:
    tenant = f"t-{uuid.uuid4().hex[:12]}"
    model = Model()
    held: list[Reservation] = []
    settled: set[str] = set()
    try:
        for kind, a, b in ops:
            if kind == "reserve":
                request = QuotaRequest(
                    request_id=uuid.uuid4().hex, tenant=tenant, scopes=SCOPES, estimated_tokens=a
                )
                decision = await store.reserve(request)
                assert decision.admitted == model.reserve(a), (decision, model)
                if decision.reservation is not None:
                    held.append(decision.reservation)
            elif held:
                res = held[a % len(held)]
                actual = b if kind == "settle" else 0
                done = await (store.settle(res, actual) if kind == "settle" else store.cancel(res))
                assert done == (res.request_id not in settled)
                if done:
                    settled.add(res.request_id)
                    model.settle(res.estimated_tokens, actual)
        for scope in SCOPES:
            assert await store.usage(tenant, scope.name) == model.scopes[scope.name].usage(
                scope.limits
            )
    finally:
        await store.aclose()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops_strategy)
def test_memory_store_matches_model(ops: list[Op]) -> None:
    asyncio.run(play(MemoryQuotaStore(), ops))


@pytest.fixture(scope="module")
def redis_url(redis_proc: RedisProc) -> str:
    return redis_proc.url


#: the store's Redis call bound in this test: generous, since the model check asserts results,
#: never speed (2 s expired once while a loaded CI box ran the whole suite)
REDIS_TIMEOUT_S = 30.0


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(ops=ops_strategy)
def test_redis_store_matches_model(redis_url: str, ops: list[Op]) -> None:
    asyncio.run(play(RedisQuotaStore.from_url(redis_url, timeout=REDIS_TIMEOUT_S,
                                               connect_timeout=REDIS_TIMEOUT_S), ops))
