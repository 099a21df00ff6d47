"""Automatic prefix caching: chained block hashes, the engine's KV accounting, usage, metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from gateway.sim.engine import Engine, SimRequest
from gateway.sim.prefix_cache import PrefixCache, block_hashes
from gateway.sim.profiles import get_profile
from gateway.sim.server import SimServer

BT = 16


def ids(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def engine(**overrides: int) -> Engine:
    return Engine(get_profile("interactive", **overrides), speedup=50, jitter=0.0)


async def run(eng: Engine, token_ids: list[int], max_tokens: int = 1) -> SimRequest:
    req = eng.submit(len(token_ids), max_tokens, token_ids=token_ids)
    await req.wait(max_tokens)
    return req


# -- hashing ------------------------------------------------------------------------------------


def test_block_hash_chains_its_prefix() -> None:
    """Block i's hash depends on every token before it; a partial last block has none."""
    a = block_hashes(ids(0, 40), BT)
    assert len(a) == 2  # 40 tokens: two full blocks, 8 left over
    same_start = block_hashes([*ids(0, 32), 999, 999], BT)
    assert same_start == a
    first_differs = block_hashes([7, *ids(1, 39)], BT)
    assert first_differs[0] != a[0] and first_differs[1] != a[1]  # block 1 equal, parent not
    assert block_hashes(ids(16, 16), BT) != [a[1]]  # the same tokens at the start: another block


def test_match_stops_before_the_last_token() -> None:
    """A fully cached prompt still computes its last token, so the hit ends a block early."""
    cache = PrefixCache(BT)
    hashes = block_hashes(ids(0, 64), BT)
    for h in hashes:
        assert cache.register(h)
    assert cache.match(hashes, 64) == (3, 0)  # (64 - 1) // 16
    assert cache.match(hashes, 65) == (4, 0)
    assert cache.match(block_hashes([1, *ids(1, 63)], BT), 64) == (0, 0)


def test_release_makes_blocks_evictable_tail_first() -> None:
    """Released blocks are evicted least recently used first, a prompt's tail before its head."""
    cache = PrefixCache(BT)
    a, b = block_hashes(ids(0, 48), BT), block_hashes(ids(1000, 48), BT)
    for h in a + b:
        cache.register(h)
    assert cache.release(a) == 3 and cache.release(b) == 3
    cache.evict_to(4)
    assert cache.evictions == 2
    assert cache.match(a, 100) == (1, 1)  # a lost its last two blocks
    assert cache.match(b, 100) == (3, 3)


# -- the engine ---------------------------------------------------------------------------------


async def test_repeated_prefix_skips_prefill() -> None:
    """A second prompt sharing a 1,000-token prefix is admitted with it cached: only the rest is
    prefilled, and its TTFT costs less."""
    eng = engine()
    async with eng:
        first = await run(eng, ids(0, 1000))
        second = await run(eng, [*ids(0, 1000), *ids(5000, 100)])
    assert first.cached_tokens == 0
    assert second.cached_tokens == 992  # 62 full blocks of the shared 1,000 tokens
    assert eng.stats.prefill_tokens_total == 1000 + 1100 - 992
    cache = eng.prefix_cache
    assert cache is not None
    assert (cache.queries, cache.hits) == (2100, 992)
    assert eng._kv_free_blocks == eng._kv_total_blocks  # every block back, cached ones evictable


async def test_blocks_are_shared_while_running() -> None:
    """A request admitted while another holds the same prefix shares its blocks (no new ones)."""
    eng = engine()
    async with eng:
        prefix = ids(0, 320)
        await run(eng, prefix)
        a = eng.submit(321, 200, token_ids=[*prefix, 1])
        b = eng.submit(321, 200, token_ids=[*prefix, 2])
        await a.wait(1)
        await b.wait(1)
        # 20 shared blocks + each request's own: ceil(521 / 16) - 20 = 13
        assert eng._kv_total_blocks - eng._kv_free_blocks == 20 + 2 * 13
        assert a.cached_tokens == b.cached_tokens == 320
        await a.wait(200)
        await b.wait(200)


async def test_lru_eviction_under_kv_pressure() -> None:
    """With the KV pool full, admitting a new prompt evicts the least recently used prefix (its
    tail first) and keeps the more recent one whole."""
    eng = engine(kv_tokens=64 * BT)  # 64 blocks
    async with eng:
        a, b, c = ids(0, 400), ids(10_000, 400), ids(20_000, 400)
        await run(eng, a)  # 25 cached blocks, evictable once done
        await run(eng, b)  # 25 more: 50 evictable in 64 free
        await run(eng, c)  # needs 26: 12 of a's blocks go
        cache = eng.prefix_cache
        assert cache is not None and cache.evictions == 12
        again_b = await run(eng, b)
        again_a = await run(eng, a)
    assert again_b.cached_tokens == 24 * BT  # whole (but the last token's block)
    # b's admission took 2 new blocks and evicted one more of a's: its first 12 blocks survived
    assert again_a.cached_tokens == 12 * BT
    assert eng._kv_free_blocks == eng._kv_total_blocks


async def test_prefix_caching_off() -> None:
    """``prefix_caching=False``: the same prompt twice is prefilled twice."""
    eng = Engine(get_profile("interactive"), speedup=50, jitter=0.0, prefix_caching=False)
    async with eng:
        await run(eng, ids(0, 500))
        second = await run(eng, ids(0, 500))
    assert second.cached_tokens == 0 and eng.prefix_cache is None
    assert eng.stats.prefill_tokens_total == 1000


# -- HTTP: usage and metrics --------------------------------------------------------------------

SYSTEM = "You are a careful assistant. " * 80  # ~480 tokens, shared by every request below


def chat(turn: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": turn}]


@pytest.fixture(scope="module")
def server() -> Iterator[SimServer]:
    with SimServer("interactive", speedup=20, jitter=0.0) as s:
        yield s


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def test_cached_tokens_in_usage_and_metrics(server: SimServer) -> None:
    """Chat, Responses and text completions report the engine's hit as cached tokens; the
    Messages API keeps Anthropic's rule (only ``cache_control`` reads are reported), though the
    engine skips the prefill all the same; /metrics counts queries and hits in tokens."""
    with httpx.Client(base_url=server.url, timeout=30) as client:
        before = client.get("/metrics").text
        q0 = metric(before, "vllm:prefix_cache_queries_total")
        h0 = metric(before, "vllm:prefix_cache_hits_total")

        first = client.post("/v1/chat/completions", json={
            "model": "m", "messages": chat("First question?"), "max_tokens": 2}).json()
        second = client.post("/v1/chat/completions", json={
            "model": "m", "messages": chat("Second question?"), "max_tokens": 2}).json()
        streamed = client.post("/v1/chat/completions", json={
            "model": "m", "messages": chat("Third?"), "max_tokens": 2, "stream": True,
            "stream_options": {"include_usage": True}}).text
        responses = client.post("/v1/responses", json={
            "model": "m", "instructions": SYSTEM, "input": "Fourth?",
            "max_output_tokens": 2}).json()
        messages = client.post("/v1/messages", json={
            "model": "m", "system": SYSTEM, "max_tokens": 2,
            "messages": [{"role": "user", "content": "Fifth?"}]}).json()
        after = client.get("/metrics").text

    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > 400 and cached % BT == 0
    assert f'"cached_tokens":{cached}' in streamed.replace(" ", "")
    # the Responses prompt renders the system text as the same first message
    assert responses["usage"]["input_tokens_details"]["cached_tokens"] == cached
    assert messages["usage"]["cache_read_input_tokens"] == 0
    queries = metric(after, "vllm:prefix_cache_queries_total") - q0
    hits = metric(after, "vllm:prefix_cache_hits_total") - h0
    prompts = (first["usage"]["prompt_tokens"] + second["usage"]["prompt_tokens"]
               + responses["usage"]["input_tokens"])
    assert queries > prompts
    assert hits >= 4 * cached  # second, streamed, responses and messages all hit
    stats = server.stats()
    prefix = stats["prefix_cache"]
    assert isinstance(prefix, dict) and prefix["hits_tokens"] >= hits


def test_flag_turns_caching_off() -> None:
    """``--no-prefix-caching`` (``prefix_caching=False``): no hit reported, counters stay 0."""
    with SimServer("interactive", speedup=20, jitter=0.0, prefix_caching=False) as s, \
            httpx.Client(base_url=s.url, timeout=30) as client:
        for turn in ("a?", "b?"):
            r = client.post("/v1/chat/completions", json={
                "model": "m", "messages": chat(turn), "max_tokens": 2}).json()
            assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        text = client.get("/metrics").text
    assert metric(text, "vllm:prefix_cache_hits_total") == 0


async def test_cancel_returns_shared_blocks() -> None:
    """Cancelling a running request that holds cached blocks leaves them cached, evictable."""
    eng = engine()
    async with eng:
        prefix = ids(0, 160)
        await run(eng, prefix)
        req = eng.submit(161, 500, token_ids=[*prefix, 3])
        await req.wait(1)
        req.cancel()
        await asyncio.sleep(0)
        again = await run(eng, prefix)
    assert again.cached_tokens == 144
    assert eng._kv_free_blocks == eng._kv_total_blocks


async def test_calibration_800_of_1000_cached() -> None:
    """SIMULATOR.md: with 800 of 1,000 prompt tokens cached, idle TTFT drops 40 -> 20 ms. The
    modelled cost of the step that prefills the prompt, plus the request overhead ``e``, is
    read from the scheduler (no wall-clock timing)."""
    eng = engine()
    profile = eng.profile

    def planned_ttft_ms(token_ids: list[int]) -> float:
        req = eng.submit(len(token_ids), 1, token_ids=token_ids)
        cost, _, chunks = eng._schedule(req.eligible_at)  # before the step loop runs again
        assert [c for c, _ in chunks] == [req]
        return profile.request_overhead_ms + cost

    async with eng:
        cold = planned_ttft_ms(ids(0, 1000))
        while eng.num_running or eng.num_waiting:
            await asyncio.sleep(0.01)
        warm = planned_ttft_ms([*ids(0, 800), *ids(9000, 200)])
        while eng.num_running or eng.num_waiting:
            await asyncio.sleep(0.01)
    assert round(cold) == 40
    assert round(warm) == 20
