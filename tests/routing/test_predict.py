"""The TTFT predictor: a fluid queue of prompt tokens per backend, its learned prefill rate."""

from __future__ import annotations

import time

import pytest

from gateway.config import Backend
from gateway.routing.backend import BackendState
from gateway.routing.predict import DEFAULT_SECONDS_PER_TOKEN, Predictor


def _backend() -> BackendState:
    return BackendState(Backend(url="http://b0"), "b0")


def test_idle_backend_predicts_own_prefill_only() -> None:
    """Nothing sent yet: the prediction is the request's own prompt at the default rate."""
    b, p = _backend(), Predictor()
    got = p.predict(b, 2000, now=100.0)
    assert got.ahead == 0
    assert got.ttft == pytest.approx(2000 * DEFAULT_SECONDS_PER_TOKEN)


def test_prompts_sent_count_ahead_and_drain() -> None:
    """Tokens sent wait ahead of the next request, and drain at the prefill rate."""
    b, p = _backend(), Predictor()
    p.start(b, 4000, now=0.0)
    now = p.predict(b, 1000, now=0.0)
    assert now.ahead == pytest.approx(4000 * DEFAULT_SECONDS_PER_TOKEN)
    assert now.ttft > p.predict(b, 100, now=0.0).ttft  # longer prompt, later first token
    half = p.predict(b, 1000, now=2000 * DEFAULT_SECONDS_PER_TOKEN)
    assert half.ahead == pytest.approx(2000 * DEFAULT_SECONDS_PER_TOKEN)
    assert p.predict(b, 1000, now=1.0).ahead == 0  # all prefilled by then


def test_rate_is_learned_from_observed_ttft() -> None:
    """TTFTs slower than the default raise the learned cost per token towards them."""
    b, p = _backend(), Predictor()
    for i in range(60):
        p.start(b, 1000, now=float(i))  # one a second: nothing ahead of each
        p.observe(b, 0.5)  # 0.5 s for 1,000 tokens = 5e-4 s/token
    assert p.load(b).seconds_per_token == pytest.approx(5e-4, rel=0.05)
    assert p.predict(b, 1000, now=1000.0).ttft == pytest.approx(0.5, rel=0.05)


def test_scraped_engine_queue_floors_the_work_ahead() -> None:
    """An engine reporting waiting requests (sent by other gateways) counts them ahead."""
    b, p = _backend(), Predictor()
    p.start(b, 1000, now=0.0)
    assert p.predict(b, 1000, now=10.0).ahead == 0
    b.engine_waiting = 3
    assert p.predict(b, 1000, now=10.0).ahead == pytest.approx(3000 * DEFAULT_SECONDS_PER_TOKEN)


def test_full_kv_cache_doubles_the_prediction() -> None:
    b, p = _backend(), Predictor()
    before = p.predict(b, 1000, now=0.0).ttft
    b.engine_kv_usage = 0.97
    assert p.predict(b, 1000, now=0.0).ttft == pytest.approx(2 * before)


def test_unobserved_starts_are_forgotten_on_release() -> None:
    """A start that ended without a first token (failed) is not matched with a later TTFT."""
    b, p = _backend(), Predictor()
    p.start(b, 100_000, now=0.0)  # fails: released without an observation
    p.settle(b)  # in flight is 0
    p.start(b, 1000, now=100.0)
    p.observe(b, 1000 * DEFAULT_SECONDS_PER_TOKEN)
    assert p.load(b).seconds_per_token == pytest.approx(DEFAULT_SECONDS_PER_TOKEN)


def test_a_start_still_waiting_raises_the_rate() -> None:
    """A request sent 50+ ms ago for 1,000 tokens and still without its first token means at
    least 5e-5 s per token, whatever was learned before: the next prediction says so."""
    b, p = _backend(), Predictor()
    p.start(b, 1000, now=0.0)
    time.sleep(0.05)
    assert p.predict(b, 1000, now=0.0).ttft >= 2000 * 0.05 / 1000
    p.observe(b, None)  # not streamed: closed without a sample
    assert p.predict(b, 1000, now=0.0).ttft == pytest.approx(2000 * DEFAULT_SECONDS_PER_TOKEN)
