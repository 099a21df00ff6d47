"""``open_redis``: every kind of URL gives a working client behind the one interface, against
a real redis-server (plain TCP, a unix socket, TLS, a 3-master Cluster)."""

from __future__ import annotations

import ssl

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

from gateway.redis import (
    PipelinedRedis,
    PyRedis,
    RedisLike,
    Timeouts,
    encode_command,
    is_no_script,
    open_redis,
    open_redis_py,
)
from tests.redis.servers import SocketRedis, TlsRedis
from tests.redis_servers import RedisCluster3, RedisProc

_SCRIPT = "return redis.call('INCRBY', KEYS[1], ARGV[1])"
_SHA = "0b6d6e8a1e6e0c8d9c7e5a2e52d83e7bd7e0b1e4"  # not its sha: every client must say NOSCRIPT


async def _exercise(client: RedisLike, tag: str) -> None:
    """What the stores use, each method once: the same answers from every client."""
    key = f"factory:{{{tag}}}:n"
    try:
        await client.execute_command("DEL", key)
        assert await client.execute_command("SET", key, 5) in (b"OK", True)
        assert await client.execute_command("GET", key) == b"5"
        sha = await client.script_load(_SCRIPT)
        await client.load_scripts([_SCRIPT, "return 1"])
        command = encode_command(("EVALSHA", sha, 1, key, 2))
        assert await client.execute_encoded(command, timeout=5.0) == 7
        assert await client.execute_encoded(command, urgent=False, timeout=5.0) == 9
        many = await client.execute_many([command, ("GET", key),
                                          ("EVALSHA", _SHA, 1, key, 1)])
        assert many[:2] == [11, b"11"]
        assert isinstance(many[2], ResponseError) and is_no_script(many[2])
        await client.drop_idle()
        assert await client.execute_command("GET", key) == b"11"  # connects again
    finally:
        await client.aclose()


async def test_plain_redis_url_gives_the_pipelined_client(redis_proc: RedisProc) -> None:
    client = open_redis(f"{redis_proc.url}/2", timeouts=Timeouts(connect=5.0))
    assert isinstance(client, PipelinedRedis) and client.kind == "pipelined"
    assert client.db == 2 and client.connect_timeout == 5.0
    await _exercise(client, "plain")


async def test_pipelined_off_gives_redis_py(redis_proc: RedisProc) -> None:
    client = open_redis(redis_proc.url, pipelined=False, max_connections=7)
    assert isinstance(client, PyRedis) and client.kind == "redis"
    pool = client.raw.connection_pool
    assert pool.max_connections == 7
    assert pool.connection_kwargs["socket_connect_timeout"] == Timeouts().connect
    # the stores' back-off replaces retries
    assert pool.connection_kwargs["retry"]._retries == 0
    await _exercise(client, "redis-py")


async def test_unix_socket(socket_redis: SocketRedis) -> None:
    for url in (f"unix://{socket_redis.path}", f"redis+unix://{socket_redis.path}"):
        client = open_redis(url, timeouts=Timeouts(connect=5.0))
        assert isinstance(client, PyRedis) and client.kind == "redis"
        assert client.raw.connection_pool.connection_kwargs["path"] == str(socket_redis.path)
        await _exercise(client, "unix")


async def test_tls(tls_redis: TlsRedis) -> None:
    client = open_redis(tls_redis.url, timeouts=Timeouts(connect=5.0))
    assert isinstance(client, PyRedis) and client.kind == "redis"
    await _exercise(client, "tls")


async def test_tls_refuses_an_untrusted_server(tls_redis: TlsRedis) -> None:
    """Certificates are checked: without the CA the connect fails (it is really TLS)."""
    client = open_redis(f"rediss://127.0.0.1:{tls_redis.port}", timeouts=Timeouts(connect=5.0))
    try:
        with pytest.raises(Exception) as caught:
            await client.execute_command("PING")
        chain: BaseException | None = caught.value
        seen = []
        while chain is not None:
            seen.append(chain)
            chain = chain.__cause__ or chain.__context__
        assert any(isinstance(e, ssl.SSLError) or "certificate" in str(e).lower() for e in seen)
    finally:
        await client.aclose()


@pytest.mark.timeout(120)
async def test_cluster(redis_cluster: RedisCluster3) -> None:
    client = open_redis(redis_cluster.url, cluster=True, timeouts=Timeouts(connect=5.0))
    assert isinstance(client, PyRedis) and client.kind == "cluster"
    assert isinstance(client.raw, RedisCluster)
    for tag in ("a", "b", "c", "d"):  # tags in different slots, on different nodes
        await _exercise(open_redis(redis_cluster.url, cluster=True), tag)
    await client.aclose()


def test_redis_py_keeps_its_retries_only_when_asked() -> None:
    """The batch state keeps redis-py's retries; every store of the request path has none."""
    kept = open_redis_py("redis://127.0.0.1:9", retries=True, max_connections=None)
    off = open_redis_py("redis://127.0.0.1:9")
    assert isinstance(kept, Redis) and isinstance(off, Redis)
    assert "retry" not in kept.connection_pool.connection_kwargs  # redis-py's default
    assert off.connection_pool.connection_kwargs["retry"]._retries == 0
    assert off.connection_pool.max_connections == 64
    default = Redis.from_url("redis://127.0.0.1:9").connection_pool.max_connections
    assert kept.connection_pool.max_connections == default  # redis-py's own
