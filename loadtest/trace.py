"""Reading and writing traces in the Azure LLM inference CSV format (:func:`read_trace`).

The format (Azure/AzurePublicDataset, 2023 traces): a header ``TIMESTAMP,ContextTokens,
GeneratedTokens`` then one row per request, e.g. ``2023-11-16 18:17:03.9799600,4808,10``. The
timestamp has up to 7 fractional digits (100 ns ticks); only differences matter here, so rows
become offsets in seconds from the first row read.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

__all__ = ["HEADER", "TraceRow", "parse_timestamp", "read_trace", "write_trace"]

HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One request: when (seconds after the first row), prompt and output lengths in tokens."""

    offset_s: float
    context_tokens: int
    generated_tokens: int


def parse_timestamp(text: str) -> datetime:
    """``2023-11-16 18:17:03.9799600`` -> datetime (fraction cut to microseconds)."""
    text = text.strip()
    head, dot, frac = text.partition(".")
    if dot:
        text = f"{head}.{(frac + '000000')[:6]}"
    return datetime.fromisoformat(text)


def read_trace(
    path: str | Path,
    *,
    start: int = 0,
    limit: int | None = None,
    window_s: float | None = None,
) -> list[TraceRow]:
    """Rows ``start`` .. ``start + limit`` within ``window_s`` of the first; offsets from 0."""
    rows: list[TraceRow] = []
    t0: datetime | None = None
    with open(path, newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None or tuple(h.strip() for h in header) != HEADER:
            raise ValueError(f"{path}: expected header {','.join(HEADER)}, got {header}")
        for i, rec in enumerate(reader):
            if i < start or not rec:
                continue
            if limit is not None and len(rows) >= limit:
                break
            ts = parse_timestamp(rec[0])
            t0 = t0 or ts
            offset = (ts - t0).total_seconds()
            if window_s is not None and offset > window_s:
                break
            rows.append(TraceRow(offset, int(rec[1]), int(rec[2])))
    return rows


def write_trace(
    path: str | Path,
    rows: Iterable[TraceRow],
    t0: datetime = datetime(2023, 11, 16, 18, 0, 0),
) -> None:
    """Write ``rows`` in the same format (7 fractional digits), e.g. for tests."""
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(HEADER)
        for r in rows:
            ts = t0 + timedelta(seconds=r.offset_s)
            w.writerow(
                [ts.strftime("%Y-%m-%d %H:%M:%S.%f") + "0", r.context_tokens, r.generated_tokens]
            )
