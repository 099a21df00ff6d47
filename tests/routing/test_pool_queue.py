"""The pool queue: priority order, deadlines, panic mode, borrowing headroom."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.config import Backend, Borrow, Health, Pool
from gateway.routing.errors import NoHealthyBackend, PoolSaturated
from gateway.routing.pool import PoolState


def _pool(n: int = 1, max_in_flight: int = 1, **kw: object) -> PoolState:
    return PoolState(Pool(name="p", backends=[
        Backend(url=f"http://b{i}", max_in_flight=max_in_flight) for i in range(n)
    ], **kw))  # type: ignore[arg-type]


async def test_interactive_never_waits_behind_batch() -> None:
    """Waiting batch requests queued first; a later interactive one is served first."""
    pool = _pool()
    held = await pool.acquire(0, time.monotonic() + 5)
    order: list[str] = []

    async def wait(name: str, priority: int) -> None:
        backend = await pool.acquire(priority, time.monotonic() + 5)
        order.append(name)
        await asyncio.sleep(0.01)
        pool.release(backend)

    tasks = [asyncio.create_task(wait(f"batch{i}", 10)) for i in range(3)]
    await asyncio.sleep(0.01)
    tasks.append(asyncio.create_task(wait("interactive", 0)))
    await asyncio.sleep(0.01)
    assert pool.queued == 4
    pool.release(held)
    await asyncio.gather(*tasks)
    assert order[0] == "interactive"


async def test_deadline_answers_by_the_deadline() -> None:
    pool = _pool()
    await pool.acquire(0, time.monotonic() + 5)
    t0 = time.monotonic()
    with pytest.raises(PoolSaturated) as info:
        await pool.acquire(0, t0 + 0.2)
    assert 0.15 < time.monotonic() - t0 < 0.5
    assert info.value.retry_after >= 1
    assert pool.queued == 0


async def test_a_slot_handed_over_as_the_deadline_passes_is_never_lost() -> None:
    """A release that hands the waiter its backend in the same loop iteration as the waiter's
    start deadline passes: the request either starts on that backend or, refused, gives the
    slot back. Before, the refusal kept the slot: the backend's ``in_flight`` stayed one up for
    good (under a flood with deadlines the pool lost a slot every few hundred refusals)."""
    pool = _pool()
    backend = pool.backends[0]
    loop = asyncio.get_running_loop()
    for _ in range(5):
        held = await pool.acquire(0, time.monotonic() + 5)
        deadline = time.monotonic() + 0.05
        # the release's timer is due when the waiter's deadline is (at most a few µs before
        # it): both run in one iteration of the loop, the release first
        loop.call_at(deadline, pool.release, held)
        try:
            got = await pool.acquire(0, deadline)
        except PoolSaturated:
            assert backend.in_flight == 0  # refused: nothing held
        else:
            assert got is backend and backend.in_flight == 1  # started: its slot
            pool.release(got)
        assert backend.in_flight == 0 and pool.queued == 0


async def test_cannot_start_in_time_refused_at_once() -> None:
    """With a known completion rate, a request whose expected start is past its deadline is
    refused immediately instead of waiting for the deadline."""
    pool = _pool()
    b = await pool.acquire(0, time.monotonic() + 5)
    for _ in range(10):  # ~10 completions/s (8 are needed before the rate is trusted)
        await asyncio.sleep(0.1)
        pool.release(b)
        b = await pool.acquire(0, time.monotonic() + 5)
    waiters = [asyncio.create_task(pool.acquire(0, time.monotonic() + 30)) for _ in range(5)]
    await asyncio.sleep(0)
    t0 = time.monotonic()
    with pytest.raises(PoolSaturated, match="before its deadline"):
        await pool.acquire(0, t0 + 0.2)
    assert time.monotonic() - t0 < 0.05
    for w in waiters:
        w.cancel()


async def test_few_completions_never_refuse_early() -> None:
    """A pool that has seen only a few completions (a cold start, or the first after an idle
    spell) does not guess a rate from them: a waiter with a short deadline waits for it."""
    pool = _pool()
    b = await pool.acquire(0, time.monotonic() + 5)
    await asyncio.sleep(0.5)
    pool.release(b)  # one completion after half a second: no rate yet
    b = await pool.acquire(0, time.monotonic() + 5)
    waiters = [asyncio.create_task(pool.acquire(0, time.monotonic() + 30)) for _ in range(5)]
    await asyncio.sleep(0)
    late = asyncio.create_task(pool.acquire(0, time.monotonic() + 0.2))
    await asyncio.sleep(0.01)
    assert not late.done()  # queued, not refused at once
    with pytest.raises(PoolSaturated, match="before the request's deadline"):
        await late  # it had its chance up to the deadline
    for w in waiters:
        w.cancel()


def test_completion_rate_is_unbiased_from_the_start() -> None:
    """Completions 0.1 s apart read as ~10/s once there are enough of them, at once and after
    a long run (the decayed count over the decayed time)."""
    pool = _pool()
    now = 1000.0
    for n in range(200):
        now += 0.1
        pool._count_completion(now)
        if n in (9, 199):
            assert 9.5 < pool._completion_rate(now) < 10.5, n


async def test_queue_full() -> None:
    pool = _pool(queue_size=1)
    await pool.acquire(0, time.monotonic() + 5)
    waiter = asyncio.create_task(pool.acquire(0, time.monotonic() + 5))
    await asyncio.sleep(0)
    with pytest.raises(PoolSaturated, match="queue is full"):
        await pool.acquire(0, time.monotonic() + 5)
    waiter.cancel()


def test_panic_mode_never_ejects_empty() -> None:
    pool = _pool(n=4, max_in_flight=10, health=Health(panic_threshold=0.5))
    now = time.monotonic()
    for b in pool.backends[:3]:
        b.ejected_until = now + 60
    # 1 of 4 healthy < 50%: panic, all backends are candidates again
    assert len(pool.candidates(now)) == 4
    pool.backends[2].ejected_until = 0.0
    assert len(pool.candidates(now)) == 2


async def test_all_tried_raises_no_healthy() -> None:
    pool = _pool(n=2)
    with pytest.raises(NoHealthyBackend):
        await pool.acquire(0, time.monotonic() + 1, exclude=pool.backends)


def test_headroom_for_borrowers() -> None:
    pool = _pool(n=2, max_in_flight=10, borrow=Borrow(max_share=0.5, ttft_p90_target=0.5))
    now = time.monotonic()
    assert pool.has_headroom(now)
    for _ in range(10):
        pool.try_pick(now)
    assert not pool.has_headroom(now)  # 10 of 20 in flight = the share
    for b in pool.backends:
        b.in_flight = 0
    for _ in range(20):
        pool.observe_ttft(0.9)
    assert not pool.has_headroom(now)  # p90 TTFT over target
    assert not _pool().has_headroom(now)  # pools without `borrow` never lend
