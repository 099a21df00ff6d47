"""Tokens of one chat message, counted the way OpenAI documents it, and its cache key.

A message costs ``TOKENS_PER_MESSAGE`` (3) of framing, plus its role, plus its content, plus
``TOKENS_PER_NAME`` (1) and the name when it has one; this is ``gateway.tokenizers``'
``count_chat_prompt`` per message, so the sum over a request's messages plus ``REPLY_PRIMING``
equals that function's total for plain messages. On top of that:

* content given as a list of parts: the text parts are joined and counted (as
  ``count_chat_prompt`` does); an ``image_url`` part adds a fixed estimate (:data:`IMAGE_TOKENS`,
  by ``detail``): the real figure depends on the image size, which the gateway does not fetch.
  Other non-text parts (audio, files) add 0. Every non-text part is tallied so the record can say
  its prompt count is partly a guess (the backend's ``prompt_tokens`` still fixes the total).
* an assistant message's ``tool_calls`` (and legacy ``function_call``): the function name and the
  arguments text of each call.
* a tool message: its content, like any other message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from gateway.tokenizers import TOKENS_PER_MESSAGE, TOKENS_PER_NAME

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = ["IMAGE_TOKENS", "MessageCount", "count_message", "message_key"]

#: Estimated tokens of one image part by ``detail``. OpenAI bills a low-detail image 85 tokens
#: and a high-detail one 85 + 170 per 512-px tile: 765 for a 1024x1024 image, used for "high" and
#: "auto" (the default) since the gateway does not know the size.
IMAGE_TOKENS = {"low": 85, "high": 765, "auto": 765}

_encode_json = msgspec.json.Encoder(order="deterministic").encode

#: (tokens including framing, non-text parts)
MessageCount = tuple[int, int]


def message_key(message: Mapping[str, Any]) -> int:
    """A 64-bit key for a message's count: equal messages give equal keys within a process.

    The common message, ``{"role": ..., "content": "<text>"}``, is keyed by Python's string hash
    of role and content (SipHash, randomly seeded per process, ~3 GB/s): blake2b of the same text is
    ~6x slower and would make hashing the re-sent history cost more than counting the new turn.
    Anything else (names, parts, tool calls) is keyed by the hash of its canonical JSON. A
    collision (odds ~1e-10 for 100k entries) only mislabels one message's estimate; the backend's
    ``prompt_tokens`` still fixes the total.
    """
    content = message.get("content")
    if len(message) == 2 and type(content) is str:
        return hash((message.get("role"), content))
    return hash(_encode_json(message))


def count_message(message: Mapping[str, Any], encode: Callable[[str], list[int]]) -> MessageCount:
    """Tokens of one message including its framing, and how many of its parts are not text."""
    tokens = TOKENS_PER_MESSAGE + len(encode(str(message.get("role", ""))))
    non_text = 0
    content = message.get("content")
    if isinstance(content, str):
        tokens += len(encode(content))
    elif isinstance(content, list):
        text, estimate, non_text = _parts(content)
        tokens += len(encode(text)) + estimate
    name = message.get("name")
    if name:
        tokens += TOKENS_PER_NAME + len(encode(str(name)))
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            if isinstance(call, dict):
                tokens += _function_tokens(call.get("function"), encode)
    tokens += _function_tokens(message.get("function_call"), encode)
    return tokens, non_text


def _parts(parts: list[Any]) -> tuple[str, int, int]:
    """(joined text of the text parts, estimated tokens of images, number of non-text parts)."""
    texts: list[str] = []
    estimate = 0
    non_text = 0
    for part in parts:
        if not isinstance(part, dict):
            continue
        text = part.get("text")
        if text is not None:
            texts.append(str(text))
            continue
        non_text += 1
        image = part.get("image_url")
        if image is not None:
            detail = image.get("detail", "auto") if isinstance(image, dict) else "auto"
            estimate += IMAGE_TOKENS.get(str(detail), IMAGE_TOKENS["auto"])
    return "".join(texts), estimate, non_text


def _function_tokens(function: Any, encode: Callable[[str], list[int]]) -> int:
    """Name plus arguments of one tool or function call."""
    if not isinstance(function, dict):
        return 0
    name = function.get("name") or ""
    arguments = function.get("arguments") or ""
    if not isinstance(arguments, str):
        arguments = _encode_json(arguments).decode()
    return len(encode(str(name))) + len(encode(arguments))
