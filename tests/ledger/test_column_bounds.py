"""The ledger's last line of defence (issue 34, point 7): a record whose numbers do not fit
their columns (PostgreSQL ``integer`` tokens, ``bigint`` costs; SQLite's 64-bit INTEGER) is
stored clamped and marked estimated, never refused into quarantine (in no query, export or
bill). And the reason a record is estimated is stored and read back."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.ledger.sql.schema import COST_MAX, INTEGER_MAX, fit_columns

if TYPE_CHECKING:
    from gateway.ledger import Ledger, UsageRecord

    from .conftest import LedgerFactory, RecordFactory


def test_fit_columns_keeps_a_record_that_fits(make_record: RecordFactory) -> None:
    record = make_record("t", output=INTEGER_MAX, cost_micros=COST_MAX)
    assert fit_columns(record) is record


def test_fit_columns_clamps_and_says_so(make_record: RecordFactory) -> None:
    record = make_record("t", prompt_total=10**30, output=-5, cost_micros=10**20,
                         cost_output=-(10**20), estimated=False)
    fitted = fit_columns(record)
    assert (fitted.prompt_total, fitted.output) == (INTEGER_MAX, 0)
    assert (fitted.cost_micros, fitted.cost_output) == (COST_MAX, 0)
    assert fitted.estimated and fitted.estimate_reason == "clamped:output"
    assert fitted.request_id == record.request_id and fitted.system == record.system


async def _stored(ledger: Ledger, tenant: str, lo: int, hi: int) -> dict[str, UsageRecord]:
    return {r.request_id: r async for r in ledger.export(lo, hi, tenant)}


async def test_an_out_of_range_record_is_stored_clamped(
        make_ledger: LedgerFactory, make_record: RecordFactory, tenant: str) -> None:
    ledger = await make_ledger()
    fine = make_record(tenant, estimated=True, estimate_reason="too_large:prompt_tokens")
    huge = make_record(tenant, system=0, history=0, new=2**31, tools=0, prompt_total=2**31,
                       output=10**30, cost_micros=10**25, estimated=False)
    for record in (fine, huge):
        ledger.write_nowait(record)
    await ledger.flush()
    stored = await _stored(ledger, tenant, fine.ts_ms - 1000, huge.ts_ms + 1000)
    assert set(stored) == {fine.request_id, huge.request_id}  # none quarantined
    assert stored[fine.request_id] == fine  # the reason round-trips
    got = stored[huge.request_id]
    assert (got.new, got.prompt_total, got.output, got.cost_micros) == (
        INTEGER_MAX, INTEGER_MAX, INTEGER_MAX, COST_MAX)
    assert got.estimated and got.estimate_reason == "clamped:new"
    page = await ledger.usage_rows(tenant, fine.ts_ms - 3_600_000, huge.ts_ms + 3_600_000, [])
    assert sum(row.requests for row in page.rows) == 2
