"""Usage records: exactly one per admitted request, never lost, never counted twice.

``record.py`` holds the record; ``base.py`` the interface (``Ledger``) and the shared write
path (buffer -> background flusher, group commit); ``sql/`` the stores of record (PostgreSQL,
SQLite embedded), their schema, migrations and the reads (``usage_rows``, ``export``,
``drift``); ``spool.py`` the local fsync'd fallback while the database is away;
``aggregate.py`` the row a usage read answers; ``export.py`` the CSV and JSON Lines formats.

Wiring (``gateway/app/state.py``; the pipeline writes the record)::

    ledger = open_ledger(url, spool_dir=spool)   # postgresql://... or sqlite:///...
    await ledger.start()                         # refuses a schema it does not know
    ...                                          # per request, before the response's end:
    await ledger.write_durable(make_record(ctx, usage, tenant=tenant))
    ...
    await ledger.close()                         # drains the buffer to the database or spool
"""

from __future__ import annotations

from gateway.ledger.aggregate import UsageRow
from gateway.ledger.base import Ledger, LedgerSettings, LedgerStats
from gateway.ledger.errors import (
    LedgerConnectError,
    LedgerError,
    LedgerStoreError,
    LedgerTimeout,
    LedgerUnavailable,
)
from gateway.ledger.export import (
    CSV_COLUMNS,
    format_csv,
    format_jsonl,
    stream_csv,
    stream_jsonl,
)
from gateway.ledger.record import (
    Outcome,
    UsageRecord,
    day_of,
    decode_record,
    encode_record,
    make_record,
    month_of,
)
from gateway.ledger.spool import Spool

__all__ = [
    "CSV_COLUMNS",
    "Ledger",
    "LedgerConnectError",
    "LedgerError",
    "LedgerSettings",
    "LedgerStats",
    "LedgerStoreError",
    "LedgerTimeout",
    "LedgerUnavailable",
    "Outcome",
    "Spool",
    "UsageRecord",
    "UsageRow",
    "day_of",
    "decode_record",
    "encode_record",
    "format_csv",
    "format_jsonl",
    "make_record",
    "month_of",
    "stream_csv",
    "stream_jsonl",
]
