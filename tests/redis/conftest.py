"""Fixtures: a redis-server a test may stop, one on a unix socket, one speaking TLS only."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from tests.redis.servers import Server, SocketRedis, TlsRedis
from tests.redis_servers import RedisProc

S = TypeVar("S", bound=Server)


@pytest.fixture()
def own_redis(tmp_path: Path) -> Iterator[RedisProc]:
    """A redis-server this test may stop, freeze and restart."""
    proc = RedisProc(tmp_path).start()
    yield proc
    proc.stop()


def _serving(server: S) -> Iterator[S]:
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def socket_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SocketRedis]:
    yield from _serving(SocketRedis(tmp_path_factory.mktemp("sock")))


@pytest.fixture(scope="session")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    yield from _serving(TlsRedis(tmp_path_factory.mktemp("tls")))
