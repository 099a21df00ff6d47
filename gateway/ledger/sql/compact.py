"""The daily rollups of PostgreSQL, made once a day has closed, and the boundary reads use.

Maintaining ``usage_daily`` on the write path (one more upsert per flush, nearly one row per
record when groups are many) cost PostgreSQL 5-23 µs a record and a quarter of the records a
second (``loadtest/bench/LEDGER.md``), and left each tenant's daily rows scattered one to a
heap page (a row is created when its group's first record of the day lands, among every
other tenant's), so a tenant-month read fetched thousands of pages. Here the write path
maintains ``usage_hourly`` alone; once a UTC day has closed (plus ``GRACE_MS`` for the records
of requests that ended after midnight), ``compact_day`` sums that day's hourly rows into
``usage_daily`` in one statement, in primary-key order (tenant first), so a tenant's day is a
run of neighbouring rows and a tenant-month about 30 short runs; the same statement sums those
rows per tenant, team and organization into ``usage_daily_tenants`` (a read across every
tenant: the month is a few thousand rows there against every group's daily rows).

``usage_rollup_state.daily_through_ms`` (one row) is the first day not yet in
``usage_daily``; reads take days before it from ``usage_daily`` and hours from it on from
``usage_hourly`` (``usage_query.py``), in one statement, so every answer is whole whatever the
compaction is doing. The boundary moves in the compaction's transaction, under the state row's
lock (``FOR UPDATE``). A record that lands for a day already compacted (a spool replayed after
an outage, a late batch) is added to ``usage_daily`` by the write path itself: the flush's
daily upsert takes only records before the boundary, read with ``FOR SHARE`` on the state row,
so a flush and a compaction of the same day are ordered by that lock: a flush that locks first
is committed before the compaction reads the hourly rows (and its records are in them); a
flush that waits for a compaction reads the moved boundary (PostgreSQL re-reads a locked row's
newest version) and adds its records of that day itself. Either way each record is in the
daily sums exactly once. The compaction replaces a day's rows (``DO UPDATE SET c =
excluded.c``) rather than adding to them, so running it twice, or over daily rows an earlier
gateway version maintained, leaves the sums of the hourly rows.

The tenant rollups answer reads grouped by nothing finer than tenant, team and organization
(about one row a tenant per day or hour). ``usage_daily_tenants`` is written by the day's
compaction from the rows it writes; for the days not compacted yet, ``compact_tenant_hours``
sums each hour's rows per tenant into ``usage_hourly_tenants`` once the hour has closed (plus
``HOUR_GRACE_MS``), up to ``tenants_through_ms``, the state row's second boundary, under the
same lock; a day's compaction drops its tenant hours. So a read across every tenant takes the
compacted days from ``usage_daily_tenants``, the hours from the daily boundary to the tenant
boundary from ``usage_hourly_tenants``, and only the last hour or two from ``usage_hourly``.
A late record is added by its flush to ``usage_daily_tenants`` (its day compacted) or to
``usage_hourly_tenants`` (its hour compacted, its day not), ordered against the compactions by
the state row's lock as above.

SQLite keeps its rollups by trigger in the writer's transaction (one writer, nothing to
gain); its boundaries are ``ALWAYS_CURRENT_MS`` and nothing is compacted.
"""

from __future__ import annotations

from gateway.ledger.sql.schema import (
    ROLLUP_COUNTERS,
    ROLLUP_KEYS,
    TENANT_ROLLUP_KEYS,
    quoted,
)

__all__ = [
    "COMPACT_DAY",
    "COMPACT_TENANT_HOURS",
    "DROP_TENANT_HOURS",
    "GRACE_MS",
    "HOUR_GRACE_MS",
    "HOUR_MS",
    "LOCK_STATE",
    "LOCK_TENANT_STATE",
    "MOVE_BOUNDARY",
    "MOVE_TENANT_BOUNDARY",
    "TENANTS_THROUGH",
    "TENANTS_THROUGH_SHARED",
    "THROUGH",
    "THROUGH_SHARED",
]

#: how long after midnight a day is left open for the records of requests still running
GRACE_MS = 15 * 60_000
DAY_MS = 86_400_000

#: the boundary, as a scalar subquery (reads)
THROUGH = "(SELECT daily_through_ms FROM usage_rollup_state WHERE id = 1)"
#: the boundary for the write path, share-locked until the flush commits
THROUGH_SHARED = "(SELECT daily_through_ms FROM usage_rollup_state WHERE id = 1 FOR SHARE)"
#: the compaction's first statement: the boundary, locked against flushes and other replicas
LOCK_STATE = "SELECT daily_through_ms FROM usage_rollup_state WHERE id = 1 FOR UPDATE"
MOVE_BOUNDARY = "UPDATE usage_rollup_state SET daily_through_ms = $1::bigint WHERE id = 1"

#: how long after its end an hour is left open before its tenant rollups are made (records of
#: requests still running; one landing later is added by its flush)
HOUR_GRACE_MS = 60_000
HOUR_MS = 3_600_000
#: the tenant rollups' boundary: hours before it (and from the daily boundary on) are in
#: ``usage_hourly_tenants``, the reads' scalar subquery
TENANTS_THROUGH = "(SELECT tenants_through_ms FROM usage_rollup_state WHERE id = 1)"
#: the same for the write path, share-locked until the flush commits
TENANTS_THROUGH_SHARED = ("(SELECT tenants_through_ms FROM usage_rollup_state WHERE id = 1 "
                          "FOR SHARE)")
LOCK_TENANT_STATE = ("SELECT daily_through_ms, tenants_through_ms FROM usage_rollup_state "
                     "WHERE id = 1 FOR UPDATE")
MOVE_TENANT_BOUNDARY = ("UPDATE usage_rollup_state SET tenants_through_ms = $1::bigint "
                        "WHERE id = 1")


def _compact_day() -> str:
    """``$1`` is the day's first ms: its hourly rows summed per group into its daily rows,
    and those (as written: the whole day's sums) per tenant, team and organization into its
    ``usage_daily_tenants`` rows, in one statement."""
    keys = ", ".join(ROLLUP_KEYS)
    tenant_keys = ", ".join(TENANT_ROLLUP_KEYS)
    sums = ", ".join(f'sum("{c}")' for c in ROLLUP_COUNTERS)
    replace = ", ".join(f'"{c}" = excluded."{c}"' for c in ROLLUP_COUNTERS)
    return f"""
WITH daily AS (
    INSERT INTO usage_daily (day_ms, {keys}, {quoted(ROLLUP_COUNTERS)})
    SELECT $1::bigint, {keys}, {sums}
    FROM usage_hourly WHERE hour_ms >= $1::bigint AND hour_ms < $1::bigint + {DAY_MS}
    GROUP BY {keys} ORDER BY {keys}
    ON CONFLICT (tenant, day_ms, key_id, model, request_class, version, batch_id, team,
                 organization) DO UPDATE SET {replace}
    RETURNING {tenant_keys}, {quoted(ROLLUP_COUNTERS)}
)
INSERT INTO usage_daily_tenants (day_ms, {tenant_keys}, {quoted(ROLLUP_COUNTERS)})
SELECT $1::bigint, {tenant_keys}, {sums} FROM daily
GROUP BY {tenant_keys} ORDER BY {tenant_keys}
ON CONFLICT (day_ms, {tenant_keys}) DO UPDATE SET {replace}
"""


def _compact_tenant_hours() -> str:
    """``[$1, $2)``: whole closed hours, their hourly rows summed per tenant, team and
    organization into ``usage_hourly_tenants`` (replacing what is there)."""
    tenant_keys = ", ".join(TENANT_ROLLUP_KEYS)
    sums = ", ".join(f'sum("{c}")' for c in ROLLUP_COUNTERS)
    replace = ", ".join(f'"{c}" = excluded."{c}"' for c in ROLLUP_COUNTERS)
    return f"""
INSERT INTO usage_hourly_tenants (hour_ms, {tenant_keys}, {quoted(ROLLUP_COUNTERS)})
SELECT hour_ms, {tenant_keys}, {sums}
FROM usage_hourly WHERE hour_ms >= $1::bigint AND hour_ms < $2::bigint
GROUP BY hour_ms, {tenant_keys} ORDER BY hour_ms, {tenant_keys}
ON CONFLICT (hour_ms, {tenant_keys}) DO UPDATE SET {replace}
"""


COMPACT_DAY = _compact_day()
COMPACT_TENANT_HOURS = _compact_tenant_hours()
#: the compacted day's tenant hours: read no more (the day is in ``usage_daily_tenants``)
DROP_TENANT_HOURS = (f"DELETE FROM usage_hourly_tenants WHERE hour_ms >= $1::bigint "
                     f"AND hour_ms < $1::bigint + {DAY_MS}")
