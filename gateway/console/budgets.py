"""The operator's budgets: each team's and organization's day and month budgets (tokens or
spend) with what is used of them now, and the budget alerts sent this period, organizations',
teams' and tenants' alike; read from the quota store, never from records.

The scopes are the ones admission builds (:func:`gateway.quota.scopes.scopes_for`, the
tenants' through :meth:`Runtime.scopes`); what is used is :meth:`QuotaStore.usage` (the
calendar day's and month's counters, in the organization's time zone), the alerts sent are
:meth:`QuotaStore.alerted`: the thresholds the store marked as fired this day and this month
(the ``:a`` hash beside each Redis budget counter, every replica's; a memory store's, this
worker's), once each across replicas, whether or not a webhook was set to carry them.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.accounting.prices import format_micros
from gateway.quota.base import Usage
from gateway.quota.errors import QuotaUnavailable
from gateway.quota.scopes import scopes_for

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from gateway.quota.base import Alerted, QuotaStore
    from gateway.quota.limits import Scope
    from gateway.runtime import Runtime

__all__ = ["Budget", "BudgetSection", "budget_section", "budgets_of", "sent_text"]

_log = logging.getLogger("gateway.console")
#: (limit of the scope, budget name in tokens, in spend, usage counter, period)
_BUDGETS = (("tokens_per_day", "tokens_per_day", "cost_per_day", "tokens_today", "day"),
            ("tokens_per_month", "tokens_per_month", "cost_per_month", "tokens_this_month",
             "month"))


@dataclass(frozen=True, slots=True)
class Budget:
    """One day or month budget of one scope: its value, what is used now, the share used (%),
    the thresholds that alert and those that alerted this period."""

    name: str
    limit: str
    used: str
    percent: int | None
    thresholds: tuple[int, ...]
    sent: tuple[int, ...]

    @property
    def sent_text(self) -> str:
        return ", ".join(f"{t}%" for t in self.sent)


@dataclass(frozen=True, slots=True)
class BudgetSection:
    """Per team and per organization their budgets, per tenant the alerts its own budgets
    sent (as text), or why the counters could not be read."""

    teams: dict[str, list[Budget]] = field(default_factory=dict)
    organizations: dict[str, list[Budget]] = field(default_factory=dict)
    tenants: dict[str, str] = field(default_factory=dict)
    error: str = ""


def budgets_of(scope: Scope, usage: Usage, alerted: Alerted) -> list[Budget]:
    """The day and month budgets ``scope`` sets, with its usage and alerts."""
    out = []
    thresholds = scope.alerts.thresholds if scope.alerts is not None else ()
    for limit_name, tokens_name, cost_name, counter, period in _BUDGETS:
        limit = getattr(scope.limits, limit_name)
        if limit is None:
            continue
        used: int = getattr(usage, counter)
        percent = used * 100 // limit if limit else None
        sent = alerted.day if period == "day" else alerted.month
        if scope.unit == "cost":
            out.append(Budget(cost_name, format_micros(limit), format_micros(used), percent,
                              thresholds, sent))
        else:
            out.append(Budget(tokens_name, str(limit), str(used), percent, thresholds, sent))
    return out


def sent_text(budgets: Iterable[Budget]) -> str:
    """The alerts some budgets sent, as the tenant table shows them (``none``: nothing)."""
    text = "; ".join(f"{b.name} {b.sent_text}" for b in budgets if b.sent)
    return text or "none"


async def _read(quota: QuotaStore, tenant: str, scope: Scope) -> list[Budget]:
    usage, alerted = await asyncio.gather(quota.usage(tenant, scope.name, scope.partition),
                                          quota.alerted(tenant, scope.name, scope.partition))
    return budgets_of(scope, usage, alerted)


def _group_scopes(runtime: Runtime) -> list[tuple[str, str, Scope]]:
    """(team or organization, its name, scope) of every budget scope of the policy's teams
    and organizations: the scopes admission builds for a tenant placed there."""
    found: list[tuple[str, str, Scope]] = []
    for name, org in sorted(runtime.organizations.items()):
        thresholds = tuple(runtime.alerts_for(name).thresholds)
        found += [("organization", name, s) for s in scopes_for(
            None, None, None, "", organization=org, thresholds=thresholds)]
    for name, team in sorted(runtime.teams.items()):
        owner = runtime.organizations.get(team.organization)
        if owner is None:
            continue
        thresholds = tuple(runtime.alerts_for(owner.name).thresholds)
        found += [("team", name, s) for s in scopes_for(
            None, None, None, "", team=team, organization=owner, thresholds=thresholds)
            if s.name.startswith("team:")]
    return found


def _tenant_scopes(runtime: Runtime, tenant: str) -> list[Scope]:
    """The tenant's own budget scopes that alert (its plan's tokens and spend)."""
    if tenant not in runtime.tenants:
        return []
    return [s for s in runtime.scopes(tenant, None, None, "")
            if s.alerts is not None and s.alerts.level == "tenant"]


async def budget_section(runtime: Runtime, quota: QuotaStore | None,
                         tenants: Sequence[str]) -> BudgetSection:
    """The teams' and organizations' budgets and the alerts sent, ``tenants``' included."""
    if quota is None:
        return BudgetSection(error="The quota counters are not available to the console.")
    groups = _group_scopes(runtime)
    mine: list[tuple[str, Scope]] = []
    for n, tenant in enumerate(tenants):
        mine += [(tenant, s) for s in _tenant_scopes(runtime, tenant)]
        if n % 32 == 31:  # hundreds of tenants: the proxy on this loop goes on between them
            await asyncio.sleep(0)
    try:
        read = await asyncio.gather(*(_read(quota, "", s) for _, _, s in groups))
        # the tenants show only the alerts sent: their marks, all in one batch
        marks = await quota.alerted_many([(t, s.name, s.partition) for t, s in mine])
    except QuotaUnavailable as exc:
        _log.warning("console: budget counters not read: %s", exc)
        return BudgetSection(error="The quota store is not answering: budgets and alerts "
                                   "are missing.")
    section = BudgetSection()
    for (kind, name, _), budgets in zip(groups, read, strict=True):
        where = section.teams if kind == "team" else section.organizations
        where.setdefault(name, []).extend(budgets)
    own: dict[str, list[Budget]] = {}
    for (tenant, scope), alerted in zip(mine, marks, strict=True):
        own.setdefault(tenant, []).extend(budgets_of(scope, Usage(), alerted))
    for tenant in tenants:
        if tenant in runtime.tenants:
            section.tenants[tenant] = sent_text(own.get(tenant, []))
    return section
