"""Rows (``aggregate.UsageRow``) of any names sum to their records, read back from a real
SQLite ledger through ``usage_rows``, ``export`` and ``drift``.

Names include ``|``, ``%`` and the empty string (the old field map split on ``|``; the
rollup keys are columns, but a name must still never merge with or split from another).
How drift is reported is in ``test_usage_queries.py`` (a rollup edited by hand).
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.ledger import LedgerSettings, UsageRecord
from gateway.ledger.sql.sqlite import SqliteLedger
from tests.ledger.usage_data import FINEST, assert_reads_match

names = st.text(alphabet="ab|%c", min_size=0, max_size=4)
_T = 1_700_000_000_000 - 1_700_000_000_000 % 86_400_000  # 2023-11-14T00:00:00Z
#: a few instants, so records share rollup rows: each side of an hour and of a day boundary
instants = st.sampled_from([_T, _T + 1, _T + 3_599_999, _T + 3_600_000, _T + 86_399_999,
                            _T + 86_400_000])
records = st.lists(
    st.builds(
        UsageRecord,
        request_id=st.uuids().map(str),
        ts_ms=instants,
        tenant=st.just("t"),
        model=names,
        request_class=names,
        batch_id=st.none() | names,
        outcome=st.sampled_from(["completed", "failed"]),
        system=st.integers(0, 10**6),
        output=st.integers(0, 10**6),
        cost_micros=st.integers(0, 10**9),
        estimated=st.booleans(),
    ),
    min_size=1,
    max_size=30,
    unique_by=lambda r: r.request_id,
)


async def _check(directory: Path, rs: list[UsageRecord]) -> None:
    # records dated 2023: retention must not expire them under the test
    ledger = SqliteLedger(directory / "ledger.db", spool_dir=directory / "spool",
                          settings=LedgerSettings(retention_days=20_000))
    await ledger.start()
    try:
        for r in rs:
            ledger.write_nowait(r)
        await ledger.flush()
        assert ledger.stats.stored == len(rs) and ledger.stats.spooled == 0
        await assert_reads_match(ledger, "t", rs, ((), ("model", "class", "batch"), FINEST))
    finally:
        await ledger.close()


@settings(max_examples=25, deadline=None)
@given(records)
def test_rows_sum_to_records(rs: list[UsageRecord]) -> None:
    """Whatever the names, grouped rows add up to the records, group by group, and the
    rollups do not drift from them."""
    with tempfile.TemporaryDirectory() as directory:
        asyncio.run(_check(Path(directory), rs))
