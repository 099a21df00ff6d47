"""Fixtures: a redis-server a test may stop, one on a unix socket, one speaking TLS only."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.redis.servers import SocketRedis, TlsRedis
from tests.redis_servers import RedisProc


@pytest.fixture()
def own_redis(tmp_path: Path) -> Iterator[RedisProc]:
    """A redis-server this test may stop, freeze and restart."""
    proc = RedisProc(tmp_path).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def socket_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SocketRedis]:
    server = SocketRedis(tmp_path_factory.mktemp("sock"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    server = TlsRedis(tmp_path_factory.mktemp("tls"))
    server.start()
    yield server
    server.stop()
