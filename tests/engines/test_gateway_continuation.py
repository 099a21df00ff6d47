"""A stream that survives its engine, on real llama-servers: the engine serving a stream is
SIGKILLed mid-answer, and the stream goes on on the other engine of the pool
(``pools[].continuation``): the client sees one answer with no error, one role, one finish,
and the one usage record says ``continued``. Asked with llama.cpp's ``timings_per_token``, every
chunk says its engine's count: the continuation asks for exactly what is left, the client gets
``max_tokens`` engine tokens in all, and the record holds the engines' figures; without it the
tokens sent are counted a chunk a token, and the record says which figures are the gateway's.

The engines run the same tiny random model at temperature 0 and answer a request alike on
either replica, but a continuation re-tokenises the text already sent (llama.cpp takes the
prefill as text), so the continued text is not asserted equal to the unbroken answer: only
the part sent before the kill is, the continuation does not echo it, and the seam has the
usual shape. (Seen while writing this: the continuation starts exactly where the unbroken
answer goes on, and drifts from it some tokens later, as near-tie logits fall differently.)"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from loadtest.engines.llama_server import LlamaServer
from tests.engines.conftest import (
    engine_backend,
    engine_policy,
    openai_client,
    record_of,
    start_gateway,
)

pytestmark = [pytest.mark.engine, pytest.mark.process]

MESSAGES = [{"role": "user", "content": "Tell me a long story."}]
TOKENS = 120


@pytest.fixture
def doomed_engine(engine_model: Path, llama_server_bin: Path,
                  tmp_path: Path) -> Iterator[LlamaServer]:
    """A llama-server of this test's own (1 slot), stopped at the end whatever its state."""
    server = LlamaServer(engine_model, slots=1, ctx=2048, threads=1, alias="tiny-llama",
                         log_path=tmp_path / "engine-doomed.log", binary=llama_server_bin)
    with server:
        yield server


def _timings(chunk: Any) -> dict[str, Any]:
    timings = (chunk.model_extra or {}).get("timings")
    return timings if isinstance(timings, dict) else {}


@pytest.mark.parametrize("timed", [False, True], ids=["chunks", "timings_per_token"])
def test_a_killed_engines_stream_continues_on_the_other(
        doomed_engine: LlamaServer, llama_servers: tuple[LlamaServer, LlamaServer],
        tmp_path: Path, timed: bool) -> None:
    spare = llama_servers[0]
    pools = [{"name": "cont", "engine": "llamacpp", "health": {"eject_after": 1000},
              "continuation": {"enabled": True},
              "backends": [engine_backend("doomed", doomed_engine),
                           engine_backend("spare", spare, weight=0.01)]}]
    models = [{"name": "tiny-cont", "pool": "cont", "backend_model": "tiny-llama"}]
    params = {"max_tokens": TOKENS, "temperature": 0, "seed": 7,
              "extra_body": {"ignore_eos": True, "timings_per_token": timed}}
    unbroken = httpx.post(spare.url + "/v1/chat/completions", timeout=60, json={
        "model": "tiny-llama", "messages": MESSAGES, "max_tokens": TOKENS, "temperature": 0,
        "seed": 7, "ignore_eos": True}).json()["choices"][0]["message"]["content"]
    gw = start_gateway(tmp_path, engine_policy(pools, models))
    try:
        stream = openai_client(gw).chat.completions.create(
            model="tiny-cont", stream=True, messages=MESSAGES,  # type: ignore[arg-type]
            stream_options={"include_usage": True}, **params)  # type: ignore[arg-type]
        request_id = stream.response.headers["x-request-id"]
        before, after, chunks = "", "", []
        counts: list[list[Any]] = [[], []]  # each engine's running count, chunk by chunk
        for chunk in stream:  # no error event: the loop ends with the stream
            chunks.append(chunk)
            content = chunk.choices[0].delta.content if chunk.choices else None
            if not content:
                continue
            if doomed_engine.proc is not None and doomed_engine.proc.poll() is None:
                before += content
                counts[0].append(_timings(chunk).get("predicted_n"))
                if len(before) >= 20:
                    doomed_engine.proc.send_signal(signal.SIGKILL)
                    doomed_engine.proc.wait(timeout=10)  # dead before the next chunk is read
            else:
                after += content
                counts[1].append(_timings(chunk).get("predicted_n"))
        doomed_engine.stop()  # reap it
        assert before and after
        assert unbroken.startswith(before)  # the replicas agree up to the kill
        assert not after.startswith(before)  # the prefill is not echoed back
        assert {c.id for c in chunks} == {f"chatcmpl-{request_id}"}
        assert {c.model for c in chunks} == {"tiny-cont"}
        assert sum(1 for c in chunks if c.choices and c.choices[0].delta.role) == 1
        finishes = [c for c in chunks if c.choices and c.choices[0].finish_reason]
        assert len(finishes) == 1 and finishes[0].choices[0].finish_reason == "length"
        assert chunks[-1].usage is not None
        record = record_of(gw, request_id)
        assert record["outcome"] == "completed" and record["continued"] is True, record
        assert record["backend"] == "spare" and record["delivered"] is True
        assert record["output"] == chunks[-1].usage.completion_tokens
        assert record["continuation_prompt"] > record["prompt_total"]
        if not timed:  # a chunk a token: never more than the engine sent; the gateway's prompt
            assert record["estimated"] is True, record
            assert record["estimate_reason"] == "continued:prompt_tokens,completion_tokens"
            assert record["output"] <= TOKENS
            return
        # the engines' own figures: the prompt the first one prefilled, the tokens received
        first = _timings(next(c for c in chunks if c.choices and c.choices[0].delta.content))
        received = counts[0][-1] + counts[1][-1]
        assert counts[1][0] == 1  # the continuation counted from 1 again
        assert received == TOKENS == record["output"], (counts, record)
        assert record["prompt_total"] == first["prompt_n"] + first["cache_n"], record
        assert record["estimated"] is False and record["estimate_reason"] is None, record
    finally:
        gw.stop()
