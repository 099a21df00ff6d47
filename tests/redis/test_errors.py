"""The one error mapping: which failures mean "Redis is away", which are refusals, and the
store error each becomes; checked on exception objects and on real failures of both clients."""

from __future__ import annotations

import signal

import pytest
from redis.exceptions import (
    AuthenticationError,
    BusyLoadingError,
    ClusterDownError,
    DataError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.quota.errors import QuotaConnectError, QuotaStoreError, QuotaTimeout
from gateway.quota.redis import map_redis_error as quota_errors
from gateway.redis import FAILURES, Timeouts, is_no_script, is_outage, kind_of, open_redis
from tests.ports import free_port
from tests.redis_servers import RedisProc

CASES = [
    # (exception, kind, outage)
    pytest.param(RedisConnectionError("refused"), "connect", True, id="refused"),
    pytest.param(AuthenticationError("WRONGPASS"), "connect", True, id="auth"),
    pytest.param(ConnectionResetError(), "connect", True, id="reset"),
    pytest.param(RedisClusterException("no startup node"), "connect", True, id="no-cluster"),
    pytest.param(RedisTimeoutError("slow"), "timeout", True, id="redis-timeout"),
    pytest.param(TimeoutError(), "timeout", True, id="deadline"),
    pytest.param(BusyLoadingError("LOADING"), "refused", True, id="loading"),
    pytest.param(ReadOnlyError("READONLY"), "refused", True, id="readonly"),
    pytest.param(OutOfMemoryError("OOM"), "refused", True, id="oom"),
    pytest.param(ClusterDownError("CLUSTERDOWN"), "refused", True, id="clusterdown"),
    pytest.param(TryAgainError("TRYAGAIN"), "refused", True, id="tryagain"),
    pytest.param(ResponseError("MASTERDOWN Link down"), "refused", True, id="masterdown"),
    pytest.param(NoScriptError("NOSCRIPT"), "refused", False, id="noscript"),
    pytest.param(ResponseError("ERR wrong number of args"), "refused", False, id="bad-command"),
    pytest.param(ResponseError("WRONGTYPE"), "refused", False, id="wrongtype"),
    pytest.param(DataError("bad value"), "refused", True, id="client-side"),
]


@pytest.mark.parametrize(("exc", "kind", "outage"), CASES)
def test_each_failure_has_one_kind_and_one_outage_answer(
        exc: Exception, kind: str, outage: bool) -> None:
    assert isinstance(exc, FAILURES)
    assert kind_of(exc) == kind
    assert is_outage(exc) is outage


def test_not_a_failure_is_no_outage() -> None:
    assert not is_outage(ValueError("ours"))
    assert not isinstance(ValueError(), FAILURES)


def test_no_script_in_either_form() -> None:
    """redis-py raises ``NoScriptError``; a reply parsed elsewhere may be a plain error."""
    assert is_no_script(NoScriptError("No matching script"))
    assert is_no_script(ResponseError("NOSCRIPT No matching script"))
    assert not is_no_script(ResponseError("ERR"))
    assert not is_no_script(RedisConnectionError())


@pytest.mark.parametrize(
    ("exc", "quota"),
    [
        pytest.param(RedisConnectionError("refused"), QuotaConnectError, id="connect"),
        pytest.param(TimeoutError(), QuotaTimeout, id="timeout"),
        pytest.param(ReadOnlyError("READONLY"), QuotaStoreError, id="refused"),
    ],
)
def test_the_quota_store_translates_each_kind(exc: Exception, quota: type[Exception]) -> None:
    mapped = quota_errors(exc)
    assert type(mapped) is quota and repr(exc) in str(mapped)


@pytest.mark.parametrize("pipelined", [True, False], ids=["pipelined", "redis-py"])
async def test_a_closed_port_is_a_connect_failure(pipelined: bool) -> None:
    client = open_redis(f"redis://127.0.0.1:{free_port()}", pipelined=pipelined,
                        timeouts=Timeouts(connect=5.0))
    try:
        with pytest.raises(FAILURES) as caught:
            await client.execute_command("PING")
        assert kind_of(caught.value) == "connect" and is_outage(caught.value)
    finally:
        await client.aclose()


@pytest.mark.parametrize("pipelined", [True, False], ids=["pipelined", "redis-py"])
async def test_a_frozen_server_is_a_timeout(own_redis: RedisProc, pipelined: bool) -> None:
    client = open_redis(own_redis.url, pipelined=pipelined, timeouts=Timeouts(connect=5.0))
    try:
        await client.execute_command("PING")
        own_redis.signal(signal.SIGSTOP)
        try:
            with pytest.raises(FAILURES) as caught:
                await client.execute_encoded(b"*1\r\n$4\r\nPING\r\n", timeout=0.2)
        finally:
            own_redis.signal(signal.SIGCONT)
        assert kind_of(caught.value) == "timeout" and is_outage(caught.value)
    finally:
        await client.aclose()
