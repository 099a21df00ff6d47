"""The official ``anthropic`` client against the Messages translation, over a real socket.

A small HTTP server plays the gateway's part: it runs the SDK's real request through
``translate`` (or ``count_tokens``), makes the chat answer a backend would give, and answers
with ``answer`` / the translated stream / ``error``. The SDK's own parsing, stream
accumulation (``messages.stream`` / ``get_final_message``), tool-use helpers (``to_param``) and
error classes then show the shapes are what a real client expects. The pipeline routes are the
lead's integration; this checks the translation end to end without them.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anthropic
import pytest

from gateway.dialects.messages import MessagesFrontend, count_tokens
from gateway.errors import (
    AuthenticationFailed,
    GatewayError,
    InvalidRequest,
    ModelNotFound,
    NoBackendAvailable,
    RateLimited,
)
from gateway.tokenizers import count_chat_prompt
from tests.dialects.sse import chat_stream

FRONT = MessagesFrontend()

#: (path, parsed JSON body) -> (status, headers, body)
Responder = Callable[[str, dict[str, Any]], tuple[int, dict[str, str], bytes]]


class Gateway:
    """A threaded HTTP server on a free port; ``respond`` answers every POST."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, str], dict[str, Any]]] = []
        self.respond: Responder = lambda path, body: (500, {}, b"{}")
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                owner.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()},
                                   body))
                try:
                    status, headers, payload = owner.respond(self.path, body)
                except GatewayError as error:
                    status, payload = FRONT.error(error)
                    headers = dict(error.headers)
                self.send_response(status)
                self.send_header("content-length", str(len(payload)))
                for name, value in headers.items():
                    self.send_header(name, value)
                if "content-type" not in {k.lower() for k in headers}:
                    self.send_header("content-type", "application/json")
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def gateway() -> Iterator[Gateway]:
    server = Gateway()
    yield server
    server.close()


@pytest.fixture()
def client(gateway: Gateway) -> Iterator[anthropic.Anthropic]:
    gateway.seen.clear()
    with anthropic.Anthropic(api_key="sk-gw-test", base_url=gateway.url, max_retries=0,
                             timeout=10.0) as sdk:
        yield sdk


def backend_answer(chat: dict[str, Any], *, text: str | None = None,
                   calls: list[dict[str, Any]] | None = None,
                   finish: str = "stop") -> dict[str, Any]:
    """What a chat backend answers: the text (default: echoes the last user text)."""
    if text is None and calls is None:
        last = chat["messages"][-1]["content"]
        text = last if isinstance(last, str) else " ".join(p.get("text", "") for p in last)
        text = f"You said: {text}"
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    prompt = count_chat_prompt(chat["messages"])
    return {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "backend",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": 7, "total_tokens": prompt + 7,
                  "prompt_tokens_details": {"cached_tokens": min(prompt, 4)}},
    }


def answering(make: Callable[[dict[str, Any]], dict[str, Any]]) -> Responder:
    """A responder that translates the request, asks ``make`` for the chat answer, and
    answers whole or streamed as the client asked."""

    def respond(path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        assert path == "/v1/messages"
        translated = FRONT.to_chat(body)
        if translated.refusal is not None:  # what the pipeline raises for a translated request
            raise translated.refusal
        answer = make(translated.chat)
        if not translated.stream:
            message = FRONT.answer(answer, model=translated.model, request_id="r1")
            return 200, {}, json.dumps(message).encode()
        stream = FRONT.stream(model=translated.model, request_id="r1",
                              prompt_tokens=count_chat_prompt(translated.chat["messages"]))
        raw = chat_stream(answer)
        out = b"".join(stream.feed(raw[i:i + 50]) for i in range(0, len(raw), 50))
        return 200, {"content-type": "text/event-stream"}, out + stream.finish()

    return respond


WEATHER = {
    "name": "get_weather",
    "description": "The weather at a place",
    "input_schema": {"type": "object", "properties": {"location": {"type": "string"}},
                     "required": ["location"]},
}


def test_create(gateway: Gateway, client: anthropic.Anthropic) -> None:
    gateway.respond = answering(backend_answer)
    message = client.messages.create(
        model="claude-sonnet", max_tokens=100, system="Be brief.",
        messages=[{"role": "user", "content": "Hello"}], metadata={"user_id": "u1"})
    assert isinstance(message, anthropic.types.Message)
    assert message.content[0].type == "text"
    assert message.content[0].text == "You said: Hello"
    assert message.stop_reason == "end_turn"
    assert message.model == "claude-sonnet"
    usage = message.usage
    assert usage.output_tokens == 7 and usage.cache_read_input_tokens == 4
    assert usage.input_tokens + usage.cache_read_input_tokens == count_chat_prompt(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}])
    _, headers, body = gateway.seen[-1]
    # this SDK sends its key as a bearer token (older ones: x-api-key); the route takes both
    assert "sk-gw-test" in (headers.get("x-api-key"), headers.get("authorization", "")[7:])
    assert "anthropic-version" in headers
    assert FRONT.to_chat(body).chat["user"] == "u1"


def test_stream_helper_and_final_message(gateway: Gateway, client: anthropic.Anthropic) -> None:
    gateway.respond = answering(backend_answer)
    with client.messages.stream(model="claude-sonnet", max_tokens=100,
                                messages=[{"role": "user", "content": "Stream me"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "You said: Stream me"
    assert final.content[0].type == "text" and final.content[0].text == text
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == 7 and final.usage.cache_read_input_tokens == 4
    assert gateway.seen[-1][2]["stream"] is True


def test_a_tool_use_round_trip(gateway: Gateway, client: anthropic.Anthropic) -> None:
    call = {"id": "call_w1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"location": "Paris"}'}}
    gateway.respond = answering(
        lambda chat: backend_answer(chat, text="Let me look.", calls=[call],
                                    finish="tool_calls"))
    question: anthropic.types.MessageParam = {"role": "user", "content": "Weather in Paris?"}
    with client.messages.stream(model="claude-sonnet", max_tokens=100, tools=[WEATHER],
                                tool_choice={"type": "auto"}, messages=[question]) as stream:
        first = stream.get_final_message()
    assert first.stop_reason == "tool_use"
    use = first.content[1]
    assert use.type == "tool_use"
    assert (use.id, use.name, use.input) == ("call_w1", "get_weather", {"location": "Paris"})

    gateway.respond = answering(lambda chat: backend_answer(chat, text="15 degrees in Paris."))
    second = client.messages.create(
        model="claude-sonnet", max_tokens=100, tools=[WEATHER],
        messages=[question, first.to_param(), {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": use.id, "content": "15 degrees"}]}])
    assert second.content[0].type == "text" and second.content[0].text == "15 degrees in Paris."
    chat = FRONT.to_chat(gateway.seen[-1][2]).chat
    assert chat["messages"][1:] == [
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "call_w1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"location":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_w1", "content": "15 degrees"},
    ]
    assert chat["tools"][0]["function"]["parameters"] == WEATHER["input_schema"]


def test_count_tokens(gateway: Gateway, client: anthropic.Anthropic) -> None:
    def respond(path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        assert path == "/v1/messages/count_tokens"
        counted = count_tokens(body, lambda chat: count_chat_prompt(chat["messages"]))
        return 200, {}, json.dumps(counted).encode()

    gateway.respond = respond
    counted = client.messages.count_tokens(
        model="claude-sonnet", system="Be brief.",
        messages=[{"role": "user", "content": "How many tokens is this?"}])
    assert counted.input_tokens == count_chat_prompt(
        [{"role": "system", "content": "Be brief."},
         {"role": "user", "content": "How many tokens is this?"}])


@pytest.mark.parametrize(("error", "cls"), [
    (InvalidRequest("messages[0].content[0].type: 'document' blocks are not supported",
                    param="messages[0].content[0].type"), anthropic.BadRequestError),
    (AuthenticationFailed("Invalid API key"), anthropic.AuthenticationError),
    (ModelNotFound("The model 'x' does not exist"), anthropic.NotFoundError),
    (RateLimited("rpm of tenant:acme", headers={"Retry-After": "2"}), anthropic.RateLimitError),
    (NoBackendAvailable("Every backend is busy"), anthropic.OverloadedError),
], ids=["400", "401", "404", "429", "529"])
def test_errors_raise_the_sdk_classes(gateway: Gateway, client: anthropic.Anthropic,
                                      error: GatewayError, cls: type[Exception]) -> None:
    def respond(path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        raise error

    gateway.respond = respond
    with pytest.raises(cls) as caught:
        client.messages.create(model="claude-sonnet", max_tokens=10,
                               messages=[{"role": "user", "content": "Hi"}])
    raised = caught.value
    assert isinstance(raised, anthropic.APIStatusError)
    assert raised.body == {"type": "error", "error": {
        "type": json.loads(FRONT.error(error)[1])["error"]["type"], "message": error.message}}
    if isinstance(error, RateLimited):
        assert raised.response.headers["retry-after"] == "2"


def test_a_refused_request_is_a_bad_request_naming_the_field(
        gateway: Gateway, client: anthropic.Anthropic) -> None:
    gateway.respond = answering(backend_answer)
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="claude-sonnet", max_tokens=10, messages=[
            {"role": "user", "content": [{"type": "document", "source": {
                "type": "text", "media_type": "text/plain", "data": "a text"}}]}])
    assert "messages[0].content[0].type" in str(caught.value)


def test_a_stream_broken_after_its_first_byte_raises_in_the_sdk(
        gateway: Gateway, client: anthropic.Anthropic) -> None:
    def respond(path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        stream = FRONT.stream(model="claude-sonnet", request_id="r1", prompt_tokens=3)
        out = stream.feed(b'data: {"choices":[{"index":0,"delta":{"content":"Hal"}}]}\n\n')
        out += stream.fail(NoBackendAvailable("The backend went away"))
        return 200, {"content-type": "text/event-stream"}, out

    gateway.respond = respond
    with pytest.raises(anthropic.APIStatusError) as caught, client.messages.stream(
            model="claude-sonnet", max_tokens=10,
            messages=[{"role": "user", "content": "Hi"}]) as stream:
        stream.get_final_message()
    assert "The backend went away" in str(caught.value)
