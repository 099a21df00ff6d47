"""Budgets at every level in one reserve, and their threshold alerts, on every store.

Scopes of tenants inside an organization share the organization's partition (its hash tag and
calendar); these run on the memory, Redis (both clients) and Redis Cluster stores.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

import pytest

from gateway.quota import Limits, QuotaRequest, QuotaStore, RedisQuotaStore, Reservation, Scope
from gateway.quota.alerts import BudgetAlert
from gateway.quota.limits import AlertRule, Partition
from tests.quota.conftest import StoreFactory
from tests.redis_servers import RedisProc


def org_scopes(org: Partition, tenant: str, *, team_day: int | None = None,
               tenant_day: int | None = None, org_day: int | None = None,
               thresholds: tuple[int, ...] = (50, 80, 100)) -> tuple[Scope, ...]:
    """The scopes of one tenant of ``org`` in team ``core``, each with alerts."""
    out = []
    if org_day is not None:
        out.append(Scope(f"org:{org.organization}", Limits(tokens_per_day=org_day), "tokens",
                         org, AlertRule("organization", org.organization, thresholds)))
    if team_day is not None:
        out.append(Scope("team:core", Limits(tokens_per_day=team_day), "tokens", org,
                         AlertRule("team", "core", thresholds)))
    if tenant_day is not None:
        out.append(Scope(f"tenant:{tenant}", Limits(tokens_per_day=tenant_day), "tokens", org,
                         AlertRule("tenant", tenant, thresholds)))
    return tuple(out)


def request(tenant: str, scopes: tuple[Scope, ...], est: int) -> QuotaRequest:
    return QuotaRequest(request_id=uuid.uuid4().hex, tenant=tenant, scopes=scopes,
                        estimated_tokens=est)


class Sink:
    """Collects what a store's alert sink receives."""

    def __init__(self) -> None:
        self.alerts: list[BudgetAlert] = []

    def __call__(self, alerts: Sequence[BudgetAlert]) -> None:
        self.alerts.extend(alerts)

    def fired(self) -> list[tuple[str, str, int, str]]:
        return sorted((a.level, a.subject, a.threshold, a.trigger) for a in self.alerts)


@pytest.fixture()
def org() -> Partition:
    return Partition(f"o-{uuid.uuid4().hex[:10]}")


async def test_two_levels_refuse_together_and_alert_once(
        make_store: StoreFactory, org: Partition) -> None:
    """Team budget 1000, tenant budgets 600: a spends 600 (its own level refuses next), b
    spends 400 (the team's level refuses both from then on); every threshold alerts once."""
    sink = Sink()
    store = make_store(alerts=sink)
    a = org_scopes(org, "a", team_day=1000, tenant_day=600)
    b = org_scopes(org, "b", team_day=1000, tenant_day=600)
    res = (await store.reserve(request("a", a, 600))).reservation
    assert res is not None
    assert await store.settle(res, 600)
    refused = await store.reserve(request("a", a, 1))
    assert (refused.admitted, refused.scope, refused.limit) == (
        False, "tenant:a", "tokens_per_day")
    res = (await store.reserve(request("b", b, 400))).reservation
    assert res is not None
    assert await store.settle(res, 400)
    for tenant, scopes in (("a", a), ("b", b)):
        refused = await store.reserve(request(tenant, scopes, 1))
        # both levels refuse a; the outer one is named on the tie (both free up at midnight)
        assert (refused.admitted, refused.scope, refused.limit) == (
            False, "team:core", "tokens_per_day")
    usage = await store.usage("x", "team:core", org)
    assert usage.tokens_today == 1000
    assert (await store.usage("a", "tenant:a", org)).tokens_today == 600
    assert (await store.usage("b", "tenant:b", org)).tokens_today == 400
    assert sink.fired() == [
        ("team", "core", 50, "usage"), ("team", "core", 80, "usage"),
        ("team", "core", 100, "usage"),
        ("tenant", "a", 50, "usage"), ("tenant", "a", 80, "usage"),
        ("tenant", "a", 100, "usage"), ("tenant", "b", 50, "usage"),
    ]
    team_alert = next(x for x in sink.alerts if x.level == "team" and x.threshold == 100)
    assert (team_alert.used, team_alert.limit, team_alert.tenant) == (1000, 1000, "b")
    assert team_alert.organization == org.organization
    assert team_alert.budget == "tokens_per_day"
    assert team_alert.period == datetime.fromtimestamp(team_alert.at, UTC).strftime("%Y-%m-%d")
    # more refusals and settles alert nothing more
    for _ in range(3):
        assert not (await store.reserve(request("a", a, 1))).admitted
    assert len(sink.alerts) == 7


async def test_a_refusal_reaches_100_percent(make_store: StoreFactory, org: Partition) -> None:
    """A request over the budget is refused at 30 % used: 100 alerts (trigger refusal), 50 and
    80 do not (usage has not reached them), and later usage still alerts at 50."""
    sink = Sink()
    store = make_store(alerts=sink)
    scopes = org_scopes(org, "a", tenant_day=1000)
    res = (await store.reserve(request("a", scopes, 300))).reservation
    assert res is not None and await store.settle(res, 300)
    assert sink.alerts == []
    assert not (await store.reserve(request("a", scopes, 800))).admitted
    assert sink.fired() == [("tenant", "a", 100, "refusal")]
    res = (await store.reserve(request("a", scopes, 300))).reservation
    assert res is not None and await store.settle(res, 300)
    assert sink.fired() == [("tenant", "a", 50, "usage"), ("tenant", "a", 100, "refusal")]


async def test_tenants_of_one_org_never_exceed_its_budget(
        make_store: StoreFactory, org: Partition) -> None:
    """Six tenants of one organization, 60 concurrent requests of 100 tokens each against an
    organization budget of 2,500: exactly 25 admitted, whichever tenants they come from."""
    store = make_store()

    async def one(i: int) -> bool:
        tenant = f"t{i % 6}"
        scopes = org_scopes(org, tenant, org_day=2500, tenant_day=10_000)
        decision = await store.reserve(request(tenant, scopes, 100))
        if decision.reservation is not None:
            await store.settle(decision.reservation, 100)
        return decision.admitted

    admitted = await asyncio.gather(*(one(i) for i in range(60)))
    assert sum(admitted) == 25
    assert (await store.usage("t0", f"org:{org.organization}", org)).tokens_today == 2500
    per_tenant = [(await store.usage(f"t{i}", f"tenant:t{i}", org)).tokens_today
                  for i in range(6)]
    assert sum(per_tenant) == 2500  # each tenant's own counter counted only its own


async def test_concurrent_settles_alert_each_threshold_once(
        make_store: StoreFactory, org: Partition) -> None:
    """20 requests of 50 tokens settle at once against a 1,000 budget: 50/80/100 once each."""
    sink = Sink()
    store = make_store(alerts=sink)
    scopes = org_scopes(org, "a", tenant_day=1000)
    held: list[Reservation] = []
    for _ in range(20):
        res = (await store.reserve(request("a", scopes, 0))).reservation
        assert res is not None
        held.append(res)
    await asyncio.gather(*(store.settle(r, 50) for r in held))
    assert sink.fired() == [("tenant", "a", 50, "usage"), ("tenant", "a", 80, "usage"),
                            ("tenant", "a", 100, "usage")]


async def test_two_replicas_alert_once(redis_proc: RedisProc, org: Partition) -> None:
    """Two Redis stores (two replicas) settling the same tenant's requests concurrently: each
    threshold alerts on exactly one of them."""
    sinks = [Sink(), Sink()]
    stores = [RedisQuotaStore.from_url(redis_proc.url, timeout=30.0, connect_timeout=30.0,
                                       alerts=sink) for sink in sinks]
    try:
        scopes = org_scopes(org, "a", tenant_day=1000, team_day=2000)
        held: list[tuple[RedisQuotaStore, Reservation]] = []
        for i in range(40):
            store = stores[i % 2]
            res = (await store.reserve(request("a", scopes, 0))).reservation
            assert res is not None
            held.append((store, res))
        await asyncio.gather(*(s.settle(r, 25) for s, r in held))
        fired = sorted(sinks[0].fired() + sinks[1].fired())
        assert fired == [("team", "core", 50, "usage"),
                         ("tenant", "a", 50, "usage"), ("tenant", "a", 80, "usage"),
                         ("tenant", "a", 100, "usage")]
    finally:
        for store in stores:
            await store.aclose()


async def test_tenants_outside_an_org_keep_their_keys(redis_proc: RedisProc) -> None:
    """A tenant without organization: the same key names as before organizations existed."""
    store: QuotaStore = RedisQuotaStore.from_url(redis_proc.url, timeout=30.0,
                                                 connect_timeout=30.0)
    tenant = f"t-{uuid.uuid4().hex[:10]}"
    try:
        scopes = (Scope("tenant", Limits(tokens_per_day=100), alerts=AlertRule("tenant", tenant)),
                  Scope("cost", Limits(tokens_per_month=100), unit="cost"))
        res = (await store.reserve(request(tenant, scopes, 10))).reservation
        assert res is not None
        record = f"gw:q:{{{tenant}}}:r:{res.request_id}"
        day, month = (redis_proc.cli("HGET", record, f).strip() for f in ("d", "m"))
        keys = sorted(redis_proc.cli("--scan", "--pattern", f"gw:q:{{{tenant}}}*").split())
        assert keys == [f"gw:q:{{{tenant}}}:r:{res.request_id}",
                        f"gw:q:{{{tenant}}}:s:cost:m:{month}",
                        f"gw:q:{{{tenant}}}:s:tenant:d:{day}"]
    finally:
        await store.aclose()


async def test_org_keys_share_the_org_tag(redis_proc: RedisProc, org: Partition) -> None:
    store = RedisQuotaStore.from_url(redis_proc.url, timeout=30.0, connect_timeout=30.0)
    try:
        scopes = org_scopes(org, "acme", org_day=100, tenant_day=100)
        res = (await store.reserve(request("acme", scopes, 10))).reservation
        assert res is not None
        tag = f"gw:q:{{org/{org.organization}}}"
        day = redis_proc.cli("HGET", f"{tag}:r:acme/{res.request_id}", "d").strip()
        keys = sorted(redis_proc.cli("--scan", "--pattern", f"{tag}*").split())
        assert keys == [f"{tag}:r:acme/{res.request_id}",
                        f"{tag}:s:org:{org.organization}:d:{day}",
                        f"{tag}:s:tenant:acme:d:{day}"]
    finally:
        await store.aclose()


async def test_a_probe_refusal_alerts_nobody(make_store: StoreFactory, org: Partition) -> None:
    """``admit`` first reserves a large body on a byte bound that the exact count may undo:
    that probe's refusal fires nothing; the real refusal after it does."""
    sink = Sink()
    store = make_store(alerts=sink)
    scopes = org_scopes(org, "a", tenant_day=1000)
    probe = QuotaRequest(request_id=uuid.uuid4().hex, tenant="a", scopes=scopes,
                         estimated_tokens=5000, refusal_alerts=False)
    assert not (await store.reserve(probe)).admitted
    assert sink.alerts == []
    assert not (await store.reserve(request("a", scopes, 5000))).admitted
    assert sink.fired() == [("tenant", "a", 100, "refusal")]
