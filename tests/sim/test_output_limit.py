"""The simulator checks a request's output limit against its context before it generates
anything (issue 34, point 8): ``max_tokens: 10**18`` used to build the whole answer (a list of
10**18 words) before the engine's own check, growing engines to gigabytes. Now prompt plus
limit above the context (``Profile.max_model_len``, the KV cache's whole blocks) is a 400
naming the API's limit field, in the API's shape, and no word is generated; a limit that fits
exactly is served as before.

``generate`` and ``make_call`` are spied on: a call for more tokens than the context fails the
test at once (rather than exhausting memory, as the unfixed code would)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from gateway.sim import answer
from gateway.sim.cache import PromptCache
from gateway.sim.completions import parse_completion
from gateway.sim.config import build_config
from gateway.sim.errors import BadRequest
from gateway.sim.messages import parse_message
from gateway.sim.responses import parse_response
from gateway.sim.server import SimServer
from gateway.tokenizers import count_chat_prompt

CONTEXT = 1024  # kv_tokens, a whole number of 16-token blocks
MESSAGES: list[Any] = [{"role": "user", "content": "Tell me about batching."}]
TOOLS: list[Any] = [{"type": "function", "function": {"name": "f", "parameters": {}}}]


@pytest.fixture(autouse=True)
def spied(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The token counts asked of ``generate`` and ``make_call``; more than the context fails."""
    asked: list[int] = []
    generate, make_call = answer.generate, answer.make_call

    def spy_generate(seed: int, n: int, stops: Any = ()) -> Any:
        asked.append(n)
        assert n <= CONTEXT, f"generated {n} words before checking the context"
        return generate(seed, n, stops)

    def spy_make_call(spec: Any, call_id: str, limit: int, encoding: str) -> Any:
        asked.append(limit)
        return make_call(spec, call_id, limit, encoding)

    monkeypatch.setattr(answer, "generate", spy_generate)
    monkeypatch.setattr(answer, "make_call", spy_make_call)
    yield asked


def _chat(field: str = "max_tokens", **extra: Any) -> Callable[[int], Any]:
    cfg = build_config(kv_tokens=CONTEXT)
    return lambda n: parse_completion({"model": "m", "messages": MESSAGES, **extra, field: n},
                                      chat=True, model="m", cfg=cfg)


PARSERS: dict[str, tuple[Callable[[int], Any], str]] = {
    "chat": (_chat(), "max_tokens"),
    "chat-completion-tokens": (_chat("max_completion_tokens"), "max_completion_tokens"),
    "chat-tool": (_chat(tools=TOOLS), "max_tokens"),
    "completions": (lambda n: parse_completion(
        {"model": "m", "prompt": "Tell me about batching.", "max_tokens": n}, chat=False,
        model="m", cfg=build_config(kv_tokens=CONTEXT)), "max_tokens"),
    "responses": (lambda n: parse_response(
        {"model": "m", "input": "Tell me about batching.", "max_output_tokens": n}, model="m",
        cfg=build_config(kv_tokens=CONTEXT)), "max_output_tokens"),
    "messages": (lambda n: parse_message(
        {"model": "m", "messages": MESSAGES, "max_tokens": n}, model="m",
        cfg=build_config(kv_tokens=CONTEXT), cache=PromptCache(8)), "max_tokens"),
}


@pytest.mark.parametrize("api", list(PARSERS))
def test_a_limit_beyond_the_context_is_refused_before_generating(
        api: str, spied: list[int]) -> None:
    parse, field = PARSERS[api]
    plan, _ = parse(1)
    prompt = plan.prompt_tokens
    spied.clear()
    for n in (10**18, CONTEXT - prompt + 1):
        with pytest.raises(BadRequest) as refused:
            parse(n)
        assert refused.value.status == 400 and refused.value.param == field
        assert str(CONTEXT) in refused.value.message and field in refused.value.message
    assert spied == []  # nothing generated, no call built
    plan, _ = parse(CONTEXT - prompt)  # exactly the context: served
    assert plan.prompt_tokens + plan.output_tokens <= CONTEXT
    if api != "chat-tool":
        assert plan.output_tokens == CONTEXT - prompt


def test_the_context_is_the_kv_caches_whole_blocks() -> None:
    assert build_config(kv_tokens=1000).profile.max_model_len == 992  # 62 blocks of 16
    assert build_config().profile.max_model_len == 450_000


@pytest.fixture(scope="module")
def server() -> Iterator[SimServer]:
    with SimServer("interactive", speedup=20, jitter=0.0, kv_tokens=CONTEXT) as s:
        yield s


def test_over_http_a_huge_limit_is_a_400_and_never_reaches_the_engine(
        server: SimServer) -> None:
    before = server.stats()
    with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as client:
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as refused:
                client.chat.completions.create(model="m", messages=MESSAGES,
                                               max_tokens=10**18, stream=stream)
            body = refused.value.response.json()["error"]
            assert body["param"] == "max_tokens" and str(CONTEXT) in body["message"]
            with pytest.raises(openai.BadRequestError) as refused:
                client.responses.create(model="m", input="hi", max_output_tokens=10**18,
                                        stream=stream)
            assert refused.value.response.json()["error"]["param"] == "max_output_tokens"
    with anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0) as claude:
        with pytest.raises(anthropic.BadRequestError) as refused_messages:
            claude.messages.create(model="m", messages=MESSAGES, max_tokens=10**18, timeout=30)
        body = refused_messages.value.response.json()
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        assert "max_tokens" in body["error"]["message"]
    # one that fits is still served, whole
    prompt = count_chat_prompt(MESSAGES)
    r = httpx.post(server.url + "/v1/chat/completions", timeout=30,
                   json={"model": "m", "messages": MESSAGES, "max_tokens": CONTEXT - prompt})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == CONTEXT - prompt
    after = server.stats()
    assert after["completed"] == before["completed"] + 1  # the refused ones never ran
