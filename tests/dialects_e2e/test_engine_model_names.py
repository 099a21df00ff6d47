"""The public model name, always (issue 36, point 3), through a real gateway process.

Fake engines name their model their own way whatever they are sent (the gateway sends
``sim-model``): llama.cpp its model file ``/models/tiny.gguf`` (sorted keys, compact), Ollama a
tag ``llama3:8b`` (Python's spaced JSON), and a name with a quote, a backslash, a slash and a
non-ASCII letter (written ASCII-escaped with ``\\/``); every SSE event is written in two pieces
cut inside its ``model`` member. Through the gateway, with the official ``openai`` and
``anthropic`` clients, every answer and every chunk carries the public name the client asked
for (chat, completions, embeddings; whole and streamed; Responses and Messages translated to
chat or passed through), and nothing else of the answer changes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.fake_engine import Engine, FakeEngines
from tests.helpers import TEST_KEY, GatewayProcess, policy

pytestmark = pytest.mark.process

ENGINES = {
    "llamacpp": Engine("/models/tiny.gguf", "llamacpp"),
    "ollama": Engine("llama3:8b", "python"),
    "weird": Engine('we"ird\\na/me \u00e9', "slashes"),
}


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    tmp: Path = tmp_path_factory.mktemp("names")
    with FakeEngines(ENGINES) as fake:
        data = policy({f"{kind}-{name}": [fake.url(name)] for name in ENGINES
                       for kind in ("chat", "native")})
        for pool in data["pools"]:
            if pool["name"].startswith("native-"):
                pool["backends"][0]["api"] = ["responses", "messages"]
        with GatewayProcess(tmp, data) as gateway:
            yield gateway


@pytest.fixture(scope="module")
def client(gw: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=TEST_KEY, max_retries=0)


@pytest.fixture(scope="module")
def claude(gw: GatewayProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key=TEST_KEY, max_retries=0)


HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("name", ENGINES)
def test_chat_completions_and_embeddings(client: openai.OpenAI, name: str) -> None:
    public = f"chat-{name}-model"
    answer = client.chat.completions.create(model=public, messages=HI)  # type: ignore[arg-type]
    assert answer.model == public
    assert answer.choices[0].message.content == "Hi there"
    chunks = list(client.chat.completions.create(
        model=public, messages=HI, stream=True,  # type: ignore[call-overload]
        stream_options={"include_usage": True}))
    assert len(chunks) == 5 and {c.model for c in chunks} == {public}
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hi there"
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 7
    completion = client.completions.create(model=public, prompt="hi")
    assert completion.model == public and completion.choices[0].text == "Hi there"
    pieces = list(client.completions.create(model=public, prompt="hi", stream=True))
    assert pieces and {p.model for p in pieces} == {public}
    embedding = client.embeddings.create(model=public, input="hi")
    assert embedding.model == public and embedding.data[0].embedding == [0.25, -0.5, 0.125]


@pytest.mark.parametrize("name", ENGINES)
def test_the_raw_stream_differs_only_in_model_and_id(gw: GatewayProcess, name: str) -> None:
    """Byte-level: each event, parsed, is the engine's with only ``model`` (and the gateway's
    id) replaced; the engine's name appears nowhere."""
    engine = ENGINES[name]
    public = f"chat-{name}-model"
    with httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {TEST_KEY}"},
                      timeout=30) as http, http.stream(
            "POST", "/v1/chat/completions",
            json={"model": public, "messages": HI, "stream": True,
                  "stream_options": {"include_usage": True}}) as s:
        raw = b"".join(s.iter_bytes())
        rid = s.headers["x-request-id"]
    events = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith(b"data: {")]
    sent = [json.loads(e) for e in (engine.encode(x) for x in _engine_chunks(engine))]
    for event in sent:
        event["model"], event["id"] = public, "chatcmpl-" + rid
    for got, want in zip(events, sent, strict=True):
        got.pop("created"), want.pop("created")
        assert got == want
    assert engine.encode(engine.model)[1:-1] not in raw
    assert raw.endswith(b"data: [DONE]\n\n")


def _engine_chunks(engine: Engine) -> list[dict[str, Any]]:
    from tests.fake_engine import _chat

    return _chat(engine, {"stream": True})


@pytest.mark.parametrize("kind", ["chat", "native"])
@pytest.mark.parametrize("name", ENGINES)
def test_messages_translated_and_passed_through(claude: anthropic.Anthropic, name: str,
                                                kind: str) -> None:
    public = f"{kind}-{name}-model"
    message = claude.messages.create(model=public, max_tokens=8, messages=HI)  # type: ignore[arg-type]
    assert message.model == public
    with claude.messages.stream(model=public, max_tokens=8, messages=HI) as stream:  # type: ignore[arg-type]
        starts = [e.message.model for e in stream if e.type == "message_start"]
        final = stream.get_final_message()
    assert starts == [public] and final.model == public
    assert "".join(b.text for b in final.content if b.type == "text") == "Hi there"


@pytest.mark.parametrize("kind", ["chat", "native"])
@pytest.mark.parametrize("name", ENGINES)
def test_responses_translated_and_passed_through(client: openai.OpenAI, name: str,
                                                 kind: str) -> None:
    public = f"{kind}-{name}-model"
    response = client.responses.create(model=public, input="hi", store=False)
    assert response.model == public and response.output_text == "Hi there"
    models = [e.response.model for e in client.responses.create(
        model=public, input="hi", stream=True, store=False) if hasattr(e, "response")]
    assert len(models) >= 2 and set(models) == {public}
