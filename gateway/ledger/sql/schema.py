"""The columns of the usage tables, in one place, and a record's row.

``usage_records`` holds one row per record, keyed ``(day, request_id)`` (the request id is the
idempotency key; the day is the partition key in PostgreSQL, so it is part of the key).
``usage_hourly`` holds the rollups: one row per (tenant, hour, key, model, class, version,
batch, team, organization), the sums of the records that landed in it, updated in the same
transaction that inserts the records, so usage queries never scan raw records.

The DDL itself is in ``migrations.py`` (frozen per version); ``tests/ledger/sql`` checks that
these names, the record's fields and the migrated tables agree, so a field added to the record
without a migration fails a test instead of a write.

A row always fits its columns (``fit_columns``, the last line of defence): token counts,
attempts and status are PostgreSQL ``integer`` (32 bits), costs ``bigint`` (SQLite's INTEGER is
64 bits, and Python's ``sqlite3`` raises ``OverflowError`` past it), and the rollups add each
record's tokens and costs into ``bigint`` sums. A number outside its column (or one that would
overflow the sums it is added to) would make the database refuse the whole row, and a refused
record is quarantined: in no usage query, export or bill. So such a number is clamped (tokens
into ``[0, INTEGER_MAX]``, costs into ``[0, COST_MAX]``) and the record is marked ``estimated``
with ``estimate_reason`` ``clamped:<field>``: it is stored, and says its figure is not the one
it was given. The usage a record is made from is validated before (``accounting.usage_bounds``),
so only a record from elsewhere (an older spool, a bug) ever needs this.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from gateway.ledger.record import UsageRecord

__all__ = [
    "COST_MAX",
    "INTEGER_MAX",
    "RECORD_COLUMNS",
    "ROLLUP_COUNTERS",
    "ROLLUP_KEYS",
    "TENANT_ROLLUP_KEYS",
    "fit_columns",
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
    "cost_reasoning", "cost_cached", "cost_cache_write", "currency", "api", "estimate_reason",
    "delivered", "sent_output", "continued", "continuation_prompt", "continuation_cost",
)

#: the largest value of PostgreSQL's ``integer`` (the token, attempts and status columns)
_INTEGER_BITS = 31
INTEGER_MAX = 2**_INTEGER_BITS - 1
#: the largest cost of one record, micro-units: 281 million currency units, far above any
#: request's cost, and 2**15 times below ``bigint``, so the rollups' sums of such records fit
#: (``ts_ms`` is the gateway's clock; its day partition is made from it before any row is)
_COST_BITS = 48
COST_MAX = 2**_COST_BITS - 1
#: the record's ``integer`` columns: counts, never negative
_INTEGERS = ("system", "history", "new", "tools", "cached", "cache_write", "output",
             "reasoning", "prompt_total", "attempts", "status")
#: the record's cost columns (``bigint``): micro-units, never negative
_COSTS = ("cost_micros", "cost_system", "cost_history", "cost_new", "cost_tools",
          "cost_output", "cost_reasoning", "cost_cached", "cost_cache_write")

#: the rollup's group (after ``hour_ms``); a record's None is stored as ""
ROLLUP_KEYS: tuple[str, ...] = (
    "tenant", "key_id", "model", "request_class", "version", "batch_id", "team", "organization",
)

#: the keys of ``usage_daily_tenants`` (migration 12): a read grouped by no other text
#: dimension sums its rows, about one a tenant a day (``usage_query.py``)
TENANT_ROLLUP_KEYS: tuple[str, ...] = ("tenant", "team", "organization")

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


def fit_columns(record: UsageRecord) -> UsageRecord:
    """The record itself when every number fits its column (the one case in practice), else a
    copy with each one clamped into its range, marked ``estimated`` with the first field
    clamped as its reason. The check is one OR per field: for integers, ``(a | b | ...) >> k``
    is 0 exactly when each is in ``[0, 2**k)`` (a negative one makes the OR negative), some
    0.2 us a record on the flush path where min/max over tuples took 0.9."""
    r = record
    if not ((r.system | r.history | r.new | r.tools | r.cached | r.cache_write | r.output
             | r.reasoning | r.prompt_total | r.attempts | r.status) >> _INTEGER_BITS
            or (r.cost_micros | r.cost_system | r.cost_history | r.cost_new | r.cost_tools
                | r.cost_output | r.cost_reasoning | r.cost_cached | r.cost_cache_write)
            >> _COST_BITS):
        return record
    changes: dict[str, Any] = {}
    for names, high in ((_INTEGERS, INTEGER_MAX), (_COSTS, COST_MAX)):
        for name in names:
            value = getattr(r, name)
            if not 0 <= value <= high:
                changes[name] = min(max(value, 0), high)
    return msgspec.structs.replace(record, **changes, estimated=True,
                                   estimate_reason=f"clamped:{next(iter(changes))}")


def record_row(record: UsageRecord) -> tuple[Any, ...]:
    """The record's values in ``RECORD_COLUMNS`` order (``day`` not included), each number
    within its column (``fit_columns``)."""
    r = fit_columns(record)
    return (
        r.request_id, r.ts_ms, r.tenant, r.team, r.organization, r.key_id, r.model,
        r.upstream_model, r.request_class, r.pool, r.backend, r.version, r.batch_id,
        r.attempts, r.status, r.outcome, r.system, r.history, r.new, r.tools, r.cached,
        r.cache_write, r.output, r.reasoning, r.prompt_total, r.estimated, r.ttft_ms,
        r.tpot_ms, r.duration_ms, r.cost_micros, r.cost_system, r.cost_history, r.cost_new,
        r.cost_tools, r.cost_output, r.cost_reasoning, r.cost_cached, r.cost_cache_write,
        r.currency, r.api, r.estimate_reason, r.delivered, min(max(r.sent_output, 0), INTEGER_MAX),
        r.continued, min(max(r.continuation_prompt, 0), INTEGER_MAX),
        min(max(r.continuation_cost, 0), COST_MAX),
    )


def rollup_contribution(record: UsageRecord) -> tuple[tuple[Any, ...], tuple[int, ...]]:
    """(the rollup key after ``hour_ms``, the record's counters): what the stores add, and what
    reconciliation sums from the records to check the rollups (as stored: ``fit_columns``)."""
    r = fit_columns(record)
    key = (r.tenant, r.key_id or "", r.model, r.request_class, r.version or "",
           r.batch_id or "", r.team or "", r.organization or "")
    counters = (
        1, int(r.outcome != "completed"), int(r.estimated), r.system, r.history, r.new,
        r.tools, r.cached, r.cache_write, r.output, r.reasoning, r.prompt_total, r.cost_micros,
        r.cost_system, r.cost_history, r.cost_new, r.cost_tools, r.cost_output,
        r.cost_reasoning, r.cost_cached, r.cost_cache_write,
    )
    return key, counters
