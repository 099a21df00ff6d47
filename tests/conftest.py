"""Shared fixtures: a simulated interactive pool and a real gateway process in front of it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.sim.server import SimServer
from tests.helpers import TEST_KEY, GatewayProcess, policy
from tests.redis_servers import RedisCluster3, RedisProc


@pytest.fixture(scope="session")
def sim() -> Iterator[SimServer]:
    """One interactive simulator, 5x faster than real time, for the whole session."""
    with SimServer("interactive", speedup=5, jitter=0.0) as server:
        yield server


@pytest.fixture(scope="session", params=["native", "aiohttp"])
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
def redis_proc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProc]:
    """A redis-server shared by the session (tests use their own tenant ids)."""
    proc = RedisProc(tmp_path_factory.mktemp("redis")).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster3]:
    cluster = RedisCluster3(tmp_path_factory.mktemp("cluster")).start()
    yield cluster
    cluster.stop()
