"""The operator page's new figures as data: the budgets of teams and organizations with what is
used of them and the alerts sent (after a threshold fires, on the memory and the Redis quota
store: the marks the store keeps equal what its alert sink received), the TTFT percentiles of a
known sample and of a backend's ring, the engine signals, and the gates' chart."""

from __future__ import annotations

import random
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

import pytest

from gateway.config import parse_policy
from gateway.console.budgets import Budget, budget_section
from gateway.console.live import percentiles, pool_stats
from gateway.console.rollouts import gate_chart
from gateway.quota.base import QuotaRequest
from gateway.quota.memory import MemoryQuotaStore
from gateway.quota.redis import RedisQuotaStore
from gateway.routing.backend import TTFT_SAMPLES
from gateway.runtime import Runtime
from tests.process_marker import PROCESS

if TYPE_CHECKING:
    from gateway.quota.alerts import BudgetAlert
    from gateway.quota.base import QuotaStore


class Sink:
    """What a store's alert sink receives."""

    def __init__(self) -> None:
        self.alerts: list[BudgetAlert] = []

    def __call__(self, alerts: Sequence[BudgetAlert]) -> None:
        self.alerts.extend(alerts)


@pytest.fixture(params=["memory", *(pytest.param(kind, marks=PROCESS)
                                    for kind in ("redis", "redis-py", "cluster"))])
async def stores(request: pytest.FixtureRequest) -> AsyncIterator[tuple[QuotaStore, Sink]]:
    """A store of each kind (Redis with the pipelined client, redis-py, Cluster) and its
    alert sink."""
    sink = Sink()
    store: QuotaStore
    kind: str = request.param
    if kind == "memory":
        store = MemoryQuotaStore(alerts=sink)
    else:  # generous timeouts: the test box is shared
        server = request.getfixturevalue("redis_cluster" if kind == "cluster" else "redis_proc")
        store = RedisQuotaStore.from_url(server.url, cluster=kind == "cluster", timeout=30.0,
                                         connect_timeout=30.0, pipelined=kind == "redis",
                                         alerts=sink)
    yield store, sink
    await store.aclose()


def _runtime(tag: str) -> Runtime:
    """globex in team labs of organization corp (alerts at 50 and 90 %), acme alone; names
    carry ``tag`` so tests sharing a Redis never meet."""
    return Runtime(parse_policy({
        "plans": [{"name": "std", "limits": {"tokens_per_day": 1000, "cost_per_month": "1"}}],
        "organizations": [{"name": f"corp{tag}", "limits": {"cost_per_month": "500"},
                           "alerts": {"thresholds": [50, 90]}},
                          {"name": f"solo{tag}"}],
        "teams": [{"name": f"labs{tag}", "organization": f"corp{tag}",
                   "limits": {"tokens_per_month": 1000, "rpm": 50}}],
        "tenants": [{"name": f"globex{tag}", "plan": "std", "team": f"labs{tag}"},
                    {"name": f"acme{tag}", "plan": "std"}],
    }))


async def _spend(store: QuotaStore, runtime: Runtime, tenant: str, tokens: int,
                 cost: int) -> None:
    scopes = runtime.scopes(tenant, None, None, "m")
    decision = await store.reserve(QuotaRequest(
        request_id=uuid.uuid4().hex, tenant=tenant, scopes=scopes, estimated_tokens=tokens,
        estimated_cost=cost))
    assert decision.admitted and decision.reservation is not None
    await store.settle(decision.reservation, tokens, cost)


async def test_budgets_and_the_alerts_sent(stores: tuple[QuotaStore, Sink]) -> None:
    """600 then 350 tokens of globex: its team's month budget (1000) and its own day budget
    (1000) cross 50 % then 90 %, each alert listed once with the budget's use; the
    organization's spend budget shows the spend and no alert; acme sent none."""
    store, sink = stores
    tag = "-" + uuid.uuid4().hex[:8]
    runtime = _runtime(tag)
    tenants = [f"acme{tag}", f"globex{tag}", f"initech{tag}"]  # initech: not in the policy
    globex, labs, corp = f"globex{tag}", f"labs{tag}", f"corp{tag}"

    before = await budget_section(runtime, store, tenants)
    assert before.error == ""
    assert before.teams[labs] == [Budget("tokens_per_month", "1000", "0", 0, (50, 90), ())]
    assert before.tenants == {f"acme{tag}": "none", globex: "none"}
    assert f"solo{tag}" not in before.organizations  # no budgets set

    await _spend(store, runtime, globex, 600, 100_000)
    middle = await budget_section(runtime, store, tenants)
    assert middle.teams[labs] == [Budget("tokens_per_month", "1000", "600", 60, (50, 90), (50,))]
    assert middle.tenants[globex] == "tokens_per_day 50%"

    await _spend(store, runtime, globex, 350, 100_000)
    after = await budget_section(runtime, store, tenants)
    (team,) = after.teams[labs]
    assert (team.used, team.percent, team.sent, team.sent_text) == ("950", 95, (50, 90),
                                                                   "50%, 90%")
    assert after.organizations[corp] == [
        Budget("cost_per_month", "500.000000", "0.200000", 0, (50, 90), ())]
    assert after.tenants == {f"acme{tag}": "none", globex: "tokens_per_day 50%, 90%"}
    # what the page lists is what the sink was handed, once each
    fired = sorted((a.level, a.subject, a.budget, a.threshold) for a in sink.alerts)
    assert fired == [("team", labs, "tokens_per_month", 50), ("team", labs, "tokens_per_month", 90),
                     ("tenant", globex, "tokens_per_day", 50),
                     ("tenant", globex, "tokens_per_day", 90)]


async def test_without_quota_counters_the_section_says_so() -> None:
    section = await budget_section(_runtime(""), None, ["acme"])
    assert section.error and not section.teams and not section.tenants


def test_percentiles_of_a_known_sample() -> None:
    """Nearest rank: the p50 of 1..100 is 50, its p99 99, whatever the order."""
    sample = [float(v) for v in range(1, 101)]
    random.Random(39).shuffle(sample)
    assert percentiles(sample, (0.5, 0.99)) == [50.0, 99.0]
    assert percentiles([4.0, 1.0, 3.0, 2.0], (0.5, 0.99, 1.0)) == [2.0, 4.0, 4.0]
    assert percentiles([7.0], (0.5, 0.99)) == [7.0, 7.0]
    assert percentiles([], (0.5, 0.99)) == [None, None]


def _router_runtime() -> Runtime:
    return Runtime(parse_policy({
        "pools": [{"name": "p", "backends": [{"name": "a", "url": "http://127.0.0.1:9"},
                                             {"name": "b", "url": "http://127.0.0.1:10"}],
                   "signals": {"interval": 5}},
                  {"name": "q", "backends": [{"name": "c", "url": "http://127.0.0.1:11"}]}],
        "models": [{"name": "m", "pool": "p"}],
    }))


def test_live_ttft_percentiles_over_the_last_samples() -> None:
    """A backend keeps its last 256 TTFTs: after 1..300 ms, the p50 and p99 are those of
    45..300 ms; the pool's p50 is over its own last 256; no sample, no figure."""
    router = _router_runtime().router
    pool = router.pools["p"]
    a = pool.backends[0]
    for ms in range(1, 301):
        a.observe(ms / 1000, None)
        pool.observe_ttft(ms / 1000)
    assert len(a.ttft_recent) == TTFT_SAMPLES == 256
    p50, p99 = percentiles(range(45, 301), (0.5, 0.99))
    live = {p["pool"]: p for p in pool_stats(router, 0.0)}
    backends = {b["backend"]: b for b in live["p"]["backends"]}
    assert (backends["a"]["ttft_p50_ms"], backends["a"]["ttft_p99_ms"]) == (p50, p99)
    assert backends["a"]["ttft_samples"] == 256
    assert live["p"]["ttft_p50_ms"] == p50
    assert (backends["b"]["ttft_p50_ms"], backends["b"]["ttft_p99_ms"]) == (None, None)
    assert live["q"]["ttft_p50_ms"] is None


def test_engine_signals_are_shown_when_scraped() -> None:
    """A pool that scrapes its engines shows what the last scrape read; a backend whose scrape
    held no engine names, or a pool that scrapes nothing, shows None."""
    router = _router_runtime().router
    a, b = router.pools["p"].backends
    a.detected_engine, a.engine_waiting, a.engine_running, a.engine_kv_usage = (
        "vllm", 3.0, 5.0, 0.4213)
    b.signals_missing = True
    live = {p["pool"]: p for p in pool_stats(router, 0.0)}
    first, second = live["p"]["backends"]
    assert first["engine"] == {"engine": "vllm", "waiting": 3.0, "running": 5.0,
                               "kv_cache": 0.4213}
    assert second["engine"] is None
    assert live["q"]["backends"][0]["engine"] is None


def test_gate_chart_puts_each_gate_against_its_threshold() -> None:
    """Per gate and class: the canary and the baseline as % of the threshold (error rate:
    baseline + max_increase; latency: the threshold the gate computed, else max_ratio x the
    baseline; agreement: its min), with the figures; a figure not measured yet is None."""
    gates: list[dict[str, Any]] = [
        {"name": "error_rate", "verdict": "pass", "classes": {
            "interactive": {"canary": 0.02, "baseline": 0.01, "max_increase": 0.01,
                            "z": -0.3, "verdict": "pass"}}},
        {"name": "ttft_p90", "verdict": "fail", "classes": {
            "batch": {"canary_p90": 300.0, "baseline_p90": 100.0, "max_ratio": 1.25,
                      "samples": [40, 40], "threshold": 150.0, "verdict": "fail"},
            "interactive": {"canary_p90": None, "baseline_p90": 80.0, "max_ratio": 1.25,
                            "samples": [0, 40], "verdict": "wait"}}},
        {"name": "tpot_p90", "verdict": "pass", "classes": {}},
        {"name": "shadow_agreement", "verdict": "pass", "rate": 0.95, "compared": 100,
         "min": 0.9},
    ]
    chart = gate_chart(gates)
    assert chart["labels"] == ["error_rate (interactive)", "ttft_p90 (batch)",
                               "ttft_p90 (interactive)", "shadow_agreement"]
    assert chart["canary"] == [100.0, 200.0, None, 105.6]
    assert chart["baseline"] == [50.0, 66.7, 80.0, None]
    assert chart["threshold"] == [100.0, 100.0, 100.0, 100.0]
    assert [f["threshold"] for f in chart["figures"]] == [0.02, 150.0, 100.0, 0.9]
    assert [f["verdict"] for f in chart["figures"]] == ["pass", "fail", "wait", "pass"]
