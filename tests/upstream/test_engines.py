"""Engine quirks in one place (issue 36, point 2): metric names, cache isolation and error
shapes per engine (``gateway/upstream/engines.py``; cached tokens: ``tests/accounting/
test_llamacpp_timings.py``)."""

from __future__ import annotations

import json

import pytest

from gateway.config import Backend, Pool
from gateway.config.model import Engine
from gateway.routing.pool import PoolState
from gateway.upstream.engines import (
    ENGINES,
    cache_mode,
    engine_of,
    openai_error,
    pool_engine,
    read_signals,
)

#: what llama-server --metrics answers (names and layout as its to_metrics() writes them)
LLAMACPP = b"""# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 1234
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 3
llamacpp:kv_cache_usage_ratio 0.25
"""
TGI = b"""tgi_queue_size 4
tgi_batch_current_size 6
tgi_request_count 99
"""


def test_llamacpp_and_tgi_names_are_read() -> None:
    signals = read_signals(LLAMACPP)
    assert signals is not None
    assert (signals.engine, signals.waiting, signals.running, signals.kv) == (
        "llamacpp", 3.0, 2.0, 0.25)
    newer = read_signals(LLAMACPP.replace(b"llamacpp:kv_cache_usage_ratio 0.25\n", b""),
                         "llamacpp")
    assert newer is not None and (newer.waiting, newer.running, newer.kv) == (3.0, 2.0, None)
    tgi = read_signals(TGI)
    assert tgi is not None and (tgi.engine, tgi.waiting, tgi.running, tgi.kv) == (
        "tgi", 4.0, 6.0, None)


def test_vllm_and_sglang_names_label_sets_and_timestamps() -> None:
    text = b"""# HELP vllm:num_requests_waiting waiting
vllm:num_requests_waiting{model_name="a b"} 3.0 1712000000000
vllm:num_requests_waiting{model_name="c"} 2.0
vllm:num_requests_running{model_name="a b"} 7
vllm:kv_cache_usage_perc{model_name="a"} 0.25
vllm:kv_cache_usage_perc{model_name="c"} 0.5
"""
    signals = read_signals(text)
    assert signals is not None and (signals.engine, signals.waiting, signals.running,
                                    signals.kv) == ("vllm", 5.0, 7.0, 0.5)
    sglang = read_signals(b"sglang:num_queue_reqs 7\nsglang:num_running_reqs 1\n"
                          b"sglang:token_usage 0.9\n")
    assert sglang is not None and (sglang.waiting, sglang.running, sglang.kv) == (7, 1, 0.9)


def test_a_known_engine_reads_only_its_own_names() -> None:
    assert read_signals(LLAMACPP, "vllm") is None
    assert read_signals(b"process_cpu_seconds_total 3\n") is None
    assert read_signals(b"", "llamacpp") is None
    signals = read_signals(LLAMACPP + b"vllm:num_requests_waiting 50\n", "llamacpp")
    assert signals is not None and signals.waiting == 3.0


def _pool(engine: Engine | None = None, *backends: Engine | None) -> PoolState:
    return PoolState(Pool(name="p", engine=engine, backends=[
        Backend(url=f"http://b{i}:8000", engine=e) for i, e in enumerate(backends or [None])]))


def test_which_engine_and_the_cache_isolation_it_takes() -> None:
    assert pool_engine(_pool()) == "unknown"
    assert cache_mode(_pool(), "salt") == "salt"  # unknown: the policy's isolation.cache
    assert cache_mode(_pool("llamacpp"), "salt") == "no_cache"
    assert cache_mode(_pool("llamacpp"), "no_cache") == "no_cache"
    assert cache_mode(_pool("vllm"), "no_cache") == "salt"  # vLLM ignores cache_prompt
    assert cache_mode(_pool("sglang"), "salt") == "salt"
    for engine in ("tgi", "ollama", "openai", "anthropic"):
        assert cache_mode(_pool(engine), "salt") == "shared"  # nothing it could take
    assert cache_mode(_pool("llamacpp"), "shared") == "shared"  # the policy shares
    mixed = _pool(None, "vllm", "sglang")
    assert pool_engine(mixed) == "unknown" and cache_mode(mixed, "no_cache") == "salt"
    assert cache_mode(_pool(None, "vllm", "llamacpp"), "salt") == "salt"  # differ: policy's
    assert cache_mode(_pool("vllm", None, "llamacpp"), "shared") == "shared"
    detected = _pool()
    detected.backends[0].detected_engine = "llamacpp"
    assert engine_of(detected, detected.backends[0]) == "llamacpp"
    assert cache_mode(detected, "salt") == "no_cache"
    configured = _pool("vllm", "llamacpp")  # the backend's own key wins over the pool's
    assert engine_of(configured, configured.backends[0]) == "llamacpp"


LLAMACPP_ERROR = {"error": {"code": 400, "message": "the request exceeds the available context "
                            "size, try increasing it", "type": "exceed_context_size_error",
                            "n_prompt_tokens": 5000, "n_ctx": 4096}}


@pytest.mark.parametrize("engine", ["llamacpp", "unknown"])
def test_llamacpp_context_error_becomes_openais(engine: str) -> None:
    out = json.loads(openai_error(engine, json.dumps(LLAMACPP_ERROR).encode()))
    assert out == {"error": {"message": LLAMACPP_ERROR["error"]["message"],
                             "type": "invalid_request_error", "param": None,
                             "code": "context_length_exceeded"}}


def test_other_error_shapes() -> None:
    flat = {"object": "error", "message": "This model's maximum context length is 2048 tokens. "
            "However, you requested 4000 tokens.", "type": "BadRequestError", "param": None,
            "code": 400}
    out = json.loads(openai_error("vllm", json.dumps(flat).encode()))
    assert out["error"]["code"] == "context_length_exceeded"
    assert out["error"]["message"] == flat["message"]
    other = {**flat, "message": "bad temperature"}
    assert json.loads(openai_error("sglang", json.dumps(other).encode())) == {"error": {
        "message": "bad temperature", "type": "BadRequestError", "param": None, "code": 400}}
    tgi = {"error": "Input validation error: `inputs` tokens + `max_new_tokens` must be <= "
                    "4096. Given: 4000 `inputs` tokens and 200 `max_new_tokens`",
           "error_type": "validation"}
    out = json.loads(openai_error("tgi", json.dumps(tgi).encode()))
    assert out["error"]["code"] == "context_length_exceeded"
    assert out["error"]["message"] == tgi["error"]
    # left as written: OpenAI's own shape, another engine's, not JSON, not an error of a shape
    openai_shaped = json.dumps({"error": {"message": "This model's maximum context length is "
                                          "8192", "type": "invalid_request_error",
                                          "param": "messages",
                                          "code": "context_length_exceeded"}}).encode()
    for engine, body in [("unknown", openai_shaped), ("openai", openai_shaped),
                         ("ollama", json.dumps(LLAMACPP_ERROR).encode()),
                         ("llamacpp", b"Bad Request"), ("llamacpp", b'{"detail": "x"}'),
                         ("llamacpp", b"[1]")]:
        assert openai_error(engine, body) is body


def test_every_engine_is_known() -> None:
    from typing import get_args

    assert set(get_args(Engine)) == set(ENGINES)
