"""The Anthropic Messages front-end (``POST /v1/messages``): Anthropic's shapes to chat and back.

Agent and coding tools speak Anthropic's Messages API; the gateway's pipeline (quotas, routing,
accounting with the history split) speaks chat completions. This module is the pure translation
between the two, with no I/O, so it is tested table-driven and by round-trip properties:

* :meth:`MessagesFrontend.translate` checks a Messages request (every refusal is an
  ``InvalidRequest`` whose ``param`` names the field, e.g. ``messages[2].content[0].type``) and
  builds the chat request: ``system`` becomes system messages (one per text block), ``tool_use``
  blocks an assistant message's ``tool_calls``, each ``tool_result`` block a ``tool`` message,
  images ``image_url`` parts (base64 sources as ``data:`` URLs).
* :meth:`MessagesFrontend.answer` turns a chat completion into an Anthropic ``message``, and
  :class:`MessagesStream` a chat SSE stream into Anthropic's events, chunk by chunk: every feed
  returns the events it can already write (a partial SSE line is all it keeps).
* :meth:`MessagesFrontend.error` renders a gateway error in Anthropic's shape and status (529
  ``overloaded_error`` when the gateway had no capacity).
* :func:`count_tokens` answers ``/v1/messages/count_tokens`` from the translated request;
  :func:`to_messages` and :func:`chat_answer_from_message` are the inverse translations, for the
  round-trip tests.

What chat cannot express is decided here, once:

* dropped, since they only tune the backend and change no shape: ``top_k`` (chat has none),
  ``cache_control`` on any block or at the top (chat has no such field; a backend that honours
  it gets the request passed through unchanged instead), ``thinking`` (and ``thinking`` /
  ``redacted_thinking`` blocks of earlier assistant turns), ``service_tier``, ``container``,
  ``inference_geo``, ``speed``, ``diagnostics``, ``context_management``, ``output_config.effort``,
  ``citations`` on text blocks, ``disable_parallel_tool_use`` without tools;
* refused with 400 naming the field: ``document``, ``search_result`` and other block types chat
  has no part for, images from the Files API (``source.type: file``), images inside a
  ``tool_result`` (a chat tool message carries text only), server tools (``tools[i].type`` other
  than ``custom``), ``mcp_servers``, ``output_config.format``, a ``system`` role inside
  ``messages`` (the top-level ``system`` is the documented place) and any field Anthropic does
  not document (Anthropic refuses them too, so a client never relies on them being ignored);
* ``tool_result.is_error``: chat tool messages have no error flag, so the content is prefixed
  with ``"Error: "`` for the model to see;
* tool call arguments that are not a JSON object in a non-streamed answer become the input
  ``{"_raw": "<the arguments>"}``: the model's output reaches the client, which sees why its
  tool cannot run, instead of the whole answer failing (a stream forwards the fragments as
  they come, since it cannot know before the end);
* the chat ``finish_reason`` maps to ``stop_reason``: ``stop`` -> ``end_turn`` (or
  ``stop_sequence`` with the sequence, when the backend names the stop string it matched, as
  vLLM does in ``stop_reason``; or ``tool_use`` when the answer has tool calls), ``length`` ->
  ``max_tokens``, ``tool_calls`` -> ``tool_use``, ``content_filter`` (or an OpenAI ``refusal``)
  -> ``refusal``;
* reasoning a backend returns (``reasoning_content``) is not shown: Anthropic returns thinking
  only when the request enables it, and most clients read ``content[0].text``.

Usage: Anthropic's ``input_tokens`` excludes the cache, so a chat usage becomes
``input_tokens = prompt - cache read - cache write`` beside ``cache_read_input_tokens`` and
``cache_creation_input_tokens`` (read by ``gateway.accounting.usage``, which keeps every token
in exactly one bucket); reasoning tokens, a part of the output, are
``output_tokens_details.thinking_tokens``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Final

import msgspec

from gateway.accounting.usage import BackendUsage, usage_from_mapping
from gateway.apis.base import Frontend, StreamTranslator, Translated
from gateway.errors import InvalidRequest, NoBackendAvailable, ServerShuttingDown, clip

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from gateway.accounting.sse import ChatChunk, ChunkToolCall
    from gateway.errors import GatewayError

__all__ = [
    "ERROR_PREFIX",
    "MessagesFrontend",
    "MessagesStream",
    "chat_answer_from_message",
    "count_tokens",
    "to_messages",
]

_encode = msgspec.json.encode

#: top-level request fields translated to chat
_TRANSLATED: Final = frozenset({
    "model", "max_tokens", "messages", "system", "tools", "tool_choice", "stop_sequences",
    "temperature", "top_p", "top_k", "metadata", "stream", "output_config",
})
#: top-level fields accepted and dropped (they tune the backend; chat has no equivalent)
_DROPPED: Final = frozenset({
    "cache_control", "thinking", "service_tier", "container", "inference_geo", "speed",
    "diagnostics", "context_management",
})
#: the image types Anthropic accepts in a base64 source
_MEDIA_TYPES: Final = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
#: what a chat tool message says before the content of a tool_result with ``is_error``
ERROR_PREFIX: Final = "Error: "
#: chat finish reasons that mean the model called tools
_TOOL_FINISH: Final = frozenset({"tool_calls", "function_call"})


# --- checking helpers -------------------------------------------------------------------------


def _refuse(param: str, why: str) -> InvalidRequest:
    return InvalidRequest(f"{param}: {why}", param=param)


def _kind(value: Any) -> str:
    """The JSON name of a value's type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _string(value: Any, param: str, *, empty: bool = True) -> str:
    if not isinstance(value, str):
        raise _refuse(param, f"must be a string, got {_kind(value)}")
    if not empty and not value:
        raise _refuse(param, "must not be empty")
    return value


def _object(value: Any, param: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _refuse(param, f"must be an object, got {_kind(value)}")
    return value


def _array(value: Any, param: str) -> list[Any]:
    if not isinstance(value, list):
        raise _refuse(param, f"must be an array, got {_kind(value)}")
    return value


def _number(value: Any, param: str, low: float, high: float) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _refuse(param, f"must be a number, got {_kind(value)}")
    if not low <= value <= high:
        raise _refuse(param, f"must be between {low:g} and {high:g}, got {value:g}")
    return value


def _positive_int(value: Any, param: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _refuse(param, f"must be an integer, got {_kind(value)}")
    if value < 1:
        raise _refuse(param, f"must be at least 1, got {value}")
    return value


def _block_type(block: Any, param: str) -> str:
    block = _object(block, param)
    kind = block.get("type")
    if not isinstance(kind, str):
        raise _refuse(f"{param}.type", "a content block needs a string 'type'")
    return kind


def _unsupported(kind: str, param: str, where: str) -> InvalidRequest:
    if kind == "document":
        why = ("'document' blocks are not supported when the backend speaks chat completions "
               "(send the text as a 'text' block)")
    else:
        why = f"'{clip(kind, 64)}' blocks are not supported in {where}"
    return _refuse(f"{param}.type", why)


# --- request: Messages -> chat ----------------------------------------------------------------


def _translate(payload: dict[str, Any], earlier: list[dict[str, Any]] | None,
               *, count_only: bool = False) -> Translated:
    """The checks and the translation; ``count_only``: a count_tokens request (no
    ``max_tokens`` needed)."""
    for key in payload:
        if key not in _TRANSLATED and key not in _DROPPED:
            raise _refuse(clip(key, 64), "unknown field (not part of the Messages API, or not "
                                         "supported when the backend speaks chat completions)")
    if "model" not in payload:
        raise _refuse("model", "field required")
    model = _string(payload["model"], "model", empty=False)
    max_tokens: int | None = None
    if "max_tokens" in payload:
        max_tokens = _positive_int(payload["max_tokens"], "max_tokens")
    elif not count_only:
        raise _refuse("max_tokens", "field required")
    if "messages" not in payload:
        raise _refuse("messages", "field required")
    messages = _array(payload["messages"], "messages")
    if not messages:
        raise _refuse("messages", "at least one message is required")

    chat_messages: list[dict[str, Any]] = []
    if "system" in payload:
        chat_messages.extend(_system(payload["system"]))
    if earlier:
        chat_messages.extend(earlier)
    for i, message in enumerate(messages):
        chat_messages.extend(_message(message, f"messages[{i}]"))

    chat: dict[str, Any] = {"model": model, "messages": chat_messages}
    if max_tokens is not None:
        chat["max_tokens"] = max_tokens
    stream = payload.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _refuse("stream", f"must be a boolean, got {_kind(stream)}")
    if stream and not count_only:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    for name in ("temperature", "top_p"):
        if payload.get(name) is not None:
            chat[name] = _number(payload[name], name, 0.0, 1.0)
    top_k = payload.get("top_k")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0):
        raise _refuse("top_k", "must be a non-negative integer")  # checked, then dropped
    if payload.get("stop_sequences") is not None:
        stops = _array(payload["stop_sequences"], "stop_sequences")
        for i, stop in enumerate(stops):
            _string(stop, f"stop_sequences[{i}]", empty=False)
        if stops:
            chat["stop"] = list(stops)
    if payload.get("metadata") is not None:
        user = _metadata_user(payload["metadata"])
        if user is not None:
            chat["user"] = user
    if payload.get("output_config") is not None:
        config = _object(payload["output_config"], "output_config")
        if config.get("format") is not None:
            raise _refuse("output_config.format", "structured output is not supported when the "
                                                  "backend speaks chat completions")
    tools = payload.get("tools")
    if tools is not None:
        tools = _array(tools, "tools")
        if tools:
            chat["tools"] = [_tool(tool, f"tools[{i}]") for i, tool in enumerate(tools)]
    if payload.get("tool_choice") is not None:
        _tool_choice(payload["tool_choice"], chat)
    return Translated(chat=chat, model=model, stream=stream and not count_only,
                      max_output=max_tokens)


def _system(system: Any) -> list[dict[str, Any]]:
    """``system``: a string is one system message, text blocks one system message each."""
    if isinstance(system, str):
        return [{"role": "system", "content": system}] if system else []
    blocks = _array(system, "system")
    out: list[dict[str, Any]] = []
    for i, block in enumerate(blocks):
        param = f"system[{i}]"
        if _block_type(block, param) != "text":
            raise _refuse(f"{param}.type", "system blocks must be 'text'")
        out.append({"role": "system", "content": _string(block.get("text"), f"{param}.text")})
    return out


def _message(message: Any, param: str) -> list[dict[str, Any]]:
    """One Messages turn as the chat messages it becomes (a user turn with tool results
    becomes a ``tool`` message per result, then the user message with the rest)."""
    message = _object(message, param)
    for key in message:
        if key not in ("role", "content"):
            raise _refuse(f"{param}.{clip(key, 64)}", "unknown field")
    role = message.get("role")
    if role not in ("user", "assistant"):
        why = "must be 'user' or 'assistant'"
        if role == "system":
            why += " (use the top-level 'system' parameter)"
        raise _refuse(f"{param}.role", why)
    if "content" not in message:
        raise _refuse(f"{param}.content", "field required")
    content = message["content"]
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    blocks = _array(content, f"{param}.content")
    if not blocks:
        raise _refuse(f"{param}.content", "must not be empty")
    if role == "assistant":
        return [_assistant(blocks, f"{param}.content")]
    return _user(blocks, f"{param}.content")


def _user(blocks: list[Any], param: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        where = f"{param}[{j}]"
        kind = _block_type(block, where)
        if kind == "text":
            parts.append({"type": "text", "text": _string(block.get("text"), f"{where}.text")})
        elif kind == "image":
            parts.append(_image(block, where))
        elif kind == "tool_result":
            if parts:  # keep the order the client gave
                out.append({"role": "user", "content": parts})
                parts = []
            out.append(_tool_result(block, where))
        elif kind == "tool_use":
            raise _refuse(f"{where}.type", "'tool_use' blocks belong in assistant messages")
        else:
            raise _unsupported(kind, where, "user messages")
    if parts:
        out.append({"role": "user", "content": parts})
    return out


def _assistant(blocks: list[Any], param: str) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        where = f"{param}[{j}]"
        kind = _block_type(block, where)
        if kind == "text":
            texts.append(_string(block.get("text"), f"{where}.text"))
        elif kind == "tool_use":
            calls.append(_tool_call(block, where))
        elif kind in ("thinking", "redacted_thinking"):
            continue  # chat has no thinking input: dropped
        elif kind == "tool_result":
            raise _refuse(f"{where}.type", "'tool_result' blocks belong in user messages")
        else:
            raise _unsupported(kind, where, "assistant messages")
    content: str | list[dict[str, str]] | None
    if not texts:
        content = None if calls else ""
    elif len(texts) == 1:
        content = texts[0]
    else:
        content = [{"type": "text", "text": text} for text in texts]
    out: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        out["tool_calls"] = calls
    return out


def _tool_call(block: dict[str, Any], param: str) -> dict[str, Any]:
    call_id = _string(block.get("id"), f"{param}.id", empty=False)
    name = _string(block.get("name"), f"{param}.name", empty=False)
    arguments = _object(block.get("input"), f"{param}.input")
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": _encode(arguments).decode()}}


def _tool_result(block: dict[str, Any], param: str) -> dict[str, Any]:
    call_id = _string(block.get("tool_use_id"), f"{param}.tool_use_id", empty=False)
    content = block.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    else:
        texts: list[str] = []
        for k, inner in enumerate(_array(content, f"{param}.content")):
            where = f"{param}.content[{k}]"
            kind = _block_type(inner, where)
            if kind == "text":
                texts.append(_string(inner.get("text"), f"{where}.text"))
            elif kind == "image":
                raise _refuse(f"{where}.type", "images in a tool_result are not supported when "
                                               "the backend speaks chat completions (a chat "
                                               "tool message carries text only)")
            else:
                raise _unsupported(kind, where, "a tool_result")
        text = "\n".join(texts)
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise _refuse(f"{param}.is_error", f"must be a boolean, got {_kind(is_error)}")
    if is_error:
        text = ERROR_PREFIX + text
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _image(block: dict[str, Any], param: str) -> dict[str, Any]:
    source = _object(block.get("source"), f"{param}.source")
    kind = source.get("type")
    if kind == "base64":
        media = source.get("media_type")
        if media not in _MEDIA_TYPES:
            raise _refuse(f"{param}.source.media_type",
                          "must be one of " + ", ".join(sorted(_MEDIA_TYPES)))
        data = _string(source.get("data"), f"{param}.source.data", empty=False)
        url = f"data:{media};base64,{data}"
    elif kind == "url":
        url = _string(source.get("url"), f"{param}.source.url", empty=False)
    elif kind == "file":
        raise _refuse(f"{param}.source.type", "file sources (the Files API) are not supported: "
                                              "send the image as 'base64' or 'url'")
    else:
        raise _refuse(f"{param}.source.type", "must be 'base64' or 'url'")
    return {"type": "image_url", "image_url": {"url": url}}


def _metadata_user(metadata: Any) -> str | None:
    metadata = _object(metadata, "metadata")
    for key in metadata:
        if key != "user_id":
            raise _refuse(f"metadata.{clip(key, 64)}", "unknown field (only 'user_id')")
    user = metadata.get("user_id")
    return None if user is None else _string(user, "metadata.user_id")


def _tool(tool: Any, param: str) -> dict[str, Any]:
    tool = _object(tool, param)
    kind = tool.get("type")
    if kind not in (None, "custom"):
        raise _refuse(f"{param}.type", f"server tools ('{clip(str(kind), 64)}') are not "
                                       "supported when the backend speaks chat completions")
    name = _string(tool.get("name"), f"{param}.name", empty=False)
    if "input_schema" not in tool:
        raise _refuse(f"{param}.input_schema", "field required")
    function: dict[str, Any] = {
        "name": name,
        "parameters": _object(tool["input_schema"], f"{param}.input_schema"),
    }
    if tool.get("description") is not None:
        function["description"] = _string(tool["description"], f"{param}.description")
    if tool.get("strict") is not None:
        if not isinstance(tool["strict"], bool):
            raise _refuse(f"{param}.strict", "must be a boolean")
        function["strict"] = tool["strict"]
    return {"type": "function", "function": function}


def _tool_choice(choice: Any, chat: dict[str, Any]) -> None:
    choice = _object(choice, "tool_choice")
    kind = choice.get("type")
    translated: Any
    if kind == "auto":
        translated = "auto"
    elif kind == "any":
        translated = "required"
    elif kind == "none":
        translated = "none"
    elif kind == "tool":
        name = _string(choice.get("name"), "tool_choice.name", empty=False)
        translated = {"type": "function", "function": {"name": name}}
    else:
        raise _refuse("tool_choice.type", "must be 'auto', 'any', 'tool' or 'none'")
    parallel = choice.get("disable_parallel_tool_use")
    if parallel is not None and not isinstance(parallel, bool):
        raise _refuse("tool_choice.disable_parallel_tool_use", "must be a boolean")
    if "tools" not in chat:
        if kind in ("any", "tool"):
            raise _refuse("tool_choice", f"'{kind}' needs 'tools'")
        return  # auto / none without tools: nothing to choose from
    chat["tool_choice"] = translated
    if parallel and kind != "none":
        chat["parallel_tool_calls"] = False


# --- answer: chat -> Messages -----------------------------------------------------------------


def _message_id(request_id: str) -> str:
    return f"msg_{request_id}"


def _tool_id(request_id: str, index: int) -> str:
    """The id of a tool call the backend gave none (chat requires one; some backends omit it)."""
    return f"toolu_{request_id}_{index}"


def _anthropic_usage(usage: BackendUsage | None) -> dict[str, Any]:
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


def _chat_usage(usage: Any) -> BackendUsage | None:
    return usage_from_mapping(usage, "openai") if isinstance(usage, dict) else None


def _stop(finish: str | None, matched: Any, tools: bool, refusal: bool) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) for a chat finish reason."""
    if finish == "length":
        return "max_tokens", None
    if finish == "content_filter" or (refusal and not tools):
        return "refusal", None
    if tools or finish in _TOOL_FINISH:
        return "tool_use", None
    if finish == "stop" and isinstance(matched, str) and matched:
        return "stop_sequence", matched
    return "end_turn", None


def _tool_input(arguments: Any) -> dict[str, Any]:
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


def _text_of(content: Any) -> str:
    """The text of a chat message's content (a string, or a list of text parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text") or "") for part in content
                       if isinstance(part, dict) and part.get("type") == "text")
    return ""


def _answer(chat: Mapping[str, Any], model: str, request_id: str) -> dict[str, Any]:
    choices = chat.get("choices")
    choice: Mapping[str, Any] = {}
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        message = {}
    refusal = message.get("refusal")
    refusal = refusal if isinstance(refusal, str) else ""
    text = _text_of(message.get("content")) + refusal
    content: list[dict[str, Any]] = []
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
            "id": call_id if isinstance(call_id, str) and call_id else _tool_id(request_id, i),
            "name": str(function.get("name") or ""),
            "input": _tool_input(function.get("arguments")),
        })
    finish = choice.get("finish_reason")
    has_calls = len(content) > (1 if text else 0)
    reason, sequence = _stop(finish if isinstance(finish, str) else None,
                             choice.get("stop_reason"), has_calls, bool(refusal))
    return {
        "id": _message_id(request_id),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": _anthropic_usage(_chat_usage(chat.get("usage"))),
    }


# --- stream: chat SSE -> Anthropic SSE --------------------------------------------------------


def _event(name: bytes, data: Any) -> bytes:
    return b"event: " + name + b"\ndata: " + _encode(data) + b"\n\n"


_PING: Final = _event(b"ping", {"type": "ping"})
_STOP: Final = _event(b"message_stop", {"type": "message_stop"})
_DELTA_HEAD: Final = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":'
_TEXT_MID: Final = b',"delta":{"type":"text_delta","text":'
_JSON_MID: Final = b',"delta":{"type":"input_json_delta","partial_json":'
_DELTA_TAIL: Final = b"}}\n\n"


def _error_event(kind: str, message: str) -> bytes:
    return _event(b"error", {"type": "error", "error": {"type": kind, "message": message}})


class MessagesStream(StreamTranslator):
    """One streamed answer: chat completions SSE in, Anthropic Messages events out.

    ``message_start`` (with the gateway's count of the prompt as ``input_tokens``) and a
    ``ping`` go out with the first bytes; text and tool calls become content blocks, each
    stopped when the next starts or the choice finishes; ``message_delta`` (stop reason, the
    backend's usage) and ``message_stop`` go out once the finish reason and the usage chunk
    have both arrived, or at ``[DONE]`` / :meth:`finish` if the usage never comes (then the
    output count is the number of chunks that carried output: an estimate).
    """

    __slots__ = (
        "_ended",
        "_finish",
        "_matched",
        "_model",
        "_next",
        "_open",
        "_output_chunks",
        "_prompt_tokens",
        "_refusal",
        "_request_id",
        "_started",
        "_text",
        "_tools",
        "_usage",
    )

    def __init__(self, *, model: str, request_id: str, prompt_tokens: int) -> None:
        super().__init__()
        self._model = model
        self._request_id = request_id
        self._prompt_tokens = prompt_tokens
        self._started = False
        self._ended = False
        self._next = 0  # the index of the next content block
        self._open: int | None = None  # the block started and not stopped
        #: the open block's text delta event up to the text, if the open block is text
        self._text: bytes | None = None
        self._tools: dict[int, int] = {}  # chat tool call index -> content block index
        self._finish: str | None = None
        self._matched: str | int | None = None
        self._refusal = False
        self._usage: BackendUsage | None = None
        self._output_chunks = 0

    # the StreamTranslator interface

    def fail(self, error: GatewayError) -> bytes:
        if self._ended:
            return b""  # the message was complete: nothing to add
        self._ended = True
        _, kind = _status_and_type(error)
        return _error_event(kind, error.message)

    # reading the chat stream

    def _head(self) -> bytes:
        self._started = True
        start = {
            "type": "message_start",
            "message": {
                "id": _message_id(self._request_id),
                "type": "message",
                "role": "assistant",
                "model": self._model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {
                    "input_tokens": self._prompt_tokens,
                    "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": 0,
                    "output_tokens": 1,  # what Anthropic's message_start says
                },
            },
        }
        return _event(b"message_start", start) + _PING

    def _opening(self, out: list[bytes]) -> None:
        if not self._started:
            out.append(self._head())

    def _done(self, out: list[bytes]) -> None:
        self._end(out)

    def _chunk(self, chunk: ChatChunk, out: list[bytes]) -> None:
        if self._ended:
            return
        choices = chunk.choices
        if chunk.error is not None and not choices:
            # a backend that fails mid-stream: its message may name internals, so not relayed
            self._ended = True
            out.append(_error_event("api_error", "The backend failed during the stream."))
            return
        for choice in choices or ():
            if choice.index != 0:
                continue
            delta = choice.delta
            if delta is not None:
                content = delta.content
                if content:
                    head = self._text
                    if head is not None:  # the common chunk: ``_text_delta``, inlined
                        self._output_chunks += 1
                        out.append(head + _encode(content) + _DELTA_TAIL)
                    else:
                        self._text_delta(content, out)
                if delta.refusal:
                    self._refusal = True
                    self._text_delta(delta.refusal, out)
                if delta.tool_calls:
                    for call in delta.tool_calls:
                        self._tool_delta(call, out)
            if choice.finish_reason is not None and self._finish is None:
                self._finish = choice.finish_reason
                self._matched = choice.stop_reason
                self._stop_open(out)
        if chunk.usage is not None:
            usage = _chat_usage(chunk.usage)
            if usage is not None:
                self._usage = usage
        if self._finish is not None and self._usage is not None:
            self._end(out)

    def _text_delta(self, text: str, out: list[bytes]) -> None:
        head = self._text
        if head is None:
            index = self._start({"type": "text", "text": ""}, out)
            head = self._text = _DELTA_HEAD + str(index).encode() + _TEXT_MID
        self._output_chunks += 1
        out.append(head + _encode(text) + _DELTA_TAIL)

    def _tool_delta(self, call: ChunkToolCall, out: list[bytes]) -> None:
        function = call.function
        arguments = function.arguments if function is not None else None
        if arguments is not None and not isinstance(arguments, str):
            arguments = _encode(arguments).decode()  # a backend that sent a JSON value
        key = call.index if call.index is not None else 0
        index = self._tools.get(key)
        if index is None:
            block = {
                "type": "tool_use",
                "id": call.id or _tool_id(self._request_id, key),
                "name": (function.name if function is not None else None) or "",
                "input": {},
            }
            index = self._tools[key] = self._start(block, out)
        # A fragment of a call whose block was already stopped (a backend interleaving its
        # calls) still goes to that block's index: holding it back would buffer the stream.
        if arguments:
            self._output_chunks += 1
            out.append(_DELTA_HEAD + str(index).encode() + _JSON_MID + _encode(arguments)
                       + _DELTA_TAIL)

    def _start(self, block: dict[str, Any], out: list[bytes]) -> int:
        self._stop_open(out)
        index = self._open = self._next
        self._next += 1
        out.append(_event(b"content_block_start",
                          {"type": "content_block_start", "index": index, "content_block": block}))
        return index

    def _stop_open(self, out: list[bytes]) -> None:
        if self._open is not None:
            out.append(_event(b"content_block_stop",
                              {"type": "content_block_stop", "index": self._open}))
            self._open = self._text = None

    def _end(self, out: list[bytes]) -> None:
        """``message_delta`` and ``message_stop``, once."""
        if self._ended:
            return
        self._ended = True
        self._stop_open(out)
        reason, sequence = _stop(self._finish, self._matched, bool(self._tools), self._refusal)
        usage: dict[str, Any]
        if self._usage is not None:
            usage = _anthropic_usage(self._usage)
        else:
            usage = {"output_tokens": self._output_chunks}
        out.append(_event(b"message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": usage,
        }))
        out.append(_STOP)

    def __repr__(self) -> str:
        state = "ended" if self._ended else ("open" if self._started else "new")
        return f"<MessagesStream [{state} | {self._next} blocks]>"


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


def _status_and_type(error: GatewayError) -> tuple[int, str]:
    if isinstance(error, _NO_CAPACITY):
        return 529, "overloaded_error"
    status = error.status
    kind = _ERROR_TYPES.get(status)
    if kind is not None:
        return status, kind
    if 400 <= status < 500:
        return status, "invalid_request_error"  # Anthropic's type for other 4xx statuses
    return status, "api_error"  # 502, 503 (e.g. the quota store away): retryable upstream


# --- the front-end ----------------------------------------------------------------------------


class MessagesFrontend(Frontend):
    """Anthropic's Messages API on the chat pipeline."""

    name = "messages"
    path = "/v1/messages"
    upstream_path = "/v1/messages"
    stream_counts_prompt = True  # ``message_start`` carries the input tokens
    output_fields = ("max_tokens",)

    def translate(self, payload: dict[str, Any],
                  earlier: list[dict[str, Any]] | None = None) -> Translated:
        return _translate(payload, earlier)

    def answer(self, chat: dict[str, Any], *, model: str, request_id: str,
               request: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return _answer(chat, model, request_id)  # a Messages answer echoes no request setting

    def stream(self, *, model: str, request_id: str, prompt_tokens: int,
               request: Mapping[str, Any] | None = None) -> MessagesStream:
        return MessagesStream(model=model, request_id=request_id, prompt_tokens=prompt_tokens)

    def error(self, error: GatewayError) -> tuple[int, bytes]:
        """Anthropic's shape; the error's headers (``Retry-After``) are the caller's to send."""
        status, kind = _status_and_type(error)
        return status, _encode({"type": "error", "error": {"type": kind,
                                                             "message": error.message}})

    def usage(self, answer: dict[str, Any]) -> BackendUsage | None:
        usage = answer.get("usage")
        return usage_from_mapping(usage, "anthropic") if isinstance(usage, dict) else None


def count_tokens(payload: dict[str, Any],
                 count_chat: Callable[[dict[str, Any]], int]) -> dict[str, int]:
    """``/v1/messages/count_tokens``: the input tokens of the translated request, counted by
    ``count_chat`` (the gateway's tokenizer over a chat payload). Checked like a create
    request, except that ``max_tokens`` is not needed."""
    translated = _translate(payload, None, count_only=True)
    return {"input_tokens": count_chat(translated.chat)}


# --- the inverse translations (chat -> Messages), for the round-trip tests --------------------


def to_messages(chat: Mapping[str, Any], *, max_tokens: int | None = None) -> dict[str, Any]:
    """The Messages request for a chat request, for the subset both express: leading system
    messages, user messages (text, ``image_url`` parts), assistant messages (text, tool
    calls), tool messages. ``max_tokens``: used when the chat request has none."""
    messages = list(chat.get("messages") or [])
    systems: list[str] = []
    while messages and messages[0].get("role") in ("system", "developer"):
        systems.append(_text_of(messages.pop(0).get("content")))
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
                       "input": _tool_input(function.get("arguments"))})
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
