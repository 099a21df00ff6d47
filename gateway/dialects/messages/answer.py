"""A chat completions answer as an Anthropic ``message``, and errors in Anthropic's shape.

* The chat ``finish_reason`` maps to ``stop_reason``: ``stop`` -> ``end_turn``, or
  ``stop_sequence`` with ``stop_sequence`` set to the string matched when the backend names it
  (vLLM and the simulator put the matched stop string in the choice's ``stop_reason``; a
  backend that does not leaves the gateway unable to know, so ``end_turn``), or ``tool_use``
  when the answer has tool calls; ``length`` -> ``max_tokens``, ``tool_calls`` -> ``tool_use``,
  ``content_filter`` (or an OpenAI ``refusal``) -> ``refusal``.
* Tool call arguments that are not a JSON object in a non-streamed answer become the input
  ``{"_raw": "<the arguments>"}``: the model's output reaches the client, which sees why its
  tool cannot run, instead of the whole answer failing (a stream forwards the fragments as
  they come, since it cannot know before the end).
* Reasoning a backend returns (``reasoning_content``, or vLLM's newer ``reasoning``) becomes a
  ``thinking`` block before the text (streamed as ``thinking_delta`` events) when the request
  asked to see thinking (``thinking`` enabled or adaptive, ``display`` not ``omitted``), as
  Anthropic answers; else it is not shown (most clients read ``content[0].text``). Its
  signature is empty: the gateway cannot sign, and the thinking block sent back in a later
  turn is dropped when translated.
* Usage: Anthropic's ``input_tokens`` excludes the cache, so a chat usage becomes
  ``input_tokens = prompt - cache read - cache write`` beside ``cache_read_input_tokens`` and
  ``cache_creation_input_tokens`` (read by ``gateway.accounting.usage``, which keeps every
  token in exactly one bucket); reasoning tokens, a part of the output, are
  ``output_tokens_details.thinking_tokens``.
* Errors: Anthropic's type by status, 529 ``overloaded_error`` when the gateway had no
  capacity.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import msgspec

from gateway.accounting.usage import BackendUsage, usage_from_mapping
from gateway.errors import NoBackendAvailable, ServerShuttingDown

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gateway.errors import GatewayError

__all__ = [
    "TOOL_FINISH",
    "answer",
    "anthropic_usage",
    "chat_usage",
    "message_id",
    "shows_thinking",
    "status_and_type",
    "stop_reason",
    "text_of",
    "tool_id",
    "tool_input",
]

#: chat finish reasons that mean the model called tools
TOOL_FINISH: Final = frozenset({"tool_calls", "function_call"})


def message_id(request_id: str) -> str:
    """The id of the gateway's answer to request ``request_id``."""
    return f"msg_{request_id}"


def tool_id(request_id: str, index: int) -> str:
    """The id of a tool call the backend gave none (chat requires one; some backends omit it)."""
    return f"toolu_{request_id}_{index}"


def anthropic_usage(usage: BackendUsage | None) -> dict[str, Any]:
    """Anthropic's usage for the backend's: ``input_tokens`` excludes both cache figures;
    the reasoning part of the output, when there is one, is ``thinking_tokens``."""
    if usage is None:
        usage = BackendUsage()
    out: dict[str, Any] = {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens - usage.cache_write_tokens,
        "cache_creation_input_tokens": usage.cache_write_tokens,
        "cache_read_input_tokens": usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
    }
    if usage.reasoning_tokens:
        out["output_tokens_details"] = {"thinking_tokens": usage.reasoning_tokens}
    return out


def chat_usage(usage: Any) -> BackendUsage | None:
    return usage_from_mapping(usage, "openai") if isinstance(usage, dict) else None


def stop_reason(finish: str | None, matched: Any, tools: bool, refusal: bool
                ) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) for a chat finish reason."""
    if finish == "length":
        return "max_tokens", None
    if finish == "content_filter" or (refusal and not tools):
        return "refusal", None
    if tools or finish in TOOL_FINISH:
        return "tool_use", None
    if finish == "stop" and isinstance(matched, str) and matched:
        return "stop_sequence", matched
    return "end_turn", None


def tool_input(arguments: Any) -> dict[str, Any]:
    """A tool call's arguments as a tool_use input (see the module docstring for non-objects)."""
    if isinstance(arguments, dict):
        return arguments
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}
    text = arguments if isinstance(arguments, str) else str(arguments)
    try:
        parsed = msgspec.json.decode(text)
    except msgspec.DecodeError:
        return {"_raw": text}
    return parsed if isinstance(parsed, dict) else {"_raw": text}


def text_of(content: Any) -> str:
    """The text of a chat message's content (a string, or a list of text parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text") or "") for part in content
                       if isinstance(part, dict) and part.get("type") == "text")
    return ""


def shows_thinking(request: Mapping[str, Any] | None) -> bool:
    """Whether a Messages request asked to see the model's thinking."""
    thinking = request.get("thinking") if request is not None else None
    return (isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")
            and thinking.get("display") != "omitted")


def answer(chat: Mapping[str, Any], model: str, request_id: str,
           thinking: bool = False) -> dict[str, Any]:
    """The ``message`` for a non-streamed chat completions answer (``thinking``: the request
    asked to see thinking, :func:`shows_thinking`)."""
    choices = chat.get("choices")
    choice: Mapping[str, Any] = {}
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        message = {}
    refusal = message.get("refusal")
    refusal = refusal if isinstance(refusal, str) else ""
    text = text_of(message.get("content")) + refusal
    content: list[dict[str, Any]] = []
    thought = message.get("reasoning_content") or message.get("reasoning")
    if thinking and isinstance(thought, str) and thought:
        content.append({"type": "thinking", "thinking": thought, "signature": ""})
    if text:
        content.append({"type": "text", "text": text})
    calls = message.get("tool_calls")
    for i, call in enumerate(calls if isinstance(calls, list) else []):
        if not isinstance(call, dict):
            continue
        function = call.get("function")
        if not isinstance(function, dict):
            continue
        call_id = call.get("id")
        content.append({
            "type": "tool_use",
            "id": call_id if isinstance(call_id, str) and call_id else tool_id(request_id, i),
            "name": str(function.get("name") or ""),
            "input": tool_input(function.get("arguments")),
        })
    finish = choice.get("finish_reason")
    has_calls = any(block["type"] == "tool_use" for block in content)
    reason, sequence = stop_reason(finish if isinstance(finish, str) else None,
                                   choice.get("stop_reason"), has_calls, bool(refusal))
    return {
        "id": message_id(request_id),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": anthropic_usage(chat_usage(chat.get("usage"))),
    }


# --- errors -----------------------------------------------------------------------------------

#: Anthropic's error type by status (https://docs.claude.com/en/api/errors)
_ERROR_TYPES: Final = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
}

#: the errors that mean the gateway had no capacity: Anthropic's 529 ``overloaded_error``
_NO_CAPACITY: Final = (NoBackendAvailable, ServerShuttingDown)


def status_and_type(error: GatewayError) -> tuple[int, str]:
    """The status and Anthropic error type a gateway error is answered with."""
    if isinstance(error, _NO_CAPACITY):
        return 529, "overloaded_error"
    status = error.status
    kind = _ERROR_TYPES.get(status)
    if kind is not None:
        return status, kind
    if 400 <= status < 500:
        return status, "invalid_request_error"  # Anthropic's type for other 4xx statuses
    return status, "api_error"  # 502, 503 (e.g. the quota store away): retryable upstream
