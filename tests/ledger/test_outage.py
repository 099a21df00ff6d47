"""Redis going away under load: records spool, then replay exactly once when it is back."""

from __future__ import annotations

import asyncio
import shutil
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from gateway.ledger import LedgerSettings, RedisLedger, UsageRecord, day_of
from gateway.ledger.reconcile import sum_records
from tests.ledger.conftest import TIMEOUT
from tests.ledger.servers import free_port

if TYPE_CHECKING:
    from tests.ledger.conftest import RecordFactory
    from tests.ledger.servers import RedisProc

FAST = LedgerSettings(replay_interval=0.1)


async def settle(ledger: RedisLedger, timeout: float = 20.0) -> None:
    """Wait until nothing is buffered or spooled."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await ledger.flush()
        if ledger.pending == 0 and not ledger.spool.segment_paths():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"ledger did not settle: {ledger!r}")


async def check_exact(ledger: RedisLedger, tenant: str, records: list[UsageRecord]) -> None:
    """Redis holds each record exactly once and the totals equal their sum."""
    stored = [r async for r in ledger.export(0, 2**62, tenant)]
    ids = [r.request_id for r in stored]
    assert len(ids) == len(set(ids)), "a record was stored twice"
    assert set(ids) == {r.request_id for r in records}, "a record was lost"
    assert sum_records(stored) == sum_records(records)
    day = day_of(records[0].ts_ms)
    assert await ledger.reconcile(tenant, day) == []
    (row,) = await ledger.usage(tenant, day, day, group_by=())
    assert row.requests == len(records)
    assert row.output == sum(r.output for r in records)
    assert row.cost_micros == sum(r.cost_micros for r in records)


@pytest.mark.parametrize("how", ["sigkill", "sigstop"])
async def test_redis_lost_mid_load(
    own_redis: RedisProc, tmp_path: Path, make_record: RecordFactory, tenant: str, how: str
) -> None:
    """Redis SIGKILLed (refused connections) or SIGSTOPped (timeouts) while records are being
    written: they go to the spool, and after Redis returns the totals are exact."""
    ledger = RedisLedger.from_url(
        own_redis.url, spool_dir=tmp_path / "spool", timeout=0.25, settings=FAST
    )
    await ledger.start()
    records = [make_record(tenant) for _ in range(3000)]
    for i in range(0, len(records), 30):
        if i == 900:
            if how == "sigkill":
                own_redis.kill()
            else:
                own_redis.signal(signal.SIGSTOP)
        if i == 2100:
            if how == "sigkill":
                own_redis.start()  # same port and directory: the AOF brings back its data
            else:
                own_redis.signal(signal.SIGCONT)
        for r in records[i : i + 30]:
            await ledger.write(r)
        await asyncio.sleep(0.02)  # ~2 s of load, Redis away for ~0.8 s of it
    await settle(ledger)
    assert ledger.stats.spooled > 0, "the outage never reached the ledger"
    assert ledger.stats.replayed > 0
    await check_exact(ledger, tenant, records)
    await ledger.close()


@pytest.mark.parametrize("cluster", [False, True], ids=["redis", "cluster"])
async def test_unreachable_at_start_spools(
    cluster: bool, tmp_path: Path, make_record: RecordFactory, tenant: str
) -> None:
    """A Redis (or Redis Cluster: its client raises ``RedisClusterException``, which is not
    a ``RedisError``) that cannot be reached at start is an outage like any other: start
    returns, the records go to the spool, nothing escapes to the caller."""
    ledger = RedisLedger.from_url(
        f"redis://127.0.0.1:{free_port()}", spool_dir=tmp_path / "spool", cluster=cluster
    )
    await ledger.start()
    for _ in range(10):
        await ledger.write(make_record(tenant))
    await ledger.flush()
    assert ledger.stats.spooled == 10
    assert await ledger.replay() == 0
    await ledger.close()
    assert ledger.pending == 0
    assert ledger.spool.segment_paths()


async def test_spool_replayed_twice_counts_once(
    redis_proc: RedisProc, tmp_path: Path, make_record: RecordFactory, tenant: str
) -> None:
    """A spool left by a process that could not reach Redis is replayed at the next start;
    a copy of it replayed again (a crash mid-replay) adds nothing."""
    spool = tmp_path / "spool"
    down = RedisLedger.from_url(f"redis://127.0.0.1:{free_port()}", spool_dir=spool)
    await down.start()
    records = [make_record(tenant) for _ in range(700)]
    for r in records:
        await down.write(r)
    await down.close()
    assert down.stats.spooled == 700
    segments = sorted(spool.glob("spool-*.jsonl"))
    assert segments
    backup = tmp_path / "backup"
    backup.mkdir()
    for seg in segments:
        shutil.copy(seg, backup / seg.name)
    dupe = segments[0].with_name(segments[0].name.replace("spool-", "spool-0"))
    shutil.copy(segments[0], dupe)  # the same records twice in one spool

    up = RedisLedger.from_url(redis_proc.url, spool_dir=spool, timeout=TIMEOUT, settings=FAST)
    await up.start()  # replays the leftover spool
    await settle(up)
    await check_exact(up, tenant, records)
    for seg in backup.iterdir():
        shutil.copy(seg, spool / seg.name)
    assert await up.replay() == 0  # nothing new
    assert not list(spool.glob("spool-*.jsonl"))
    await check_exact(up, tenant, records)
    await up.close()


async def test_replay_waits_for_redis(
    own_redis: RedisProc, tmp_path: Path, make_record: RecordFactory, tenant: str
) -> None:
    """While Redis is down the spool is kept (not deleted, not half-replayed)."""
    ledger = RedisLedger.from_url(
        own_redis.url, spool_dir=tmp_path / "spool", timeout=0.25, settings=FAST
    )
    await ledger.start()
    own_redis.kill()
    records = [make_record(tenant) for _ in range(100)]
    for r in records:
        await ledger.write(r)
    await ledger.flush()
    assert ledger.stats.spooled == 100
    assert await ledger.replay() == 0
    assert ledger.spool.segment_paths()
    own_redis.start()
    await settle(ledger)
    await check_exact(ledger, tenant, records)
    await ledger.close()
