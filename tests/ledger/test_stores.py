"""The same behaviour from every ledger of record (SQLite and PostgreSQL), read back through
the reads the product uses: ``usage_rows``, ``export`` and ``drift``."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING

from gateway.ledger import UsageRecord, day_of, format_csv, format_jsonl
from tests.ledger.usage_data import (
    FINEST,
    all_rows,
    assert_reads_match,
    day_ms,
    day_span,
    utc_days,
)

if TYPE_CHECKING:
    from gateway.ledger import Ledger
    from tests.ledger.conftest import LedgerFactory, RecordFactory

DAY_MS = 86_400_000


def totals(records: list[UsageRecord]) -> dict[str, int]:
    """requests and token sums, the way a usage row reports them."""
    return {
        "requests": len(records),
        "system": sum(r.system for r in records),
        "history": sum(r.history for r in records),
        "new": sum(r.new for r in records),
        "tools": sum(r.tools for r in records),
        "cached": sum(r.cached for r in records),
        "output": sum(r.output for r in records),
        "prompt_total": sum(r.prompt_total for r in records),
        "cost_micros": sum(r.cost_micros for r in records),
        "estimated": sum(r.estimated for r in records),
    }


def row_totals(row: object) -> dict[str, int]:
    return {name: getattr(row, name) for name in totals([])}


async def test_same_record_twice_counts_once(
    make_ledger: LedgerFactory, make_record: RecordFactory, tenant: str
) -> None:
    """Writing a record again (same request id), in the same batch or a later one, is a no-op."""
    ledger = await make_ledger()
    records = [make_record(tenant) for _ in range(20)]
    for r in records:
        await ledger.write(r)
        await ledger.write(r)
    await ledger.flush()
    for r in records[:5]:
        await ledger.write(r)
    await ledger.flush()
    (row,) = await all_rows(ledger, tenant, *day_span(records), ("day",))
    assert row_totals(row) == totals(records)
    assert len([r async for r in ledger.export(0, 2**62, tenant)]) == 20
    await assert_reads_match(ledger, tenant, records)
    assert ledger.stats.stored == 20
    assert ledger.stats.duplicates == 25


async def test_second_ledger_dedupes_too(
    make_ledger: LedgerFactory, make_record: RecordFactory, tenant: str
) -> None:
    """Two replicas (two ledgers on one database) writing the same records concurrently
    count each once."""
    one = await make_ledger()
    two = await make_ledger()
    records = [make_record(tenant) for _ in range(300)]
    for r in records:
        await one.write(r)
        await two.write(r)
    await asyncio.gather(one.flush(), two.flush())
    (row,) = await all_rows(two, tenant, *day_span(records), ())
    assert row_totals(row) == totals(records)
    assert one.stats.stored + two.stats.stored == 300
    await assert_reads_match(one, tenant, records)


async def test_group_by_model_and_class(
    ledger: Ledger, make_record: RecordFactory, tenant: str
) -> None:
    """Rows split by model and class; totals per group match the records of that group."""
    records = [
        make_record(tenant, model=model, request_class=cls)
        for model in ("m-a", "m|b")  # a '|' in a name must not break the field split
        for cls in ("interactive", "batch")
        for _ in range(3)
    ]
    for r in records:
        await ledger.write(r)
    await ledger.flush()
    day = day_of(records[0].ts_ms)
    span = day_span(records)
    rows = await all_rows(ledger, tenant, *span, ("tenant", "day", "model", "class"))
    assert [(r.day, r.model, r.request_class) for r in rows] == [
        (day, m, c) for m in ("m-a", "m|b") for c in ("batch", "interactive")
    ]
    for row in rows:
        group = [r for r in records if (r.model, r.request_class) == (row.model, row.request_class)]
        assert row_totals(row) == totals(group)
        assert row.tenant == tenant
    (by_model,) = [r for r in await all_rows(ledger, tenant, *span, ("model",))
                   if r.model == "m-a"]
    assert by_model.requests == 6 and by_model.day is None and by_model.request_class is None


async def test_group_by_batch(ledger: Ledger, make_record: RecordFactory, tenant: str) -> None:
    """Requests of a batch job group under its id; the rest under None."""
    records = [make_record(tenant, batch_id=batch)
               for batch in ("batch-1", "batch-1", "batch-2", None)]
    for r in records:
        await ledger.write(r)
    await ledger.flush()
    rows = await all_rows(ledger, tenant, *day_span(records), ("batch",))
    assert {r.batch_id: r.requests for r in rows} == {None: 1, "batch-1": 2, "batch-2": 1}


async def test_days_and_months(
    make_ledger: LedgerFactory, make_record: RecordFactory, tenant: str
) -> None:
    """Records on several days land in their own day partitions; a range sums them, and
    month rows over a range of whole months agree."""
    ledger = await make_ledger()
    now = int(time.time() * 1000)
    stamps = [now - d * DAY_MS for d in (0, 0, 1, 3, 40)]
    records = [make_record(tenant, ts_ms=ts) for ts in stamps]
    for r in records:
        await ledger.write(r)
    await ledger.flush()
    span = day_span(records)
    rows = await all_rows(ledger, tenant, *span, ("day",))
    assert {r.day: r.requests for r in rows} == {
        day_of(ts): sum(1 for s in stamps if day_of(s) == day_of(ts)) for ts in stamps
    }
    (everything,) = await all_rows(ledger, tenant, *span, ())
    assert row_totals(everything) == totals(records)
    # a range of whole months, by month
    start = datetime.fromtimestamp(min(stamps) / 1000, UTC).date().replace(day=1)
    end = datetime.fromtimestamp(now / 1000, UTC).date().replace(day=28) + timedelta(days=4)
    end = end.replace(day=1)  # the first day after the last month
    months = await all_rows(ledger, tenant, day_ms(start), day_ms(end), ("month",))
    assert sum(r.requests for r in months) == 5
    assert {r.month for r in months} == {day_of(ts)[:7] for ts in stamps}
    for ts in set(stamps):
        assert await ledger.drift(tenant, date.fromisoformat(day_of(ts))) == []
    await assert_reads_match(ledger, tenant, records, ((), ("day",), ("month",)))


async def test_tenants_are_isolated(
    ledger: Ledger, make_record: RecordFactory, tenant: str
) -> None:
    """Tenant A's usage, export and drift never include tenant B's records."""
    other = tenant + "-b"
    mine = [make_record(tenant) for _ in range(4)]
    theirs = [make_record(other, model="their-model") for _ in range(6)]
    for r in [*mine, *theirs]:
        await ledger.write(r)
    await ledger.flush()
    span = day_span([*mine, *theirs])
    rows = await all_rows(ledger, tenant, *span, ("day", "model", "class"))
    assert [r.model for r in rows] == ["chat-model"]
    assert row_totals(rows[0]) == totals(mine)
    exported = [r async for r in ledger.export(0, 2**62, tenant)]
    assert {r.request_id for r in exported} == {r.request_id for r in mine}
    for day in utc_days(theirs):
        assert await ledger.drift(other, day) == []
    await assert_reads_match(ledger, tenant, mine)
    await assert_reads_match(ledger, other, theirs)
    everyone = await all_rows(ledger, None, *span, ("tenant",))
    by_tenant = {r.tenant: r.requests for r in everyone}
    assert by_tenant[tenant] == 4 and by_tenant[other] == 6
    assert {tenant, other} <= set(await ledger.tenants())


async def test_export_time_range_and_formats(
    ledger: Ledger, make_record: RecordFactory, tenant: str
) -> None:
    """``export`` yields exactly the records in [from, to), across day partitions, and the
    CSV / JSONL helpers render them."""
    now = int(time.time() * 1000)
    records = [make_record(tenant, ts_ms=now - i * 3_600_000) for i in range(30)]  # 30 hours
    for r in records:
        await ledger.write(r)
    await ledger.flush()
    lo, hi = now - 20 * 3_600_000, now - 5 * 3_600_000
    got = [r async for r in ledger.export(lo, hi, tenant)]
    assert sorted(r.request_id for r in got) == sorted(
        r.request_id for r in records if lo <= r.ts_ms < hi
    )
    assert len(got) == 15
    assert set(got) <= set(records)  # the records come back whole
    csv_text = format_csv(got)
    assert csv_text.count("\n") == 16 and csv_text.startswith("request_id,ts_ms,tenant,")
    assert format_jsonl(got).count("\n") == 15
    everyone = [r async for r in ledger.export(lo, hi)]
    assert {r.request_id for r in got} <= {r.request_id for r in everyone}


async def test_close_drains_the_buffer(
    make_ledger: LedgerFactory, make_record: RecordFactory, tenant: str
) -> None:
    """Records still in the buffer at ``close`` are stored; none is lost on shutdown."""
    slow = await make_ledger(flush_interval=60.0, batch_size=10_000)
    records = [make_record(tenant) for _ in range(500)]
    for r in records:
        slow.write_nowait(r)
    assert slow.pending == 500
    await slow.close()
    assert slow.pending == 0
    reader = await make_ledger()
    (row,) = await all_rows(reader, tenant, *day_span(records), ())
    assert row_totals(row) == totals(records)
    await assert_reads_match(reader, tenant, records)


async def test_write_after_close_is_kept(
    make_ledger: LedgerFactory, make_record: RecordFactory, tenant: str
) -> None:
    """A late record (a request finishing during shutdown) goes to disk, not to nowhere."""
    ledger = await make_ledger()
    await ledger.close()
    record = make_record(tenant)
    await ledger.write(record)
    assert ledger.stats.written == 1
    assert ledger.pending == 0


async def test_aggregates_equal_sum_of_records(
    ledger: Ledger, make_record: RecordFactory, tenant: str
) -> None:
    """After a mixed load (duplicates, batches, classes) every day's rollups equal its
    records, and the records are each stored once."""
    records = [
        make_record(tenant, request_class=("interactive", "batch")[i % 2], batch_id=f"b{i % 3}")
        for i in range(300)
    ]
    for r in records + records[::7]:
        await ledger.write(r)
    await ledger.flush()
    for day in utc_days(records):
        assert await ledger.drift(tenant, day) == []
    await assert_reads_match(ledger, tenant, records, ((), ("class", "batch"), FINEST))


async def test_idle_flusher_sleeps_until_the_first_record(
    make_ledger: LedgerFactory, make_record: RecordFactory, tenant: str
) -> None:
    """With nothing buffered the flusher sets no timer (an idle gateway does not wake every
    ``flush_interval``); the first record wakes it and is stored one interval later."""
    ledger = await make_ledger(flush_interval=0.01)
    checks = 0
    due = ledger._due

    def counted() -> bool:
        nonlocal checks
        checks += 1
        return due()

    ledger._due = counted  # type: ignore[method-assign]
    await ledger.flush()
    # a flush finishing wakes the flusher once more (it finds nothing due and parks): let
    # that settle before counting, and allow one such late wake on a loaded machine; a
    # flusher on a timer checks every interval (about thirty times here)
    await asyncio.sleep(0.1)
    checks = 0
    await asyncio.sleep(0.3)  # thirty intervals
    assert checks <= 1, f"{checks} checks in 30 idle intervals"
    ledger.write_nowait(make_record(tenant))
    async with asyncio.timeout(30):
        while ledger.stats.stored < 1:
            await asyncio.sleep(0.01)
    assert ledger.pending == 0 and checks >= 1


async def test_records_wait_one_flush_interval_then_go_together(
    ledger: Ledger, make_record: RecordFactory, tenant: str
) -> None:
    """The durability window of ``write_nowait``: a record waits ``flush_interval`` (not for
    ``batch_size`` records, nor for ``close``) and then goes in one batch with those written
    meanwhile. The test checks that order of events, which holds however loaded the machine
    is; how long the window lasts in milliseconds is a property of the load (it is
    ``stats.max_lag_ms``, the ``gateway_ledger_commit_lag_seconds`` gauge), not asserted here."""
    interval_ms = ledger.settings.flush_interval * 1000
    for _ in range(20):  # 20 rounds of 10 records, 10 ms or more apart: >= 200 ms in all
        for _ in range(10):
            await ledger.write(make_record(tenant))
        await asyncio.sleep(0.01)
    # never closed or flushed by hand: the timer must do it (a flush task's records leave
    # ``pending`` when the task is done, a loop turn after they are counted as stored)
    async with asyncio.timeout(30):
        while ledger.stats.stored < 200 or ledger.pending:
            await asyncio.sleep(0.01)
    # every batch is taken once its oldest record has waited the interval: none on write
    assert ledger.stats.last_lag_ms >= interval_ms
    assert ledger.stats.max_lag_ms >= interval_ms
    # the first batch went 50 ms into a >= 200 ms run (the timer, not the end of the writes
    # or batch_size, flushed it), and a batch holds whole rounds, so at most one per round
    assert 2 <= ledger.stats.flushes <= 20
