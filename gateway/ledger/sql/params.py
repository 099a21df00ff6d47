"""Bound parameters and text ordering, written once for both dialects.

A read is one SQL text whose placeholders are the dialect's own: ``?`` for SQLite, ``$1``,
``$2``, ... for PostgreSQL (cast to the column's type, so asyncpg never has to guess from a
row comparison). ``ordered`` makes text compare by code point in both: SQLite's default
``BINARY`` collation already does; PostgreSQL's database collation may follow a locale, so
text there gets ``COLLATE "C"``. Orders, keyset comparisons and Python's own ``sorted`` then
all agree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.ledger.sql.migrations import Dialect

__all__ = ["Params", "ordered"]


class Params:
    """Collects the values of one statement; ``add`` returns the placeholder to write."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self.values: list[Any] = []

    def add(self, value: Any, pg_type: str) -> str:
        self.values.append(value)
        if self.dialect == "postgresql":
            return f"${len(self.values)}::{pg_type}"
        return "?"


def ordered(expression: str, dialect: Dialect) -> str:
    """A text expression that orders and compares by code point."""
    return f'{expression} COLLATE "C"' if dialect == "postgresql" else expression
