"""Check a day's totals against the records they were built from.

The totals are updated in the same atomic step that stores the record, so they should always
equal the sum of the day's records; a difference means a bug, a hand edit or a partial
restore, and the records (the detailed truth) win. ``reconcile`` returns every field that
differs; an empty list means the day is consistent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from gateway.ledger.aggregate import add_record

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from gateway.ledger.record import UsageRecord

__all__ = ["Difference", "diff_totals", "sum_records"]


class Difference(msgspec.Struct, frozen=True, kw_only=True):
    """One total that disagrees with its records: ``field`` is ``model|class|batch|counter``."""

    tenant: str
    day: str
    field: str
    aggregate: int
    records: int


def sum_records(records: Iterable[UsageRecord]) -> dict[str, int]:
    """The ``{field: int}`` totals the records should have produced."""
    totals: dict[str, int] = {}
    for record in records:
        add_record(totals, record)
    return totals


def diff_totals(
    tenant: str, day: str, aggregate: Mapping[str, int], records: Mapping[str, int]
) -> list[Difference]:
    """Fields whose stored total differs from the records' sum (missing counts as 0)."""
    out = []
    for field in sorted(set(aggregate) | set(records)):
        stored, summed = int(aggregate.get(field, 0)), int(records.get(field, 0))
        if stored != summed:
            out.append(
                Difference(tenant=tenant, day=day, field=field, aggregate=stored, records=summed)
            )
    return out
