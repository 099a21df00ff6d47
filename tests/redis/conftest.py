"""Fixtures: a redis-server on a unix socket, one speaking TLS only (one a test may stop:
``own_redis`` of ``tests/conftest.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeVar

import pytest

from tests.process_marker import starts_process
from tests.redis.servers import Server, SocketRedis, TlsRedis

S = TypeVar("S", bound=Server)


def _serving(server: S) -> Iterator[S]:
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
@starts_process
def socket_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SocketRedis]:
    yield from _serving(SocketRedis(tmp_path_factory.mktemp("sock")))


@pytest.fixture(scope="session")
@starts_process
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    yield from _serving(TlsRedis(tmp_path_factory.mktemp("tls")))
