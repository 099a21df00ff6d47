"""The step loop against the closed-form model of SIMULATOR.md (jitter 0, sped up).

Wall times are multiplied back by the speed-up and compared with the formula; tolerances cover
the event loop's ~1 ms timer granularity, which the speed-up magnifies.
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.sim.engine import Engine, QueueFullError, RequestState, RequestTooLargeError
from gateway.sim.profiles import PROFILES, get_profile

SPEEDUP = 5.0
P = PROFILES["interactive"]


def model_ms(wall_s: float, speedup: float = SPEEDUP) -> float:
    return wall_s * 1000 * speedup


def engine(speedup: float = SPEEDUP, **overrides: int) -> Engine:
    return Engine(get_profile("interactive", **overrides), speedup=speedup, jitter=0.0)


async def times_of(eng: Engine, prompt: int, max_tokens: int) -> tuple[float, list[float]]:
    """Submit one request; return its submit time and the time each token was seen."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    req = eng.submit(prompt, max_tokens)
    seen, times = 0, []
    while seen < max_tokens:
        n = await req.wait(seen)
        times.extend([loop.time()] * (n - seen))
        seen = n
    return t0, times


def test_step_cost_formula() -> None:
    """Idle 1k-token prompt: a + 1000/R + q*1000^2 = 32 ms, plus e = 40 ms TTFT."""
    prefill = P.chunk_cost_ms(0, 1000)
    assert prefill == pytest.approx(25.5)
    assert P.step_cost_ms(0, 0, prefill) + P.request_overhead_ms == pytest.approx(40.0)
    # One decoding sequence with ~1k context: 6.5 + 0.03 + 0.05 = 6.58 ms.
    assert P.step_cost_ms(1, 1000, 0.0) == pytest.approx(6.58)
    # Chunks from a later position pay the quadratic term on the larger positions.
    assert P.chunk_cost_ms(2048, 100) > P.chunk_cost_ms(0, 100)


def test_profiles_differ_only_in_limits() -> None:
    """Interactive and batch share the hardware constants (same light-load latency)."""
    i, b = PROFILES["interactive"], PROFILES["batch"]
    assert (i.max_running, i.step_tokens, i.queue_limit) == (32, 2048, 256)
    assert (b.max_running, b.step_tokens, b.queue_limit) == (256, 8192, 4096)
    assert i.step_cost_ms(3, 3000, 1.0) == b.step_cost_ms(3, 3000, 1.0)
    with pytest.raises(ValueError, match="unknown profile"):
        get_profile("nope")
    assert get_profile("batch", max_running=7).max_running == 7


async def test_idle_ttft_1k_prompt() -> None:
    """TTFT of a 1000-token prompt on an idle engine is ~40 ms of model time.

    Best of three, at a low speed-up: the minimum filters out OS scheduling noise on a busy box.
    """
    async with engine(speedup=2) as eng:
        ttfts = []
        for _ in range(3):
            t0, times = await times_of(eng, 1000, 1)
            ttfts.append(model_ms(times[0] - t0, 2))
    assert min(ttfts) == pytest.approx(40.0, abs=4.0)


async def test_long_prompt_is_chunked_by_step_budget() -> None:
    """A 5000-token prompt with T=2048 takes three prefill steps before its first token."""
    chunks = ((0, 2048), (2048, 2048), (4096, 904))
    expected = P.request_overhead_ms + sum(
        P.step_cost_ms(0, 0, P.chunk_cost_ms(s, k)) for s, k in chunks
    )
    async with engine(speedup=2) as eng:
        t0, times = await times_of(eng, 5000, 1)
        assert eng.stats.steps == 3
    assert model_ms(times[0] - t0, 2) == pytest.approx(expected, rel=0.1)


async def test_tpot_batch_1() -> None:
    """One sequence decodes a token every ~6.6 ms."""
    async with engine() as eng:
        _, times = await times_of(eng, 1000, 101)
    tpot = model_ms(times[-1] - times[0]) / 100
    assert tpot == pytest.approx(P.step_cost_ms(1, 1050, 0.0), rel=0.08)


async def test_tpot_grows_with_running_sequences() -> None:
    """16 decoding sequences: step = a + 16c + d*ctx/1000, ~7.9 ms (vs 6.6 alone)."""
    async with engine() as eng:
        results = await asyncio.gather(*(times_of(eng, 1000, 101) for _ in range(16)))
    # All 16 decode together once the last prompt is in; use a middle window.
    times = results[0][1]
    tpot = model_ms(times[90] - times[30]) / 60
    expected = P.step_cost_ms(16, 16 * 1060, 0.0)
    assert expected == pytest.approx(7.8, abs=0.1)
    assert tpot == pytest.approx(expected, rel=0.08)


async def _throughput(n: int, speedup: float = 10.0) -> float:
    """Output tokens per model-second when n requests (100 in, 50 out) arrive together."""
    loop = asyncio.get_running_loop()
    async with engine(speedup=speedup) as eng:
        t0 = loop.time()
        reqs = [eng.submit(100, 50) for _ in range(n)]
        await asyncio.sleep(0.005)
        assert eng.num_running <= P.max_running
        assert eng.num_running + eng.num_waiting == n
        await asyncio.gather(*(r.wait(50) for r in reqs))
        return n * 50 / (model_ms(loop.time() - t0, speedup) / 1000)


async def test_throughput_rises_then_plateaus_at_slots() -> None:
    """Tokens/s grows ~linearly up to S=32, then queueing holds it flat."""
    t4, t32, t64 = [await _throughput(n) for n in (4, 32, 64)]
    assert t32 > 5 * t4
    assert t64 == pytest.approx(t32, rel=0.2)


async def test_cancel_running_frees_slot_and_kv() -> None:
    """Cancelling the only running request admits the next one at once."""
    async with engine(max_running=1) as eng:
        a = eng.submit(100, 10_000)
        b = eng.submit(100, 3)
        await a.wait(0)
        assert (eng.num_running, eng.num_waiting) == (1, 1)
        assert eng.kv_used_tokens > 0
        a.cancel()
        assert a.state is RequestState.CANCELLED
        assert (eng.num_running, eng.num_waiting, eng.kv_used_tokens) == (0, 1, 0)
        assert await b.wait(2) == 3
        assert b.state is RequestState.FINISHED
        assert eng.stats.cancelled == 1 and eng.stats.completed == 1


async def test_cancel_waiting_leaves_queue() -> None:
    """A queued request that is cancelled leaves the queue immediately; its waiter wakes."""
    async with engine(max_running=1) as eng:
        eng.submit(100, 10_000)
        b = eng.submit(100, 5)
        waiter = asyncio.create_task(b.wait(0))
        await asyncio.sleep(0.01)
        b.cancel()
        assert eng.num_waiting == 0
        assert await asyncio.wait_for(waiter, 1) == 0


async def test_queue_limit_rejects() -> None:
    """Beyond the waiting-queue limit, submit raises instead of queueing."""
    async with engine(max_running=1, queue_limit=2) as eng:
        eng.submit(10, 5)
        eng.submit(10, 5)
        with pytest.raises(QueueFullError):
            eng.submit(10, 5)
        assert eng.stats.rejected == 1


async def test_kv_capacity_makes_requests_wait() -> None:
    """With KV for one request only, the second waits although a slot is free."""
    async with engine(kv_tokens=160) as eng:
        a = eng.submit(100, 20)
        b = eng.submit(100, 20)
        await a.wait(0)
        assert (eng.num_running, eng.num_waiting) == (1, 1)
        await b.wait(19)
        assert a.state is RequestState.FINISHED
        with pytest.raises(RequestTooLargeError):
            eng.submit(150, 20)


async def test_stop_before_first_token() -> None:
    """max_tokens 0 (a stop at the first word) finishes after prefill with no tokens."""
    async with engine() as eng:
        req = eng.submit(10, 0)
        assert await req.wait(0) == 0
        assert req.state is RequestState.FINISHED


async def test_idle_loop_sleeps() -> None:
    """With nothing to do the loop waits on its event: no steps are taken."""
    async with engine() as eng:
        req = eng.submit(10, 2)
        await req.wait(1)
        steps = eng.stats.steps
        await asyncio.sleep(0.05)
        assert eng.stats.steps == steps
        snap = eng.snapshot()
        assert snap["completed"] == 1 and snap["generated_tokens_total"] == 2
        assert snap["prompt_tokens_total"] == 10
