"""Totals: naming, range planning, and totals == sum of records for any records."""

from __future__ import annotations

from datetime import date

from hypothesis import given
from hypothesis import strategies as st

from gateway.ledger import UsageRecord
from gateway.ledger.aggregate import Period, add_record, plan_periods, rows_from
from gateway.ledger.reconcile import diff_totals, sum_records

names = st.text(alphabet="ab|%c", min_size=0, max_size=4)
records = st.lists(
    st.builds(
        UsageRecord,
        request_id=st.uuids().map(str),
        ts_ms=st.just(1_700_000_000_000),
        tenant=st.just("t"),
        model=names,
        request_class=names,
        batch_id=st.none() | names,
        system=st.integers(0, 10**6),
        output=st.integers(0, 10**6),
        cost_micros=st.integers(0, 10**9),
        estimated=st.booleans(),
    ),
    max_size=30,
)


@given(records)
def test_rows_sum_to_records(rs: list[UsageRecord]) -> None:
    """Whatever the names (including ``|`` and ``%``), grouped rows add up to the records."""
    totals: dict[str, int] = {}
    for r in rs:
        add_record(totals, r)
    rows = rows_from("t", [(Period("d", "2023-11-14"), totals)], ("model", "class", "batch"))
    assert sum(row.requests for row in rows) == len(rs)
    assert sum(row.output for row in rows) == sum(r.output for r in rs)
    for row in rows:
        group = [
            r
            for r in rs
            if (r.model, r.request_class, r.batch_id or None)
            == (row.model, row.request_class, row.batch_id)
        ]
        assert row.requests == len(group)
        assert row.cost_micros == sum(r.cost_micros for r in group)
    assert diff_totals("t", "d", totals, sum_records(rs)) == []


def test_whole_months_read_from_month_totals() -> None:
    periods = plan_periods(date(2024, 1, 30), date(2024, 3, 31), by_day=False)
    assert periods == [
        Period("d", "2024-01-30"),
        Period("d", "2024-01-31"),
        Period("m", "2024-02"),
        Period("m", "2024-03"),
    ]
    assert len(plan_periods(date(2024, 2, 1), date(2024, 2, 29), by_day=True)) == 29


def test_reconcile_reports_each_difference() -> None:
    r = UsageRecord(request_id="1", ts_ms=0, tenant="t", model="m", output=5)
    stored = {"m|||requests": 1, "m|||output": 4}
    (diff,) = diff_totals("t", "1970-01-01", stored, sum_records([r]))
    assert (diff.field, diff.aggregate, diff.records) == ("m|||output", 4, 5)
