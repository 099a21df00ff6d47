"""The ledger of record in SQL: PostgreSQL in production, SQLite embedded.

``schema.py`` names the columns (one list, for both dialects); ``migrations.py`` holds the
versioned DDL and applies it (``gateway db migrate``); ``store.py`` is what both stores share
(the write path into the database or the spool, replay, the reads from the hourly rollups);
``sqlite.py`` and ``postgres.py`` are the stores; ``url.py`` picks one from a URL.
"""

from __future__ import annotations

from gateway.ledger.sql.migrations import (
    MIGRATIONS,
    SCHEMA_VERSION,
    Migration,
    SchemaMismatch,
)
from gateway.ledger.sql.url import LedgerUrl, open_ledger, parse_ledger_url

__all__ = [
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "LedgerUrl",
    "Migration",
    "SchemaMismatch",
    "open_ledger",
    "parse_ledger_url",
]
