"""The inverse translation, chat -> Responses: a chat completions request as the Responses
request ``to_chat`` maps back to it, for the common subset (for the property tests and for
tools that replay chat traffic)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.errors import InvalidRequest, clip

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["to_responses"]


def _bad(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(message, param=param)


def _object(value: Any, param: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(f"'{param}' must be an object", param)
    return value


def _array(value: Any, param: str) -> list[Any]:
    if not isinstance(value, list):
        raise _bad(f"'{param}' must be an array", param)
    return value


#: chat request fields ``to_responses`` translates
_CHAT_FIELDS = frozenset({
    "model", "messages", "tools", "tool_choice", "parallel_tool_calls", "max_tokens",
    "max_completion_tokens", "temperature", "top_p", "user", "metadata", "stream",
    "stream_options", "store", "response_format", "reasoning_effort",
})


def to_responses(chat: Mapping[str, Any]) -> dict[str, Any]:
    """A chat completions request as the Responses request ``to_chat`` maps back to it (the
    common subset: a field outside it is an ``InvalidRequest`` naming it). A first system
    message with text content becomes ``instructions`` (unless it is the only message: the
    input may not be empty); assistant tool calls become
    ``function_call`` items after the assistant's text, tool messages ``function_call_output``."""
    for key in chat:
        if key not in _CHAT_FIELDS:
            raise _bad(f"'{clip(str(key), 64)}' has no Responses equivalent", str(key))
    payload: dict[str, Any] = {"model": chat.get("model")}
    messages = list(_array(chat.get("messages"), "messages"))
    if len(messages) > 1 and messages[0].get("role") == "system" and isinstance(
            messages[0].get("content"), str):
        payload["instructions"] = messages.pop(0)["content"]
    items: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        items.extend(_items_of(_object(message, f"messages[{i}]"), f"messages[{i}]"))
    payload["input"] = items
    tools = chat.get("tools")
    if tools is not None:
        payload["tools"] = [{"type": "function", **t["function"]} for t in tools]
    choice = chat.get("tool_choice")
    if choice is not None:
        payload["tool_choice"] = (choice if isinstance(choice, str)
                                  else {"type": "function", "name": choice["function"]["name"]})
    limit = chat.get("max_completion_tokens", chat.get("max_tokens"))
    if limit is not None:
        payload["max_output_tokens"] = limit
    for key in ("parallel_tool_calls", "temperature", "top_p", "user", "metadata", "store"):
        if chat.get(key) is not None:
            payload[key] = chat[key]
    if chat.get("stream"):
        payload["stream"] = True
    fmt = chat.get("response_format")
    if fmt is not None:
        if fmt.get("type") == "json_schema":
            payload["text"] = {"format": {"type": "json_schema", **fmt["json_schema"]}}
        else:
            payload["text"] = {"format": {"type": fmt.get("type")}}
    effort = chat.get("reasoning_effort")
    if effort is not None:
        payload["reasoning"] = {"effort": effort}
    return payload


def _items_of(message: dict[str, Any], param: str) -> list[dict[str, Any]]:
    role = message.get("role")
    content = message.get("content")
    if role == "tool":
        return [{"type": "function_call_output", "call_id": message.get("tool_call_id"),
                 "output": content if isinstance(content, str) else _joined(content)}]
    if role not in ("user", "system", "developer", "assistant"):
        raise _bad(f"'{param}.role' {clip(str(role), 64)!r} has no Responses equivalent",
                   f"{param}.role")
    items: list[dict[str, Any]] = []
    if role == "assistant":
        calls = message.get("tool_calls") or []
        if content is not None or not calls:
            text = content if isinstance(content, str) else _joined(content)
            items.append({"type": "message", "role": "assistant", "content": [
                {"type": "output_text", "text": text, "annotations": []}]})
        items.extend({"type": "function_call", "call_id": call["id"],
                      "name": call["function"]["name"],
                      "arguments": call["function"]["arguments"]} for call in calls)
        return items
    if isinstance(content, str):
        return [{"type": "message", "role": role, "content": content}]
    parts: list[dict[str, Any]] = []
    for part in _array(content, f"{param}.content"):
        if part.get("type") == "image_url":
            image = part["image_url"]
            parts.append({"type": "input_image", "image_url": image["url"],
                          "detail": image.get("detail", "auto")})
        else:
            parts.append({"type": "input_text", "text": part.get("text", "")})
    return [{"type": "message", "role": role, "content": parts}]


def _joined(content: Any) -> str:
    """The text of chat content given as parts (None: empty)."""
    if not isinstance(content, list):
        return ""
    return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
