"""The OpenAI-compatible HTTP surface, driven by the official ``openai`` client and httpx."""

from __future__ import annotations

import base64
import math
import struct
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from gateway.sim.server import SimServer
from gateway.tokenizers import count_chat_prompt, count_text

MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Tell me about continuous batching."}
]


@pytest.fixture(scope="module")
def server() -> Iterator[SimServer]:
    with SimServer("interactive", speedup=10, jitter=0.0, models=["sim-a", "sim-b"]) as s:
        yield s


@pytest.fixture
def client(server: SimServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as c:
        yield c


def wait_idle(server: SimServer, timeout: float = 2.0) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while True:
        stats = server.stats()
        if (stats["running"], stats["waiting"]) == (0, 0) or time.monotonic() > deadline:
            return stats
        time.sleep(0.01)


def test_chat_non_stream(client: openai.OpenAI) -> None:
    """Exactly max_tokens tokens, usage by the tokenizer package, finish 'length'."""
    r = client.chat.completions.create(model="anything", messages=MESSAGES, max_tokens=12)
    assert r.object == "chat.completion" and r.model == "anything"
    choice = r.choices[0]
    assert choice.finish_reason == "length" and choice.message.role == "assistant"
    assert count_text(choice.message.content or "") == 12
    assert r.usage is not None
    assert r.usage.prompt_tokens == count_chat_prompt(MESSAGES)
    assert (r.usage.completion_tokens, r.usage.total_tokens) == (12, r.usage.prompt_tokens + 12)
    assert r.usage.prompt_tokens_details is not None
    assert r.usage.prompt_tokens_details.cached_tokens == 0


def test_chat_is_reproducible_and_honours_seed(client: openai.OpenAI) -> None:
    def text(seed: int | None = None) -> str:
        r = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=8, seed=seed)
        return str(r.choices[0].message.content)

    assert text() == text()
    assert text(1) != text(2)


def test_default_max_tokens(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="m", messages=MESSAGES)
    assert r.usage is not None and r.usage.completion_tokens == 64


def test_chat_stream_one_chunk_per_token(client: openai.OpenAI) -> None:
    """Role chunk, one content chunk per token, finish chunk, usage chunk when asked."""
    stream = client.chat.completions.create(
        model="m",
        messages=MESSAGES,
        max_tokens=20,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == ""
    content = [c.choices[0].delta.content for c in chunks[1:-2]]
    assert len(content) == 20 and all(content)
    assert all(count_text(t or "") == 1 for t in content)
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 20
    assert {c.id for c in chunks} == {chunks[0].id}
    assert all(c.object == "chat.completion.chunk" for c in chunks)


def test_stream_without_usage_has_no_usage_chunk(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=5, stream=True)
    )
    assert all(c.choices for c in chunks) and all(c.usage is None for c in chunks)
    assert len(chunks) == 1 + 5 + 1


def test_stop_string_ends_early(client: openai.OpenAI) -> None:
    full = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=40)
    words = (full.choices[0].message.content or "").split(" ")[1:]
    stop = " " + words[5]
    r = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=40, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.usage is not None and r.usage.completion_tokens == words.index(words[5])


def test_completions(client: openai.OpenAI) -> None:
    r = client.completions.create(model="m", prompt="Once upon a time", max_tokens=7)
    assert r.object == "text_completion"
    assert count_text(r.choices[0].text) == 7 and r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.prompt_tokens == count_text("Once upon a time")
    chunks = list(client.completions.create(model="m", prompt=[1, 2, 3], max_tokens=4, stream=True))
    assert [c.choices[0].finish_reason for c in chunks] == [None] * 4 + ["length"]
    assert all(count_text(c.choices[0].text) == 1 for c in chunks[:4])


def test_embeddings(client: openai.OpenAI) -> None:
    """Unit vectors, 256 dims by default, dimensions honoured, deterministic per input."""
    r = client.embeddings.create(model="m", input=["alpha", "beta gamma"])
    assert [len(d.embedding) for d in r.data] == [256, 256]
    assert math.isclose(sum(x * x for x in r.data[0].embedding), 1.0, rel_tol=1e-5)
    assert r.usage.prompt_tokens == count_text("alpha") + count_text("beta gamma")
    again = client.embeddings.create(
        model="m", input="alpha", dimensions=32, encoding_format="float"
    )
    assert len(again.data[0].embedding) == 32
    tokens = client.embeddings.create(model="m", input=[[1, 2, 3], [4, 5]])
    assert tokens.usage.prompt_tokens == 5


def test_embeddings_base64(server: SimServer) -> None:
    body = {"model": "m", "input": "alpha", "encoding_format": "base64", "dimensions": 8}
    data = httpx.post(server.url + "/v1/embeddings", json=body).json()
    vec = struct.unpack("<8f", base64.b64decode(data["data"][0]["embedding"]))
    assert math.isclose(sum(x * x for x in vec), 1.0, rel_tol=1e-5)


def test_models(client: openai.OpenAI, server: SimServer) -> None:
    assert [m.id for m in client.models.list()] == ["sim-a", "sim-b"]
    assert client.models.retrieve("other").id == "other"  # lenient by default


def test_strict_models() -> None:
    with SimServer(models=["only"], strict_models=True, speedup=10) as s:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.NotFoundError) as err:
            c.chat.completions.create(model="nope", messages=MESSAGES, max_tokens=1)
        assert err.value.code == "model_not_found"
        with pytest.raises(openai.NotFoundError):
            c.models.retrieve("nope")
        assert c.models.retrieve("only").id == "only"


def test_health_metrics_stats(server: SimServer, client: openai.OpenAI) -> None:
    client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=3)
    assert httpx.get(server.url + "/health").status_code == 200
    text = httpx.get(server.url + "/metrics").text
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:request_queue_time_seconds_sum",
    ):
        assert f'{name}{{model_name="sim-a"' in text or f"{name}{{le=" in text, name
    stats = httpx.get(server.url + "/sim/stats").json()
    assert set(stats) >= {
        "running",
        "waiting",
        "kv_used_tokens",
        "completed",
        "cancelled",
        "generated_tokens_total",
        "prompt_tokens_total",
    }
    assert stats["completed"] >= 1


def test_openai_shaped_errors(server: SimServer) -> None:
    r = httpx.post(server.url + "/v1/chat/completions", content=b"{not json")
    assert r.status_code == 400
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    r = httpx.post(server.url + "/v1/chat/completions", json={"model": "m", "messages": "hi"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    assert httpx.get(server.url + "/v2/nothing").status_code == 404
    assert httpx.get(server.url + "/v1/chat/completions").status_code == 405


# -- faults -----------------------------------------------------------------------------------


def test_fault_error_status(client: openai.OpenAI) -> None:
    with pytest.raises(openai.InternalServerError) as err:
        client.chat.completions.create(
            model="m",
            messages=MESSAGES,
            max_tokens=2,
            extra_headers={"x-sim-error-status": "500"},
        )
    assert err.value.status_code == 500
    ok = client.chat.completions.create(
        model="m",
        messages=MESSAGES,
        max_tokens=2,
        extra_headers={"x-sim-error-status": "500", "x-sim-error-rate": "0"},
    )
    assert ok.choices[0].finish_reason == "length"


def test_fault_retry_after(server: SimServer) -> None:
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 2}
    r = httpx.post(
        server.url + "/v1/chat/completions", json=body, headers={"x-sim-retry-after": "7"}
    )
    assert r.status_code == 429 and r.headers["retry-after"] == "7"
    assert r.json()["error"]["type"] == "rate_limit_exceeded"


def test_fault_extra_latency(client: openai.OpenAI) -> None:
    t0 = time.perf_counter()
    client.chat.completions.create(
        model="m",
        messages=MESSAGES,
        max_tokens=1,
        extra_headers={"x-sim-extra-latency-ms": "300"},
    )
    assert time.perf_counter() - t0 >= 0.3


def test_fault_stall_after_headers(server: SimServer) -> None:
    """Stream headers come at once; the first token only after the stall."""
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 2, "stream": True}
    t0 = time.perf_counter()
    with httpx.stream(
        "POST", server.url + "/v1/chat/completions", json=body, headers={"x-sim-stall-ms": "400"}
    ) as r:
        headers_at = time.perf_counter() - t0
        lines = [line for line in r.iter_lines() if line]
        done_at = time.perf_counter() - t0
    assert headers_at < 0.2 and done_at >= 0.4
    assert lines[-1] == "data: [DONE]"


def test_fault_disconnect_after(server: SimServer) -> None:
    """The connection breaks after N content chunks, without [DONE]; the engine frees the slot."""
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 50, "stream": True}
    before = server.stats()["cancelled"]
    seen: list[str] = []
    with pytest.raises(httpx.RemoteProtocolError):  # noqa: SIM117
        with httpx.stream(
            "POST",
            server.url + "/v1/chat/completions",
            json=body,
            headers={"x-sim-disconnect-after": "3"},
        ) as r:
            seen.extend(line for line in r.iter_lines() if line)
    assert sum('"content":" ' in line for line in seen) == 3
    assert "data: [DONE]" not in seen
    stats = wait_idle(server)
    assert stats["running"] == 0 and stats["cancelled"] == before + 1


def test_client_disconnect_cancels_request() -> None:
    """Closing a stream mid-way removes the request from the batch at once."""
    with SimServer(speedup=1, jitter=0.0) as s:
        body = {"model": "m", "messages": MESSAGES, "max_tokens": 5000, "stream": True}
        with httpx.stream("POST", s.url + "/v1/chat/completions", json=body) as r:
            lines = r.iter_lines()
            for _ in range(4):
                next(lines)
            assert s.stats()["running"] == 1
        stats = wait_idle(s)
        assert stats["running"] == 0 and stats["cancelled"] == 1 and stats["kv_used_tokens"] == 0


def test_queue_full_is_503() -> None:
    """Beyond the waiting-queue limit the simulator answers 503 queue_full."""
    with SimServer(max_running=1, queue_limit=1, speedup=1, jitter=0.0) as s:
        # Answers long enough (tens of seconds) that the first cannot finish before the others
        # have arrived, however slowly a loaded box delivers them; stop() cancels both.
        body = {"model": "m", "messages": MESSAGES, "max_tokens": 5000}
        statuses: list[int] = []

        def post() -> None:
            statuses.append(httpx.post(s.url + "/v1/chat/completions", json=body).status_code)

        def wait_for(running: int, waiting: int) -> None:
            deadline = time.monotonic() + 30  # a loaded box may take a while to deliver it
            while (s.stats()["running"], s.stats()["waiting"]) != (running, waiting):
                assert time.monotonic() < deadline, s.stats()
                time.sleep(0.01)

        # One at a time: two submitted within the engine's request overhead would both sit in
        # the waiting queue, and the second would be the one refused.
        threads = [threading.Thread(target=post) for _ in range(2)]
        threads[0].start()
        wait_for(1, 0)
        threads[1].start()
        wait_for(1, 1)
        r = httpx.post(s.url + "/v1/chat/completions", json=body)
        assert r.status_code == 503 and r.json()["error"]["code"] == "queue_full"
        s.stop()  # cancels the two in flight
        for t in threads:
            t.join()
