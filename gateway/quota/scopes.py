"""From policy to quota scopes: the organization, team, tenant, key and model limits a request
is checked against, in the order the admission script reads them, with each level's alerts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.accounting.prices import to_micros
from gateway.quota.limits import AlertRule, Limits, Partition, Scope, build_scopes

if TYPE_CHECKING:
    from collections.abc import Callable

    from gateway.config import LimitSet, Organization, Plan, Team
    from gateway.quota.limits import AlertLevel

__all__ = ["limits_of", "scopes_for"]


def limits_of(limits: LimitSet | dict[str, int] | None) -> Limits | None:
    if limits is None:
        return None
    if isinstance(limits, dict):
        return Limits(**limits)
    return Limits(rpm=limits.rpm, tpm=limits.tpm, concurrency=limits.concurrency,
                  tokens_per_day=limits.tokens_per_day, tokens_per_month=limits.tokens_per_month)


def _cost_limits(limits: LimitSet | None) -> Limits | None:
    """Spend budgets as a cost-unit scope's day/month budgets, in micro-units."""
    if limits is None or (limits.cost_per_day is None and limits.cost_per_month is None):
        return None
    day, month = limits.cost_per_day, limits.cost_per_month
    return Limits(tokens_per_day=None if day is None else to_micros(str(day)),
                  tokens_per_month=None if month is None else to_micros(str(month)))


def scopes_for(
    plan: Plan | None,
    key_id: str | None,
    key_limits: dict[str, int] | None,
    model: str,
    *,
    tenant: str | None = None,
    team: Team | None = None,
    organization: Organization | None = None,
    thresholds: tuple[int, ...] = (),
) -> tuple[Scope, ...]:
    """The tenant's plan, the key's own limits and the plan's limits for this model; spend
    budgets (``cost_per_day`` / ``cost_per_month``) become scopes counted in cost.

    A tenant outside any organization gets the scopes it always had: ``tenant``,
    ``key:<id>``, ``model:<m>``, ``cost``, ``cost:model:<m>``. Inside an ``organization`` every
    scope shares the organization's :class:`Partition` (hash tag and calendar) and is named
    for whose it is, outer levels first: ``org:<o>``, ``team:<team>``, ``tenant:<t>``,
    ``tenant:<t>/key:<id>``, ``tenant:<t>/model:<m>``, then the spend scopes ``org:<o>/cost``,
    ``team:<team>/cost``, ``tenant:<t>/cost``, ``tenant:<t>/cost:model:<m>``. Organization and
    team names hold no ``:`` or ``/`` and tenant names no ``/``, so no two of these collide.

    With ``thresholds`` (and ``tenant``), the budgets of the organization, team, tenant and
    key scopes alert (:class:`AlertRule`); per-model budgets do not.
    """
    def rule(level: AlertLevel, subject: str | None) -> AlertRule | None:
        if not thresholds or subject is None:
            return None
        return AlertRule(level, subject, thresholds)

    own = limits_of(plan.limits) if plan is not None else Limits()
    per_model = limits_of(plan.models.get(model)) if plan is not None else None
    if organization is None:
        scopes = build_scopes(own or Limits(), key_id=key_id, key=limits_of(key_limits),
                              model=model, per_model=per_model)
        if thresholds:
            scopes = tuple(_with_rule(s, tenant, key_id, rule) for s in scopes)
        if plan is None:
            return scopes
        extra = []
        tenant_cost = _cost_limits(plan.limits)
        if tenant_cost is not None:
            extra.append(Scope("cost", tenant_cost, unit="cost", alerts=rule("tenant", tenant)))
        model_cost = _cost_limits(plan.models.get(model))
        if model_cost is not None:
            extra.append(Scope(f"cost:model:{model}", model_cost, unit="cost"))
        return scopes + tuple(extra)

    part = Partition(organization.name, organization.timezone)
    me = f"tenant:{tenant or 'default'}"
    org_name = f"org:{organization.name}"
    team_name = f"team:{team.name}" if team is not None else ""
    # (name, limits, unit, alert rule), outer levels first, token scopes before spend scopes
    levels: list[tuple[str, Limits | None, str, AlertRule | None]] = [
        (org_name, limits_of(organization.limits), "tokens",
         rule("organization", organization.name)),
    ]
    if team is not None:
        levels.append((team_name, limits_of(team.limits), "tokens", rule("team", team.name)))
    levels.append((me, own, "tokens", rule("tenant", tenant)))
    if key_id is not None:
        levels.append((f"{me}/key:{key_id}", limits_of(key_limits), "tokens",
                       rule("key", key_id)))
    levels.append((f"{me}/model:{model}", per_model, "tokens", None))
    levels.append((f"{org_name}/cost", _cost_limits(organization.limits), "cost",
                   rule("organization", organization.name)))
    if team is not None:
        levels.append((f"{team_name}/cost", _cost_limits(team.limits), "cost",
                       rule("team", team.name)))
    if plan is not None:
        levels.append((f"{me}/cost", _cost_limits(plan.limits), "cost", rule("tenant", tenant)))
        levels.append((f"{me}/cost:model:{model}", _cost_limits(plan.models.get(model)),
                       "cost", None))
    return tuple(
        Scope(name, limits, "cost" if unit == "cost" else "tokens", part, alert)
        for name, limits, unit, alert in levels
        if limits is not None and not limits.unlimited
    )


def _with_rule(scope: Scope, tenant: str | None, key_id: str | None,
               rule: Callable[[AlertLevel, str | None], AlertRule | None]) -> Scope:
    """A scope of a tenant outside any organization, with the alerts of its level."""
    if scope.name == "tenant":
        return Scope(scope.name, scope.limits, scope.unit, None, rule("tenant", tenant))
    if scope.name.startswith("key:"):
        return Scope(scope.name, scope.limits, scope.unit, None, rule("key", key_id))
    return scope
