"""Reconciliation in SQL: a day's hourly and daily rollups against the sum of its records.

The hourly rollups grow in the same transaction that inserts the records, and the daily ones
are the hourly ones of a closed day (``compact.py``; SQLite: a trigger), so for every hour or
day and group they equal the records' sums; a difference means a bug, a hand edit or a partial
restore (and the records, the detailed truth, win). For one tenant and one UTC day there are
two statements: the day's rollup rows (a range of their primary key) and the day's records
summed into the same groups (hour, key, model, class, version, batch, team, organization) the
way the write path adds them (None as "", ``failed`` = outcome not completed). Every (hour,
group, counter) whose figures differ is a :class:`Drift`, with both figures; a group present
on one side only counts as zeros on the other. The day's ``usage_daily`` rows (a third
statement, ``daily_statement``) are compared with the same records summed over the whole day
(``grain`` "day": ``hour`` is then the day's midnight) once the day is compacted; before, a
day has no daily rows (any found are a drift against nothing).

The records of days past retention are gone while their rollups stay: reconcile only days
that still have records (the CLI skips the others).
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.ledger.sql.params import Params
from gateway.ledger.sql.schema import ROLLUP_COUNTERS, ROLLUP_KEYS, quoted
from gateway.ledger.window import DAY_MS, HOUR_MS, iso_hour

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gateway.ledger.sql.migrations import Dialect

__all__ = ["Drift", "compare", "daily_statement", "day_statements"]

#: the group columns after ``tenant`` and ``hour_ms``
_GROUP = ROLLUP_KEYS[1:]
_SUMMED = ROLLUP_COUNTERS[3:]  # requests, failed and estimated are counts


class Drift(msgspec.Struct, frozen=True, kw_only=True):
    """One rollup counter that disagrees with its records ("" = no key, version, ...)."""

    tenant: str
    hour: str
    key_id: str
    model: str
    request_class: str
    version: str
    batch_id: str
    team: str
    organization: str
    counter: str
    rollup: int
    records: int
    #: which rollups: "hour" (``usage_hourly``) or "day" (``usage_daily``)
    grain: str = "hour"

    def describe(self) -> str:
        """One line: where, which counter, both figures."""
        group = " ".join(f"{name}={getattr(self, name)!r}" for name in _GROUP)
        where = self.hour if self.grain == "hour" else f"{self.hour[:10]} (daily)"
        return (f"{self.tenant} {where} {group}: {self.counter} rollup={self.rollup} "
                f"records={self.records} (diff {self.rollup - self.records:+d})")


def _day_ms(day: date) -> int:
    return int(datetime.combine(day, datetime.min.time(), UTC).timestamp() * 1000)


def day_statements(dialect: Dialect, tenant: str, day: date
                   ) -> tuple[tuple[str, list[Any]], tuple[str, list[Any]]]:
    """(the rollups statement, the records statement) of ``tenant``'s ``day``; each row is
    ``hour_ms``, the group columns, then ``ROLLUP_COUNTERS``."""
    lo = _day_ms(day)
    rp = Params(dialect)
    rollups = (f"SELECT hour_ms, {', '.join(_GROUP)}, {quoted(ROLLUP_COUNTERS)} "
               f"FROM usage_hourly WHERE tenant = {rp.add(tenant, 'text')} "
               f"AND hour_ms >= {rp.add(lo, 'bigint')} AND hour_ms < "
               f"{rp.add(lo + DAY_MS, 'bigint')}")
    cp = Params(dialect)
    day_value: Any = day if dialect == "postgresql" else day.isoformat()
    groups = ", ".join(f"coalesce({c}, '')" for c in _GROUP)
    sums = ", ".join(f'CAST(sum("{c}") AS bigint)' for c in _SUMMED)
    positions = ", ".join(str(i + 1) for i in range(len(_GROUP) + 1))
    records = (f"SELECT ts_ms - ts_ms % {HOUR_MS}, {groups}, count(*), "
               "CAST(sum(CASE WHEN outcome <> 'completed' THEN 1 ELSE 0 END) AS bigint), "
               f"CAST(sum(CASE WHEN estimated THEN 1 ELSE 0 END) AS bigint), {sums} "
               f"FROM usage_records WHERE day = {cp.add(day_value, 'date')} "
               f"AND tenant = {cp.add(tenant, 'text')} GROUP BY {positions}")
    return (rollups, rp.values), (records, cp.values)


def daily_statement(dialect: Dialect, tenant: str, day: date) -> tuple[str, list[Any]]:
    """The ``usage_daily`` rows of ``tenant``'s ``day``: ``day_ms``, the group columns, then
    ``ROLLUP_COUNTERS`` (compared with the records statement of ``day_statements``)."""
    p = Params(dialect)
    return (f"SELECT day_ms, {', '.join(_GROUP)}, {quoted(ROLLUP_COUNTERS)} "
            f"FROM usage_daily WHERE tenant = {p.add(tenant, 'text')} "
            f"AND day_ms = {p.add(_day_ms(day), 'bigint')}"), p.values


def _by_group(rows: Sequence[Sequence[Any]], grain_ms: int = HOUR_MS
              ) -> dict[tuple[Any, ...], tuple[int, ...]]:
    n = len(_GROUP) + 1
    out: dict[tuple[Any, ...], tuple[int, ...]] = {}
    for row in rows:
        start = int(row[0])
        key = (start - start % grain_ms, *(str(v) for v in row[1:n]))
        counters = tuple(int(v or 0) for v in row[n:])
        previous = out.get(key)
        if previous is not None:  # cannot happen for a primary key; summed all the same
            counters = tuple(a + b for a, b in zip(previous, counters, strict=True))
        out[key] = counters
    return out


def compare(tenant: str, rollup_rows: Sequence[Sequence[Any]],
            record_rows: Sequence[Sequence[Any]], *, grain: str = "hour") -> list[Drift]:
    """Every (hour or day, group, counter) where the rollups and the records' sums differ;
    ``record_rows`` are by hour either way (``day_statements``)."""
    grain_ms = HOUR_MS if grain == "hour" else DAY_MS
    rollups, records = _by_group(rollup_rows, grain_ms), _by_group(record_rows, grain_ms)
    zeros = (0,) * len(ROLLUP_COUNTERS)
    drifts: list[Drift] = []
    for key in sorted(set(rollups) | set(records)):
        stored, summed = rollups.get(key, zeros), records.get(key, zeros)
        if stored == summed:
            continue
        hour_ms, *group = key
        names = dict(zip(_GROUP, group, strict=True))
        for counter, a, b in zip(ROLLUP_COUNTERS, stored, summed, strict=True):
            if a != b:
                drifts.append(Drift(tenant=tenant, hour=iso_hour(hour_ms), counter=counter,
                                    rollup=a, records=b, grain=grain, **names))
    return drifts
