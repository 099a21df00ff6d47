"""The real engine works: llama-server serves the tiny model (chat, stream, metrics, slots).

What the gateway relies on is pinned here too: the ``model`` it answers with (the alias), the
usage block, the 400 for a prompt over a slot's context, the ``llamacpp:`` metric names.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from loadtest.engines.build import EngineNotBuilt
from loadtest.engines.llama_server import LlamaServer
from loadtest.engines.tiny_model import TinyModelSpec, tiny_model_path
from tests.engines.conftest import ENGINE_MODEL

pytestmark = [pytest.mark.engine, pytest.mark.process]

MESSAGES = [{"role": "user", "content": "Hello there, how are you?"}]

# every name llama-server 0.3.36 (llama.cpp b1-0c1e570) exports without speculative decoding
METRICS = {
    "llamacpp:prompt_tokens_total": "counter",
    "llamacpp:prompt_tokens_cached_total": "counter",
    "llamacpp:prompt_seconds_total": "counter",
    "llamacpp:tokens_predicted_total": "counter",
    "llamacpp:tokens_predicted_seconds_total": "counter",
    "llamacpp:n_decode_total": "counter",
    "llamacpp:n_tokens_max": "counter",
    "llamacpp:spec_decode_num_draft_tokens_total": "counter",
    "llamacpp:spec_decode_num_accepted_tokens_total": "counter",
    "llamacpp:spec_decode_num_drafts_total": "counter",
    "llamacpp:prompt_tokens_seconds": "gauge",
    "llamacpp:predicted_tokens_seconds": "gauge",
    "llamacpp:requests_processing": "gauge",
    "llamacpp:requests_deferred": "gauge",
    "llamacpp:n_busy_slots_per_decode": "gauge",
}


def _chat(server: LlamaServer, **body: Any) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/chat/completions", timeout=60,
                      json={"messages": MESSAGES, "max_tokens": 16, **body})


def _metrics(server: LlamaServer) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return {name: float(value) for name, _, value in
            (line.partition(" ") for line in text.splitlines() if line.startswith("llamacpp:"))}


def test_model_file_is_written_once(engine_model: Path) -> None:
    assert engine_model.name == "tiny-llama-e256-l4-h4-kv4-ff1024-c4096-s0-f16.gguf"
    assert engine_model.read_bytes()[:4] == b"GGUF"
    assert 50_000_000 < engine_model.stat().st_size < 70_000_000
    mtime = engine_model.stat().st_mtime_ns
    assert tiny_model_path(TinyModelSpec()) == engine_model
    assert engine_model.stat().st_mtime_ns == mtime  # cached, not rewritten


def test_model_is_deterministic_and_llama_shaped(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    spec = TinyModelSpec(embedding=64, layers=2, heads=2, kv_heads=1, context=1024, seed=7)
    try:
        one = tiny_model_path(spec, directory=tmp_path / "one")
    except EngineNotBuilt as exc:  # no GPT-2 vocab in the cache
        pytest.skip(str(exc))
    two = tiny_model_path(spec, directory=tmp_path / "two")
    assert one.read_bytes() == two.read_bytes()
    reader = gguf.GGUFReader(one)
    kv = {name: field.contents() for name, field in reader.fields.items()
          if not name.startswith("tokenizer.ggml.") or name.endswith("_id")}
    assert kv["general.architecture"] == "llama"
    assert (kv["llama.embedding_length"], kv["llama.block_count"]) == (64, 2)
    assert (kv["llama.attention.head_count"], kv["llama.attention.head_count_kv"]) == (2, 1)
    assert kv["llama.context_length"] == 1024
    assert kv["tokenizer.ggml.eos_token_id"] == 50256
    assert len(reader.fields["tokenizer.ggml.tokens"].data) == 50257
    shapes = {t.name: tuple(int(n) for n in t.shape) for t in reader.tensors}  # ggml order
    assert shapes["token_embd.weight"] == (64, 50257)
    assert shapes["blk.1.attn_k.weight"] == (64, 32)
    assert shapes["blk.0.ffn_down.weight"] == (256, 64)
    assert len(shapes) == 3 + 9 * 2


def test_both_engines_are_up(llama_servers: tuple[LlamaServer, LlamaServer]) -> None:
    for server in llama_servers:
        assert server.running
        assert server.get("/health") == (200, {"status": "ok"})
        models = httpx.get(f"{server.url}/v1/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == [ENGINE_MODEL]
        assert models["data"][0]["meta"]["n_vocab"] == 50257
    assert llama_servers[0].port != llama_servers[1].port


def test_tokenizer_is_gpt2(llama_server: LlamaServer) -> None:
    """The real GPT-2 BPE: the ids tiktoken's ``gpt2`` encoding gives, no BOS."""
    r = httpx.post(f"{llama_server.url}/tokenize", json={"content": "Hello there, how are you?"})
    assert r.json()["tokens"] == [15496, 612, 11, 703, 389, 345, 30]


def test_chat_completion_has_usage(llama_servers: tuple[LlamaServer, LlamaServer]) -> None:
    for server in llama_servers:
        r = _chat(server, ignore_eos=True)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["object"] == "chat.completion"
        assert body["model"] == ENGINE_MODEL
        assert body["id"].startswith("chatcmpl-")
        choice = body["choices"][0]
        assert choice["message"]["role"] == "assistant"
        assert isinstance(choice["message"]["content"], str) and choice["message"]["content"]
        assert choice["finish_reason"] == "length"
        usage = body["usage"]
        assert usage["completion_tokens"] == 16
        assert usage["prompt_tokens"] > 7  # the ChatML frame is plain text here
        assert usage["total_tokens"] == usage["prompt_tokens"] + 16


def test_streaming(llama_server: LlamaServer) -> None:
    body = {"messages": MESSAGES, "max_tokens": 12, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    events: list[str] = []
    with httpx.stream("POST", f"{llama_server.url}/v1/chat/completions", json=body,
                      timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert {c["model"] for c in chunks} == {ENGINE_MODEL}
    assert len({c["id"] for c in chunks}) == 1
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "length"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 12


def test_metrics(llama_server: LlamaServer) -> None:
    before = _metrics(llama_server)
    assert set(METRICS) <= set(before), sorted(set(METRICS) - set(before))
    text = httpx.get(f"{llama_server.url}/metrics", timeout=10).text
    for name, kind in METRICS.items():
        assert f"# TYPE {name} {kind}" in text
    assert _chat(llama_server, ignore_eos=True).status_code == 200
    after = _metrics(llama_server)
    predicted = "llamacpp:tokens_predicted_total"
    assert after[predicted] >= before[predicted] + 16
    assert after["llamacpp:requests_processing"] == 0


def test_slots(llama_servers: tuple[LlamaServer, LlamaServer]) -> None:
    for server in llama_servers:
        status, slots = server.get("/slots")
        assert status == 200
        assert [s["id"] for s in slots] == [0, 1]
        assert {s["n_ctx"] for s in slots} == {2048}  # -c 4096 over -np 2
        assert all(isinstance(s["is_processing"], bool) for s in slots)


def test_prompt_over_the_context_is_a_400(llama_server: LlamaServer) -> None:
    r = _chat(llama_server, messages=[{"role": "user", "content": "hello " * 3000}])
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "exceed_context_size_error"
    assert error["code"] == 400
    assert error["n_ctx"] == 2048
    assert error["n_prompt_tokens"] > 2048
    assert "exceeds the available context size" in error["message"]


def test_embeddings_on_the_second_engine(llama_servers: tuple[LlamaServer, LlamaServer]) -> None:
    r = httpx.post(f"{llama_servers[1].url}/v1/embeddings", timeout=30,
                   json={"model": ENGINE_MODEL, "input": ["hello", "world"]})
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    assert [len(d["embedding"]) for d in data] == [256, 256]
    r = httpx.post(f"{llama_servers[0].url}/v1/embeddings", timeout=30,
                   json={"model": ENGINE_MODEL, "input": "hello"})
    assert r.status_code == 501  # not started with --embeddings


async def test_async_context_manager(llama_server_bin: Path, engine_model: Path,
                                     tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    async with LlamaServer(engine_model, alias="x", log_path=log,
                           binary=llama_server_bin) as server:
        async with httpx.AsyncClient() as client:
            r = await client.get(f"{server.url}/health")
        assert r.status_code == 200
    assert not server.running
    assert "llama-server" in log.read_text()
