"""Managed keys in Redis (the pipelined client and redis-py) and in a real 3-master Redis
Cluster: put, get, list, revoke; the store answers the same whichever client it holds."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gateway.auth.keystore import KeyRecord, RedisKeyStore, digest_for
from gateway.redis import open_redis
from tests.redis_servers import RedisCluster3, RedisProc

pytestmark = pytest.mark.process


async def _exercise(store: RedisKeyStore) -> None:
    records = [KeyRecord(id=f"id{i}", tenant="acme" if i % 2 else "globex",
                         digest=digest_for(b"secret-secret-secret", f"key{i}"), created=time.time())
               for i in range(6)]
    for r in records:
        await store.put(r)
    got = await store.get(records[3].digest)
    assert got is not None and got.id == "id3" and got.usable(time.time())
    assert {r.id for r in await store.list("acme")} == {"id1", "id3", "id5"}
    revoked = await store.revoke("id3")
    assert revoked is not None and revoked.revoked is not None
    again = await store.get(records[3].digest)
    assert again is not None and not again.usable(time.time())
    assert await store.get("0" * 64) is None
    assert await store.revoke("nope") is None
    by_id = await store.by_id("id3")
    assert by_id is not None and by_id.digest == records[3].digest and by_id.revoked
    assert await store.by_id("nope") is None


@pytest.mark.parametrize("pipelined", [True, False], ids=["pipelined", "redis-py"])
async def test_redis(own_redis: RedisProc, pipelined: bool) -> None:
    client = open_redis(own_redis.url, pipelined=pipelined)
    assert client.kind == ("pipelined" if pipelined else "redis")
    store = RedisKeyStore(client, timeout=2.0)
    await _exercise(store)
    await store.aclose()


@pytest.mark.timeout(120)
async def test_redis_cluster(tmp_path: Path) -> None:
    cluster = RedisCluster3(tmp_path).start()
    try:
        store = RedisKeyStore(open_redis(cluster.url, cluster=True), timeout=2.0)
        await _exercise(store)
        await store.aclose()
    finally:
        cluster.stop()
