"""A tenant below its share takes a headroom slot on a full backend rather than a free slot
behind pending prefills: the free slot a light tenant finds beside a flood is most often on the
backend where the flood's requests are prefilling, and its request would wait for them. Only in
prefill-aware pools, only when every free slot's backend has more prefills pending than the
headroom's, never for a tenant at or above its share, never on an ejected backend."""

from __future__ import annotations

import time

import pytest

from gateway.config import Backend, Pool
from gateway.routing.backend import BackendState
from gateway.routing.pool import PoolState


def _pool(**kw: object) -> PoolState:
    return PoolState(Pool(name="p", backends=[
        Backend(url=f"http://b{i}", max_in_flight=4) for i in range(2)
    ], **kw))  # type: ignore[arg-type]


def _far() -> float:
    return time.monotonic() + 3600


async def _flooded(pool: PoolState) -> tuple[BackendState, BackendState]:
    """A holds every slot of one backend and all but one of the other, whose free slot has one
    of A's prefills pending: (the full backend, the one with the free slot)."""
    for _ in range(7):
        await pool.acquire(0, _far(), tenant="a")
    full = next(b for b in pool.backends if b.full)
    free = next(b for b in pool.backends if not b.full)
    pool.prefill_started(free, "a", time.monotonic())
    return full, free


async def test_light_tenant_takes_the_clear_headroom_not_the_free_slot_behind_a_prefill() -> None:
    pool = _pool()
    full, free = await _flooded(pool)
    started = pool.headroom_started
    got = await pool.acquire(0, _far(), tenant="b")
    assert got is full
    assert full.in_flight == 5  # above its max_in_flight: a headroom slot
    assert free.in_flight == 3  # its free slot left for the flood
    assert pool.headroom_started == started + 1  # counted as a headroom start
    pool.release(got, "b")
    assert full.in_flight == 4


async def test_free_slot_without_pending_prefills_is_taken_as_before() -> None:
    pool = _pool()
    full, free = await _flooded(pool)
    pool.prefill_ended(free, "a", time.monotonic())  # A's first chunk: nothing pending there
    started = pool.headroom_started
    got = await pool.acquire(0, _far(), tenant="b")
    assert got is free
    assert full.in_flight == 4
    assert pool.headroom_started == started


async def test_headroom_with_as_many_prefills_pending_is_no_escape() -> None:
    pool = _pool()
    full, free = await _flooded(pool)
    pool.prefill_started(full, "a", time.monotonic())
    got = await pool.acquire(0, _far(), tenant="b")
    assert got is free


@pytest.mark.parametrize("kw", [{"prefill_aware": False}, {"fair_headroom": 0}, {"fair": False}])
async def test_only_prefill_aware_pools_with_headroom(kw: dict[str, object]) -> None:
    pool = _pool(**kw)
    full, free = await _flooded(pool)
    got = await pool.acquire(0, _far(), tenant="b")
    assert got is free
    assert full.in_flight == 4


async def test_tenant_at_its_share_takes_no_headroom() -> None:
    """A holds 7 of 8 slots: far above its share beside B; its own next request takes the free
    slot (or waits), never the headroom, however many prefills are pending there."""
    pool = _pool(fair_stagger=False)
    full, free = await _flooded(pool)
    now = time.monotonic()
    assert pool.try_pick(now, tenant="b", spare=True) is full  # B holds a slot: A has company
    got = pool.try_pick(now, tenant="a")
    assert got is free
    assert full.in_flight == 5


async def test_never_an_ejected_backend_however_clear() -> None:
    pool = _pool()
    full, free = await _flooded(pool)
    full.ejected_until = time.monotonic() + 60
    got = await pool.acquire(0, _far(), tenant="b")
    assert got is free
