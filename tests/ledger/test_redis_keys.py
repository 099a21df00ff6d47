"""The Redis key layout (``gateway/ledger/keys.py``) as it lands in a real Redis."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from redis.asyncio import Redis

from gateway.ledger import LedgerSettings, RedisLedger, day_of
from gateway.ledger.keys import tenant_tag
from tests.ledger.conftest import TIMEOUT

if TYPE_CHECKING:
    from tests.ledger.conftest import RecordFactory
    from tests.ledger.servers import RedisProc

DAY_MS = 86_400_000


async def test_one_record_keys_and_ttls(
    redis_proc: RedisProc, tmp_path: Path, make_record: RecordFactory, tenant: str
) -> None:
    """seen (TTL seen_ttl_days), day stream + day hash (expire retention_days after the day),
    month hash, and the tenant in ``gw:l:tenants``."""
    settings = LedgerSettings(seen_ttl_days=35, retention_days=90, month_retention_days=400)
    ledger = RedisLedger.from_url(
        redis_proc.url, spool_dir=tmp_path, timeout=TIMEOUT, settings=settings
    )
    await ledger.start()
    record = make_record(tenant, model="m", request_class="interactive", tools=0)
    await ledger.write(record)
    await ledger.close()
    day, tag = day_of(record.ts_ms), f"gw:l:{{{tenant}}}"
    client = Redis.from_url(redis_proc.url, decode_responses=True)
    try:
        seen, stream = f"{tag}:seen:{record.request_id}", f"{tag}:s:{day}"
        expected = [seen, stream, f"{tag}:d:{day}", f"{tag}:m:{day[:7]}"]
        assert sorted(await client.keys(f"{tag}:*")) == sorted(expected)
        seen_ttl = await client.pttl(f"{tag}:seen:{record.request_id}")
        assert 34 * DAY_MS < seen_ttl <= 35 * DAY_MS
        assert 90 * DAY_MS < await client.pttl(f"{tag}:s:{day}") <= 91 * DAY_MS
        assert 90 * DAY_MS < await client.pttl(f"{tag}:d:{day}") <= 91 * DAY_MS
        assert 400 * DAY_MS < await client.pttl(f"{tag}:m:{day[:7]}") <= 432 * DAY_MS
        totals = await client.hgetall(f"{tag}:d:{day}")
        assert totals["m|interactive||requests"] == "1"
        assert "m|interactive||tools" not in totals  # zero counters are not stored
        assert await client.sismember("gw:l:tenants", tenant)
        assert await client.xlen(f"{tag}:s:{day}") == 1
    finally:
        await client.aclose()


def test_tenant_cannot_break_the_hash_tag() -> None:
    assert tenant_tag("a}b{c%") == "gw:l:{a%7Db%7Bc%25}"
