"""One request: SSE scanning from bytes, and timings that match the simulator's model."""

from __future__ import annotations

import time

import pytest

from gateway.sim.server import SimServer
from loadtest.client import Client, Result, Target, _Stream, synth_prompt
from loadtest.workload import Workload, spec_factory


def _scan(*chunks: bytes, keep_text: bool = False) -> tuple[Result, _Stream]:
    res = Result(time.perf_counter_ns())
    stream = _Stream(res, keep_text)
    for c in chunks:
        stream.feed(c)
    return res, stream


def test_counts_content_events_split_anywhere() -> None:
    """Events split across reads are reassembled; the role event and usage:null are no tokens."""
    raw = (
        b'data: {"choices":[{"delta":{"role":"assistant","content":""}}],"usage":null}\n\n'
        b'data: {"choices":[{"delta":{"content":"Hel"},"finish_reason":null}],"usage":null}\n\n'
        b'data: {"choices":[{"delta":{"content": "lo"},"finish_reason":null}]}\n\n'
        b'data: {"choices":[{"delta":{"content":"!"},"finish_reason":"stop"}]}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}\n\n'
        b"data: [DONE]\n\n"
    )
    res, stream = _scan(*(raw[i : i + 7] for i in range(0, len(raw), 7)), keep_text=True)
    assert res.chunks == 3 and res.first_ns > 0
    assert res.finish_reason == "stop"
    assert (res.prompt_tokens, res.completion_tokens) == (5, 3)
    assert stream.done and "".join(stream.parts) == "Hello!"


def test_in_stream_error_event() -> None:
    res, _ = _scan(b'data: {"error":{"message":"engine stopped","type":"server_error"}}\n\n')
    assert res.error == "stream_error" and "engine stopped" in res.detail


def test_synth_prompt_length_is_about_right() -> None:
    """Common words are ~1 token each (o200k), so the count lands near the ask."""
    from gateway.tokenizers import count_text

    for n in (50, 1000, 4000):
        got = count_text(synth_prompt(n, "#12"), "o200k_base")
        assert abs(got - n) <= max(5, n * 0.02), (n, got)


async def test_ttft_and_tpot_match_the_simulator(sim: SimServer) -> None:
    """Idle TTFT ~ (e + prefill step) / speedup and TPOT ~ (a + c + d*ctx) / speedup (batch 1)."""
    prof = sim.config.profile
    speedup = sim.config.speedup
    target = Target(url=sim.url, model="m")
    make = spec_factory(target, Workload(prompt_tokens=1000, max_tokens=100))
    async with Client(1) as client:
        results = [await client.send(make(i)) for i in range(5)]
    assert all(r.ok for r in results), results[0]
    k = results[0].prompt_tokens or 1000
    prefill_ms = prof.step_ms + k / prof.prefill_tokens_per_ms + prof.attn_quadratic_ms * k * k
    ttft_model = (prof.request_overhead_ms + prefill_ms) / speedup
    ctx_k = (k + 50) / 1000
    tpot_model = (prof.step_ms + prof.per_seq_ms + prof.per_kctx_ms * ctx_k) / speedup
    assert all(r.output_tokens == 100 and r.finish_reason == "length" for r in results)
    # HTTP, tokenising the prompt and sharing the GIL with the in-process simulator add a few ms
    # on top of the model, never less: the least disturbed of 5 requests must sit close to it.
    ttft_ms = min((r.ttft_s or 0) * 1e3 for r in results)
    tpot_ms = sorted((r.tpot_s or 0) * 1e3 for r in results)[2]
    assert ttft_model * 0.9 <= ttft_ms <= ttft_model + 4.0, (ttft_ms, ttft_model)
    assert tpot_ms == pytest.approx(tpot_model, rel=0.10), (tpot_ms, tpot_model)
