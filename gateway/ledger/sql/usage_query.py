"""The usage query: rollup sums grouped by any dimension, in group order, a page at a time.

One statement per page, on one rollup table (never the records)::

    SELECT * FROM (
        SELECT <group expressions> AS g0, g1, ..., CAST(sum(<counter>) AS bigint), ...
        FROM usage_hourly
        WHERE tenant = :tenant AND hour_ms >= :lo AND hour_ms < :hi [AND <first> >= :a0]
        GROUP BY <group expressions>) AS g
    [WHERE (g0, g1, ...) > (:a0, :a1, ...)]
    ORDER BY g0, g1, ... LIMIT :limit + 1

A read of whole UTC days (``from`` and ``to`` at midnight) not grouped by hour reads
``usage_daily`` for the days already compacted (``compact.py``: the same groups and
counters) and ``usage_hourly`` for the rest, one ``UNION ALL`` as the source (time column
``t``): a closed tenant-month is at most 31 rows a group rather than 744. ``tenant = :tenant
AND hour_ms`` (or ``day_ms``) in a range is a range of the rollups' primary key (tenant
first, then the time), so a tenant's month is one index range of each table whatever the
number of records behind it. The admin's all-tenant read drops the tenant condition (and
scans the rollups of every tenant). A read of whole days grouped by nothing but ``tenant``,
``team``, ``organization``, ``day`` or ``month`` (the console's operator page, a total) takes
the tenant rollups instead (``usage_daily_tenants``, then ``usage_hourly_tenants`` for the
hours not compacted into days, then ``usage_hourly`` for the last hour or two): about one row
a tenant a day or hour, so a month across 200 tenants is some 6,000 rows (and a day's hours)
whatever the number of groups behind them.

Dimensions: ``hour`` (``hour_ms``), ``day`` (``hour_ms - hour_ms % 86400000``: UTC days),
``month`` (a ``CASE`` over the month starts inside the range, computed here, so both dialects
run the same integer comparisons), and the rollup's key columns ``tenant``, ``key``,
``model``, ``class``, ``version``, ``batch``, ``team``, ``organization``. Text orders by code
point in both dialects (:func:`~gateway.ledger.sql.params.ordered`).

Pagination is keyset: the cursor (``next``) is the last row's group values, base64url of a
small JSON object that also names the grouping, so a cursor of another grouping (or anything
else) is refused instead of answering wrong rows. The next page starts strictly after it; the
first group value also bounds the scan (``<first> >= :a0``), so late pages of a time-grouped
read skip the hours already returned. A cursor never widens what the caller may read: the
tenant condition comes from the caller, not from the cursor.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.ledger.aggregate import UsageRow
from gateway.ledger.sql.compact import TENANTS_THROUGH, THROUGH
from gateway.ledger.sql.params import Params, ordered
from gateway.ledger.sql.schema import ROLLUP_COUNTERS, ROLLUP_KEYS, TENANT_ROLLUP_KEYS
from gateway.ledger.window import DAY_MS, MAX_RANGE_DAYS, iso_day, iso_hour, iso_month

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from gateway.ledger.sql.migrations import Dialect

__all__ = [
    "DEFAULT_LIMIT",
    "DIMENSIONS",
    "MAX_LIMIT",
    "TEXT_DIMENSIONS",
    "TIME_DIMENSIONS",
    "UsagePage",
    "UsageQuery",
    "UsageQueryError",
    "check_dimensions",
    "check_text",
    "decode_cursor",
    "encode_cursor",
    "parse_group_by",
]

DEFAULT_LIMIT = 1000
MAX_LIMIT = 10_000
TIME_DIMENSIONS = ("hour", "day", "month")
#: a text dimension and its ``usage_hourly`` column (also the ``UsageRow`` field)
TEXT_DIMENSIONS: dict[str, str] = {
    "tenant": "tenant", "key": "key_id", "model": "model", "class": "request_class",
    "version": "version", "batch": "batch_id", "team": "team", "organization": "organization",
}
DIMENSIONS: tuple[str, ...] = (*TIME_DIMENSIONS, *TEXT_DIMENSIONS)
#: the dimensions ``usage_daily_tenants`` answers (a read of whole days grouped by these only)
_TENANT_LEVEL = frozenset({"day", "month", "tenant", "team", "organization"})
#: columns where the rollup keeps a record's None as "": answered as None again
_NULLABLE = frozenset({"key_id", "version", "batch_id", "team", "organization"})
#: the longest text a cursor or a tenant parameter may carry
_MAX_TEXT = 1024
_MAX_CURSOR = 16_384


class UsageQueryError(ValueError):
    """A grouping, limit, cursor or tenant that cannot be queried; ``param`` names it."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


class UsagePage(msgspec.Struct, kw_only=True):
    """One page of rows; ``next`` is the cursor of the page after it (None on the last)."""

    rows: list[UsageRow]
    has_more: bool
    next: str | None


class _Cursor(msgspec.Struct):
    g: list[str]
    k: list[int | str]


def check_text(value: str, param: str) -> str:
    """``value`` if a database can compare it (valid UTF-8, no NUL, not huge)."""
    try:
        value.encode()
    except UnicodeEncodeError:
        raise UsageQueryError(f"{param}: not valid text", param) from None
    if "\x00" in value or len(value) > _MAX_TEXT:
        raise UsageQueryError(f"{param}: not a name (no NUL, at most {_MAX_TEXT} characters)",
                              param)
    return value


def parse_group_by(text: str | None, default: Sequence[str]) -> tuple[str, ...]:
    """A comma list of dimensions (spaces allowed); absent: ``default``; empty: none (one
    total row)."""
    if text is None:
        return tuple(default)
    return check_dimensions(d.strip() for d in text.split(",") if d.strip())


def check_dimensions(names: Iterable[str]) -> tuple[str, ...]:
    """``names`` as a grouping, if each is a known dimension and none repeats."""
    dims = tuple(names)
    unknown = [d for d in dims if d not in DIMENSIONS]
    if unknown:
        shown = ", ".join(repr(d[:32]) for d in unknown[:4])
        raise UsageQueryError(f"group_by: unknown dimension {shown}; use any of "
                              f"{', '.join(DIMENSIONS)}", "group_by")
    if len(set(dims)) != len(dims):
        raise UsageQueryError("group_by: a dimension is repeated", "group_by")
    return dims


def encode_cursor(group_by: Sequence[str], key: Sequence[int | str]) -> str:
    raw = msgspec.json.encode(_Cursor(list(group_by), list(key)))
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode_cursor(text: str, group_by: Sequence[str]) -> tuple[int | str, ...]:
    """The group values a cursor of this grouping holds; ``UsageQueryError`` otherwise."""
    bad = UsageQueryError("after: not a cursor of this query (use the `next` of a previous "
                          "page with the same group_by)", "after")
    if len(text) > _MAX_CURSOR:
        raise bad
    try:
        raw = base64.urlsafe_b64decode(text.encode("ascii") + b"=" * (-len(text) % 4))
        cursor = msgspec.json.decode(raw, type=_Cursor)
    except (binascii.Error, ValueError, UnicodeError, msgspec.DecodeError):
        raise bad from None
    if cursor.g != list(group_by) or len(cursor.k) != len(group_by):
        raise bad
    for dim, value in zip(group_by, cursor.k, strict=True):
        if dim in TIME_DIMENSIONS:
            if not isinstance(value, int) or not 0 <= value < 2**62:
                raise bad
        elif not isinstance(value, str):
            raise bad
        else:
            try:
                check_text(value, "after")
            except UsageQueryError:
                raise bad from None
    return tuple(cursor.k)


def _days_and_hours(p: Params, tenant: str | None, lo_ms: int, hi_ms: int,
                    by_tenant: bool = False) -> str:
    """The rollup rows of a read of whole days, as one source with a time column ``t``: the
    days before the compaction boundary from ``usage_daily``, the hours from it on from
    ``usage_hourly`` (``compact.py``). With ``by_tenant`` (the read groups by no text
    dimension but tenant, team and organization) the tenant rollups instead: the days from
    ``usage_daily_tenants``, then the hours up to the tenant boundary from
    ``usage_hourly_tenants``, the rest from ``usage_hourly``. Each side carries the tenant and
    the range; the boundaries are read in the statement's snapshot."""
    keys = TENANT_ROLLUP_KEYS if by_tenant else ROLLUP_KEYS
    columns = ", ".join([*keys, *(f'"{c}"' for c in ROLLUP_COUNTERS)])
    parts: list[tuple[str, str, list[str]]]
    if by_tenant:  # the tenant hours up to their boundary, the last ones from usage_hourly
        # (two plain bounds, not GREATEST of them: each is an index condition, where the
        # planner reads GREATEST as unknown and scans every hourly row of the range)
        parts = [("usage_daily_tenants", "day_ms", [f"day_ms < {THROUGH}"]),
                 ("usage_hourly_tenants", "hour_ms",
                  [f"hour_ms >= {THROUGH}", f"hour_ms < {TENANTS_THROUGH}"]),
                 ("usage_hourly", "hour_ms",
                  [f"hour_ms >= {THROUGH}", f"hour_ms >= {TENANTS_THROUGH}"])]
    else:
        parts = [("usage_daily", "day_ms", [f"day_ms < {THROUGH}"]),
                 ("usage_hourly", "hour_ms", [f"hour_ms >= {THROUGH}"])]
    sides = []
    for table, column, bounds in parts:
        where = [f"tenant = {p.add(tenant, 'text')}"] if tenant is not None else []
        where += [f"{column} >= {p.add(lo_ms, 'bigint')}",
                  f"{column} < {p.add(hi_ms, 'bigint')}", *bounds]
        sides.append(f"SELECT {column} AS t, {columns} FROM {table} "
                     f"WHERE {' AND '.join(where)}")
    return f"({' UNION ALL '.join(sides)}) AS u"


def _month_starts(lo: int, hi: int) -> list[int]:
    """Unix ms of the first instant of every UTC month that meets ``[lo, hi)``."""
    when = datetime.fromtimestamp(lo / 1000, UTC)
    month = date(when.year, when.month, 1)
    starts: list[int] = []
    while True:
        ms = int(datetime.combine(month, datetime.min.time(), UTC).timestamp() * 1000)
        if ms >= hi:
            return starts
        starts.append(ms)
        month = date(month.year + month.month // 12, month.month % 12 + 1, 1)


@dataclass(frozen=True, slots=True)
class UsageQuery:
    """One page's statement and how to read its rows; build it with :meth:`build`."""

    group_by: tuple[str, ...]
    limit: int
    sql: str
    params: list[Any]
    #: a cursor was given with no dimensions (one total row, already returned)
    exhausted: bool = False

    @classmethod
    def build(
        cls,
        dialect: Dialect,
        tenant: str | None,
        lo_ms: int,
        hi_ms: int,
        group_by: Sequence[str],
        *,
        limit: int = DEFAULT_LIMIT,
        after: str | None = None,
    ) -> UsageQuery:
        """Validate and write the statement; raises ``UsageQueryError`` naming the bad
        parameter. Hours count when their start is in ``[lo_ms, hi_ms)``."""
        dims = check_dimensions(group_by)
        if not 1 <= limit <= MAX_LIMIT:
            raise UsageQueryError(f"limit: between 1 and {MAX_LIMIT}", "limit")
        if hi_ms <= lo_ms:
            raise UsageQueryError("to: must be after from", "to")
        if hi_ms - lo_ms > MAX_RANGE_DAYS * DAY_MS:
            raise UsageQueryError(f"to: the range is longer than {MAX_RANGE_DAYS} days", "to")
        if tenant is not None:
            check_text(tenant, "tenant")
        key = decode_cursor(after, dims) if after is not None else None

        # whole UTC days without an hour dimension: the daily rollups answer the same sums
        # from at most 31 rows a group a month instead of 744
        daily = "hour" not in dims and lo_ms % DAY_MS == 0 and hi_ms % DAY_MS == 0
        p = Params(dialect)
        if daily:
            by_tenant = all(d in _TENANT_LEVEL for d in dims)
            source, t = _days_and_hours(p, tenant, lo_ms, hi_ms, by_tenant), "t"
        else:
            source, t = "usage_hourly", "hour_ms"
        exprs: list[str] = []
        for dim in dims:
            if dim == "hour":
                exprs.append(t)
            elif dim == "day":
                exprs.append(f"({t} - {t} % {DAY_MS})")
            elif dim == "month":
                starts = _month_starts(lo_ms, hi_ms)
                bounds = [*starts[1:], hi_ms]
                whens = " ".join(f"WHEN {t} < {b} THEN {m}" for m, b in zip(
                    starts, bounds, strict=True))
                exprs.append(f"(CASE {whens} END)")
            else:
                exprs.append(ordered(TEXT_DIMENSIONS[dim], dialect))
        where: list[str] = []
        if tenant is not None:
            where.append(f"tenant = {p.add(tenant, 'text')}")
        where.append(f"{t} >= {p.add(lo_ms, 'bigint')}")
        where.append(f"{t} < {p.add(hi_ms, 'bigint')}")
        if key and dims:  # the scan starts at the cursor's first group value
            first = dims[0]
            if first in TIME_DIMENSIONS:
                where.append(f"{t} >= {p.add(key[0], 'bigint')}")
            else:
                column = ordered(TEXT_DIMENSIONS[first], dialect)
                where.append(f"{column} >= {p.add(key[0], 'text')}")
        sums = ", ".join(f'CAST(sum("{c}") AS bigint) AS "{c}"' for c in ROLLUP_COUNTERS)
        groups = [f"{e} AS g{i}" for i, e in enumerate(exprs)]
        inner = (f"SELECT {', '.join([*groups, sums])} FROM {source} "
                 f"WHERE {' AND '.join(where)}")
        if exprs:
            inner += f" GROUP BY {', '.join(exprs)}"
        refs = [ordered(f"g{i}", dialect) if d in TEXT_DIMENSIONS else f"g{i}"
                for i, d in enumerate(dims)]
        sql = f"SELECT * FROM ({inner}) AS g"
        if key and dims:
            values = [p.add(v, "bigint" if d in TIME_DIMENSIONS else "text")
                      for d, v in zip(dims, key, strict=True)]
            sql += f" WHERE ({', '.join(refs)}) > ({', '.join(values)})"
        if refs:
            sql += f" ORDER BY {', '.join(refs)}"
        sql += f" LIMIT {p.add(limit + 1, 'bigint')}"
        return cls(dims, limit, sql, p.values, exhausted=key is not None and not dims)

    def page(self, fetched: Sequence[Sequence[Any]]) -> UsagePage:
        """The page of the statement's result rows (``limit + 1`` at most)."""
        n = len(self.group_by)
        # with no dimension the statement answers one total row, even over no rollups
        rows = [r for r in fetched if n or (r[n] is not None and int(r[n]))]
        if self.exhausted:
            rows = []
        more = len(rows) > self.limit
        rows = rows[: self.limit]
        nxt = None
        if more:
            last = rows[-1]
            nxt = encode_cursor(self.group_by, [int(v) if d in TIME_DIMENSIONS else str(v)
                                                for d, v in zip(self.group_by, last[:n],
                                                                strict=True)])
        return UsagePage(rows=[self._row(r) for r in rows], has_more=more, next=nxt)

    def _row(self, values: Sequence[Any]) -> UsageRow:
        n = len(self.group_by)
        fields: dict[str, Any] = {}
        for dim, value in zip(self.group_by, values[:n], strict=True):
            if dim == "hour":
                fields["hour"] = iso_hour(int(value))
            elif dim == "day":
                fields["day"] = iso_day(int(value))
            elif dim == "month":
                fields["month"] = iso_month(int(value))
            else:
                column = TEXT_DIMENSIONS[dim]
                fields[column] = (value or None) if column in _NULLABLE else value
        for name, value in zip(ROLLUP_COUNTERS, values[n:], strict=True):
            fields[name] = int(value or 0)
        return UsageRow(**fields)

