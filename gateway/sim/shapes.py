"""OpenAI response shapes for chat and text completions, whole and as SSE chunks.

A chat answer is text or one tool call (``message.tool_calls``; streamed as a first delta with
the call's index, id and function name, then one delta per argument fragment). As vLLM does,
a choice that finished says in ``stop_reason`` the stop string that ended it (null when none
did): the only way a client of chat completions learns which of its ``stop`` strings matched,
since the text ends before it.

Streaming renders each token's event from a pre-built prefix and suffix around the JSON-encoded
word, so the per-token cost is one small concatenation rather than a dict and an encode.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import msgspec

__all__ = ["DONE", "ChunkFormat", "completion_body", "named_event", "new_id", "tool_call", "usage"]

DONE = b"data: [DONE]\n\n"
_encode = msgspec.json.Encoder().encode
_ids = itertools.count(1)


def new_id(prefix: str, sep: str = "-") -> str:
    """A unique id such as ``chatcmpl-sim00000000002a`` (``resp_sim...`` with ``sep="_"``)."""
    return f"{prefix}{sep}sim{next(_ids):012x}"


def named_event(name: bytes, data: bytes) -> bytes:
    """An SSE event with an ``event:`` line (the Responses and Messages APIs name theirs)."""
    return b"event: " + name + b"\ndata: " + data + b"\n\n"


def tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """One entry of a chat message's ``tool_calls``."""
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }


def completion_body(
    *,
    chat: bool,
    model: str,
    text: str,
    finish_reason: str,
    usage_: dict[str, Any],
    tool_calls: list[dict[str, Any]] | None = None,
    stop_reason: str | None = None,
) -> bytes:
    """The JSON of a non-streamed ``chat.completion`` or ``text_completion`` (``stop_reason``:
    the stop string that ended the text, as vLLM reports it)."""
    choice: dict[str, Any]
    if chat:
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
        if tool_calls:
            message["content"] = None
            message["tool_calls"] = tool_calls
        choice = {"index": 0, "message": message, "logprobs": None,
                  "finish_reason": finish_reason, "stop_reason": stop_reason}
    else:
        choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason,
                  "stop_reason": stop_reason}
    return _encode(
        {
            "id": new_id("chatcmpl" if chat else "cmpl"),
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": [choice],
            "usage": usage_,
        }
    )


class ChunkFormat:
    """Renders the SSE events of one streamed response (per request)."""

    __slots__ = ("_args_prefix", "_head", "_prefix", "_suffix", "chat")

    def __init__(self, *, chat: bool, model: str) -> None:
        self.chat = chat
        rid = new_id("chatcmpl" if chat else "cmpl")
        obj = "chat.completion.chunk" if chat else "text_completion"
        head = _encode({"id": rid, "object": obj, "created": int(time.time()), "model": model})
        self._head = head[:-1]  # without the closing brace, to append "choices"
        if chat:
            self._prefix = b"data: " + self._head + b',"choices":[{"index":0,"delta":{"content":'
            self._suffix = b'},"logprobs":null,"finish_reason":null}]}\n\n'
            self._args_prefix = (
                b"data: " + self._head + b',"choices":[{"index":0,"delta":{"tool_calls":'
                b'[{"index":0,"function":{"arguments":'
            )
        else:
            self._prefix = b"data: " + self._head + b',"choices":[{"text":'
            self._suffix = b',"index":0,"logprobs":null,"finish_reason":null}]}\n\n'
            self._args_prefix = b""

    def _event(self, rest: dict[str, Any]) -> bytes:
        return b"data: " + self._head + b"," + _encode(rest)[1:] + b"\n\n"

    def token(self, word: str) -> bytes:
        """The event carrying one generated token."""
        return self._prefix + _encode(word) + self._suffix

    def tool_head(self, call_id: str, name: str) -> bytes:
        """A tool call's first event: the role, the call's index, id and name, no arguments."""
        head = tool_call(call_id, name, "")
        delta = {"role": "assistant", "content": None, "tool_calls": [{"index": 0, **head}]}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        return self._event({"choices": [choice]})

    def tool_arguments(self, piece: str) -> bytes:
        """The event carrying one fragment (token) of a tool call's arguments."""
        return self._args_prefix + _encode(piece) + b"}}]" + self._suffix

    def role(self) -> bytes:
        """Chat's first event: the assistant role with empty content (nothing for completions)."""
        if not self.chat:
            return b""
        delta = {"role": "assistant", "content": ""}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        return self._event({"choices": [choice]})

    def finish(self, finish_reason: str, stop_reason: str | None = None) -> bytes:
        """The last choice event: empty delta (or text), the finish reason and the stop string
        that ended the text (``stop_reason``, as vLLM sends it)."""
        choice: dict[str, Any]
        if self.chat:
            choice = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish_reason,
                      "stop_reason": stop_reason}
        else:
            choice = {"text": "", "index": 0, "logprobs": None, "finish_reason": finish_reason,
                      "stop_reason": stop_reason}
        return self._event({"choices": [choice]})

    def usage(self, usage_: dict[str, Any]) -> bytes:
        """The ``stream_options.include_usage`` event: no choices, only usage."""
        return self._event({"choices": [], "usage": usage_})

    def error(self, message: str, type_: str, code: str | None) -> bytes:
        """An in-stream error event, for failures after the headers went out."""
        err = {"message": message, "type": type_, "param": None, "code": code}
        return b"data: " + _encode({"error": err}) + b"\n\n"
