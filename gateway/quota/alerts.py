"""Budget threshold alerts: what the stores report when a day or month budget crosses one.

A scope with an :class:`~gateway.quota.limits.AlertRule` is watched: after a settle, each of
its day and month budgets (tokens, or spend for a cost scope) is compared with the rule's
thresholds, and a refusal by a budget counts as reaching 100 %. A threshold alerts at most once
per (scope, period): the Redis store decides that inside the settle (or reserve) script, with a
dedupe hash beside the budget counter, so one replica alone reports it; the memory store keeps
the same set in the process. The store hands what fired to its sink (``AlertSink``), which
must not block (``gateway.alerts`` logs, counts and queues the webhook).

Usage is read as the counter stands after the settle: what settled requests used plus what
requests still in flight hold as their estimate.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from gateway.quota.limits import AlertLevel, Scope

__all__ = [
    "AlertSink",
    "BudgetAlert",
    "BudgetName",
    "due",
    "emit",
    "make_alert",
    "period_label",
]

_log = logging.getLogger("gateway.quota.alerts")

BudgetName = Literal["tokens_per_day", "tokens_per_month", "cost_per_day", "cost_per_month"]
Trigger = Literal["usage", "refusal"]
Kind = Literal["day", "month"]


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetAlert:
    """One threshold of one budget crossed, once per period.

    ``used`` and ``limit`` are in the budget's unit: tokens, or micro-units of the price
    currency for a spend budget (``unit == "cost"``). ``tenant`` is the tenant whose request
    crossed it (the subject itself at the tenant level).
    """

    level: AlertLevel
    subject: str
    tenant: str
    organization: str | None
    timezone: str
    scope: str
    budget: BudgetName
    period: str
    threshold: int
    used: int
    limit: int
    unit: Literal["tokens", "cost"]
    trigger: Trigger
    at: float

    @property
    def id(self) -> str:
        """Stable across replicas and retries: what a receiver dedupes deliveries by."""
        owner = self.organization if self.organization is not None else self.tenant
        raw = f"{owner}\0{self.scope}\0{self.budget}\0{self.period}\0{self.threshold}"
        return hashlib.sha256(raw.encode()).hexdigest()[:32]


#: a store's hand-off of alerts that fired; called on the event loop, must not block
AlertSink = Callable[[Sequence[BudgetAlert]], None]


def due(thresholds: Sequence[int], used: int, limit: int, refused: bool) -> list[int]:
    """The thresholds ``used`` has reached (``used * 100 >= t * limit``); a refusal also
    reaches 100. The stores then keep those that have not alerted this period. The Lua in
    ``scripts.py`` (``alert``) is the same rule."""
    return [t for t in thresholds if used * 100 >= t * limit or (refused and t >= 100)]


def period_label(kind: Kind, period_id: int) -> str:
    """``2025-03-30`` for day 20250330, ``2025-03`` for month 202503."""
    if kind == "day":
        return f"{period_id // 10000:04d}-{period_id // 100 % 100:02d}-{period_id % 100:02d}"
    return f"{period_id // 100:04d}-{period_id % 100:02d}"


def make_alert(scope: Scope, tenant: str, kind: Kind, period_id: int, threshold: int,
               used: int, trigger: Trigger, at: float) -> BudgetAlert:
    """The alert of one threshold of ``scope``'s day or month budget."""
    rule = scope.alerts
    assert rule is not None
    limits = scope.limits
    limit = limits.tokens_per_day if kind == "day" else limits.tokens_per_month
    prefix = "cost" if scope.unit == "cost" else "tokens"
    budget: BudgetName = f"{prefix}_per_{kind}"  # type: ignore[assignment]
    return BudgetAlert(
        level=rule.level, subject=rule.subject, tenant=tenant,
        organization=None if scope.partition is None else scope.partition.organization,
        timezone=scope.timezone, scope=scope.name, budget=budget,
        period=period_label(kind, period_id), threshold=threshold, used=used,
        limit=limit if limit is not None else 0, unit=scope.unit, trigger=trigger, at=at,
    )


def emit(sink: AlertSink | None, alerts: Sequence[BudgetAlert]) -> None:
    """Hand alerts to the sink; a broken sink is logged, never raised into admission."""
    if sink is None or not alerts:
        return
    try:
        sink(alerts)
    except Exception:
        _log.exception("budget alert sink failed")
