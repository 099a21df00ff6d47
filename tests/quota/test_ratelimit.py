"""The ``x-ratelimit-*`` figures every store returns with a decision (``RateLimitState``).

Run against memory, Redis (the pipelined client and redis-py) and Redis Cluster: the same
figures from the same sequence, in the same single round trip as the reserve itself.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from gateway.quota import (
    Decision,
    Limits,
    QuotaRequest,
    QuotaStore,
    RateLimitState,
    Scope,
    build_scopes,
)
from tests.quota.conftest import StoreFactory

WINDOW = 60.0


def req(tenant: str, scopes: tuple[Scope, ...], est: int = 100, rid: str = "") -> QuotaRequest:
    return QuotaRequest(request_id=rid or uuid.uuid4().hex, tenant=tenant, scopes=scopes,
                        estimated_tokens=est)


def only(**limits: int) -> tuple[Scope, ...]:
    return (Scope("tenant", Limits(**limits)),)


async def figures(store: QuotaStore, request: QuotaRequest, admitted: bool = True
                  ) -> RateLimitState:
    decision = await store.reserve(request)
    assert decision.admitted is admitted, decision
    assert decision.ratelimit is not None, decision
    return decision.ratelimit


def key_and_tenant(tenant: Limits, key: Limits, key_id: str = "k1") -> tuple[Scope, ...]:
    return build_scopes(tenant, key_id=key_id, key=key)


async def test_remaining_counts_down_and_matches_usage(store: QuotaStore, tenant: str) -> None:
    """rpm=5, tpm=10000, 100-token estimates: each admission leaves one request and 100
    tokens fewer, always the limit minus what the store reports as used."""
    scopes = only(rpm=5, tpm=10_000)
    for n in range(1, 6):
        rl = await figures(store, req(tenant, scopes, est=100))
        used = await store.usage(tenant, "tenant")
        assert (used.requests, used.tokens) == (n, 100 * n)
        assert (rl.limit_requests, rl.remaining_requests) == (5, 5 - n)
        assert (rl.limit_tokens, rl.remaining_tokens) == (10_000, 10_000 - 100 * n)
        assert 0.0 < rl.reset_requests_s <= WINDOW and 0.0 < rl.reset_tokens_s <= WINDOW


async def test_rpm_refusal_shows_zero_left_and_when_one_frees(
    store: QuotaStore, tenant: str
) -> None:
    """At the limit the refusal reports 0 requests left and a reset equal to its wait."""
    scopes = only(rpm=2)
    for _ in range(2):
        await figures(store, req(tenant, scopes))
    decision = await store.reserve(req(tenant, scopes))
    assert not decision.admitted and decision.limit == "rpm"
    rl = decision.ratelimit
    assert rl is not None
    assert (rl.limit_requests, rl.remaining_requests) == (2, 0)
    assert 0.0 < rl.reset_requests_s <= WINDOW
    assert rl.reset_requests_s == pytest.approx(decision.retry_after, abs=1e-3)
    assert rl.limit_tokens is None  # no scope sets tpm
    assert (await store.usage(tenant, "tenant")).requests == 2  # the refusal counted nothing


async def test_tpm_refusal_shows_tokens_as_they_stand(store: QuotaStore, tenant: str) -> None:
    """Two 500-token estimates use tpm=1000 up: 0 left; a refused third reserves nothing, so
    the figures stay 0 left with a reset > 0; requests, unlimited, are not reported."""
    scopes = only(tpm=1000)
    assert (await figures(store, req(tenant, scopes, est=500))).remaining_tokens == 500
    assert (await figures(store, req(tenant, scopes, est=500))).remaining_tokens == 0
    rl = await figures(store, req(tenant, scopes, est=1), admitted=False)
    assert (rl.limit_tokens, rl.remaining_tokens) == (1000, 0)
    assert 0.0 < rl.reset_tokens_s <= WINDOW
    assert (rl.limit_requests, rl.remaining_requests, rl.reset_requests_s) == (None, 0, 0.0)


async def test_tokens_follow_the_estimate_and_the_settle(store: QuotaStore, tenant: str) -> None:
    """The figure is after this request's estimate; a settle below the estimate gives the
    difference back, which the next request's figure shows."""
    scopes = only(tpm=5000)
    first = await store.reserve(req(tenant, scopes, est=1200))
    assert first.ratelimit is not None and first.ratelimit.remaining_tokens == 3800
    assert first.reservation is not None and await store.settle(first.reservation, 200)
    rl = await figures(store, req(tenant, scopes, est=300))
    assert rl.remaining_tokens == 5000 - 200 - 300
    assert rl.remaining_tokens == 5000 - (await store.usage(tenant, "tenant")).tokens


async def test_key_tighter_than_tenant(store: QuotaStore, tenant: str) -> None:
    """Tenant rpm 10, key rpm 3: the key's figures."""
    scopes = key_and_tenant(Limits(rpm=10), Limits(rpm=3))
    rl = await figures(store, req(tenant, scopes))
    assert (rl.limit_requests, rl.remaining_requests) == (3, 2)


async def test_tenant_tighter_than_key(store: QuotaStore, tenant: str) -> None:
    """Tenant rpm 4, key rpm 10: the tenant's figures."""
    scopes = key_and_tenant(Limits(rpm=4), Limits(rpm=10))
    rl = await figures(store, req(tenant, scopes))
    assert (rl.limit_requests, rl.remaining_requests) == (4, 3)


async def test_tightest_is_fewest_left_not_smallest_limit(store: QuotaStore, tenant: str) -> None:
    """Tenant rpm 10 of which key k1 used 8; key k2 has rpm 5 untouched: after k2's request
    the tenant has 1 left and k2 has 4, so the tenant's (larger) limit is the tightest."""
    tenant_limits = Limits(rpm=10)
    for _ in range(8):
        await figures(store, req(tenant, key_and_tenant(tenant_limits, Limits(rpm=100))))
    rl = await figures(store, req(tenant, key_and_tenant(tenant_limits, Limits(rpm=5), "k2")))
    assert (rl.limit_requests, rl.remaining_requests) == (10, 1)
    # and k1, at 9 of its own 100, still reports the tenant's 0 left
    rl = await figures(store, req(tenant, key_and_tenant(tenant_limits, Limits(rpm=100))))
    assert (rl.limit_requests, rl.remaining_requests) == (10, 0)


async def test_requests_and_tokens_may_come_from_different_scopes(
    store: QuotaStore, tenant: str
) -> None:
    """Key rpm 3 binds the requests, the model's tpm 500 the tokens."""
    scopes = build_scopes(Limits(rpm=100, tpm=100_000), key_id="k", key=Limits(rpm=3),
                          model="m", per_model=Limits(tpm=500))
    rl = await figures(store, req(tenant, scopes, est=200))
    assert (rl.limit_requests, rl.remaining_requests) == (3, 2)
    assert (rl.limit_tokens, rl.remaining_tokens) == (500, 300)


async def test_a_tie_goes_to_the_first_scope(store: QuotaStore, tenant: str) -> None:
    """Tenant rpm 6 and key rpm 4, after two tenant-only requests both have 3 left before
    the key's first: the tenant (first scope) is reported."""
    for _ in range(2):
        await figures(store, req(tenant, only(rpm=6)))
    rl = await figures(store, req(tenant, key_and_tenant(Limits(rpm=6), Limits(rpm=4))))
    assert (rl.limit_requests, rl.remaining_requests) == (6, 3)


async def test_reset_is_when_the_oldest_entry_leaves(store: QuotaStore, tenant: str) -> None:
    """The first request of an empty window resets a full window later; a later one reports
    the first (still the oldest) leaving: sooner than a full window from its own time."""
    scopes = only(rpm=10, tpm=10_000)
    first = await figures(store, req(tenant, scopes))
    assert first.reset_requests_s == pytest.approx(WINDOW, abs=1e-3)
    assert first.reset_tokens_s == pytest.approx(WINDOW, abs=1e-3)
    await asyncio.sleep(0.05)
    second = await figures(store, req(tenant, scopes))
    assert 0.0 < second.reset_requests_s < first.reset_requests_s
    assert 0.0 < second.reset_tokens_s < first.reset_tokens_s


async def test_window_rolls_remaining_back(make_store: StoreFactory, tenant: str) -> None:
    """With a 0.5 s window, once the reset has passed the next request sees the full limit
    again minus itself."""
    store = make_store(window=0.5)
    scopes = only(rpm=3)
    rl = await figures(store, req(tenant, scopes))
    await figures(store, req(tenant, scopes))
    assert rl.reset_requests_s <= 0.5
    await asyncio.sleep(0.6)
    rl = await figures(store, req(tenant, scopes))
    assert rl.remaining_requests == 2


async def test_a_zero_limit_never_frees(store: QuotaStore, tenant: str) -> None:
    rl = await figures(store, req(tenant, only(rpm=0, tpm=0), est=0), admitted=False)
    assert (rl.limit_requests, rl.remaining_requests) == (0, 0)
    assert rl.reset_requests_s == pytest.approx(WINDOW)
    assert rl.reset_tokens_s == pytest.approx(WINDOW)


async def test_an_empty_window_resets_at_once(store: QuotaStore, tenant: str) -> None:
    """Refused by another limit with nothing counted yet: the tpm window is empty, so its
    reset is 0 and every token is left."""
    rl = await figures(store, req(tenant, only(tpm=1000, concurrency=0)), admitted=False)
    assert (rl.limit_tokens, rl.remaining_tokens, rl.reset_tokens_s) == (1000, 1000, 0.0)


@pytest.mark.parametrize("scopes", [
    pytest.param(only(concurrency=5, tokens_per_day=10_000), id="no-rpm-no-tpm"),
    pytest.param((Scope("tenant", Limits(concurrency=5)),
                  Scope("cost", Limits(tpm=1_000_000), unit="cost")), id="cost-tpm-only"),
])
async def test_none_without_rpm_or_token_tpm(store: QuotaStore, tenant: str,
                                              scopes: tuple[Scope, ...]) -> None:
    """No figures when nothing sets rpm or a token tpm (a cost scope's tpm counts money)."""
    decision = await store.reserve(req(tenant, scopes))
    assert decision.admitted and decision.ratelimit is None


async def test_cost_scope_is_not_a_token_limit(store: QuotaStore, tenant: str) -> None:
    """A cost scope with a tighter tpm than the tenant's does not stand in for tokens."""
    scopes = (Scope("tenant", Limits(tpm=10_000)), Scope("cost", Limits(tpm=10), unit="cost"))
    request = QuotaRequest(request_id=uuid.uuid4().hex, tenant=tenant, scopes=scopes,
                           estimated_tokens=100, estimated_cost=5)
    rl = await figures(store, request)
    assert (rl.limit_tokens, rl.remaining_tokens) == (10_000, 9_900)


async def test_replay_of_a_live_reservation_has_no_figures(store: QuotaStore,
                                                           tenant: str) -> None:
    """A retried reserve returns the same reservation, counts nothing and reports nothing."""
    scopes = only(rpm=10)
    first = await store.reserve(req(tenant, scopes, rid="same"))
    again = await store.reserve(req(tenant, scopes, rid="same"))
    assert first.ratelimit is not None and first.ratelimit.remaining_requests == 9
    assert again.admitted and again.ratelimit is None
    rl = await figures(store, req(tenant, scopes))
    assert rl.remaining_requests == 8


async def test_decision_without_figures_by_default() -> None:
    """Existing callers that build a Decision keep working: the field defaults to None."""
    assert Decision(admitted=False).ratelimit is None
