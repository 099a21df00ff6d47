"""Prompt tokens of every API, counted as chat: each front-end maps its input onto chat messages.

A chat request is counted with ``gateway.tokenizers.count_chat_prompt`` (OpenAI's documented
framing: 3 tokens a message, 1 more for a name, 3 of reply priming), plus the name and arguments
of each tool call an assistant message carries, as the gateway counts them. A Responses or a
Messages request is first written as the chat messages a translation would send (instructions
or system first, one message per turn, a tool call on an assistant message, a tool result as a
``tool`` message) and counted the same way, so a prompt costs the same tokens whichever API it
came in by. Tool definitions are not counted (as for chat).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from gateway.tokenizers import count_chat_prompt, get_encoding

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

__all__ = ["count_prompt", "prompt_key"]

_encode = msgspec.json.Encoder().encode


def _calls_tokens(message: Mapping[str, Any], encoding: str) -> int:
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or not calls:
        return 0
    encode = get_encoding(encoding).encode_ordinary
    total = 0
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            continue
        arguments = function.get("arguments") or ""
        if not isinstance(arguments, str):
            arguments = _encode(arguments).decode()
        total += len(encode(str(function.get("name") or ""))) + len(encode(arguments))
    return total


def count_prompt(messages: Iterable[Mapping[str, Any]], encoding: str) -> int:
    """Prompt tokens of chat messages: OpenAI's framing, the text, and any tool calls."""
    listed = list(messages)
    return count_chat_prompt(listed, encoding) + sum(_calls_tokens(m, encoding) for m in listed)


def prompt_key(messages: list[dict[str, Any]]) -> bytes:
    """The bytes that seed an answer's text: the chat messages' JSON (as chat has always used)."""
    return _encode(messages)
