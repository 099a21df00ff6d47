"""A tenant's limits in use right now, read from the quota store's counters.

The scopes are the ones a request of the tenant is admitted against (:meth:`Runtime.scopes`,
the same call the pipeline makes): its organization's, its team's, its own (the plan's), the
signed-in key's, each model's of its plan, and the spend scopes. For each limit set, what is
used now comes from :meth:`QuotaStore.usage` (the counters admission checks; no record is
read): requests and tokens in the rolling 60 s window for ``rpm`` / ``tpm``, leases held for
``concurrency``, the calendar day's and month's tokens or spend for the budgets. ``remaining``
is ``limit - used`` (never below 0): for the scope that is tightest it is the
``x-ratelimit-remaining-*`` figure the tenant's next answer would carry, before that request.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.accounting.prices import format_micros
from gateway.quota.errors import QuotaUnavailable
from gateway.quota.limits import LIMIT_NAMES

if TYPE_CHECKING:
    from gateway.quota.base import QuotaStore, Usage
    from gateway.quota.limits import Scope
    from gateway.runtime import Runtime

__all__ = ["InUse", "LimitsInUse", "limits_in_use", "scope_label"]

_log = logging.getLogger("gateway.console")
#: which counter of a scope's usage each limit reads
_USED = {"rpm": "requests", "tpm": "tokens", "concurrency": "in_flight",
         "tokens_per_day": "tokens_today", "tokens_per_month": "tokens_this_month"}
_COST_NAMES = {"tokens_per_day": "cost_per_day", "tokens_per_month": "cost_per_month"}


@dataclass(frozen=True, slots=True)
class InUse:
    """One limit of one scope: its value, what is used now and what remains (as shown)."""

    scope: str
    name: str
    limit: str
    used: str
    remaining: str
    #: percentages of the budget that alert (organization, team, tenant and key budgets)
    thresholds: str = ""


@dataclass(frozen=True, slots=True)
class LimitsInUse:
    """The rows, or why the counters could not be read."""

    rows: list[InUse]
    error: str = ""


def scope_label(name: str, tenant: str) -> str:
    """A scope's name as the page says it."""
    mine = f"tenant:{tenant}/"
    if name.startswith(mine):
        name = name[len(mine):]
    if name in ("tenant", f"tenant:{tenant}"):
        return "tenant"
    if name == "cost":
        return "tenant spend"
    if name.startswith("key:"):
        return f"API key {name[4:]}"
    if name.startswith("model:"):
        return f"model {name[6:]}"
    if name.startswith("cost:model:"):
        return f"model {name[11:]} spend"
    if name.startswith("org:"):
        org, _, rest = name[4:].partition("/")
        return f"organization {org}" + (" spend" if rest == "cost" else "")
    if name.startswith("team:"):
        team, _, rest = name[5:].partition("/")
        return f"team {team}" + (" spend" if rest == "cost" else "")
    return name


def _scopes(runtime: Runtime, tenant: str, key_id: str | None,
            key_limits: dict[str, int] | None) -> list[Scope]:
    """Every scope of the tenant: those of a request to no particular model, then each model
    scope of its plan (named once)."""
    seen: dict[str, Scope] = {s.name: s for s in runtime.scopes(tenant, key_id, key_limits, "")}
    config = runtime.tenants.get(tenant)
    plan = runtime.plans.get(config.plan) if config is not None else None
    for model in sorted(plan.models) if plan is not None else ():
        for scope in runtime.scopes(tenant, key_id, key_limits, model):
            seen.setdefault(scope.name, scope)
    return list(seen.values())


def _rows(scope: Scope, usage: Usage, tenant: str) -> list[InUse]:
    rows = []
    label = scope_label(scope.name, tenant)
    thresholds = ("" if scope.alerts is None
                  else ", ".join(f"{t}%" for t in scope.alerts.thresholds))
    for name in LIMIT_NAMES:
        limit = getattr(scope.limits, name)
        if limit is None:
            continue
        used = getattr(usage, _USED[name])
        left = max(0, limit - used)
        budget = name in ("tokens_per_day", "tokens_per_month")
        if scope.unit == "cost" and budget:
            rows.append(InUse(label, _COST_NAMES[name], format_micros(limit),
                              format_micros(used), format_micros(left), thresholds))
        elif scope.unit == "cost":  # a spend scope counts money in tpm: not shown as tokens
            continue
        else:
            rows.append(InUse(label, name, str(limit), str(used), str(left),
                              thresholds if budget else ""))
    return rows


async def limits_in_use(runtime: Runtime, quota: QuotaStore | None, tenant: str,
                        key_id: str | None, key_limits: dict[str, int] | None) -> LimitsInUse:
    """What ``tenant`` uses now of each of its limits (``key_id``: the signed-in key)."""
    if quota is None:
        return LimitsInUse([], "The quota counters are not available to the console.")
    rows: list[InUse] = []
    try:
        for scope in _scopes(runtime, tenant, key_id, key_limits):
            rows += _rows(scope, await quota.usage(tenant, scope.name, scope.partition), tenant)
    except QuotaUnavailable as exc:
        _log.warning("console: quota counters of %s not read: %s", tenant, exc)
        return LimitsInUse(rows, "The quota store is not answering: figures are missing.")
    return LimitsInUse(rows)
