"""The OpenAI API through the gateway, with the official client: client -> gateway -> simulator."""

from __future__ import annotations

import openai
import pytest

from gateway.sim.server import SimServer
from tests.helpers import TEST_KEY, GatewayProcess

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Tell me about inference gateways."},
]


@pytest.fixture()
def client(gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=TEST_KEY, max_retries=0)


@pytest.fixture()
def direct(sim: SimServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=sim.url + "/v1", api_key="unused", max_retries=0)


def test_chat_non_streaming(client: openai.OpenAI, direct: openai.OpenAI) -> None:
    """A chat completion comes back whole, equal to what the simulator generates."""
    reply = client.chat.completions.create(model="chat-model", messages=MESSAGES, max_tokens=12)
    expected = direct.chat.completions.create(model="sim-model", messages=MESSAGES, max_tokens=12)
    assert reply.object == "chat.completion"
    assert reply.choices[0].message.content == expected.choices[0].message.content
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 12
    assert reply.usage.prompt_tokens == expected.usage.prompt_tokens  # type: ignore[union-attr]


def test_chat_streaming_one_chunk_per_token(client: openai.OpenAI, direct: openai.OpenAI) -> None:
    """Each token arrives as its own chunk, and the reassembled text equals the simulator's."""
    stream = client.chat.completions.create(
        model="chat-model",
        messages=MESSAGES,
        max_tokens=20,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces: list[str] = []
    usage = None
    finish = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                pieces.append(choice.delta.content)
            finish = choice.finish_reason or finish
    expected = direct.chat.completions.create(model="sim-model", messages=MESSAGES, max_tokens=20)
    assert "".join(pieces) == expected.choices[0].message.content
    assert len(pieces) == 20
    assert usage is not None and usage.completion_tokens == 20
    assert finish == "length"


def test_stream_without_usage_has_no_usage_chunk(client: openai.OpenAI) -> None:
    """Without include_usage the client sees no usage chunk (the backend was not asked)."""
    chunks = list(
        client.chat.completions.create(
            model="chat-model", messages=MESSAGES, max_tokens=5, stream=True
        )
    )
    assert all(c.usage is None for c in chunks)
    assert sum(1 for c in chunks for ch in c.choices if ch.delta.content) == 5


def test_completions(client: openai.OpenAI) -> None:
    """Legacy completions, plain and streamed."""
    reply = client.completions.create(model="chat-model", prompt="Once upon a time", max_tokens=7)
    assert reply.object == "text_completion"
    assert reply.usage is not None and reply.usage.completion_tokens == 7
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model="chat-model", prompt="Once upon a time", max_tokens=7, stream=True
        )
        if c.choices
    )
    assert streamed == reply.choices[0].text


def test_embeddings(client: openai.OpenAI) -> None:
    """Embeddings pass through, one vector per input."""
    reply = client.embeddings.create(model="chat-model", input=["a", "b c"], dimensions=32)
    assert [len(d.embedding) for d in reply.data] == [32, 32]
    assert reply.usage.prompt_tokens > 0


def test_models(client: openai.OpenAI) -> None:
    """The public model names are listed and retrievable; unknown ones are 404."""
    assert [m.id for m in client.models.list()] == ["chat-model"]
    assert client.models.retrieve("chat-model").id == "chat-model"
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("no-such-model")
    assert info.value.code == "model_not_found"
