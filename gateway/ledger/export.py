"""Records as CSV or JSON Lines, for billing exports and the admin API.

The ``format_*`` helpers take a list and return text; the ``stream_*`` helpers take the
ledger's ``export`` iterator and yield chunks, so a month of records goes out as a streaming
HTTP body without being held in memory.
"""

from __future__ import annotations

import csv
import io
from typing import TYPE_CHECKING

from gateway.ledger.record import UsageRecord, encode_record

if TYPE_CHECKING:
    from collections.abc import AsyncIterable, AsyncIterator, Iterable

__all__ = ["CSV_COLUMNS", "format_csv", "format_jsonl", "stream_csv", "stream_jsonl"]

#: every record field, in declaration order
CSV_COLUMNS: tuple[str, ...] = UsageRecord.__struct_fields__


def _csv_cell(value: object) -> object:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


def format_csv(records: Iterable[UsageRecord], *, header: bool = True) -> str:
    """CSV with a header row; None is an empty cell, booleans are ``true``/``false``."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    if header:
        writer.writerow(CSV_COLUMNS)
    for record in records:
        writer.writerow([_csv_cell(getattr(record, name)) for name in CSV_COLUMNS])
    return buf.getvalue()


def format_jsonl(records: Iterable[UsageRecord]) -> str:
    """One JSON object per line, the same encoding the ledger stores."""
    return "".join(encode_record(r).decode() + "\n" for r in records)


async def stream_csv(
    records: AsyncIterable[UsageRecord], *, chunk: int = 500
) -> AsyncIterator[str]:
    """CSV text in chunks of ``chunk`` records (the header goes with the first chunk)."""
    batch: list[UsageRecord] = []
    header = True
    async for record in records:
        batch.append(record)
        if len(batch) >= chunk:
            yield format_csv(batch, header=header)
            batch, header = [], False
    if batch or header:
        yield format_csv(batch, header=header)


async def stream_jsonl(
    records: AsyncIterable[UsageRecord], *, chunk: int = 500
) -> AsyncIterator[str]:
    """JSON Lines in chunks of ``chunk`` records."""
    batch: list[UsageRecord] = []
    async for record in records:
        batch.append(record)
        if len(batch) >= chunk:
            yield format_jsonl(batch)
            batch = []
    if batch:
        yield format_jsonl(batch)
