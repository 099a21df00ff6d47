"""Organizations and teams in the policy: loading, clear refusals, and the scopes they make."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config import PolicyError, load_policy
from gateway.quota.limits import Partition
from gateway.runtime import Runtime

BASE: dict[str, Any] = {
    "auth": {"required": False},
    "pools": [{"name": "p", "backends": [{"url": "http://127.0.0.1:9000"}]}],
    "models": [{"name": "m", "pool": "p"}],
    "prices": {"models": {"m": {"input": "1", "output": "2"}}},
    "plans": [{"name": "std", "limits": {"tokens_per_day": 1000, "cost_per_month": "5"}}],
    "organizations": [{"name": "bigco", "timezone": "Europe/Paris",
                       "limits": {"tokens_per_day": 10_000, "cost_per_day": "20"},
                       "alerts": {"thresholds": [75, 100]}}],
    "teams": [{"name": "core", "organization": "bigco", "limits": {"tokens_per_month": 50_000}}],
    "tenants": [{"name": "acme", "plan": "std", "team": "core"},
                {"name": "solo", "plan": "std", "organization": "bigco"},
                {"name": "loner", "plan": "std"}],
}


def policy_with(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(json.dumps(BASE))
    for key, value in changes.items():
        data[key] = value
    return data


def load(tmp_path: Path, data: dict[str, Any]) -> Runtime:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(data))
    return Runtime(load_policy(path))


def test_placement_and_scopes(tmp_path: Path) -> None:
    runtime = load(tmp_path, BASE)
    assert runtime.placement("acme") == ("core", "bigco")
    assert runtime.placement("solo") == (None, "bigco")
    assert runtime.placement("loner") == (None, None)
    assert runtime.placement("nobody") == (None, None)
    assert runtime.placement(None) == (None, None)

    scopes = runtime.scopes("acme", "k1", {"tokens_per_day": 10}, "m")
    assert [s.name for s in scopes] == [
        "org:bigco", "team:core", "tenant:acme", "tenant:acme/key:k1",
        "org:bigco/cost", "tenant:acme/cost"]
    assert {s.partition for s in scopes} == {Partition("bigco", "Europe/Paris")}
    assert [(s.alerts.level, s.alerts.subject, s.alerts.thresholds) for s in scopes
            if s.alerts is not None] == [
        ("organization", "bigco", (75, 100)), ("team", "core", (75, 100)),
        ("tenant", "acme", (75, 100)), ("key", "k1", (75, 100)),
        ("organization", "bigco", (75, 100)), ("tenant", "acme", (75, 100))]
    cost = {s.name: s for s in scopes}["org:bigco/cost"]
    assert cost.unit == "cost" and cost.limits.tokens_per_day == 20_000_000  # micro-units

    solo = runtime.scopes("solo", None, None, "m")
    assert [s.name for s in solo] == ["org:bigco", "tenant:solo", "org:bigco/cost",
                                      "tenant:solo/cost"]


def test_tenants_outside_an_org_keep_their_scope_names(tmp_path: Path) -> None:
    """The names (so the Redis keys) of a tenant without organization are what they were;
    its budgets alert at the policy's default thresholds."""
    runtime = load(tmp_path, BASE)
    scopes = runtime.scopes("loner", "k", {"tokens_per_day": 5}, "m")
    assert [(s.name, s.partition) for s in scopes] == [
        ("tenant", None), ("key:k", None), ("cost", None)]
    assert [s.alerts.level if s.alerts else None for s in scopes] == ["tenant", "key", "tenant"]
    assert scopes[0].alerts is not None and scopes[0].alerts.thresholds == (50, 80, 100)


@pytest.mark.parametrize(
    ("changes", "field", "problem"),
    [
        pytest.param({"teams": [{"name": "core", "organization": "nope"}]},
                     "$.teams[0].organization", "unknown organization 'nope'", id="team-org"),
        pytest.param({"tenants": [{"name": "a", "plan": "std", "team": "ghost"}]},
                     "$.tenants[0].team", "unknown team 'ghost' (teams: core)",
                     id="tenant-team"),
        pytest.param({"tenants": [{"name": "a", "plan": "std", "organization": "x"}]},
                     "$.tenants[0].organization", "unknown organization 'x'", id="tenant-org"),
        pytest.param({"organizations": [*BASE["organizations"], {"name": "other"}],
                      "tenants": [{"name": "a", "plan": "std", "team": "core",
                                   "organization": "other"}]},
                     "$.tenants[0].organization",
                     "team 'core' belongs to organization 'bigco', not 'other'",
                     id="team-in-another-org"),
        pytest.param({"organizations": [{"name": "bigco", "timezone": "Europe/Atlantis"}]},
                     "$.organizations[0].timezone", "unknown timezone 'Europe/Atlantis'",
                     id="timezone"),
        pytest.param({"organizations": [{"name": "bigco", "timezone": "../../etc/passwd"}]},
                     "$.organizations[0].timezone", "unknown timezone", id="timezone-path"),
        pytest.param({"organizations": [{"name": "bigco"}, {"name": "bigco"}]},
                     "$.organizations[1].name", "duplicate name 'bigco'", id="duplicate-org"),
        pytest.param({"organizations": [{"name": "big:co"}]},
                     "$.organizations[0].name", "matching regex", id="org-name"),
        pytest.param({"alerts": {"thresholds": [50, 50]}}, "$.alerts.thresholds",
                     "repeated threshold", id="repeated-threshold"),
        pytest.param({"alerts": {"thresholds": [120]}}, "$.alerts.thresholds[0]",
                     "<= 100", id="threshold-range"),
        pytest.param({"alerts": {"webhook_url_env": "HOOK"}}, "$.alerts.webhook_secret_env",
                     "HMAC-signed", id="webhook-without-secret"),
    ],
)
def test_bad_placements_are_refused(tmp_path: Path, changes: dict[str, Any], field: str,
                                    problem: str) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy_with(**changes)))
    with pytest.raises(PolicyError) as err:
        load_policy(path)
    assert err.value.field == field, err.value
    assert problem in err.value.problem, err.value


def test_the_shipped_example_loads() -> None:
    """policies/example-budgets.yaml (the README's example) loads and places as documented."""
    from tests.helpers import REPO

    runtime = Runtime(load_policy(REPO / "policies" / "example-budgets.yaml"))
    assert runtime.placement("search") == ("platform", "acme")
    assert runtime.placement("lab") == (None, None)
    names = [s.name for s in runtime.scopes("search", "search-ci", {"tokens_per_day": 200000},
                                            "llama-3.1-8b-chat")]
    assert names == ["org:acme", "team:platform", "tenant:search", "tenant:search/key:search-ci",
                     "org:acme/cost", "team:platform/cost", "tenant:search/cost"]
    assert runtime.alerts_for("acme").webhook_url_env == "ACME_BUDGET_WEBHOOK_URL"
    assert runtime.alerts_for(None).thresholds == [80, 100]
