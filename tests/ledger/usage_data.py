"""Records for the usage-read tests, what the rollup query must answer for them, computed in
Python straight from the records (never from the rollups), and one check that every read of
a store (``usage_rows``, ``export``, ``drift``) agrees with the records written to it.

Names are chosen to catch ordering mistakes: upper and lower case (``Zeta`` sorts before
``alpha`` by code point, after it in most locales), non-ASCII, ``|`` and ``%``. Timestamps fall
on a few shared instants too, so export chunks end in the middle of equal ``ts_ms``, and
exactly on hour, day and month boundaries.
"""

from __future__ import annotations

import random
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Any

from gateway.ledger import UsageRecord
from gateway.ledger.sql.schema import ROLLUP_COUNTERS
from gateway.ledger.sql.usage_query import TEXT_DIMENSIONS

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from gateway.ledger import Ledger, UsageRow

__all__ = [
    "FINEST",
    "HOUR",
    "JAN_15",
    "all_rows",
    "assert_reads_match",
    "counters",
    "day_ms",
    "day_span",
    "expected_rows",
    "row_dict",
    "sample_records",
    "utc_days",
]

HOUR = 3_600_000
DAY = 24 * HOUR
#: 2024-01-15T00:00:00Z; samples run from here for ``days`` days (into March)
JAN_15 = int(datetime(2024, 1, 15, tzinfo=UTC).timestamp() * 1000)
_BOUNDARIES = [int(datetime(2024, m, 1, tzinfo=UTC).timestamp() * 1000) for m in (2, 3)]
_NULLABLE = {"key_id", "version", "batch_id", "team", "organization"}


def sample_records(n: int, tenants: Sequence[str], *, seed: int = 7, start: int = JAN_15,
                   days: int = 60) -> list[UsageRecord]:
    rng = random.Random(seed)
    shared = [start + rng.randrange(days * DAY) for _ in range(8)]
    edges = [*_BOUNDARIES, *(b - 1 for b in _BOUNDARIES), start, start + DAY - 1]
    edges = [e for e in edges if start <= e < start + days * DAY]
    out = []
    for i in range(n):
        pick = rng.random()
        if pick < 0.15:
            ts = rng.choice(shared)
        elif pick < 0.2 and edges:
            ts = rng.choice(edges)
        else:
            ts = start + rng.randrange(days * DAY)
        costs = {f"cost_{k}": rng.randrange(0, 5000) for k in (
            "system", "history", "new", "tools", "output", "reasoning")}
        cached = rng.randrange(0, 3)
        out.append(UsageRecord(
            request_id=f"req-{seed}-{i:05d}-{rng.randrange(10**6):06d}",
            ts_ms=ts,
            tenant=rng.choice(tenants),
            team=rng.choice([None, "red", "Blue"]),
            organization=rng.choice([None, "org-1"]),
            key_id=rng.choice([None, "key-a", "Key-B", "kéy-ü"]),
            model=rng.choice(["alpha", "Zeta", "mödel|x%", "m-2"]),
            upstream_model=rng.choice([None, "llama-3.1-8b"]),
            request_class=rng.choice(["interactive", "batch"]),
            pool=rng.choice([None, "chat"]),
            backend=rng.choice([None, "b1", "b2"]),
            version=rng.choice([None, "v1", "v2"]),
            batch_id=rng.choice([None, None, "batch_abc"]),
            attempts=rng.randrange(0, 3),
            status=rng.choice([200, 200, 429, 502]),
            outcome=rng.choice(["completed", "completed", "failed", "cancelled"]),
            system=rng.randrange(50), history=rng.randrange(500), new=rng.randrange(100),
            tools=rng.randrange(20), cached=cached * 7, cache_write=rng.randrange(9),
            output=rng.randrange(300), reasoning=rng.randrange(30),
            prompt_total=rng.randrange(700),
            estimated=rng.random() < 0.2,
            ttft_ms=rng.choice([None, rng.random() * 1000]),
            tpot_ms=rng.choice([None, rng.random() * 50]),
            duration_ms=rng.choice([None, rng.random() * 10_000, 12.5]),
            cost_micros=sum(costs.values()),
            cost_cached=rng.randrange(100), cost_cache_write=rng.randrange(100),
            currency="USD",
            **costs,
        ))
    return out


def counters(record: UsageRecord) -> dict[str, int]:
    """What one record adds to each rollup counter (the definition, written out)."""
    out = {c: int(getattr(record, c)) for c in ROLLUP_COUNTERS
           if c not in ("requests", "failed", "estimated")}
    out["requests"] = 1
    out["failed"] = int(record.outcome != "completed")
    out["estimated"] = int(record.estimated)
    return out


def _value(record: UsageRecord, dim: str) -> tuple[Any, Any]:
    """(sort key, answered value) of ``record`` in dimension ``dim``."""
    when = datetime.fromtimestamp(record.ts_ms // 1000, UTC)
    if dim == "hour":
        return record.ts_ms - record.ts_ms % HOUR, when.strftime("%Y-%m-%dT%H:00:00Z")
    if dim == "day":
        return record.ts_ms - record.ts_ms % DAY, when.strftime("%Y-%m-%d")
    if dim == "month":
        return (when.year, when.month), when.strftime("%Y-%m")
    column = TEXT_DIMENSIONS[dim]
    value = getattr(record, column)
    return value or "", (value or None) if column in _NULLABLE else value


def expected_rows(records: Iterable[UsageRecord], group_by: Sequence[str], lo: int, hi: int,
                  tenant: str | None) -> list[dict[str, Any]]:
    """The rows the query must answer, in order: for records of ``tenant`` (None: all) whose
    hour starts in ``[lo, hi)``, the sums per group."""
    groups: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in records:
        if tenant is not None and r.tenant != tenant:
            continue
        if not lo <= r.ts_ms - r.ts_ms % HOUR < hi:
            continue
        values = [_value(r, d) for d in group_by]
        key = tuple(v[0] for v in values)
        row = groups.get(key)
        if row is None:
            row = groups[key] = {TEXT_DIMENSIONS.get(d, d): v[1]
                                 for d, v in zip(group_by, values, strict=True)}
            row.update(dict.fromkeys(ROLLUP_COUNTERS, 0))
        for name, value in counters(r).items():
            row[name] += value
    return [groups[k] for k in sorted(groups)]


def row_dict(row: UsageRow, group_by: Sequence[str]) -> dict[str, Any]:
    """A query row as ``expected_rows`` spells it: the grouped fields and the counters."""
    fields = [TEXT_DIMENSIONS.get(d, d) for d in group_by]
    return {f: getattr(row, f) for f in [*fields, *ROLLUP_COUNTERS]}


#: every group a rollup row has: rows grouped so are the rollup rows themselves
FINEST = ("hour", "key", "model", "class", "version", "batch", "team", "organization")


def day_ms(day: date | str) -> int:
    """00:00 UTC of ``day`` (a ``date`` or ``YYYY-MM-DD``) in unix ms."""
    when = day if isinstance(day, date) else date.fromisoformat(day)
    return int(datetime(when.year, when.month, when.day, tzinfo=UTC).timestamp() * 1000)


def utc_days(records: Iterable[UsageRecord]) -> list[date]:
    """The UTC days the records fall on, in order."""
    return sorted({date.fromisoformat(r.day) for r in records})


def day_span(records: Iterable[UsageRecord]) -> tuple[int, int]:
    """``[lo, hi)`` unix ms: from the first to the end of the last UTC day of the records."""
    days = utc_days(records)
    return day_ms(days[0]), day_ms(days[-1]) + DAY


async def all_rows(ledger: Ledger, tenant: str | None, lo: int, hi: int,
                   group_by: Sequence[str]) -> list[UsageRow]:
    """Every row of ``usage_rows``, following the pages to the last."""
    rows: list[UsageRow] = []
    after: str | None = None
    while True:
        page = await ledger.usage_rows(tenant, lo, hi, group_by, after=after)
        rows += page.rows
        if page.next is None:
            return rows
        after = page.next


async def assert_reads_match(ledger: Ledger, tenant: str, records: Sequence[UsageRecord],
                             groupings: Iterable[Sequence[str]] = ((), FINEST)) -> None:
    """``records`` are exactly what ``ledger`` holds for ``tenant`` (each once): ``export``
    gives them back whole and in order, ``usage_rows`` in each grouping equals their sums
    computed here, and ``drift`` is empty on each of their days."""
    want = sorted(records, key=lambda r: (r.tenant, r.ts_ms, r.request_id))
    got = [r async for r in ledger.export(0, 2**62, tenant)]
    assert [r.request_id for r in got] == [r.request_id for r in want], "records lost or doubled"
    assert got == want
    lo, hi = day_span(records)
    for group_by in groupings:
        rows = [row_dict(r, group_by) for r in await all_rows(ledger, tenant, lo, hi, group_by)]
        assert rows == expected_rows(records, group_by, lo, hi, tenant), group_by
    for day in utc_days(records):
        assert await ledger.drift(tenant, day) == [], day
