"""Usage records: exactly one per admitted request, never lost, never counted twice.

``record.py`` holds the record; ``base.py`` the interface (``Ledger``) and the shared write
path (buffer -> background flusher); ``redis.py`` and ``memory.py`` the stores; ``spool.py`` the
local fsync'd fallback; ``keys.py`` and ``scripts.py`` the Redis layout and Lua;
``aggregate.py`` the totals; ``reconcile.py`` and ``export.py`` the checks and formats.

Wiring (in the app factory / lifespan)::

    ledger = (RedisLedger.from_url(url, spool_dir=spool) if url else MemoryLedger(spool))
    await ledger.start()
    ...                                  # per request, in the finally path:
    ledger.write_nowait(make_record(ctx, usage, tenant=tenant))
    ...
    await ledger.close()                 # drains the buffer to Redis or the spool
"""

from __future__ import annotations

from gateway.ledger.aggregate import COUNTERS, GROUP_DIMENSIONS, UsageRow
from gateway.ledger.base import DEFAULT_GROUP_BY, Ledger, LedgerSettings, LedgerStats
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
from gateway.ledger.memory import MemoryLedger
from gateway.ledger.reconcile import Difference
from gateway.ledger.record import (
    Outcome,
    UsageRecord,
    day_of,
    decode_record,
    encode_record,
    make_record,
    month_of,
)
from gateway.ledger.redis import RedisLedger
from gateway.ledger.spool import Spool

__all__ = [
    "COUNTERS",
    "CSV_COLUMNS",
    "DEFAULT_GROUP_BY",
    "GROUP_DIMENSIONS",
    "Difference",
    "Ledger",
    "LedgerConnectError",
    "LedgerError",
    "LedgerSettings",
    "LedgerStats",
    "LedgerStoreError",
    "LedgerTimeout",
    "LedgerUnavailable",
    "MemoryLedger",
    "Outcome",
    "RedisLedger",
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
