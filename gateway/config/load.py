"""Load policy files, validate them, and say exactly what is wrong when they are bad.

A path may be one YAML file or a directory of ``*.yaml``/``*.yml`` files (merged in name order:
lists concatenate, mappings merge, scalars must not conflict). Each file is type-checked on its own
first so an error names the file it came from; cross-references (a model's pool exists, names are
unique, API keys resolve) are checked on the merged result.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import msgspec
import yaml

from gateway.config.model import Policy

if TYPE_CHECKING:
    from gateway.config.model import Alerts, Model

__all__ = ["PolicyError", "key_hashes", "load_policy", "parse_policy"]


class PolicyError(ValueError):
    """A policy that cannot be used: names the file, the field and the problem."""

    def __init__(self, source: str, field: str, problem: str) -> None:
        self.source, self.field, self.problem = source, field, problem
        super().__init__(f"{source}: {field}: {problem}")


def _json_path(msg: str) -> tuple[str, str]:
    """Split msgspec's 'problem - at `$.a.b`' into (field, problem)."""
    problem, sep, where = msg.rpartition(" - at `")
    if not sep:
        return "$", msg
    return where.rstrip("`"), problem


def parse_policy(data: Any, source: str = "<policy>") -> Policy:
    """Type-check one mapping against the policy model."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PolicyError(
            source, "$", f"expected a mapping at the top level, got {type(data).__name__}"
        )
    try:
        return msgspec.convert(data, Policy, strict=True)
    except msgspec.ValidationError as exc:
        field, problem = _json_path(str(exc))
        raise PolicyError(source, field, problem) from exc


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "$"
        problem = getattr(exc, "problem", None) or str(exc)
        raise PolicyError(str(path), where, f"invalid YAML: {problem}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(str(path), "$", f"cannot read file: {exc}") from exc


def _merge(into: dict[str, Any], new: dict[str, Any], source: str, prefix: str = "$") -> None:
    for key, value in new.items():
        here = f"{prefix}.{key}"
        if key not in into:
            into[key] = value
        elif isinstance(into[key], list) and isinstance(value, list):
            into[key] = into[key] + value
        elif isinstance(into[key], dict) and isinstance(value, dict):
            merged = dict(into[key])
            _merge(merged, value, source, here)
            into[key] = merged
        elif into[key] != value:
            raise PolicyError(source, here, "set again with a different value by another file")


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
        if not found:
            raise PolicyError(str(path), "$", "directory holds no .yaml or .yml file")
        return found
    if not path.exists():
        raise PolicyError(str(path), "$", "no such file or directory")
    return [path]


def load_policy(path: str | os.PathLike[str]) -> Policy:
    """Load, merge and validate policy YAML from a file or a directory."""
    root = Path(path)
    merged: dict[str, Any] = {}
    for file in _files(root):
        data = _read_yaml(file)
        parse_policy(data, str(file))  # typed errors name this file
        _merge(merged, data or {}, str(file))
    policy = parse_policy(merged, str(root))
    validate(policy, str(root))
    return policy


def _unique(names: list[str], source: str, field: str) -> None:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            raise PolicyError(source, f"$.{field}[{i}].name", f"duplicate name {name!r}")
        seen.add(name)


def validate(policy: Policy, source: str = "<policy>") -> None:
    """Cross-field checks the types alone cannot express."""
    if not policy.pools:
        raise PolicyError(source, "$.pools", "at least one pool is required")
    if not policy.models:
        raise PolicyError(source, "$.models", "at least one model is required")
    _unique([p.name for p in policy.pools], source, "pools")
    _unique([m.name for m in policy.models], source, "models")
    pools = {p.name for p in policy.pools}
    for i, model in enumerate(policy.models):
        if model.pool not in pools:
            known = ", ".join(sorted(pools))
            raise PolicyError(
                source, f"$.models[{i}].pool", f"unknown pool {model.pool!r} (pools: {known})"
            )
    for i, pool in enumerate(policy.pools):
        labels = [b.label for b in pool.backends]
        for j, label in enumerate(labels):
            if labels.index(label) != j:
                raise PolicyError(
                    source, f"$.pools[{i}].backends[{j}]", f"duplicate backend {label!r}"
                )
    _validate_routing(policy, source, pools)
    for i, key in enumerate(policy.auth.keys):
        if (key.sha256 is None) == (key.key_env is None):
            raise PolicyError(source, f"$.auth.keys[{i}]", "give exactly one of sha256 or key_env")
    managed = policy.store.keys_file is not None or bool(os.environ.get(policy.store.redis_url_env))
    if policy.auth.required and not policy.auth.keys and not managed:
        raise PolicyError(source, "$.auth.keys", "auth.required is true but no key is configured"
                          " (no static keys, no keys_file, no Redis for managed keys)")
    _validate_tenants(policy, source)
    _validate_organizations(policy, source)
    _validate_batch(policy, source)


def _validate_batch(policy: Policy, source: str) -> None:
    """Batch jobs run their lines in class ``batch``; leases must outlive a renewal tick."""
    if policy.batch.run and "batch" not in {c.name for c in policy.classes}:
        raise PolicyError(source, "$.classes", "batch jobs need a class named 'batch'"
                          " (or set batch.run: false)")
    if policy.batch.lease_seconds < 3 * policy.batch.poll_interval:
        raise PolicyError(source, "$.batch.lease_seconds",
                          "must be at least 3 x batch.poll_interval")


def _validate_routing(policy: Policy, source: str, pools: set[str]) -> None:
    """Classes, pools and rollouts must name things that exist."""
    _unique([c.name for c in policy.classes], source, "classes")
    classes = {c.name for c in policy.classes}
    known = ", ".join(sorted(classes))

    def need_class(name: str | None, field: str) -> None:
        if name is not None and name not in classes:
            raise PolicyError(source, field, f"unknown class {name!r} (classes: {known})")

    def need_pool(name: str | None, field: str) -> None:
        if name is not None and name not in pools:
            raise PolicyError(source, field, f"unknown pool {name!r}")

    need_class(policy.routing.default_class, "$.routing.default_class")
    for i, rule in enumerate(policy.routing.rules):
        need_class(rule.request_class, f"$.routing.rules[{i}].class")
    for i, pool in enumerate(policy.pools):
        need_class(pool.request_class, f"$.pools[{i}].class")
        need_pool(pool.fallback, f"$.pools[{i}].fallback")
        if pool.fallback == pool.name:
            raise PolicyError(source, f"$.pools[{i}].fallback", "a pool cannot fall back to itself")
    for i, key in enumerate(policy.auth.keys):
        need_class(key.default_class, f"$.auth.keys[{i}].default_class")
    for i, model in enumerate(policy.models):
        for cls, pool_name in model.pools.items():
            need_class(cls, f"$.models[{i}].pools.{cls}")
            need_pool(pool_name, f"$.models[{i}].pools.{cls}")
        for j, version in enumerate(model.versions):
            need_pool(version.pool, f"$.models[{i}].versions[{j}].pool")
        if model.versions and not any(v.weight > 0 for v in model.versions):
            raise PolicyError(source, f"$.models[{i}].versions", "at least one weight must be > 0")
        _validate_progressive(model, source, f"$.models[{i}].versions")
        if model.shadow is not None:
            need_pool(model.shadow.pool, f"$.models[{i}].shadow.pool")
    names = {m.name for m in policy.models}
    for name in policy.prices.models:
        if name not in names:
            raise PolicyError(source, f"$.prices.models.{name}", f"unknown model {name!r}")
    for tenant, overrides in policy.prices.tenants.items():
        for name in overrides:
            if name not in policy.prices.models:
                raise PolicyError(source, f"$.prices.tenants.{tenant}.{name}",
                                  f"model {name!r} has no price in prices.models to override")


def _validate_progressive(model: Model, source: str, field: str) -> None:
    """One progressive version per model, with a baseline beside it, steps that grow; a
    shadow stage (a first step of 0) needs the model's shadow on the canary and the
    ``shadow_agreement`` gate, which alone can judge a version that takes no traffic."""
    versions = model.versions
    progressive = [j for j, v in enumerate(versions) if v.progressive is not None]
    if not progressive:
        return
    if len(progressive) > 1:
        raise PolicyError(source, field, "at most one version may be progressive")
    j = progressive[0]
    labels = [v.label for v in versions]
    if len(set(labels)) != len(labels):
        raise PolicyError(source, field, "versions of a progressive rollout need distinct names")
    if not any(v.weight > 0 for k, v in enumerate(versions) if k != j):
        raise PolicyError(source, field, "a progressive version needs a baseline version with "
                          "weight > 0 beside it")
    steps = versions[j].progressive.steps  # type: ignore[union-attr]
    if any(b <= a for a, b in itertools.pairwise(steps)):
        raise PolicyError(source, f"{field}[{j}].progressive.steps",
                          f"steps must grow: {steps}")
    if steps[0] == 0:
        canary = versions[j]
        if len(steps) < 2:
            raise PolicyError(source, f"{field}[{j}].progressive.steps",
                              "a shadow stage (step 0) needs a live step after it")
        if model.shadow is None or model.shadow.label != canary.label:
            raise PolicyError(source, f"{field}[{j}].progressive.steps",
                              f"a shadow stage (step 0) needs the model's shadow to mirror to "
                              f"the canary: shadow.version: {canary.label}")
        if canary.progressive.gates.shadow_agreement is None:  # type: ignore[union-attr]
            raise PolicyError(source, f"{field}[{j}].progressive.gates.shadow_agreement",
                              "a shadow stage (step 0) is judged by shadow_agreement: set it")


def _validate_tenants(policy: Policy, source: str) -> None:
    _unique([p.name for p in policy.plans], source, "plans")
    _unique([t.name for t in policy.tenants], source, "tenants")
    plans = {p.name for p in policy.plans}
    classes = {c.name for c in policy.classes}
    for i, tenant in enumerate(policy.tenants):
        if tenant.plan not in plans:
            raise PolicyError(source, f"$.tenants[{i}].plan", f"unknown plan {tenant.plan!r}")
        if tenant.default_class is not None and tenant.default_class not in classes:
            raise PolicyError(source, f"$.tenants[{i}].default_class",
                              f"unknown class {tenant.default_class!r}")
    models = {m.name for m in policy.models}
    for i, plan in enumerate(policy.plans):
        for name in plan.models:
            if name not in models:
                raise PolicyError(source, f"$.plans[{i}].models.{name}", f"unknown model {name!r}")


def _known_zone(name: str) -> bool:
    """True for ``UTC`` and for IANA names the installed tzdata has (nothing downloads)."""
    if name == "UTC":
        return True
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return False
    return True


def _validate_alerts(alerts: Alerts, source: str, field: str) -> None:
    thresholds = alerts.thresholds
    if len(set(thresholds)) != len(thresholds):
        raise PolicyError(source, f"{field}.thresholds", f"repeated threshold in {thresholds}")
    if alerts.webhook_url_env is not None and alerts.webhook_secret_env is None:
        raise PolicyError(source, f"{field}.webhook_secret_env",
                          "a webhook needs webhook_secret_env (its body is HMAC-signed)")
    if alerts.webhook_secret_env is not None and alerts.webhook_url_env is None:
        raise PolicyError(source, f"{field}.webhook_url_env",
                          "webhook_secret_env is set but webhook_url_env is not")


def _validate_organizations(policy: Policy, source: str) -> None:
    """Organizations hold teams, teams hold tenants; every name must resolve. A cycle cannot
    be written: a team names an organization, a tenant a team or an organization."""
    _unique([o.name for o in policy.organizations], source, "organizations")
    _unique([t.name for t in policy.teams], source, "teams")
    orgs = {o.name for o in policy.organizations}
    known_orgs = ", ".join(sorted(orgs)) or "none declared"
    _validate_alerts(policy.alerts, source, "$.alerts")
    for i, org in enumerate(policy.organizations):
        if not _known_zone(org.timezone):
            raise PolicyError(source, f"$.organizations[{i}].timezone",
                              f"unknown timezone {org.timezone!r} (an IANA name such as "
                              "'Europe/Paris' from the installed tzdata, or 'UTC')")
        if org.alerts is not None:
            _validate_alerts(org.alerts, source, f"$.organizations[{i}].alerts")
    team_orgs: dict[str, str] = {}
    for i, team in enumerate(policy.teams):
        if team.organization not in orgs:
            raise PolicyError(source, f"$.teams[{i}].organization",
                              f"unknown organization {team.organization!r} "
                              f"(organizations: {known_orgs})")
        team_orgs[team.name] = team.organization
    known_teams = ", ".join(sorted(team_orgs)) or "none declared"
    for i, tenant in enumerate(policy.tenants):
        if tenant.team is not None and tenant.team not in team_orgs:
            raise PolicyError(source, f"$.tenants[{i}].team",
                              f"unknown team {tenant.team!r} (teams: {known_teams})")
        if tenant.organization is not None and tenant.organization not in orgs:
            raise PolicyError(source, f"$.tenants[{i}].organization",
                              f"unknown organization {tenant.organization!r} "
                              f"(organizations: {known_orgs})")
        if (tenant.team is not None and tenant.organization is not None
                and team_orgs[tenant.team] != tenant.organization):
            raise PolicyError(source, f"$.tenants[{i}].organization",
                              f"team {tenant.team!r} belongs to organization "
                              f"{team_orgs[tenant.team]!r}, not {tenant.organization!r}")


def key_hashes(policy: Policy) -> dict[str, str]:
    """sha256 hex of each configured key -> key id; env-named keys are read and hashed now."""
    hashes: dict[str, str] = {}
    for key in policy.auth.keys:
        if key.sha256 is not None:
            hashes[key.sha256] = key.id
        elif key.key_env is not None:
            secret = os.environ.get(key.key_env)
            if secret:
                hashes[hashlib.sha256(secret.encode()).hexdigest()] = key.id
    return hashes
