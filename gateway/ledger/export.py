"""Records as CSV or JSON Lines, for billing exports and the admin API, and back.

The ``format_*`` helpers take a list and return text; the ``stream_*`` helpers take the
ledger's ``export`` iterator (which reads the database in chunks) and yield chunks, so a month
of records goes out as a streaming HTTP body or to stdout without being held in memory.

CSV has every record field as a column, in declaration order: an empty cell is None (the
optional fields are None or non-empty in every record the gateway writes), booleans are
``true``/``false``, floats are written as their shortest repr, so ``parse_csv`` reads back the
exact records. JSON Lines is the ledger's own encoding (``decode_record`` reads it back).
"""

from __future__ import annotations

import csv
import io
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.ledger.record import UsageRecord, encode_record

if TYPE_CHECKING:
    from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator

__all__ = [
    "CSV_COLUMNS",
    "format_csv",
    "format_jsonl",
    "parse_csv",
    "stream_csv",
    "stream_jsonl",
]

#: every record field, in declaration order
CSV_COLUMNS: tuple[str, ...] = UsageRecord.__struct_fields__
#: the fields whose empty cell reads back as None
_OPTIONAL = frozenset(f.name for f in msgspec.structs.fields(UsageRecord) if f.default is None)


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


def parse_csv(lines: Iterable[str]) -> Iterator[UsageRecord]:
    """The records of ``format_csv``/``stream_csv`` output (the header row first); raises
    ``ValueError`` on a row that is not a record."""
    reader = csv.DictReader(lines)
    if reader.fieldnames is None or tuple(reader.fieldnames) != CSV_COLUMNS:
        if reader.fieldnames is None:
            return
        raise ValueError(f"not a usage CSV header: {reader.fieldnames[:4]}...")
    for row in reader:
        values: dict[str, Any] = {
            k: None if v == "" and k in _OPTIONAL else v for k, v in row.items()}
        try:
            yield msgspec.convert(values, UsageRecord, strict=False)
        except msgspec.ValidationError as exc:
            raise ValueError(f"line {reader.line_num}: {exc}") from None


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
