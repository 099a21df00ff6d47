"""The lean auto-pipelining Redis client against a real redis-server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis
from redis.exceptions import AuthenticationError, NoScriptError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.redis import pipelined
from gateway.redis.pipelined import PipelinedRedis, supports_url
from tests.redis_servers import RedisProc


@pytest.fixture
async def client(redis_proc: RedisProc) -> AsyncIterator[PipelinedRedis]:
    """A lean client on the session's redis-server, closed after the test. Its connect bound
    is generous: these tests are about replies, and a loaded box can take more than the
    production default (0.2 s) to connect and select (the connect timeout has its own tests)."""
    client = PipelinedRedis.from_url(redis_proc.url, connect_timeout=5.0)
    yield client
    await client.aclose()


def _writes(client: PipelinedRedis) -> int:
    return int(repr(client).split("writes=")[1].rstrip(">"))


def test_only_plain_redis_urls() -> None:
    assert supports_url("redis://h:1/2")
    assert not supports_url("rediss://h:1")
    assert not supports_url("unix:///tmp/redis.sock")


async def test_concurrent_calls_share_writes_and_get_their_own_replies(
    client: PipelinedRedis,
) -> None:
    keys = [f"resp-test-{i}" for i in range(500)]
    await asyncio.gather(*(client.execute_command("SET", k, i) for i, k in enumerate(keys)))
    values = await asyncio.gather(*(client.execute_command("GET", k) for k in keys))
    assert values == [str(i).encode() for i in range(500)]
    # 1,000 commands issued 500 at a time went out in a handful of writes
    assert "commands=1000" in repr(client)
    writes = _writes(client)
    assert writes < 20
    with pytest.raises(NoScriptError):
        await client.execute_command("EVALSHA", "0" * 40, 0)
    with pytest.raises(ResponseError):
        await client.execute_command("NOSUCHCOMMAND")
    sha = await client.script_load("return ARGV[1]")
    assert await client.execute_command("EVALSHA", sha, 0, "x") == b"x"
    assert await client.ping()


async def test_a_cancelled_call_does_not_shift_later_replies(client: PipelinedRedis) -> None:
    await client.execute_command("SET", "resp-slow", "a")
    # a blocking call that times out on our side; its reply comes later and is skipped
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await client.execute_command("BLPOP", "resp-empty-list", 0.3)
    assert await client.execute_command("GET", "resp-slow") == b"a"


async def test_server_death_fails_waiters_and_the_next_call_reconnects(
    own_redis: RedisProc,
) -> None:
    client = PipelinedRedis.from_url(own_redis.url)
    try:
        assert await client.ping()
        own_redis.stop()
        with pytest.raises(RedisConnectionError):
            await client.execute_command("PING")
        own_redis.start()
        assert await client.ping()
    finally:
        await client.aclose()


async def test_db_and_password_from_the_url(own_redis: RedisProc) -> None:
    client = PipelinedRedis.from_url(own_redis.url)
    await client.execute_command("CONFIG", "SET", "requirepass", "s3cret")
    await client.aclose()
    host_port = own_redis.url.split("//")[1].split("/")[0]
    authed = PipelinedRedis.from_url(f"redis://:s3cret@{host_port}/3")
    try:
        await authed.execute_command("SET", "in-db-3", "yes")
        assert await authed.execute_command("GET", "in-db-3") == b"yes"
        assert b" db=3 " in await authed.execute_command("CLIENT", "INFO")
    finally:
        await authed.aclose()
    denied = PipelinedRedis.from_url(f"redis://:wrong@{host_port}/0")
    with pytest.raises(AuthenticationError):
        await denied.execute_command("PING")
    await denied.aclose()


async def test_non_urgent_commands_wait_briefly_to_share_a_write(client: PipelinedRedis) -> None:
    await client.ping()
    before = _writes(client)
    assert await client.execute_command("PING", urgent=False) == b"PONG"
    assert _writes(client) == before + 1  # sent alone, not held for company that never came

    async def lazy(i: int) -> Any:
        await asyncio.sleep(0)  # issued over several loop iterations
        return await client.execute_command("ECHO", str(i), urgent=False)

    replies = await asyncio.gather(*(lazy(i) for i in range(50)))
    assert replies == [str(i).encode() for i in range(50)]
    after = _writes(client)
    assert after - before <= 3  # one for the lone PING, one or two for the fifty


async def test_timeout_raises_redis_timeout_and_keeps_the_order(client: PipelinedRedis) -> None:
    await client.execute_command("SET", "resp-t", "b")
    with pytest.raises(RedisTimeoutError):
        await client.execute_command("BLPOP", "resp-empty-2", 0.3, timeout=0.05)
    assert await client.execute_command("GET", "resp-t", timeout=1.0) == b"b"


async def test_a_lone_non_urgent_command_is_written_at_once(
    client: PipelinedRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At an idle connection a settle has nobody to share a write with: waiting for company
    would only put it in the way of the next request's reserve. (The timer is made long, so
    the wait would show.)"""
    await client.ping()
    monkeypatch.setattr(pipelined, "LAZY_FLUSH_S", 30.0)
    assert await asyncio.wait_for(client.execute_command("PING", urgent=False), 5.0) == b"PONG"


async def _written(client: PipelinedRedis, writes: int) -> None:
    """Until the client has made ``writes`` writes (a few loop iterations)."""
    for _ in range(200):
        if _writes(client) >= writes:
            return
        await asyncio.sleep(0.001)


async def test_an_urgent_command_is_not_held_behind_non_urgent_ones_on_the_wire(
    client: PipelinedRedis, redis_proc: RedisProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reserve issued while the last request's settle is on the wire unanswered goes out
    at once, beside it (Redis answers them in order), instead of a round trip later."""
    await client.ping()
    monkeypatch.setattr(pipelined, "LAZY_FLUSH_S", 30.0)
    before = _writes(client)
    other = redis.Redis.from_url(redis_proc.url)
    try:
        other.execute_command("CLIENT", "PAUSE", 400, "ALL")  # the server holds the replies
        settle = asyncio.ensure_future(client.execute_command("ECHO", "settle", urgent=False))
        await _written(client, before + 1)
        assert _writes(client) == before + 1 and not settle.done()
        reserve = asyncio.ensure_future(client.execute_command("ECHO", "reserve"))
        await _written(client, before + 2)
        # written while the settle is still unanswered: one round trip, not two
        assert _writes(client) == before + 2 and not settle.done()
        assert await asyncio.wait_for(reserve, 5.0) == b"reserve"
        assert await asyncio.wait_for(settle, 5.0) == b"settle"
    finally:
        other.close()


async def test_an_urgent_command_waits_for_an_urgent_batch_on_the_wire(
    client: PipelinedRedis, redis_proc: RedisProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Behind an urgent command on the wire, later ones still wait and share the next write
    (one batch at a time under load)."""
    await client.ping()
    monkeypatch.setattr(pipelined, "LAZY_FLUSH_S", 30.0)
    before = _writes(client)
    other = redis.Redis.from_url(redis_proc.url)
    try:
        other.execute_command("CLIENT", "PAUSE", 300, "ALL")
        first = asyncio.ensure_future(client.execute_command("ECHO", "first"))
        await _written(client, before + 1)
        later = [asyncio.ensure_future(client.execute_command("ECHO", str(i)))
                 for i in range(5)]
        await asyncio.sleep(0.02)
        assert _writes(client) == before + 1 and not first.done()
        assert await asyncio.wait_for(asyncio.gather(*later), 5.0) == [
            str(i).encode() for i in range(5)]
        assert await first == b"first"
        assert _writes(client) == before + 2
    finally:
        other.close()
