"""What the console's pages show, computed from usage rows and the policy: plain data, no HTTP.

Every number comes from the rollups through :meth:`SqlLedger.usage_rows` (the same call and
the same rows as ``GET /v1/usage``), never from the records. A tenant's month is read once
grouped by day and model; the chart, the per-model table and the totals are sums of those
rows. The token buckets overlap by design (cached and cache write are parts of the prompt,
reasoning is part of the output), so the chart stacks three bars a day that each sum to a
whole: the input by role (system, history, new, tools), the same input by cache (uncached,
cache read, cache write) and the output (visible, reasoning). The spend chart beside it is the
same rows' cost, per day and to date.

The operator's teams and organizations are sums of their tenants' rows of the one read grouped
by tenant (a tenant counts where the policy places it now).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any

from gateway.accounting.prices import format_micros
from gateway.ledger.sql.usage_query import MAX_LIMIT

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from gateway.config import LimitSet
    from gateway.ledger.aggregate import UsageRow
    from gateway.ledger.sql.store import SqlLedger
    from gateway.runtime import Runtime

__all__ = [
    "BUCKETS",
    "GroupSpend",
    "LimitLine",
    "Month",
    "MonthError",
    "TenantMonth",
    "TenantSpend",
    "chart_data",
    "group_spend",
    "limit_lines",
    "parse_month",
    "read_rows",
    "spend_chart",
    "tenant_month",
    "tenant_spend",
    "tokens_of",
]

#: the token buckets of a usage row, in the tables' column order
BUCKETS = ("system", "history", "new", "tools", "cached", "cache_write", "output", "reasoning")
_MONTH = re.compile(r"^(\d{4})-(0[1-9]|1[0-2])$")
#: (dataset label, stack, how a row gives it)
_SERIES: tuple[tuple[str, str, str], ...] = (
    ("system", "input by role", "system"),
    ("history", "input by role", "history"),
    ("new input", "input by role", "new"),
    ("tools", "input by role", "tools"),
    ("uncached", "input by cache", "uncached"),
    ("cached", "input by cache", "cached"),
    ("cache write", "input by cache", "cache_write"),
    ("output", "output", "visible"),
    ("reasoning", "output", "reasoning"),
)


class MonthError(ValueError):
    """A ``month`` parameter that is not ``YYYY-MM`` in 1970..9999."""


@dataclass(frozen=True, slots=True)
class Month:
    """A UTC calendar month: its label, ``[lo, hi)`` in unix ms and its days."""

    label: str
    lo: int
    hi: int
    days: tuple[str, ...]

    @classmethod
    def of(cls, year: int, month: int) -> Month:
        first = date(year, month, 1)
        following = date(year + month // 12, month % 12 + 1, 1)
        count = (following - first).days
        return cls(f"{year:04d}-{month:02d}", _ms(first), _ms(following),
                   tuple((first + timedelta(days=i)).isoformat() for i in range(count)))


def _ms(day: date) -> int:
    return int(datetime.combine(day, datetime.min.time(), UTC).timestamp() * 1000)


def parse_month(text: str | None, now: datetime | None = None) -> Month:
    """``YYYY-MM`` as a month; empty or None is the current UTC month."""
    if not text:
        now = now or datetime.now(UTC)
        return Month.of(now.year, now.month)
    match = _MONTH.match(text.strip())
    if match is None or not 1970 <= int(match.group(1)) <= 9998:
        raise MonthError(f"month: {text[:32]!r} is not a month (YYYY-MM)")
    return Month.of(int(match.group(1)), int(match.group(2)))


async def read_rows(ledger: SqlLedger, tenant: str | None, lo: int, hi: int,
                    group_by: Sequence[str]) -> list[UsageRow]:
    """Every row of a usage read, page after page (a month by day and model is one page)."""
    rows: list[UsageRow] = []
    after: str | None = None
    while True:
        page = await ledger.usage_rows(tenant, lo, hi, group_by, limit=MAX_LIMIT, after=after)
        rows += page.rows
        if not page.has_more:
            return rows
        after = page.next


def tokens_of(row: UsageRow) -> int:
    """The tokens a row's requests used, as the token budgets count them: prompt and output."""
    return row.prompt_total + row.output


def _counts(rows: Iterable[UsageRow]) -> dict[str, int]:
    out = dict.fromkeys(("requests", "failed", "prompt_total", "cost_micros", *BUCKETS), 0)
    for row in rows:
        for name in out:
            out[name] += getattr(row, name)
    out["tokens"] = out["prompt_total"] + out["output"]
    return out


@dataclass(frozen=True, slots=True)
class TenantMonth:
    """A tenant's month: the rows by day and model, the sums by model, the totals, the chart."""

    tenant: str
    month: Month
    currency: str
    rows: list[dict[str, Any]]
    by_model: list[dict[str, Any]]
    totals: dict[str, Any]
    chart: dict[str, Any]
    spend: dict[str, Any]


def _with_cost(counts: dict[str, Any], currency: str) -> dict[str, Any]:
    return {**counts, "cost": format_micros(counts["cost_micros"]), "currency": currency}


def tenant_month(tenant: str, month: Month, rows: Sequence[UsageRow],
                 currency: str) -> TenantMonth:
    """The tenant page's data from its month's rows grouped by day and model."""
    table = [{"day": r.day, "model": r.model, **_with_cost(_counts([r]), currency)}
             for r in rows]
    models = sorted({r.model or "" for r in rows})
    by_model = [{"model": m, **_with_cost(_counts(r for r in rows if (r.model or "") == m),
                                          currency)} for m in models]
    return TenantMonth(tenant, month, currency, table, by_model,
                       _with_cost(_counts(rows), currency), chart_data(month, rows),
                       spend_chart(month, rows, currency))


def chart_data(month: Month, rows: Iterable[UsageRow]) -> dict[str, Any]:
    """Per day of the month, every series of the stacked chart (models summed)."""
    index = {day: i for i, day in enumerate(month.days)}
    values = {key: [0] * len(month.days) for _, _, key in _SERIES}
    for row in rows:
        i = index.get(row.day or "")
        if i is None:
            continue
        parts = {name: getattr(row, name) for name in BUCKETS}
        parts["uncached"] = row.prompt_total - row.cached - row.cache_write
        parts["visible"] = row.output - row.reasoning
        for _, _, key in _SERIES:
            values[key][i] += parts[key]
    return {"labels": [day[8:] for day in month.days], "month": month.label,
            "series": [{"label": label, "stack": stack, "data": values[key]}
                       for label, stack, key in _SERIES]}


def spend_chart(month: Month, rows: Iterable[UsageRow], currency: str) -> dict[str, Any]:
    """Per day of the month, the spend in micro-units of ``currency`` (models summed); the
    page draws each day's and the month to date."""
    index = {day: i for i, day in enumerate(month.days)}
    micros = [0] * len(month.days)
    for row in rows:
        i = index.get(row.day or "")
        if i is not None:
            micros[i] += row.cost_micros
    return {"labels": [day[8:] for day in month.days], "month": month.label,
            "currency": currency, "micros": micros}


@dataclass(frozen=True, slots=True)
class LimitLine:
    """One limit in force for a tenant: where it is set, its value, and what is used of it
    (None where the console does not read it: the rolling and concurrency counters)."""

    level: str
    name: str
    limit: str
    used: str | None = None


def _lines(level: str, limits: LimitSet | dict[str, int] | None,
           used: dict[str, str]) -> list[LimitLine]:
    if limits is None:
        return []
    values = limits if isinstance(limits, dict) else {
        name: getattr(limits, name) for name in (
            "rpm", "tpm", "concurrency", "tokens_per_day", "tokens_per_month",
            "cost_per_day", "cost_per_month")}
    return [LimitLine(level, name, str(value), used.get(name))
            for name, value in values.items() if value is not None]


def limit_lines(runtime: Runtime, tenant: str, today: UsageRow | None,
                this_month: UsageRow | None,
                key_limits: dict[str, int] | None = None) -> list[LimitLine]:
    """The limits of a tenant's plan (per tenant and per model), its team's and
    organization's, and its key's; the tenant's day and month budgets with what it used today
    and this month (UTC), read from the rollups."""
    used: dict[str, str] = {}
    if today is not None:
        used["tokens_per_day"] = str(tokens_of(today))
        used["cost_per_day"] = format_micros(today.cost_micros)
    if this_month is not None:
        used["tokens_per_month"] = str(tokens_of(this_month))
        used["cost_per_month"] = format_micros(this_month.cost_micros)
    config = runtime.tenants.get(tenant)
    plan = runtime.plans.get(config.plan) if config is not None else None
    lines: list[LimitLine] = []
    if plan is not None:
        lines += _lines(f"tenant (plan {plan.name})", plan.limits, used)
        for model, limits in sorted(plan.models.items()):
            lines += _lines(f"model {model}", limits, {})
    team, organization = runtime.placement(tenant)
    if team is not None and team in runtime.teams:
        lines += _lines(f"team {team}", runtime.teams[team].limits, {})
    if organization is not None and organization in runtime.organizations:
        lines += _lines(f"organization {organization}",
                        runtime.organizations[organization].limits, {})
    lines += _lines("this API key", key_limits, {})
    return lines


@dataclass(frozen=True, slots=True)
class TenantSpend:
    """A tenant's month on the operator's page."""

    tenant: str
    requests: int
    tokens: int
    cost: str
    configured: bool


def tenant_spend(configured: Iterable[str], rows: Iterable[UsageRow]) -> list[TenantSpend]:
    """Every tenant of the policy and every tenant with usage this month, by name."""
    by_tenant = {r.tenant or "": r for r in rows}
    names = set(configured)
    return [
        TenantSpend(name, row.requests if row else 0, tokens_of(row) if row else 0,
                    format_micros(row.cost_micros if row else 0), name in names)
        for name in sorted(names | set(by_tenant))
        for row in (by_tenant.get(name),)
    ]


@dataclass(frozen=True, slots=True)
class GroupSpend:
    """A team's or organization's month on the operator's page: its tenants' rows summed."""

    name: str
    #: a team's organization (None for an organization)
    organization: str | None
    #: the policy's tenants placed in it
    tenants: tuple[str, ...]
    requests: int
    tokens: int
    cost_micros: int
    cost: str


def group_spend(runtime: Runtime, rows: Iterable[UsageRow]
                ) -> tuple[list[GroupSpend], list[GroupSpend]]:
    """Every team and every organization of the policy with the sums of its tenants' rows
    (``rows``: one read grouped by tenant), by name: (teams, organizations)."""
    by_tenant = {r.tenant or "": r for r in rows}
    members: dict[tuple[str, str], list[str]] = {}
    for tenant in sorted(runtime.tenants):
        team, organization = runtime.placement(tenant)
        if team is not None:
            members.setdefault(("team", team), []).append(tenant)
        if organization is not None:
            members.setdefault(("organization", organization), []).append(tenant)

    def one(kind: str, name: str, organization: str | None) -> GroupSpend:
        tenants = tuple(members.get((kind, name), ()))
        mine = [by_tenant[t] for t in tenants if t in by_tenant]
        cost = sum(r.cost_micros for r in mine)
        return GroupSpend(name, organization, tenants, sum(r.requests for r in mine),
                          sum(tokens_of(r) for r in mine), cost, format_micros(cost))

    teams = [one("team", t.name, t.organization)
             for t in sorted(runtime.teams.values(), key=lambda t: t.name)]
    organizations = [one("organization", name, None) for name in sorted(runtime.organizations)]
    return teams, organizations
