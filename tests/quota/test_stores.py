"""One suite, every store: memory, Redis and Redis Cluster must agree on every limit."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from gateway.quota import (
    InvalidQuotaRequest,
    Limits,
    QuotaRequest,
    QuotaStore,
    Reservation,
    Scope,
    Usage,
    build_scopes,
)
from gateway.quota.limits import seconds_to_next_day, seconds_to_next_month
from tests.quota.conftest import StoreFactory


def req(
    tenant: str, scopes: tuple[Scope, ...], est: int = 100, ttl: float = 30.0, rid: str = ""
) -> QuotaRequest:
    return QuotaRequest(
        request_id=rid or uuid.uuid4().hex,
        tenant=tenant,
        scopes=scopes,
        estimated_tokens=est,
        lease_ttl=ttl,
    )


def only(**limits: int) -> tuple[Scope, ...]:
    return (Scope("tenant", Limits(**limits)),)


async def admit(store: QuotaStore, request: QuotaRequest) -> Reservation:
    decision = await store.reserve(request)
    assert decision.admitted and decision.reservation is not None, decision
    return decision.reservation


async def test_rpm_admits_exactly_rpm_then_refuses(store: QuotaStore, tenant: str) -> None:
    """rpm=5: five admissions, then a refusal naming rpm with ~60 s to wait."""
    for _ in range(5):
        await admit(store, req(tenant, only(rpm=5)))
    decision = await store.reserve(req(tenant, only(rpm=5)))
    assert not decision.admitted and decision.reservation is None
    assert (decision.scope, decision.limit) == ("tenant", "rpm")
    assert 55.0 < decision.retry_after <= 60.0
    assert (await store.usage(tenant, "tenant")).requests == 5


async def test_rpm_window_rolls(make_store: StoreFactory, tenant: str) -> None:
    """After retry_after the oldest admission has left the window and one more fits."""
    store = make_store(window=0.5)
    for _ in range(3):
        await admit(store, req(tenant, only(rpm=3)))
    decision = await store.reserve(req(tenant, only(rpm=3)))
    assert decision.limit == "rpm" and 0.3 < decision.retry_after <= 0.5
    await asyncio.sleep(decision.retry_after + 0.05)
    await admit(store, req(tenant, only(rpm=3)))


async def test_rpm_zero_refuses_everything(store: QuotaStore, tenant: str) -> None:
    decision = await store.reserve(req(tenant, only(rpm=0)))
    assert decision.limit == "rpm" and decision.retry_after > 0


async def test_tpm_counts_tokens_and_settle_returns_unused(store: QuotaStore, tenant: str) -> None:
    """tpm=1000 with 400-token estimates: two fit; settling one at 100 frees room for a third."""
    scopes = only(tpm=1000)
    first = await admit(store, req(tenant, scopes, est=400))
    await admit(store, req(tenant, scopes, est=400))
    refused = await store.reserve(req(tenant, scopes, est=400))
    assert (refused.scope, refused.limit) == ("tenant", "tpm")
    assert 55.0 < refused.retry_after <= 60.0
    assert await store.settle(first, 100)
    await admit(store, req(tenant, scopes, est=400))
    assert (await store.usage(tenant, "tenant")).tokens == 900


async def test_tpm_estimate_above_limit_never_fits(store: QuotaStore, tenant: str) -> None:
    decision = await store.reserve(req(tenant, only(tpm=100), est=101))
    assert decision.limit == "tpm" and decision.retry_after == pytest.approx(60.0)


async def test_concurrency_leases(store: QuotaStore, tenant: str) -> None:
    """concurrency=2: a third request waits (hint <= 1 s) until one settles."""
    scopes = only(concurrency=2)
    first = await admit(store, req(tenant, scopes))
    await admit(store, req(tenant, scopes))
    refused = await store.reserve(req(tenant, scopes))
    assert (refused.scope, refused.limit) == ("tenant", "concurrency")
    assert 0.0 < refused.retry_after <= 1.0
    assert (await store.usage(tenant, "tenant")).in_flight == 2
    await store.settle(first, 10)
    await admit(store, req(tenant, scopes))


async def test_lease_expires_without_renew(store: QuotaStore, tenant: str) -> None:
    """A lease nobody renews frees its slot after the TTL; renewing it then reports the loss."""
    scopes = only(concurrency=1)
    lost = await admit(store, req(tenant, scopes, ttl=0.3))
    assert (await store.reserve(req(tenant, scopes))).limit == "concurrency"
    await asyncio.sleep(0.4)
    await admit(store, req(tenant, scopes))
    assert not await store.renew(lost)


async def test_renew_keeps_a_lease_alive(store: QuotaStore, tenant: str) -> None:
    scopes = only(concurrency=1)
    held = await admit(store, req(tenant, scopes, ttl=0.4))
    for _ in range(3):
        await asyncio.sleep(0.2)
        assert await store.renew(held)
    assert (await store.reserve(req(tenant, scopes))).limit == "concurrency"
    await store.settle(held, 0)
    assert not await store.renew(held)


async def test_day_budget(store: QuotaStore, tenant: str) -> None:
    """A daily budget refuses until the next UTC midnight."""
    await admit(store, req(tenant, only(tokens_per_day=1000), est=600))
    decision = await store.reserve(req(tenant, only(tokens_per_day=1000), est=600))
    assert (decision.scope, decision.limit) == ("tenant", "tokens_per_day")
    assert decision.retry_after == pytest.approx(seconds_to_next_day(time.time()), abs=2.0)
    await admit(store, req(tenant, only(tokens_per_day=1000), est=400))
    assert (await store.usage(tenant, "tenant")).tokens_today == 1000


async def test_month_budget(store: QuotaStore, tenant: str) -> None:
    """A monthly budget refuses until the first UTC midnight of next month."""
    await admit(store, req(tenant, only(tokens_per_month=1000), est=600))
    decision = await store.reserve(req(tenant, only(tokens_per_month=1000), est=600))
    assert decision.limit == "tokens_per_month"
    assert decision.retry_after == pytest.approx(seconds_to_next_month(time.time()), abs=2.0)
    assert (await store.usage(tenant, "tenant")).tokens_this_month == 600


async def test_tightest_scope_binds_and_refusal_reserves_nothing(
    store: QuotaStore, tenant: str
) -> None:
    """Tenant rpm 10, key rpm 3, model tpm 500: the key binds first, then the model; a refused
    request leaves every scope as it was."""
    scopes = build_scopes(
        Limits(rpm=10, tpm=10_000, concurrency=10, tokens_per_day=10_000),
        key_id="k1",
        key=Limits(rpm=3),
        model="m1",
        per_model=Limits(tpm=500),
    )
    assert [s.name for s in scopes] == ["tenant", "key:k1", "model:m1"]
    for _ in range(3):
        await admit(store, req(tenant, scopes, est=100))
    before = {s.name: await store.usage(tenant, s.name) for s in scopes}
    refused = await store.reserve(req(tenant, scopes, est=100))
    assert (refused.scope, refused.limit) == ("key:k1", "rpm")
    assert {s.name: await store.usage(tenant, s.name) for s in scopes} == before

    other_key = build_scopes(
        scopes[0].limits, key_id="k2", key=Limits(rpm=3), model="m1", per_model=Limits(tpm=500)
    )
    refused = await store.reserve(req(tenant, other_key, est=300))
    assert (refused.scope, refused.limit) == ("model:m1", "tpm")
    assert await store.usage(tenant, "tenant") == before["tenant"]
    assert await store.usage(tenant, "key:k2") == Usage()


async def test_settle_charges_overshoot_past_the_limit(store: QuotaStore, tenant: str) -> None:
    """Estimates 2x500 fit tpm=1000; actuals 2x800 are charged anyway (1600), and the next
    request is refused until tokens leave the window."""
    scopes = only(tpm=1000, tokens_per_day=1000, tokens_per_month=5000)
    a = await admit(store, req(tenant, scopes, est=500))
    b = await admit(store, req(tenant, scopes, est=500))
    assert await store.settle(a, 800) and await store.settle(b, 800)
    used = await store.usage(tenant, "tenant")
    assert (used.tokens, used.tokens_today, used.tokens_this_month) == (1600, 1600, 1600)
    assert (await store.reserve(req(tenant, scopes, est=1))).limit in ("tpm", "tokens_per_day")


async def test_settle_is_idempotent(store: QuotaStore, tenant: str) -> None:
    scopes = only(tpm=1000, concurrency=5, tokens_per_day=9999)
    held = await admit(store, req(tenant, scopes, est=500))
    assert await store.settle(held, 200) is True
    after = await store.usage(tenant, "tenant")
    assert await store.settle(held, 900) is False
    assert await store.cancel(held) is False
    assert await store.usage(tenant, "tenant") == after
    assert (after.tokens, after.in_flight, after.tokens_today) == (200, 0, 200)


async def test_cancel_returns_tokens_but_counts_the_request(store: QuotaStore, tenant: str) -> None:
    scopes = only(rpm=10, tpm=1000, concurrency=1)
    held = await admit(store, req(tenant, scopes, est=700))
    assert await store.cancel(held)
    used = await store.usage(tenant, "tenant")
    assert (used.requests, used.tokens, used.in_flight) == (1, 0, 0)


async def test_reserve_is_idempotent_by_request_id(store: QuotaStore, tenant: str) -> None:
    """A retried reserve (reply lost) returns the same reservation and counts once."""
    scopes = only(rpm=10, tpm=1000)
    first = await admit(store, req(tenant, scopes, est=300, rid="same"))
    again = await admit(store, req(tenant, scopes, est=300, rid="same"))
    assert again.request_id == first.request_id
    assert again.expires_at == pytest.approx(first.expires_at, abs=1e-3)
    assert (await store.usage(tenant, "tenant")).requests == 1


async def test_unlimited_scope_always_admits(store: QuotaStore, tenant: str) -> None:
    held = await admit(store, req(tenant, (Scope("tenant", Limits()),)))
    assert await store.settle(held, 5)


def test_bad_ids_are_refused_before_any_io(tenant: str) -> None:
    with pytest.raises(InvalidQuotaRequest):
        req("a}b", only(rpm=1))
    with pytest.raises(InvalidQuotaRequest):
        req(tenant, only(rpm=1), est=-1)
    with pytest.raises(ValueError):
        Scope("x{y}", Limits())


def cost_scopes(day: int | None = None, month: int | None = None,
                rpm: int | None = None) -> tuple[Scope, ...]:
    """A token scope (rpm) beside a cost scope with spend budgets in micro-units."""
    return (
        Scope("tenant", Limits(rpm=rpm if rpm is not None else 1000)),
        Scope("cost", Limits(tokens_per_day=day, tokens_per_month=month), unit="cost"),
    )


def creq(tenant: str, scopes: tuple[Scope, ...], tokens: int, cost: int) -> QuotaRequest:
    return QuotaRequest(request_id=uuid.uuid4().hex, tenant=tenant, scopes=scopes,
                        estimated_tokens=tokens, estimated_cost=cost)


async def test_cost_budget_counts_cost_not_tokens(store: QuotaStore, tenant: str) -> None:
    """A cost scope reserves the estimated cost; token counts do not touch it."""
    scopes = cost_scopes(day=1_000_000)
    for _ in range(4):
        await admit(store, creq(tenant, scopes, tokens=10_000_000, cost=250_000))
    decision = await store.reserve(creq(tenant, scopes, tokens=1, cost=1))
    assert not decision.admitted
    assert (decision.scope, decision.limit) == ("cost", "tokens_per_day")
    assert 0 < decision.retry_after <= seconds_to_next_day(time.time()) + 1
    assert (await store.usage(tenant, "cost")).tokens_today == 1_000_000


async def test_cost_settle_returns_unused_and_charges_overshoot(
    store: QuotaStore, tenant: str
) -> None:
    scopes = cost_scopes(day=1_000, month=5_000)
    res = await admit(store, creq(tenant, scopes, tokens=100, cost=600))
    assert await store.settle(res, 50, 200)  # cheaper than estimated: 400 come back
    usage = await store.usage(tenant, "cost")
    assert (usage.tokens_today, usage.tokens_this_month) == (200, 200)
    res = await admit(store, creq(tenant, scopes, tokens=100, cost=700))
    assert await store.settle(res, 100, 1_500)  # overshoot is charged past the budget
    usage = await store.usage(tenant, "cost")
    assert usage.tokens_today == 1_700
    refused = await store.reserve(creq(tenant, scopes, tokens=1, cost=1))
    assert not refused.admitted and refused.limit == "tokens_per_day"
    res_none = await store.reserve(creq(tenant, cost_scopes(month=5_000), tokens=1, cost=10))
    assert res_none.admitted and res_none.reservation is not None
    assert await store.settle(res_none.reservation, 1)  # no actual cost: the estimate stays
    assert (await store.usage(tenant, "cost")).tokens_this_month == 1_710


async def test_cost_refusal_reserves_nothing_anywhere(store: QuotaStore, tenant: str) -> None:
    """Over budget: refused, and the token scope's rpm was not charged either."""
    scopes = cost_scopes(day=100, rpm=10)
    decision = await store.reserve(creq(tenant, scopes, tokens=5, cost=101))
    assert not decision.admitted and decision.scope == "cost"
    assert (await store.usage(tenant, "tenant")).requests == 0
