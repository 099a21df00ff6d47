"""The same contract from both rollout stores: compare-and-set on the revision, counts per
replica and window, one lease holder at a time (Redis: a real redis-server)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from gateway.rollouts import MemoryRolloutStore, RedisRolloutStore, RolloutStore
from gateway.rollouts.machine import Phase, RolloutState, transition
from tests.redis_servers import RedisProc

Case = Callable[[RolloutStore, str], Awaitable[None]]


def _run(kind: str, redis_proc: RedisProc, case: Case) -> None:
    model = f"model-{os.urandom(4).hex()}"  # the session's redis-server is shared

    async def go() -> None:
        store: RolloutStore = (MemoryRolloutStore() if kind == "memory"
                               else RedisRolloutStore.from_url(redis_proc.url))
        try:
            await case(store, model)
        finally:
            await store.aclose()

    asyncio.run(go())


@pytest.fixture(params=["memory", "redis"])
def kind(request: pytest.FixtureRequest) -> Any:
    return request.param


def test_save_is_a_compare_and_set_on_the_revision(kind: str, redis_proc: RedisProc) -> None:
    async def case(store: RolloutStore, model: str) -> None:
        first = RolloutState(model, "canary", "d", [10.0, 100.0])
        assert await store.load(model) is None
        assert await store.save(first, None)
        assert not await store.save(first, None)  # someone saved first
        moved = transition(first, Phase.PROGRESSING, 0, "started", 5.0)
        assert await store.save(moved, first.revision)
        stale = transition(first, Phase.ABORTED, 0, "operator:abort", 6.0)
        assert not await store.save(stale, first.revision)  # read before the move
        loaded = await store.load(model)
        assert loaded is not None and (loaded.phase, loaded.revision) == (Phase.PROGRESSING, 1)
        assert loaded.history == moved.history

    _run(kind, redis_proc, case)


def test_counts_are_kept_per_replica_and_window(kind: str, redis_proc: RedisProc) -> None:
    async def case(store: RolloutStore, model: str) -> None:
        await store.publish(model, 3, "a", {"canary|x": {"n": 1}}, 60)
        await store.publish(model, 3, "a", {"canary|x": {"n": 2}}, 60)  # replaces a's
        got = await store.gather(model, 3)
        assert got == [{"canary|x": {"n": 2}}]
        if kind == "redis":  # the embedded store is the only replica
            await store.publish(model, 3, "b", {"canary|x": {"n": 5}}, 60)
            assert len(await store.gather(model, 3)) == 2
        assert await store.gather(model, 4) == []

    _run(kind, redis_proc, case)


def test_one_lease_holder_at_a_time(redis_proc: RedisProc) -> None:
    async def case(store: RolloutStore, model: str) -> None:
        a, b = f"a-{model}", f"b-{model}"
        await store.resign("whoever")
        # the lease key is global: wait out any other test's holder
        while not await store.lead(a, 0.3):
            await asyncio.sleep(0.1)
        assert not await store.lead(b, 0.3)
        assert await store.lead(a, 0.3)  # renewal
        await asyncio.sleep(0.5)  # a died: its lease runs out
        assert await store.lead(b, 0.3)
        await store.resign(b)
        assert await store.lead(a, 0.3)
        await store.resign(a)

    _run("redis", redis_proc, case)


def test_an_unreachable_redis_is_one_named_error() -> None:
    """No Redis listening: the store says so with its own error (the admin API's 503), not
    redis-py's."""
    from gateway.rollouts import RolloutStoreUnavailable
    from tests.ports import free_port

    async def go() -> None:
        store = RedisRolloutStore.from_url(f"redis://127.0.0.1:{free_port()}")
        try:
            with pytest.raises(RolloutStoreUnavailable):
                await store.load("m")
            with pytest.raises(RolloutStoreUnavailable):
                await store.publish("m", 1, "a", {}, 60)
        finally:
            await store.aclose()

    asyncio.run(go())
