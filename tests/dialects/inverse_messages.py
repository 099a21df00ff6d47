"""The inverse translations, chat -> Messages: a chat request as a Messages request, and an
Anthropic ``message`` as the chat answer it stands for (for the round-trip property tests)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import msgspec

from gateway.accounting.usage import BackendUsage, usage_from_mapping
from gateway.dialects.messages.answer import text_of, tool_input

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["chat_answer_from_message", "to_messages"]

_encode = msgspec.json.encode


def to_messages(chat: Mapping[str, Any], *, max_tokens: int | None = None) -> dict[str, Any]:
    """The Messages request for a chat request, for the subset both express: leading system
    messages, user messages (text, ``image_url`` parts), assistant messages (text, tool
    calls), tool messages. ``max_tokens``: used when the chat request has none."""
    messages = list(chat.get("messages") or [])
    systems: list[str] = []
    while messages and messages[0].get("role") in ("system", "developer"):
        systems.append(text_of(messages.pop(0).get("content")))
    out: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []  # tool results waiting for their user turn
    for message in messages:
        role = message.get("role")
        if role == "tool":
            results.append({"type": "tool_result", "tool_use_id": message.get("tool_call_id"),
                            "content": message.get("content")})
            continue
        if results:
            out.append({"role": "user", "content": results})
            results = []
        if role == "user":
            out.append({"role": "user", "content": _blocks_of(message.get("content"))})
        elif role == "assistant":
            out.append({"role": "assistant", "content": _assistant_blocks(message)})
        else:
            raise ValueError(f"a {role!r} message after the first turn has no Messages form")
    if results:
        out.append({"role": "user", "content": results})
    payload: dict[str, Any] = {"model": chat.get("model"), "messages": out}
    limit = chat.get("max_tokens") or chat.get("max_completion_tokens") or max_tokens
    if limit is None:
        raise ValueError("a Messages request needs max_tokens")
    payload["max_tokens"] = limit
    if len(systems) == 1:
        payload["system"] = systems[0]
    elif systems:
        payload["system"] = [{"type": "text", "text": text} for text in systems]
    if chat.get("stream"):
        payload["stream"] = True
    for name in ("temperature", "top_p"):
        if chat.get(name) is not None:
            payload[name] = chat[name]
    stop = chat.get("stop")
    if stop:
        payload["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    if chat.get("user") is not None:
        payload["metadata"] = {"user_id": chat["user"]}
    if chat.get("tools"):
        payload["tools"] = [_tool_of(tool) for tool in chat["tools"]]
    choice = _tool_choice_of(chat.get("tool_choice"), chat.get("parallel_tool_calls"))
    if choice is not None and chat.get("tools"):
        payload["tool_choice"] = choice
    return payload


def _blocks_of(content: Any) -> Any:
    if not isinstance(content, list):
        return content
    blocks: list[dict[str, Any]] = []
    for part in content:
        if part.get("type") == "image_url":
            url = str((part.get("image_url") or {}).get("url") or "")
            if url.startswith("data:") and ";base64," in url:
                media, data = url[5:].split(";base64,", 1)
                blocks.append({"type": "image", "source": {"type": "base64",
                                                           "media_type": media, "data": data}})
            else:
                blocks.append({"type": "image", "source": {"type": "url", "url": url}})
        else:
            blocks.append({"type": "text", "text": part.get("text", "")})
    return blocks


def _assistant_blocks(message: Mapping[str, Any]) -> Any:
    content = message.get("content")
    calls = message.get("tool_calls") or []
    if not calls:
        return _blocks_of(content) if content is not None else ""
    blocks: list[dict[str, Any]] = []
    if isinstance(content, list):
        blocks.extend(_blocks_of(content))
    elif content:
        blocks.append({"type": "text", "text": content})
    for call in calls:
        function = call.get("function") or {}
        blocks.append({"type": "tool_use", "id": call.get("id"), "name": function.get("name"),
                       "input": tool_input(function.get("arguments"))})
    return blocks


def _tool_of(tool: Mapping[str, Any]) -> dict[str, Any]:
    function = tool.get("function") or {}
    out: dict[str, Any] = {"name": function.get("name"),
                           "input_schema": function.get("parameters") or {"type": "object"}}
    if function.get("description") is not None:
        out["description"] = function["description"]
    if function.get("strict") is not None:
        out["strict"] = function["strict"]
    return out


def _tool_choice_of(choice: Any, parallel: Any) -> dict[str, Any] | None:
    out: dict[str, Any] | None = None
    if choice == "auto":
        out = {"type": "auto"}
    elif choice == "required":
        out = {"type": "any"}
    elif choice == "none":
        out = {"type": "none"}
    elif isinstance(choice, dict):
        out = {"type": "tool", "name": (choice.get("function") or {}).get("name")}
    if parallel is False:
        out = out or {"type": "auto"}
        if out["type"] != "none":
            out["disable_parallel_tool_use"] = True
    return out


#: Anthropic stop_reason -> chat finish_reason
_FINISH_OF: Final = {
    "end_turn": "stop", "stop_sequence": "stop", "pause_turn": "stop", "max_tokens": "length",
    "model_context_window_exceeded": "length", "tool_use": "tool_calls",
    "refusal": "content_filter",
}


def chat_answer_from_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """The chat completion an Anthropic ``message`` stands for (the inverse of ``answer``):
    text blocks joined as the content, tool_use blocks as tool calls, the usage with the cache
    figures as parts of ``prompt_tokens``."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in message.get("content") or []:
        if block.get("type") == "text":
            texts.append(block.get("text", ""))
        elif block.get("type") == "tool_use":
            calls.append({"id": block.get("id"), "type": "function",
                          "function": {"name": block.get("name"),
                                       "arguments": _encode(block.get("input") or {}).decode()}})
    reply: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        reply["tool_calls"] = calls
    choice: dict[str, Any] = {
        "index": 0, "message": reply,
        "finish_reason": _FINISH_OF.get(str(message.get("stop_reason")), "stop"),
    }
    if message.get("stop_sequence") is not None:
        choice["stop_reason"] = message["stop_sequence"]
    wire = message.get("usage") or {}
    usage = usage_from_mapping(wire, "anthropic") or BackendUsage()
    details = wire.get("output_tokens_details") or {}
    thinking = min(int(details.get("thinking_tokens") or 0), usage.completion_tokens)
    return {
        "id": message.get("id"),
        "object": "chat.completion",
        "created": 0,
        "model": message.get("model"),
        "choices": [choice],
        "usage": {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_tokens,
                                      "cache_write_tokens": usage.cache_write_tokens},
            "completion_tokens_details": {"reasoning_tokens": thinking},
        },
    }
