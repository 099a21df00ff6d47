"""Per-day and per-month totals: what a record adds, how totals are named, how they are read.

Both stores keep the same shape, a flat ``{field: int}`` map per tenant per day and per month,
so the same code turns them into rows and checks them against records. A field is
``<model>|<class>|<batch>|<counter>`` (``batch`` empty outside batch jobs); ``|`` and ``%``
inside a name are percent-escaped so the split is unambiguous. Everything here is pure: the
stores do the I/O.
"""

from __future__ import annotations

from datetime import date, timedelta
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from gateway.ledger.record import UsageRecord

__all__ = [
    "COUNTERS",
    "GROUP_DIMENSIONS",
    "Period",
    "UsageRow",
    "add_record",
    "counters_of",
    "field_prefix",
    "parse_day",
    "plan_periods",
    "rows_from",
]

#: the totals kept per group, in the order the SQL stores read them from the rollups
COUNTERS = (
    "requests",
    "system",
    "history",
    "new",
    "tools",
    "cached",
    "output",
    "prompt_total",
    "cost_micros",
    "estimated",
    "cache_write",
    "reasoning",
)
GROUP_DIMENSIONS = frozenset({"day", "month", "model", "class", "batch"})

#: day, month, model, class, batch; None where not grouped by
_GroupKey = tuple[str | None, str | None, str | None, str | None, str | None]


class UsageRow(msgspec.Struct, kw_only=True):
    """Totals of one group; a dimension not grouped by is None (so is an empty key, version,
    batch, team or organization in the rollup query's rows: use the group_by to tell them
    apart). ``hour``/``day``/``month`` are ISO labels (``2024-05-01T13:00:00Z``,
    ``2024-05-01``, ``2024-05``)."""

    tenant: str | None = None
    hour: str | None = None
    day: str | None = None
    month: str | None = None
    key_id: str | None = None
    model: str | None = None
    request_class: str | None = None
    version: str | None = None
    batch_id: str | None = None
    team: str | None = None
    organization: str | None = None
    requests: int = 0
    system: int = 0
    history: int = 0
    new: int = 0
    tools: int = 0
    cached: int = 0
    output: int = 0
    prompt_total: int = 0
    cost_micros: int = 0
    #: requests whose tokens were the gateway's estimate
    estimated: int = 0
    #: of ``prompt_total``, tokens written to the backend's cache; of ``output``, reasoning
    cache_write: int = 0
    reasoning: int = 0
    #: requests whose outcome was not ``completed`` (filled by the rollup query)
    failed: int = 0
    #: the lines of ``cost_micros`` (filled by the rollup query)
    cost_system: int = 0
    cost_history: int = 0
    cost_new: int = 0
    cost_tools: int = 0
    cost_output: int = 0
    cost_reasoning: int = 0
    cost_cached: int = 0
    cost_cache_write: int = 0


def _escape(name: str) -> str:
    return name.replace("%", "%25").replace("|", "%7C")


def _unescape(name: str) -> str:
    return name.replace("%7C", "|").replace("%25", "%")


def field_prefix(record: UsageRecord) -> str:
    """``model|class|batch|``: the group part of every field a record adds to."""
    batch = record.batch_id or ""
    return f"{_escape(record.model)}|{_escape(record.request_class)}|{_escape(batch)}|"


def counters_of(record: UsageRecord) -> tuple[int, ...]:
    """The record's contribution to each of ``COUNTERS``."""
    r = record
    return (
        1,
        r.system,
        r.history,
        r.new,
        r.tools,
        r.cached,
        r.output,
        r.prompt_total,
        r.cost_micros,
        int(r.estimated),
        r.cache_write,
        r.reasoning,
    )


def add_record(totals: dict[str, int], record: UsageRecord) -> None:
    """Add one record to a ``{field: int}`` map, as the rollups sum it (zeros skipped)."""
    prefix = field_prefix(record)
    for name, value in zip(COUNTERS, counters_of(record), strict=True):
        if value:
            key = prefix + name
            totals[key] = totals.get(key, 0) + value


def parse_day(value: date | str) -> date:
    """A day given as a ``date`` or ``YYYY-MM-DD``."""
    return value if isinstance(value, date) else date.fromisoformat(value)


class Period(msgspec.Struct, frozen=True):
    """One aggregate to read: ``kind`` "d" (label ``YYYY-MM-DD``) or "m" (``YYYY-MM``)."""

    kind: str
    label: str


def plan_periods(since: date, until: date, *, by_day: bool) -> list[Period]:
    """The aggregates that cover ``since..until`` (inclusive) with the fewest reads.

    Whole calendar months inside the range are read from the month total (one read instead
    of ~30, and still there after day totals expire) unless rows are wanted per day.
    """
    periods: list[Period] = []
    day = since
    while day <= until:
        month_end = (day.replace(day=28) + timedelta(days=4)).replace(day=1) - timedelta(days=1)
        if not by_day and day.day == 1 and month_end <= until:
            periods.append(Period("m", day.strftime("%Y-%m")))
            day = month_end + timedelta(days=1)
            continue
        periods.append(Period("d", day.isoformat()))
        day += timedelta(days=1)
    return periods


def rows_from(
    tenant: str,
    totals: Iterable[tuple[Period, Mapping[str, int]]],
    group_by: Sequence[str],
) -> list[UsageRow]:
    """Rows grouped by ``group_by`` from per-period ``{field: int}`` maps, sorted by group."""
    unknown = set(group_by) - GROUP_DIMENSIONS
    if unknown:
        raise ValueError(f"cannot group usage by {sorted(unknown)}")
    dims = set(group_by)
    groups: dict[_GroupKey, dict[str, int]] = {}
    for period, fields in totals:
        month = period.label[:7]
        day = period.label if period.kind == "d" else None
        for field, value in fields.items():
            model, cls, batch, counter = field.split("|")
            key = (
                day if "day" in dims else None,
                month if "month" in dims else None,
                _unescape(model) if "model" in dims else None,
                _unescape(cls) if "class" in dims else None,
                _unescape(batch) if "batch" in dims else None,
            )
            group = groups.setdefault(key, {})
            group[counter] = group.get(counter, 0) + int(value)
    rows = []
    for key in sorted(groups, key=lambda k: tuple(v or "" for v in k)):
        sums: dict[str, Any] = {c: groups[key].get(c, 0) for c in COUNTERS}
        rows.append(
            UsageRow(
                tenant=tenant,
                day=key[0],
                month=key[1],
                model=key[2],
                request_class=key[3],
                batch_id=key[4] or None,
                **sums,
            )
        )
    return rows
