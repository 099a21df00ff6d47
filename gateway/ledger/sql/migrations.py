"""Versioned schema migrations for both dialects, how they are applied, and the start-up check.

Each migration is frozen once released: a change to the schema is a new migration, never an
edit of an old one, so a database at any version reaches the current one the same way. The
applied versions are rows of ``gateway_schema``; ``migrate`` applies the missing ones in order,
each in its own transaction (PostgreSQL: under an advisory lock, so replicas started together
migrate once). ``check_version`` is the start-up check: a gateway refuses to run against a
schema older than it needs (run ``gateway db migrate``) or newer than it knows (a newer gateway
migrated it: upgrade this one).

1. ``usage_records``: one row per record, keyed ``(day, request_id)``; in PostgreSQL
   partitioned by range of ``day`` (the stores create each day's partition as records for it
   arrive, and drop whole partitions past retention).
2. ``usage_hourly``: the rollups, back-filled from the records already there; maintained from
   then on in the same transaction as the records (PostgreSQL: the store's insert statement;
   SQLite: a trigger on insert).
3. ``stored_responses``: the Responses API's stored responses (``store: true``), kept for
   ``previous_response_id`` and retrieval: one row per response id with its tenant, its expiry
   (indexed, for the retention sweep), the client's request, the chat messages it was
   translated to and the response object, each as JSON text (``responses.py``).
4. ``usage_records.api``: the client API of the request (chat, completions, embeddings,
   responses, messages); records written before it read as ``chat``.
5. ``usage_daily``: the rollups by UTC day (same group, same counters), back-filled from
   ``usage_hourly`` and maintained beside it in the same transaction (PostgreSQL: the store's
   insert statement; SQLite: a second trigger). A month read grouped by day or month (no
   hour) sums at most 31 rows a group instead of 744 (``usage_query.py``).
6. ``usage_rollup_state``: PostgreSQL's daily rollups are made from the hourly ones once a day
   has closed (``compact.py``), no longer per record on the write path: its one row's
   ``daily_through_ms`` is the first day not yet in ``usage_daily``, and a read takes days
   before it from ``usage_daily``, hours from it on from ``usage_hourly`` (the migration sets
   it to today's start and deletes today's daily rows, which the compaction rebuilds whole).
   A BRIN index on ``usage_hourly.hour_ms`` lets the compaction read a day of every tenant
   without scanning the table (hourly rows land in time order). SQLite keeps its trigger:
   its ``daily_through_ms`` is past any time, so the same reads take whole days from
   ``usage_daily``.
7. Stored responses as chains, and their storage per tenant: a row continuing another
   (``previous_response_id``) holds only its own new chat messages (``delta`` = 1) and points
   at it (``previous_id``, indexed), so a conversation of n turns is O(n) bytes, not O(n^2);
   the rows written before keep their whole conversation and read as before (``delta`` = 0
   ends a walk back). ``deleted`` marks a response deleted by its tenant that a later one
   still continues (kept, unreadable, until nothing needs it). ``bytes`` is each row's size
   (back-filled from its JSON), and ``stored_response_usage`` holds each tenant's rows and
   bytes, back-filled and kept by triggers on every insert, replacement and delete (the
   ``stored_responses`` bound reads one row of it).
8. ``usage_records.estimate_reason``: why a record's tokens are the gateway's estimate
   (``no_usage``, a backend figure not believed such as ``too_large:prompt_tokens``, or
   ``clamped:<field>``); NULL for the records written before it and for every record the
   backend's usage counted for.
9. ``usage_records.delivered`` and ``sent_output``: whether the whole answer reached the
   client's connection, and the output tokens handed to it (NULL and 0 for the records
   written before it).
10. ``usage_records.continued`` and ``continuation_prompt``: whether a stream broken after its
   first byte went on on another backend, and the prompt tokens of its continuations (false
   and 0 for the records written before it).
11. ``usage_records.continuation_cost``: the continuations' prompt priced at the uncached
   input price, micro-units (the operator's cost; in ``cost_micros`` too when the policy bills
   it); 0 for the records written before it.
12. The rollups by tenant, team and organization alone, so a read across every tenant (the
   console's operator page, ``/v1/usage`` without a tenant) sums a few thousand rows a month
   instead of every group's: ``usage_daily_tenants`` (about one row a tenant a day,
   back-filled from ``usage_daily``, kept beside it: PostgreSQL by the daily compaction and the
   write path's late records, SQLite by a trigger) and, for PostgreSQL's days not compacted yet,
   ``usage_hourly_tenants``, made from the hourly rollups once an hour has closed, up to
   ``usage_rollup_state.tenants_through_ms`` (``compact.py``; set to ``daily_through_ms`` here,
   so SQLite's is past any time and its table stays empty).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gateway.ledger.errors import LedgerError

__all__ = ["ALWAYS_CURRENT_MS", "MIGRATIONS", "SCHEMA_VERSION", "Dialect", "Migration",
           "SchemaMismatch", "verdict"]

Dialect = Literal["postgresql", "sqlite"]


class SchemaMismatch(LedgerError):
    """The database's schema is not the one this gateway was built for."""


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    postgresql: str
    sqlite: str

    def script(self, dialect: Dialect) -> str:
        return self.postgresql if dialect == "postgresql" else self.sqlite


# -- 1: the records -------------------------------------------------------------------------
def _record_columns(text: str, bigint: str, integer: str, real: str, boolean: str) -> str:
    tokens = " ".join(f'"{c}" {integer} NOT NULL DEFAULT 0,' for c in (
        "system", "history", "new", "tools", "cached", "cache_write", "output", "reasoning",
        "prompt_total"))
    costs = " ".join(f"{c} {bigint} NOT NULL DEFAULT 0," for c in (
        "cost_micros", "cost_system", "cost_history", "cost_new", "cost_tools", "cost_output",
        "cost_reasoning", "cost_cached", "cost_cache_write"))
    return f"""
    request_id {text} NOT NULL, ts_ms {bigint} NOT NULL, tenant {text} NOT NULL,
    team {text}, organization {text}, key_id {text}, model {text} NOT NULL,
    upstream_model {text}, request_class {text} NOT NULL, pool {text}, backend {text},
    version {text}, batch_id {text}, attempts {integer} NOT NULL DEFAULT 0,
    status {integer} NOT NULL DEFAULT 0, outcome {text} NOT NULL,
    {tokens}
    estimated {boolean} NOT NULL DEFAULT FALSE,
    ttft_ms {real}, tpot_ms {real}, duration_ms {real},
    {costs}
    currency {text} NOT NULL DEFAULT 'USD'"""


_SCHEMA_TABLE_PG = """
CREATE TABLE IF NOT EXISTS gateway_schema (
    version integer PRIMARY KEY, name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now());
"""
_SCHEMA_TABLE_SQLITE = """
CREATE TABLE IF NOT EXISTS gateway_schema (
    version INTEGER PRIMARY KEY, name TEXT NOT NULL,
    applied_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')));
"""

_RECORDS_PG = f"""
CREATE TABLE usage_records (
    day date NOT NULL,
    {_record_columns("text", "bigint", "integer", "double precision", "boolean")},
    PRIMARY KEY (day, request_id)
) PARTITION BY RANGE (day);
CREATE INDEX usage_records_tenant_ts ON usage_records (tenant, ts_ms);
"""
_RECORDS_SQLITE = f"""
CREATE TABLE usage_records (
    day TEXT NOT NULL,
    {_record_columns("TEXT", "INTEGER", "INTEGER", "REAL", "INTEGER")},
    PRIMARY KEY (day, request_id)
) WITHOUT ROWID;
CREATE INDEX usage_records_tenant_ts ON usage_records (tenant, ts_ms);
"""


# -- 2: the hourly rollups --------------------------------------------------------------------
_KEYS = ("tenant", "key_id", "model", "request_class", "version", "batch_id", "team",
         "organization")
_SUMMED = ("system", "history", "new", "tools", "cached", "cache_write", "output",
           "reasoning", "prompt_total", "cost_micros", "cost_system", "cost_history",
           "cost_new", "cost_tools", "cost_output", "cost_reasoning", "cost_cached",
           "cost_cache_write")
_COUNTERS = ("requests", "failed", "estimated", *_SUMMED)


def _rollup_table(text: str, bigint: str, table: str = "usage_hourly",
                  time_column: str = "hour_ms") -> str:
    """A rollup table: the time bucket, the group, the counters (hourly; daily in 5)."""
    keys = " ".join(f"{k} {text} NOT NULL DEFAULT ''," for k in _KEYS)
    counters = ", ".join(f'"{c}" {bigint} NOT NULL DEFAULT 0' for c in _COUNTERS)
    return f"""
CREATE TABLE {table} (
    {time_column} {bigint} NOT NULL, {keys} {counters},
    PRIMARY KEY (tenant, {time_column}, key_id, model, request_class, version, batch_id, team,
                 organization));
"""


def _backfill(estimated: str) -> str:
    sums = ", ".join(f'sum("{c}")' for c in _SUMMED)
    keys = ", ".join(f"coalesce({k}, '')" for k in _KEYS)
    return f"""
INSERT INTO usage_hourly (hour_ms, {", ".join(_KEYS)}, {", ".join(f'"{c}"' for c in _COUNTERS)})
SELECT ts_ms - ts_ms % 3600000, {keys}, count(*),
       sum(CASE WHEN outcome <> 'completed' THEN 1 ELSE 0 END),
       sum(CASE WHEN {estimated} THEN 1 ELSE 0 END), {sums}
FROM usage_records
GROUP BY ts_ms - ts_ms % 3600000, {keys};
"""


def _sqlite_trigger(table: str = "usage_hourly", time_column: str = "hour_ms",
                    grain_ms: int = 3600000) -> str:
    """SQLite's trigger adding each inserted record to one rollup table (hourly; daily in 5)."""
    keys = ", ".join(f"coalesce(NEW.{k}, '')" for k in _KEYS)
    values = ", ".join(f'NEW."{c}"' for c in _SUMMED)
    updates = ", ".join(f'"{c}" = "{c}" + excluded."{c}"' for c in _COUNTERS)
    return f"""
CREATE TRIGGER {table}_on_insert AFTER INSERT ON usage_records BEGIN
INSERT INTO {table} ({time_column}, {", ".join(_KEYS)}, {", ".join(f'"{c}"' for c in _COUNTERS)})
VALUES (NEW.ts_ms - NEW.ts_ms % {grain_ms}, {keys}, 1,
        CASE WHEN NEW.outcome <> 'completed' THEN 1 ELSE 0 END,
        CASE WHEN NEW.estimated THEN 1 ELSE 0 END, {values})
ON CONFLICT (tenant, {time_column}, key_id, model, request_class, version, batch_id, team,
             organization) DO UPDATE SET {updates};
END;
"""


# -- 3: stored responses -----------------------------------------------------------------------
def _stored_responses(text: str, bigint: str) -> str:
    return f"""
CREATE TABLE stored_responses (
    id {text} PRIMARY KEY, tenant {text} NOT NULL, created_ms {bigint} NOT NULL,
    expires_ms {bigint} NOT NULL, request {text} NOT NULL, messages {text} NOT NULL,
    answer {text} NOT NULL);
CREATE INDEX stored_responses_expires ON stored_responses (expires_ms);
"""


# -- 5: the daily rollups ---------------------------------------------------------------------
def _daily_backfill() -> str:
    """The days of the hourly rollups already there (the records may be past retention)."""
    sums = ", ".join(f'sum("{c}")' for c in _COUNTERS)
    keys = ", ".join(_KEYS)
    return f"""
INSERT INTO usage_daily (day_ms, {keys}, {", ".join(f'"{c}"' for c in _COUNTERS)})
SELECT hour_ms - hour_ms % 86400000, {keys}, {sums}
FROM usage_hourly
GROUP BY hour_ms - hour_ms % 86400000, {keys};
"""


# -- 6: daily rollups from closed days (PostgreSQL), the state the reads consult -------------
#: SQLite's ``daily_through_ms``: later than any record (its trigger keeps every day current)
ALWAYS_CURRENT_MS = 2**62
_TODAY_MS_PG = ("(extract(epoch FROM date_trunc('day', now() AT TIME ZONE 'UTC'))"
                "::bigint * 1000)")
_ROLLUP_STATE_PG = f"""
CREATE TABLE usage_rollup_state (
    id integer PRIMARY KEY CHECK (id = 1), daily_through_ms bigint NOT NULL);
INSERT INTO usage_rollup_state (id, daily_through_ms) VALUES (1, {_TODAY_MS_PG});
DELETE FROM usage_daily WHERE day_ms >= {_TODAY_MS_PG};
CREATE INDEX usage_hourly_hour_brin ON usage_hourly USING brin (hour_ms);
"""
_ROLLUP_STATE_SQLITE = f"""
CREATE TABLE usage_rollup_state (
    id INTEGER PRIMARY KEY CHECK (id = 1), daily_through_ms INTEGER NOT NULL);
INSERT INTO usage_rollup_state (id, daily_through_ms) VALUES (1, {ALWAYS_CURRENT_MS});
"""


# -- 7: stored responses as chains, and their storage per tenant ----------------------------
def _chains(text: str, bigint: str, octets: str) -> str:
    """The columns, indexes and usage table of 7 (``octets``: a column's size in bytes)."""
    size = " + ".join(octets.format(c) for c in ("request", "messages", "answer"))
    return f"""
UPDATE stored_responses SET bytes = {size};
CREATE INDEX stored_responses_previous ON stored_responses (previous_id)
    WHERE previous_id IS NOT NULL;
CREATE INDEX stored_responses_tenant ON stored_responses (tenant, expires_ms);
CREATE INDEX stored_responses_deleted ON stored_responses (id) WHERE deleted = 1;
CREATE TABLE stored_response_usage (
    tenant {text} PRIMARY KEY, responses {bigint} NOT NULL DEFAULT 0,
    bytes {bigint} NOT NULL DEFAULT 0);
INSERT INTO stored_response_usage (tenant, responses, bytes)
SELECT tenant, count(*), sum(bytes) FROM stored_responses GROUP BY tenant;
"""


_CHAINS_PG = """
ALTER TABLE stored_responses ADD COLUMN previous_id text,
    ADD COLUMN delta smallint NOT NULL DEFAULT 0,
    ADD COLUMN deleted smallint NOT NULL DEFAULT 0,
    ADD COLUMN bytes bigint NOT NULL DEFAULT 0;
""" + _chains("text", "bigint", "octet_length({})") + """
CREATE FUNCTION stored_response_usage_track() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO stored_response_usage AS u (tenant, responses, bytes)
        VALUES (NEW.tenant, 1, NEW.bytes)
        ON CONFLICT (tenant) DO UPDATE
        SET responses = u.responses + 1, bytes = u.bytes + excluded.bytes;
    ELSIF TG_OP = 'UPDATE' THEN
        UPDATE stored_response_usage SET bytes = bytes - OLD.bytes + NEW.bytes
        WHERE tenant = NEW.tenant;
    ELSE
        UPDATE stored_response_usage SET responses = responses - 1, bytes = bytes - OLD.bytes
        WHERE tenant = OLD.tenant;
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER stored_response_usage_track
    AFTER INSERT OR DELETE OR UPDATE OF bytes ON stored_responses
    FOR EACH ROW EXECUTE FUNCTION stored_response_usage_track();
"""
_CHAINS_SQLITE = """
ALTER TABLE stored_responses ADD COLUMN previous_id TEXT;
ALTER TABLE stored_responses ADD COLUMN delta INTEGER NOT NULL DEFAULT 0;
ALTER TABLE stored_responses ADD COLUMN deleted INTEGER NOT NULL DEFAULT 0;
ALTER TABLE stored_responses ADD COLUMN bytes INTEGER NOT NULL DEFAULT 0;
""" + _chains("TEXT", "INTEGER", "length(CAST({} AS BLOB))") + """
CREATE TRIGGER stored_response_usage_insert AFTER INSERT ON stored_responses BEGIN
INSERT INTO stored_response_usage (tenant, responses, bytes) VALUES (NEW.tenant, 1, NEW.bytes)
ON CONFLICT (tenant) DO UPDATE SET responses = responses + 1, bytes = bytes + excluded.bytes;
END;
CREATE TRIGGER stored_response_usage_update AFTER UPDATE OF bytes ON stored_responses BEGIN
UPDATE stored_response_usage SET bytes = bytes - OLD.bytes + NEW.bytes WHERE tenant = NEW.tenant;
END;
CREATE TRIGGER stored_response_usage_delete AFTER DELETE ON stored_responses BEGIN
UPDATE stored_response_usage SET responses = responses - 1, bytes = bytes - OLD.bytes
WHERE tenant = OLD.tenant;
END;
"""



# -- 12: the daily rollups by tenant alone ----------------------------------------------------
_TENANT_KEYS = ("tenant", "team", "organization")


def _tenant_rollups(text: str, bigint: str) -> str:
    """The tables of 12, ``usage_daily_tenants`` back-filled from ``usage_daily`` (the same
    closed days), and the state's second boundary."""
    keys = " ".join(f"{k} {text} NOT NULL DEFAULT ''," for k in _TENANT_KEYS)
    counters = ", ".join(f'"{c}" {bigint} NOT NULL DEFAULT 0' for c in _COUNTERS)
    names = ", ".join(_TENANT_KEYS)
    sums = ", ".join(f'sum("{c}")' for c in _COUNTERS)
    return f"""
CREATE TABLE usage_daily_tenants (
    day_ms {bigint} NOT NULL, {keys} {counters},
    PRIMARY KEY (day_ms, {names}));
INSERT INTO usage_daily_tenants (day_ms, {names}, {", ".join(f'"{c}"' for c in _COUNTERS)})
SELECT day_ms, {names}, {sums} FROM usage_daily GROUP BY day_ms, {names};
CREATE TABLE usage_hourly_tenants (
    hour_ms {bigint} NOT NULL, {keys} {counters},
    PRIMARY KEY (hour_ms, {names}));
ALTER TABLE usage_rollup_state ADD COLUMN tenants_through_ms {bigint} NOT NULL DEFAULT 0;
UPDATE usage_rollup_state SET tenants_through_ms = daily_through_ms;
"""


def _tenant_daily_trigger() -> str:
    """SQLite's third trigger: each inserted record into its tenant's day."""
    keys = ", ".join(f"coalesce(NEW.{k}, '')" for k in _TENANT_KEYS)
    values = ", ".join(f'NEW."{c}"' for c in _SUMMED)
    updates = ", ".join(f'"{c}" = "{c}" + excluded."{c}"' for c in _COUNTERS)
    return f"""
CREATE TRIGGER usage_daily_tenants_on_insert AFTER INSERT ON usage_records BEGIN
INSERT INTO usage_daily_tenants (day_ms, {", ".join(_TENANT_KEYS)},
                                 {", ".join(f'"{c}"' for c in _COUNTERS)})
VALUES (NEW.ts_ms - NEW.ts_ms % 86400000, {keys}, 1,
        CASE WHEN NEW.outcome <> 'completed' THEN 1 ELSE 0 END,
        CASE WHEN NEW.estimated THEN 1 ELSE 0 END, {values})
ON CONFLICT (day_ms, {", ".join(_TENANT_KEYS)}) DO UPDATE SET {updates};
END;
"""


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "usage records", _SCHEMA_TABLE_PG + _RECORDS_PG,
              _SCHEMA_TABLE_SQLITE + _RECORDS_SQLITE),
    Migration(2, "hourly rollups", _rollup_table("text", "bigint") + _backfill("estimated"),
              _rollup_table("TEXT", "INTEGER") + _backfill("estimated") + _sqlite_trigger()),
    Migration(3, "stored responses", _stored_responses("text", "bigint"),
              _stored_responses("TEXT", "INTEGER")),
    Migration(4, "the client API on each record",
              "ALTER TABLE usage_records ADD COLUMN api text NOT NULL DEFAULT 'chat';\n",
              "ALTER TABLE usage_records ADD COLUMN api TEXT NOT NULL DEFAULT 'chat';\n"),
    Migration(5, "daily rollups",
              _rollup_table("text", "bigint", "usage_daily", "day_ms") + _daily_backfill(),
              _rollup_table("TEXT", "INTEGER", "usage_daily", "day_ms") + _daily_backfill()
              + _sqlite_trigger("usage_daily", "day_ms", 86400000)),
    Migration(6, "daily rollups from closed days", _ROLLUP_STATE_PG, _ROLLUP_STATE_SQLITE),
    Migration(7, "stored responses as chains, storage per tenant", _CHAINS_PG, _CHAINS_SQLITE),
    Migration(8, "why a record's tokens are estimated",
              "ALTER TABLE usage_records ADD COLUMN estimate_reason text;\n",
              "ALTER TABLE usage_records ADD COLUMN estimate_reason TEXT;\n"),
    Migration(9, "whether the answer reached the client",
              "ALTER TABLE usage_records ADD COLUMN delivered boolean;\n"
              "ALTER TABLE usage_records ADD COLUMN sent_output integer NOT NULL DEFAULT 0;\n",
              "ALTER TABLE usage_records ADD COLUMN delivered INTEGER;\n"
              "ALTER TABLE usage_records ADD COLUMN sent_output INTEGER NOT NULL DEFAULT 0;\n"),
    Migration(10, "streams continued on another backend",
              "ALTER TABLE usage_records ADD COLUMN continued boolean NOT NULL DEFAULT false;\n"
              "ALTER TABLE usage_records ADD COLUMN continuation_prompt integer NOT NULL "
              "DEFAULT 0;\n",
              "ALTER TABLE usage_records ADD COLUMN continued INTEGER NOT NULL DEFAULT 0;\n"
              "ALTER TABLE usage_records ADD COLUMN continuation_prompt INTEGER NOT NULL "
              "DEFAULT 0;\n"),
    Migration(11, "the price of a stream's continuations",
              "ALTER TABLE usage_records ADD COLUMN continuation_cost bigint NOT NULL "
              "DEFAULT 0;\n",
              "ALTER TABLE usage_records ADD COLUMN continuation_cost INTEGER NOT NULL "
              "DEFAULT 0;\n"),
    Migration(12, "rollups by tenant", _tenant_rollups("text", "bigint"),
              _tenant_rollups("TEXT", "INTEGER") + _tenant_daily_trigger()),
)

#: the schema version this gateway reads and writes
SCHEMA_VERSION = MIGRATIONS[-1].version


def verdict(applied: int) -> str | None:
    """None when a database at version ``applied`` is usable, else why not (the message a
    refused start-up shows)."""
    if applied == SCHEMA_VERSION:
        return None
    if applied > SCHEMA_VERSION:
        return (f"the ledger database is at schema version {applied}, newer than this gateway "
                f"knows ({SCHEMA_VERSION}): a newer gateway migrated it; upgrade this one")
    if applied == 0:
        return ("the ledger database has no gateway schema: run `gateway db migrate` "
                f"(schema version {SCHEMA_VERSION}) before starting the gateway")
    return (f"the ledger database is at schema version {applied}, this gateway needs "
            f"{SCHEMA_VERSION}: run `gateway db migrate`")
