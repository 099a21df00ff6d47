"""The columns of the usage tables, in one place, and a record's row.

``usage_records`` holds one row per record, keyed ``(day, request_id)`` (the request id is the
idempotency key; the day is the partition key in PostgreSQL, so it is part of the key).
``usage_hourly`` holds the rollups: one row per (tenant, hour, key, model, class, version,
batch, team, organization), the sums of the records that landed in it, updated in the same
transaction that inserts the records, so usage queries never scan raw records.

The DDL itself is in ``migrations.py`` (frozen per version); ``tests/ledger/sql`` checks that
these names, the record's fields and the migrated tables agree, so a field added to the record
without a migration fails a test instead of a write.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.ledger.record import UsageRecord

__all__ = [
    "RECORD_COLUMNS",
    "ROLLUP_COUNTERS",
    "ROLLUP_KEYS",
    "hour_of",
    "quoted",
    "record_row",
    "rollup_contribution",
]

_HOUR_MS = 3_600_000

#: ``usage_records`` columns after ``day``, in table order: the record's fields
RECORD_COLUMNS: tuple[str, ...] = (
    "request_id", "ts_ms", "tenant", "team", "organization", "key_id", "model",
    "upstream_model", "request_class", "pool", "backend", "version", "batch_id", "attempts",
    "status", "outcome", "system", "history", "new", "tools", "cached", "cache_write",
    "output", "reasoning", "prompt_total", "estimated", "ttft_ms", "tpot_ms", "duration_ms",
    "cost_micros", "cost_system", "cost_history", "cost_new", "cost_tools", "cost_output",
    "cost_reasoning", "cost_cached", "cost_cache_write", "currency", "api",
)

#: the rollup's group (after ``hour_ms``); a record's None is stored as ""
ROLLUP_KEYS: tuple[str, ...] = (
    "tenant", "key_id", "model", "request_class", "version", "batch_id", "team", "organization",
)

#: the rollup's sums; ``requests`` counts records, ``estimated`` and ``failed`` count those
#: records, the rest sum the record's field of the same name
ROLLUP_COUNTERS: tuple[str, ...] = (
    "requests", "failed", "estimated", "system", "history", "new", "tools", "cached",
    "cache_write", "output", "reasoning", "prompt_total", "cost_micros", "cost_system",
    "cost_history", "cost_new", "cost_tools", "cost_output", "cost_reasoning", "cost_cached",
    "cost_cache_write",
)


def quoted(names: tuple[str, ...] | list[str]) -> str:
    """``"a", "b"``: column names quoted (``new`` is a keyword in SQLite triggers)."""
    return ", ".join(f'"{n}"' for n in names)


def hour_of(ts_ms: int) -> int:
    """The unix-ms start of the UTC hour that holds ``ts_ms``."""
    return ts_ms - ts_ms % _HOUR_MS


def record_row(record: UsageRecord) -> tuple[Any, ...]:
    """The record's values in ``RECORD_COLUMNS`` order (``day`` not included)."""
    r = record
    return (
        r.request_id, r.ts_ms, r.tenant, r.team, r.organization, r.key_id, r.model,
        r.upstream_model, r.request_class, r.pool, r.backend, r.version, r.batch_id,
        r.attempts, r.status, r.outcome, r.system, r.history, r.new, r.tools, r.cached,
        r.cache_write, r.output, r.reasoning, r.prompt_total, r.estimated, r.ttft_ms,
        r.tpot_ms, r.duration_ms, r.cost_micros, r.cost_system, r.cost_history, r.cost_new,
        r.cost_tools, r.cost_output, r.cost_reasoning, r.cost_cached, r.cost_cache_write,
        r.currency, r.api,
    )


def rollup_contribution(record: UsageRecord) -> tuple[tuple[Any, ...], tuple[int, ...]]:
    """(the rollup key after ``hour_ms``, the record's counters): what the stores add, and what
    reconciliation sums from the records to check the rollups."""
    r = record
    key = (r.tenant, r.key_id or "", r.model, r.request_class, r.version or "",
           r.batch_id or "", r.team or "", r.organization or "")
    counters = (
        1, int(r.outcome != "completed"), int(r.estimated), r.system, r.history, r.new,
        r.tools, r.cached, r.cache_write, r.output, r.reasoning, r.prompt_total, r.cost_micros,
        r.cost_system, r.cost_history, r.cost_new, r.cost_tools, r.cost_output,
        r.cost_reasoning, r.cost_cached, r.cost_cache_write,
    )
    return key, counters
