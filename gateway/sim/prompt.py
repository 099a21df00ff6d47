"""Prompt tokens of every API, counted as chat: each front-end maps its input onto chat messages.

A chat request is counted with ``gateway.tokenizers.count_chat_prompt`` (OpenAI's documented
framing: 3 tokens a message, 1 more for a name, 3 of reply priming), plus the name and arguments
of each tool call an assistant message carries, as the gateway counts them. A Responses or a
Messages request is first written as the chat messages a translation would send (instructions
or system first, one message per turn, a tool call on an assistant message, a tool result as a
``tool`` message) and counted the same way, so a prompt costs the same tokens whichever API it
came in by. Tool definitions are not counted (as for chat).

:func:`prompt_ids` gives the same prompt as token ids, for the engine's prefix cache: each
message as a chat template renders it (start marker, role, separator, content, name, tool
calls, end marker), then the reply priming, so that ``len(prompt_ids(m)) == count_prompt(m)``
and a conversation's turn n+1 starts with the ids of turn n (its reply priming aside). The
framing tokens are ids above every tiktoken vocabulary.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from gateway.tokenizers import count_chat_prompt, get_encoding

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

__all__ = ["count_prompt", "prompt_ids", "prompt_key"]

_encode = msgspec.json.Encoder().encode

# Framing ids (beyond o200k's 200k entries): a message's 3 (start, separator, end), a name's 1,
# the reply priming's 3.
_START, _SEP, _END, _NAME = 1 << 24, (1 << 24) + 1, (1 << 24) + 2, (1 << 24) + 3
_PRIMING = [_START, (1 << 24) + 4, _SEP]


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


def _content_text(content: Any) -> str:
    """A message's text as ``count_chat_prompt`` reads it: a string, or its text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def _call_ids(message: Mapping[str, Any], encode: Any) -> list[int]:
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or not calls:
        return []
    out: list[int] = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            continue
        arguments = function.get("arguments") or ""
        if not isinstance(arguments, str):
            arguments = _encode(arguments).decode()
        out += encode(str(function.get("name") or ""))
        out += encode(arguments)
    return out


def prompt_ids(messages: Iterable[Mapping[str, Any]], encoding: str) -> list[int]:
    """The prompt of chat messages as token ids; as many as :func:`count_prompt` counts."""
    encode = get_encoding(encoding).encode_ordinary
    ids: list[int] = []
    for message in messages:
        ids.append(_START)
        ids += encode(str(message.get("role", "")))
        ids.append(_SEP)
        ids += encode(_content_text(message.get("content")))
        name = message.get("name")
        if name:
            ids.append(_NAME)
            ids += encode(str(name))
        ids += _call_ids(message, encode)
        ids.append(_END)
    ids += _PRIMING
    return ids


def prompt_key(messages: list[dict[str, Any]]) -> bytes:
    """The bytes that seed an answer's text: the chat messages' JSON (as chat has always used)."""
    return _encode(messages)
