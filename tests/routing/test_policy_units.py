"""Class resolution, rollout weights, retry budget, back-off, ejection: pure units."""

from __future__ import annotations

import random
import time

import pytest

from gateway.config import ApiKey, Backend, Health, Model, Retry, RouteRule, Routing, Version
from gateway.routing.backend import BackendState
from gateway.routing.classes import UnknownClass, resolve_class
from gateway.routing.retry import RetryBudget, backoff
from gateway.routing.versions import choose_version

CLASSES = {"interactive", "batch"}


def _resolve(routing: Routing, header: str | None = None, key: ApiKey | None = None,
             model: str = "m", endpoint: str = "/v1/chat/completions",
             payload: dict[str, object] | None = None, stream: bool = False,
             tenant_default: str | None = None) -> str:
    return resolve_class(routing, CLASSES, header, bool(key and key.allow_class_header),
                         key.default_class if key else None, tenant_default, model, endpoint,
                         payload or {}, stream)


def test_class_order_header_key_rules_default() -> None:
    rules = [RouteRule(request_class="batch", models=["bulk"]),
             RouteRule(request_class="batch", min_max_tokens=2000, stream=False),
             RouteRule(request_class="batch", user="etl-*")]
    routing = Routing(rules=rules)
    allowed = ApiKey(id="k", sha256="0" * 64, allow_class_header=True)
    plain = ApiKey(id="k2", sha256="0" * 64, default_class="batch")
    assert _resolve(routing) == "interactive"
    assert _resolve(routing, header="batch") == "interactive"  # key may not set it
    assert _resolve(routing, header="batch", key=allowed) == "batch"
    with pytest.raises(UnknownClass, match="interactive"):  # names the declared classes
        _resolve(routing, header="nonsense", key=allowed)
    with pytest.raises(UnknownClass):  # even where the key may not set the class
        _resolve(routing, header="nonsense")
    assert _resolve(routing, key=plain) == "batch"
    assert _resolve(routing, tenant_default="batch") == "batch"
    assert _resolve(routing, key=allowed, tenant_default="batch", header="interactive") == (
        "interactive")
    assert _resolve(routing, model="bulk") == "batch"
    assert _resolve(routing, payload={"max_tokens": 4000}) == "batch"
    assert _resolve(routing, payload={"max_tokens": 4000}, stream=True) == "interactive"
    assert _resolve(routing, payload={"user": "etl-nightly"}) == "batch"
    assert _resolve(Routing(class_header=True), header="batch") == "batch"


def test_rollout_weights_within_3_percent() -> None:
    """95/5 over 10,000 decisions lands within +/-3% of each weight."""
    model = Model(name="m", pool="p", versions=[Version(backend_model="v1", weight=95),
                                                Version(backend_model="v2", weight=5)])
    rng = random.Random(7)
    picks = [choose_version(model, None, rng) for _ in range(10_000)]
    share = sum(1 for v in picks if v is not None and v.backend_model == "v2") / 10_000
    assert abs(share - 0.05) <= 0.03 * 0.05 + 0.005  # 3% relative, plus sampling slack
    counts = {"v1": 0, "v2": 0}
    for i in range(10_000):
        v = choose_version(model, f"tenant-{i}".encode())
        assert v is not None
        counts[v.backend_model] += 1
    assert abs(counts["v2"] / 10_000 - 0.05) < 0.03 * 0.05 + 0.005
    # sticky: the same key always gets the same version
    assert len({choose_version(model, b"tenant-42").backend_model for _ in range(20)}) == 1  # type: ignore[union-attr]


def test_retry_budget_caps_retries() -> None:
    budget = RetryBudget(Retry(budget_ratio=0.1, budget_min_per_s=0.0, budget_window=10))
    for _ in range(100):
        budget.on_request()
    granted = sum(budget.try_retry() for _ in range(100))
    assert granted == 10


def test_retry_budget_minimum_allows_light_traffic() -> None:
    budget = RetryBudget(Retry(budget_ratio=0.1, budget_min_per_s=1.0, budget_window=10))
    budget.on_request()
    assert sum(budget.try_retry() for _ in range(50)) == 10  # 0.1 * 1 + 1/s * 10 s, floored


@pytest.mark.parametrize("retry", [1, 2, 3, 8])
def test_backoff_exponential_with_jitter(retry: int) -> None:
    cfg = Retry(backoff_base=0.1, backoff_max=0.5)
    cap = min(0.5, 0.1 * 2 ** (retry - 1))
    values = [backoff(cfg, retry, random.Random(i)) for i in range(50)]
    assert all(cap / 2 <= v <= cap for v in values)
    assert len(set(values)) > 1


def test_ejection_backoff_and_half_open() -> None:
    health = Health(eject_after=2, eject_base=1.0, eject_max=3.0)
    b = BackendState(Backend(url="http://x"), "x")
    now = time.monotonic()
    assert not b.on_failure(health, now)
    assert b.on_failure(health, now)  # second consecutive failure ejects for 1 s
    assert not b.available(now + 0.5)
    assert b.available(now + 1.1)  # half-open: one trial
    b.on_pick(now + 1.1)
    assert not b.available(now + 1.1)  # only one trial at a time
    assert b.on_failure(health, now + 1.2)  # trial failed: ejected for 2 s
    assert not b.available(now + 3.0) and b.available(now + 3.3)
    b.on_pick(now + 3.3)
    b.on_success()
    assert b.available(now + 3.3) and b.consecutive_failures == 0
    for _ in range(5):  # repeated ejections cap at eject_max
        b.on_failure(health, now)
        b.on_failure(health, now)
        b.ejected_until and b.on_success()
    assert b.ejections <= 5
