"""The simulator serves what coding agents send, and says which stop string ended an answer.

* chat and text completions name the matched stop string in the choice's ``stop_reason``, as
  vLLM does (null when none matched), whole and streamed: the gateway's Messages translation
  reads it for ``stop_sequence``;
* Messages: ``system``-role messages inside ``messages`` (Claude Code) are folded into the
  system prompt in order; server tools are accepted and never called;
* Responses: custom and built-in tools are accepted, echoed and never called;
  ``custom_tool_call`` items and their outputs are read as tool calls.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.sim.answer import decide
from gateway.sim.server import SimServer
from gateway.tokenizers import count_chat_prompt

FIXTURES = Path(__file__).resolve().parent.parent / "dialects" / "fixtures"
USER = [{"role": "user", "content": "Tell me about continuous batching."}]


@pytest.fixture(scope="module")
def server() -> Iterator[SimServer]:
    with SimServer("interactive", speedup=20, jitter=0.0) as s:
        yield s


def _post(server: SimServer, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(server.url + path, json=body, timeout=30)
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def _events(server: SimServer, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", server.url + path, json={**body, "stream": True},
                      timeout=30) as r:
        assert r.status_code == 200
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


def _a_stop(server: SimServer) -> str:
    """A stop string that will match: a word from the middle of the unstopped answer."""
    text = _post(server, "/v1/chat/completions",
                 {"model": "m", "messages": USER, "max_tokens": 30})["choices"][0]
    words: list[str] = text["message"]["content"].split(" ")
    return " " + words[8]


def test_chat_names_the_stop_string_that_matched(server: SimServer) -> None:
    stop = _a_stop(server)
    body = {"model": "m", "messages": USER, "max_tokens": 30, "stop": ["@@never@@", stop]}
    choice = _post(server, "/v1/chat/completions", body)["choices"][0]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", stop)
    assert stop not in choice["message"]["content"]
    last = [c for c in _events(server, "/v1/chat/completions", body) if c["choices"]][-1]
    assert last["choices"][0]["finish_reason"] == "stop"
    assert last["choices"][0]["stop_reason"] == stop


def test_no_stop_string_no_stop_reason(server: SimServer) -> None:
    body = {"model": "m", "messages": USER, "max_tokens": 5, "stop": ["@@never@@"]}
    choice = _post(server, "/v1/chat/completions", body)["choices"][0]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("length", None)
    completion = _post(server, "/v1/completions", {"model": "m", "prompt": "Hi",
                                                   "max_tokens": 5})["choices"][0]
    assert completion["stop_reason"] is None


def test_messages_fold_system_role_messages_into_the_system_prompt(server: SimServer) -> None:
    folded = _post(server, "/v1/messages", {
        "model": "m", "max_tokens": 3, "system": "A.",
        "messages": [*USER, {"role": "system", "content": [{"type": "text", "text": " B."}]}]})
    assert folded["usage"]["input_tokens"] == count_chat_prompt(
        [{"role": "system", "content": "A. B."}, *USER])


def test_messages_accept_server_tools_and_never_call_them(server: SimServer) -> None:
    answer = _post(server, "/v1/messages", {
        "model": "m", "max_tokens": 4, "messages": USER,
        "tools": [{"type": "web_search_20250305", "name": "web_search"}]})
    assert answer["content"][0]["type"] == "text"


def test_the_claude_code_request_streams_in_anthropic_order(server: SimServer) -> None:
    body = json.loads((FIXTURES / "claude_code_request.json").read_text())
    body["max_tokens"] = 8
    kinds = [e["type"] for e in _events(server, "/v1/messages", body)]
    assert kinds[:3] == ["message_start", "content_block_start", "ping"]
    assert kinds[-2:] == ["message_delta", "message_stop"]


def test_the_codex_request_is_served_and_its_tools_echoed(server: SimServer) -> None:
    body = json.loads((FIXTURES / "codex_request.json").read_text())
    body.update(stream=False, max_output_tokens=6)
    answer = _post(server, "/v1/responses", body)
    assert answer["status"] in ("completed", "incomplete")
    assert [t["type"] for t in answer["tools"]] == ["function", "function", "custom",
                                                    "web_search", "function"]


def test_responses_read_custom_tool_calls(server: SimServer) -> None:
    answer = _post(server, "/v1/responses", {
        "model": "m", "max_output_tokens": 4,
        "tools": [{"type": "custom", "name": "apply_patch"}],
        "tool_choice": {"type": "custom", "name": "apply_patch"},
        "input": [{"role": "user", "content": "Patch it"},
                  {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch",
                   "input": "*** Begin Patch\n*** End Patch\n"},
                  {"type": "custom_tool_call_output", "call_id": "c1", "output": "Done"}]})
    assert answer["output"][0]["type"] == "message"


def test_natural_length_ends_an_answer_below_a_large_limit() -> None:
    """``natural_length`` (the demo's simulators): a text answer allowed more than the default
    length ends by itself there (``stop``); one allowed less is cut at its limit as before."""
    common = {"api": "chat", "model": "m", "prompt_tokens": 5, "key": b"k", "seed": 1,
              "default_limit": 16}
    long = decide(limit=32000, natural=True, **common)  # type: ignore[arg-type]
    assert (len(long.words), long.finish) == (16, "stop")
    short = decide(limit=8, natural=True, **common)  # type: ignore[arg-type]
    assert (len(short.words), short.finish) == (8, "length")
    exact = decide(limit=32000, **common)  # type: ignore[arg-type]
    assert (len(exact.words), exact.finish) == (32000, "length")


def test_a_deferred_tool_is_never_the_one_called(server: SimServer) -> None:
    """Claude Code's tool search sends a ``defer_loading`` placeholder first: a model never
    calls a tool not loaded into its context."""
    tools = [{"name": "DeferredToolPlaceholder", "defer_loading": True,
              "input_schema": {"type": "object"}},
             {"name": "Bash", "input_schema": {"type": "object",
                                               "properties": {"command": {"type": "string"}}}}]
    body = {"model": "sim-model", "max_tokens": 64, "tools": tools,
            "messages": [{"role": "user", "content": "list files"}]}
    answer = _post(server, "/v1/messages", body)
    (call,) = [b for b in answer["content"] if b["type"] == "tool_use"]
    assert call["name"] == "Bash"
