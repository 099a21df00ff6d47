"""Fixtures: one ``store`` fixture that runs the same tests against the memory, Redis (the
pipelined client and redis-py) and Redis Cluster stores (our own redis-server and 3-master
cluster: ``redis_proc``, ``redis_cluster`` and ``own_redis`` of ``tests/conftest.py``)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from gateway.quota import MemoryQuotaStore, QuotaStore, RedisQuotaStore
from tests.process_marker import PROCESS

StoreFactory = Callable[..., QuotaStore]


@pytest.fixture(params=["memory", *(pytest.param(kind, marks=PROCESS)
                                    for kind in ("redis", "redis-py", "cluster"))])
async def make_store(request: pytest.FixtureRequest) -> AsyncIterator[StoreFactory]:
    """Builds stores of one kind (``make_store(window=1.0)``); closes them after the test."""
    kind: str = request.param
    url = ""
    if kind in ("redis", "redis-py"):
        url = request.getfixturevalue("redis_proc").url
    elif kind == "cluster":
        url = request.getfixturevalue("redis_cluster").url
    made: list[QuotaStore] = []

    def make(**kwargs: Any) -> QuotaStore:
        store: QuotaStore
        if kind == "memory":
            store = MemoryQuotaStore(**kwargs)
        else:  # generous timeout: the test box is shared
            store = RedisQuotaStore.from_url(url, cluster=kind == "cluster", timeout=30.0,
                                             pipelined=kind == "redis",
                                             **{"connect_timeout": 30.0, **kwargs})
        made.append(store)
        return store

    yield make
    for store in made:
        await store.aclose()


@pytest.fixture()
def store(make_store: StoreFactory) -> QuotaStore:
    return make_store()


@pytest.fixture()
def tenant() -> str:
    """A fresh tenant per test, so tests sharing a Redis never see each other's counters."""
    return f"t-{uuid.uuid4().hex[:12]}"
