"""``fair_stagger`` in a real pool queue: while another tenant holds slots, a tenant at or
above its share starts only where no light tenant's streamed request awaits its first chunk,
and while its own prefills are pending, only in their burst's backend (within the burst's
window); a slot held back goes at the next first chunk. On by default, never for a tenant
alone or with ``fair_stagger: false``."""

from __future__ import annotations

import asyncio
import time

from gateway.config import Backend, Pool
from gateway.routing.backend import BackendState
from gateway.routing.pool import PoolState


def _pool(**kw: object) -> PoolState:
    return PoolState(Pool(name="p", backends=[
        Backend(url=f"http://b{i}", max_in_flight=2) for i in range(2)
    ], **kw))  # type: ignore[arg-type]


def _far() -> float:
    return time.monotonic() + 3600


async def _settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


def _waiter(pool: PoolState, tenant: str) -> asyncio.Task[BackendState]:
    return asyncio.create_task(pool.acquire(0, _far(), tenant=tenant, tokens=100))


async def _fill(pool: PoolState) -> tuple[BackendState, BackendState]:
    """A holds both slots of one backend and one of the other, B the last: (A's full backend,
    the shared one)."""
    held = [(t, await pool.acquire(0, _far(), tenant=t)) for t in ("a", "a", "a", "b")]
    b_backend = held[-1][1]
    other = next(b for b in pool.backends if b is not b_backend)
    assert sum(1 for t, b in held if b is other and t == "a") == 2
    return other, b_backend


async def test_flood_never_starts_where_a_light_prefill_is_pending() -> None:
    pool = _pool()
    full, shared = await _fill(pool)
    waiting = _waiter(pool, "a")
    await _settle()
    started = time.monotonic()
    pool.prefill_started(shared, "b", started)  # B's streamed request there awaits its chunk
    pool.release(shared, "a")  # A's slot on B's backend frees
    await _settle()
    assert not waiting.done()
    pool.prefill_ended(shared, "b", started)  # B's first chunk: the slot goes to A
    await _settle()
    assert waiting.done() and waiting.result() is shared
    assert full.in_flight == 2


async def test_flood_prefills_pending_on_one_backend_hold_the_other() -> None:
    """A's prefill pending on one backend (its burst, past the burst window): A's slot freed on
    the other waits for that first chunk, then goes."""
    pool = _pool()
    full, shared = await _fill(pool)
    waiting = _waiter(pool, "a")
    await _settle()
    started = time.monotonic()
    pool.prefill_started(full, "a", started)
    pool._burst = (full, started - 1.0)  # its burst began long ago: closed
    pool.release(shared, "a")
    await _settle()
    assert not waiting.done()
    pool.prefill_ended(full, "a", started)
    await _settle()
    assert waiting.done() and waiting.result() is shared


async def test_a_burst_takes_starts_on_its_own_backend_within_its_window() -> None:
    pool = _pool()
    full, _ = await _fill(pool)
    now = time.monotonic()  # one instant for both picks: inside the window however slow
    pool.release(full, "a")  # A holds 2 of 4 beside B's 1: at its share, paced
    first = pool.try_pick(now, tenant="a")
    assert first is full  # the only free slot; nothing pending: it begins a burst
    assert pool._burst is not None and pool._burst[0] is full
    pool.prefill_started(first, "a", now)
    pool.release(full, "a")
    second = pool.try_pick(now, tenant="a")  # inside the window: joins it
    assert second is full
    pool.release(full, "a")
    assert pool.try_pick(now + 1.0, tenant="a") is None  # window passed: waits for the chunks


async def test_never_when_off_nor_for_a_tenant_alone() -> None:
    for kw, tenants in (({"fair_stagger": False}, ("a", "a", "a", "b")), ({}, ("a",) * 4)):
        pool = _pool(**kw)
        held = [(t, await pool.acquire(0, _far(), tenant=t)) for t in tenants]
        waiting = _waiter(pool, "a")
        await _settle()
        backend = held[0][1]
        pool.prefill_started(backend, "b" if "b" in tenants else "a", time.monotonic())
        pool.release(backend, "a")
        await _settle()
        assert waiting.done() and waiting.result() is backend, kw


async def test_the_flood_stays_staggered_while_a_light_tenant_lingers() -> None:
    """B's last request ended: for ``fair_linger`` seconds B still counts as sharing the pool,
    so A's freed slot waits for A's pending burst as if B held slots (its next request then
    finds one backend clear); with ``fair_linger: 0`` A is alone at once and takes it."""
    for linger, held_back in ((30.0, True), (0.0, False)):
        pool = _pool(fair_linger=linger)
        full, shared = await _fill(pool)
        waiting = _waiter(pool, "a")
        await _settle()
        started = time.monotonic()
        pool.prefill_started(full, "a", started)  # A's burst pending there, its window closed
        pool._burst = (full, started - 1.0)
        pool.release(shared, "b")  # B's last request ends: a slot frees beside A's burst
        await _settle()
        assert waiting.done() is not held_back, linger
        if held_back:
            pool.prefill_ended(full, "a", started)  # the burst's first chunk: the slot goes
            await _settle()
            assert waiting.done() and waiting.result() is shared


async def test_a_lingering_tenant_stops_counting_when_its_linger_ends() -> None:
    pool = _pool(fair_linger=0.5)
    full, shared = await _fill(pool)
    now = time.monotonic()
    pool.prefill_started(full, "a", now)
    pool._burst = (full, now - 1.0)
    pool.release(shared, "b")
    assert pool.try_pick(now + 0.25, tenant="a") is None  # B lingers: A waits for its burst
    assert pool.try_pick(now + 1.0, tenant="a") is shared  # B gone: A alone, not staggered


async def test_a_slot_held_for_a_hand_over_goes_once_that_request_is_sent() -> None:
    """A slot held back because a waiter was handed a backend goes as soon as that waiter
    runs, when its request is not streamed (no first chunk will be counted to release it)."""
    pool = _pool()
    full, shared = await _fill(pool)  # A 3, B 1: A at or above its share, paced
    first, second = _waiter(pool, "a"), _waiter(pool, "a")
    await _settle()
    pool.release(full, "a")  # a burst begins on A's backend: handed to the first waiter
    pool._burst = (full, time.monotonic() - 1.0)  # and its window closes at once
    pool.release(shared, "a")  # the other backend's slot: held for the hand-over
    assert not second.done()
    await _settle()  # the first waiter runs (not streamed: no prefill is counted)
    assert first.done() and first.result() is full
    assert second.done() and second.result() is shared
