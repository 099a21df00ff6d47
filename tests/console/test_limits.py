"""The limits in use (``gateway.console.limits``) against the quota store's own decisions: after
N admissions, each scope's ``used`` is N and the tightest scope's ``remaining`` is the
``x-ratelimit-remaining-requests`` of the last decision; team and organization budgets are
shown with their alert thresholds, spend in money; the bound on failed sign-ins."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config import parse_policy
from gateway.console.limits import limits_in_use, scope_label
from gateway.console.rollouts import figures_text
from gateway.console.signin_limit import SignInLimiter
from gateway.quota.base import QuotaRequest
from gateway.quota.memory import MemoryQuotaStore
from gateway.runtime import Runtime


def _runtime(**tenant: Any) -> Runtime:
    return Runtime(parse_policy({
        "plans": [{"name": "std", "limits": {"rpm": 60, "tpm": 10_000, "concurrency": 4,
                                              "tokens_per_day": 1000, "cost_per_month": "5"},
                   "models": {"m": {"rpm": 6}}}],
        "organizations": [{"name": "org", "limits": {"tokens_per_month": 99_999},
                           "alerts": {"thresholds": [25, 75]}}],
        "teams": [{"name": "red", "organization": "org", "limits": {"tpm": 7_000}}],
        "tenants": [{"name": "acme", "plan": "std", **tenant}],
        "pools": [{"name": "p", "backends": [{"name": "b", "url": "http://127.0.0.1:9"}]}],
        "models": [{"name": "m", "pool": "p"}],
    }))


async def _admit(runtime: Runtime, store: MemoryQuotaStore, n: int,
                 key: dict[str, int]) -> Any:
    decision = None
    for i in range(n):
        scopes = runtime.scopes("acme", "k1", key, "m")
        decision = await store.reserve(QuotaRequest(request_id=f"r{i}", tenant="acme",
                                                    scopes=scopes, estimated_tokens=10))
        assert decision.admitted
    return decision


@pytest.mark.parametrize("placement", [{}, {"team": "red"}], ids=["alone", "in-a-team"])
async def test_used_and_remaining_are_the_headers_figures(placement: dict[str, Any]) -> None:
    runtime, store = _runtime(**placement), MemoryQuotaStore()
    decision = await _admit(runtime, store, 3, {"rpm": 5})
    in_use = await limits_in_use(runtime, store, "acme", "k1", {"rpm": 5})
    assert in_use.error == ""
    rows = {(r.scope, r.name): r for r in in_use.rows}
    assert (rows["tenant", "rpm"].limit, rows["tenant", "rpm"].used) == ("60", "3")
    assert rows["model m", "rpm"].used == "3"
    key = rows["API key k1", "rpm"]  # the tightest: 2 left, as the header said
    assert (key.used, key.remaining) == ("3", "2")
    assert decision.ratelimit.remaining_requests == 2
    assert rows["tenant", "tpm"].used == "30"  # the estimates, held until settled
    assert rows["tenant", "concurrency"].used == "3"  # three leases live
    assert rows["tenant", "tokens_per_day"].used == "30"
    assert rows["tenant spend", "cost_per_month"].limit == "5.000000"
    if placement:
        assert rows["team red", "tpm"].limit == "7000"
        org = rows["organization org", "tokens_per_month"]
        assert (org.used, org.thresholds) == ("30", "25%, 75%")


async def test_without_a_quota_store_the_page_says_so() -> None:
    in_use = await limits_in_use(_runtime(), None, "acme", None, None)
    assert in_use.rows == [] and in_use.error


@pytest.mark.parametrize(("name", "label"), [
    ("tenant", "tenant"), ("key:k1", "API key k1"), ("cost", "tenant spend"),
    ("model:m/x", "model m/x"), ("cost:model:m", "model m spend"),
    ("tenant:acme", "tenant"), ("tenant:acme/key:k1", "API key k1"),
    ("org:o", "organization o"), ("org:o/cost", "organization o spend"),
    ("team:t/cost", "team t spend"),
])
def test_scope_labels(name: str, label: str) -> None:
    assert scope_label(name, "acme") == label


def test_gate_figures_as_text() -> None:
    gate = {"name": "error_rate", "verdict": "pass",
            "classes": {"interactive": {"canary": 0, "z": -0.3781}}}
    assert figures_text(gate) == "classes {interactive: {canary: 0, z: -0.3781}}"


def test_failed_sign_ins_are_bounded_per_address() -> None:
    now = [1000.0]
    limiter = SignInLimiter(limit=3, window=60, clock=lambda: now[0])
    for _ in range(3):
        assert limiter.retry_after("10.0.0.1") is None
        limiter.failed("10.0.0.1")
    assert limiter.retry_after("10.0.0.1") == 60
    assert limiter.retry_after("10.0.0.2") is None  # another address is not held
    now[0] += 59.5
    assert limiter.retry_after("10.0.0.1") == 1
    now[0] += 0.5  # the oldest failure leaves the window
    assert limiter.retry_after("10.0.0.1") is None
