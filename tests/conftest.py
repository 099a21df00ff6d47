"""Shared fixtures: a simulated interactive pool and a real gateway process in front of it;
our own redis-server, Redis Cluster and PostgreSQL. And the ``process`` marker's hooks
(``tests/process_marker.py``): a test that uses a fixture marked ``@starts_process`` gets the
marker before ``-m`` selects, and an unmarked test that starts a process fails."""

from __future__ import annotations

import itertools
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from gateway.sim.server import SimServer
from tests.helpers import TEST_KEY, GatewayProcess, policy
from tests.ledger.postgres import PostgresNotFound, PostgresServer
from tests.process_marker import mark_process_items, starts_process, unmarked_processes
from tests.redis_servers import RedisCluster3, RedisProc


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_process_items(items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    with unmarked_processes(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    with unmarked_processes(item):
        return (yield)


@pytest.fixture(scope="session")
def sim() -> Iterator[SimServer]:
    """One interactive simulator, 5x faster than real time, for the whole session."""
    with SimServer("interactive", speedup=5, jitter=0.0) as server:
        yield server


@pytest.fixture(scope="session", params=["native", "aiohttp"])
@starts_process
def gateway(
    sim: SimServer, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[GatewayProcess]:
    """``gateway serve`` on a free port with pool 'chat' -> the simulator (model 'chat-model'),
    once with each upstream client."""
    tmp: Path = tmp_path_factory.mktemp("gateway")
    data = policy({"chat": [sim.url]}, max_body_bytes=64 * 1024, upstream_client=request.param)
    data["server"]["timeouts"] = {"first_token": 2.0}
    with GatewayProcess(tmp, data) as gw:
        yield gw


@pytest.fixture()
def api_key() -> str:
    return TEST_KEY


@pytest.fixture(scope="session")
@starts_process
def redis_proc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProc]:
    """A redis-server shared by the session (tests use their own tenant ids)."""
    proc = RedisProc(tmp_path_factory.mktemp("redis")).start()
    yield proc
    proc.stop()


@pytest.fixture()
@starts_process
def own_redis(tmp_path: Path) -> Iterator[RedisProc]:
    """A redis-server of this test's own, which it may stop, kill, freeze and restart."""
    proc = RedisProc(tmp_path).start()
    yield proc
    proc.stop()


@pytest.fixture()
def gateway_redis(own_redis: RedisProc, monkeypatch: pytest.MonkeyPatch) -> RedisProc:
    """``own_redis``, named in ``GATEWAY_REDIS_URL`` for the gateways the test starts."""
    monkeypatch.setenv("GATEWAY_REDIS_URL", own_redis.url)
    return own_redis


@pytest.fixture(scope="session")
@starts_process
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster3]:
    cluster = RedisCluster3(tmp_path_factory.mktemp("cluster")).start()
    yield cluster
    cluster.stop()


def _postgres_server() -> PostgresServer:
    """A started server, or the test fails (never skips: CI installs PostgreSQL)."""
    try:
        server = PostgresServer()
    except PostgresNotFound as exc:
        missing = str(exc)
    else:
        missing = ""
    if missing:
        pytest.fail(missing, pytrace=False)
    try:
        return server.start()
    except BaseException:
        server.close()
        raise


@pytest.fixture(scope="session")
@starts_process
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL for the session; tests get their own database from ``postgres_url``."""
    server = _postgres_server()
    yield server
    server.close()


_databases = itertools.count(1)


@pytest.fixture()
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh, empty database (from template0) on the session's server, dropped after the
    test, so tests never see each other's rows."""
    name = f"test_{next(_databases)}"
    url = postgres_server.create_database(name)
    yield url
    postgres_server.drop_database(name)


@pytest.fixture()
@starts_process
def own_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL this test may stop, kill and restart (same port, same data)."""
    server = _postgres_server()
    yield server
    server.close()
