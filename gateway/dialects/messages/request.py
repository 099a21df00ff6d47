"""A Messages request checked in Anthropic's shape and translated to chat completions.

:func:`translate` refuses what is malformed in any case (an ``InvalidRequest`` whose ``param``
names the field, e.g. ``messages[2].content[0].type``) and builds the chat request:

* ``system`` (a string, or text blocks: one system message each), then the ``system``-role
  messages of ``messages`` (Claude Code sends them), folded into the system prompt in their
  order: a chat template takes system messages first only (Qwen's refuses one later), so they
  go after the top-level system and before the turns;
* ``tool_use`` blocks an assistant message's ``tool_calls``, each ``tool_result`` block a
  ``tool`` message (``is_error``: the content prefixed with ``"Error: "``, since chat tool
  messages have no error flag), images ``image_url`` parts (base64 sources as ``data:`` URLs);
* custom tools (no ``type``, or ``custom``) chat function tools; ``tool_choice``;
  ``stop_sequences`` -> ``stop``; ``metadata.user_id`` -> ``user``; ``temperature``, ``top_p``;
* ``output_config.format`` -> ``response_format`` (``json_schema``); ``output_config.effort``,
  else ``thinking`` enabled with a ``budget_tokens``, -> ``reasoning_effort`` (``xhigh`` and
  ``max`` as ``high``; a budget under 4,096 tokens ``low``, under 16,384 ``medium``); adaptive
  thinking leaves the effort to the model, as a chat model does without one.

What chat cannot express follows the rule of ``dialects.ignored``: dropped and named
(``x-gateway-ignored``) when translated, passed through untouched otherwise:

* dropped: ``cache_control`` (top level, on system, tool and message blocks: the engine's prompt
  cache needs no marks), ``top_k``, ``context_management``, ``service_tier``, ``container``,
  ``inference_geo``, ``speed``, ``diagnostics``, ``fallbacks``, ``mcp_servers``, a ``thread``
  that only asks to be created, ``thinking`` ``disabled`` (chat has no portable switch),
  metadata keys besides ``user_id``, server and Anthropic-defined tools (``web_search_*``,
  ``bash_*``, ``text_editor_*``, ...: ``tools[i]``) and a ``tool_choice`` naming one, any field
  the API does not have; ``thinking`` / ``redacted_thinking`` blocks of earlier assistant turns
  are dropped unnamed (the model's own reasoning: chat takes none back);
* refused when translated (a 400 naming the field): ``billing_policy`` billing anyone but the
  caller and ``fallback_credit_token`` (both change what is billed), ``compaction`` (its answer
  is a summary block chat cannot make), a ``thread`` to continue (a conversation the gateway
  does not hold), and content chat has no part for: ``document``, ``search_result``, server
  tool blocks, images from the Files API, images inside a ``tool_result``.
"""

from __future__ import annotations

import math
from typing import Any, Final

import msgspec

from gateway.dialects.base import Translated
from gateway.dialects.ignored import Ignored
from gateway.errors import InvalidRequest, clip

__all__ = ["ERROR_PREFIX", "translate"]

_encode = msgspec.json.encode

#: top-level fields translated to chat (or read for it); any other is dropped or refused
_TRANSLATED: Final = frozenset({
    "model", "max_tokens", "messages", "system", "tools", "tool_choice", "stop_sequences",
    "temperature", "top_p", "metadata", "stream", "output_config", "thinking",
})
#: the image types Anthropic accepts in a base64 source
_MEDIA_TYPES: Final = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
#: what a chat tool message says before the content of a tool_result with ``is_error``
ERROR_PREFIX: Final = "Error: "
#: ``output_config.effort`` -> chat ``reasoning_effort``
_EFFORTS: Final = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high",
                   "max": "high"}
#: ``thinking.type`` values that leave the effort to the model
_MODEL_DECIDES: Final = frozenset({"adaptive", "between_tools"})
#: a thinking budget below each bound -> that effort (above the last: ``high``)
_BUDGETS: Final = ((4096, "low"), (16384, "medium"))
#: the name a chat ``json_schema`` needs (Anthropic's format has none)
_SCHEMA_NAME: Final = "output"


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


def _empty(value: Any) -> bool:
    """A value that sets nothing: null, an empty array or object."""
    return value is None or value == [] or value == {}


# --- the request ------------------------------------------------------------------------------


def translate(payload: dict[str, Any], earlier: list[dict[str, Any]] | None,
              *, count_only: bool = False) -> Translated:
    """The checks and the translation; ``count_only``: a count_tokens request (no
    ``max_tokens`` needed)."""
    left = Ignored()
    for key, value in payload.items():
        if key not in _TRANSLATED and not _empty(value):
            _leftover(key, value, left)
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

    system: list[dict[str, Any]] = []
    if "system" in payload:
        system.extend(_system(payload["system"], "system", left))
    turns: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        if isinstance(message, dict) and message.get("role") == "system":
            system.extend(_system_message(message, param, left))
        else:
            turns.extend(_message(message, param, left))
    chat_messages = system
    if earlier:
        chat_messages.extend(earlier)
    chat_messages.extend(turns)

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
    if payload.get("stop_sequences") is not None:
        stops = _array(payload["stop_sequences"], "stop_sequences")
        for i, stop in enumerate(stops):
            _string(stop, f"stop_sequences[{i}]", empty=False)
        if stops:
            chat["stop"] = list(stops)
    if payload.get("metadata") is not None:
        user = _metadata_user(payload["metadata"], left)
        if user is not None:
            chat["user"] = user
    effort = _effort(payload, chat, left)
    tools = payload.get("tools")
    names: dict[str, bool] = {}  # tool name -> offered to chat (False: dropped)
    if tools is not None:
        tools = _array(tools, "tools")
        chat_tools = [t for i, tool in enumerate(tools)
                      if (t := _tool(tool, f"tools[{i}]", left, names)) is not None]
        if chat_tools:
            chat["tools"] = chat_tools
    if payload.get("tool_choice") is not None:
        _tool_choice(payload["tool_choice"], chat, names, left)
    return Translated(chat=chat, model=model, stream=stream and not count_only,
                      max_output=max_tokens, ignored=left.dropped(), refusal=left.refusal,
                      effort=effort)


def _leftover(key: str, value: Any, left: Ignored) -> None:
    """A top-level field chat has no place for: dropped and named, or refused when
    translated (see the module docstring)."""
    if key == "billing_policy":
        bill_to = value.get("bill_to") if isinstance(value, dict) else None
        if bill_to not in (None, "self"):  # "self", the default, changes nothing
            left.refuse(_refuse("billing_policy", "billing another party is not supported "
                                                  "when the backend speaks chat completions"))
    elif key == "fallback_credit_token":
        left.refuse(_refuse(key, "fallback credit is not supported when the backend speaks "
                                 "chat completions (it would change what is billed)"))
    elif key == "compaction":
        left.refuse(_refuse(key, "compaction requests are not supported when the backend "
                                 "speaks chat completions"))
    elif key == "thread":
        if isinstance(value, dict) and value.get("type") == "create":
            left.drop(key)  # nothing held: the answer is the same
        else:
            left.refuse(_refuse(key, "server-held threads are not supported when the backend "
                                     "speaks chat completions: send the whole conversation"))
    elif key == "top_k":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise _refuse("top_k", "must be a non-negative integer")
        left.drop(key)
    else:
        left.drop(clip(key, 64))


def _cached(block: dict[str, Any], left: Ignored) -> None:
    """A block's ``cache_control`` mark is dropped (and named, once)."""
    if block.get("cache_control") is not None:
        left.drop("cache_control")


def _system(system: Any, param: str, left: Ignored) -> list[dict[str, Any]]:
    """``system``: a string is one system message, text blocks one system message each."""
    if isinstance(system, str):
        return [{"role": "system", "content": system}] if system else []
    blocks = _array(system, param)
    out: list[dict[str, Any]] = []
    for i, block in enumerate(blocks):
        where = f"{param}[{i}]"
        if _block_type(block, where) != "text":
            raise _refuse(f"{where}.type", "system blocks must be 'text'")
        _cached(block, left)
        out.append({"role": "system", "content": _string(block.get("text"), f"{where}.text")})
    return out


def _system_message(message: dict[str, Any], param: str, left: Ignored
                    ) -> list[dict[str, Any]]:
    """A ``system``-role message of ``messages``: its text, as for the top-level ``system``."""
    for key in message:
        if key not in ("role", "content"):
            left.drop(f"{param}.{clip(key, 64)}")
    if "content" not in message:
        raise _refuse(f"{param}.content", "field required")
    return _system(message["content"], f"{param}.content", left)


def _message(message: Any, param: str, left: Ignored) -> list[dict[str, Any]]:
    """One Messages turn as the chat messages it becomes (a user turn with tool results
    becomes a ``tool`` message per result, then the user message with the rest)."""
    message = _object(message, param)
    for key in message:
        if key not in ("role", "content"):
            left.drop(f"{param}.{clip(key, 64)}")
    role = message.get("role")
    if role not in ("user", "assistant"):
        raise _refuse(f"{param}.role", "must be 'user', 'assistant' or 'system'")
    if "content" not in message:
        raise _refuse(f"{param}.content", "field required")
    content = message["content"]
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    blocks = _array(content, f"{param}.content")
    if not blocks:
        raise _refuse(f"{param}.content", "must not be empty")
    if role == "assistant":
        return [_assistant(blocks, f"{param}.content", left)]
    return _user(blocks, f"{param}.content", left)


def _user(blocks: list[Any], param: str, left: Ignored) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        where = f"{param}[{j}]"
        kind = _block_type(block, where)
        _cached(block, left)
        if kind == "text":
            parts.append({"type": "text", "text": _string(block.get("text"), f"{where}.text")})
        elif kind == "image":
            image = _image(block, where, left)
            if image is not None:
                parts.append(image)
        elif kind == "tool_result":
            if parts:  # keep the order the client gave
                out.append({"role": "user", "content": parts})
                parts = []
            out.append(_tool_result(block, where, left))
        elif kind == "tool_use":
            raise _refuse(f"{where}.type", "'tool_use' blocks belong in assistant messages")
        else:
            left.refuse(_unsupported(kind, where, "user messages"))
    if parts:
        out.append({"role": "user", "content": parts})
    return out


def _assistant(blocks: list[Any], param: str, left: Ignored) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        where = f"{param}[{j}]"
        kind = _block_type(block, where)
        _cached(block, left)
        if kind == "text":
            texts.append(_string(block.get("text"), f"{where}.text"))
        elif kind == "tool_use":
            calls.append(_tool_call(block, where))
        elif kind in ("thinking", "redacted_thinking"):
            continue  # chat has no thinking input: dropped
        elif kind == "tool_result":
            raise _refuse(f"{where}.type", "'tool_result' blocks belong in user messages")
        else:
            left.refuse(_unsupported(kind, where, "assistant messages"))
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


def _tool_result(block: dict[str, Any], param: str, left: Ignored) -> dict[str, Any]:
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
            _cached(inner, left)
            if kind == "text":
                texts.append(_string(inner.get("text"), f"{where}.text"))
            elif kind == "image":
                left.refuse(_refuse(f"{where}.type", "images in a tool_result are not supported "
                                                     "when the backend speaks chat completions "
                                                     "(a chat tool message carries text only)"))
            else:
                left.refuse(_unsupported(kind, where, "a tool_result"))
        text = "\n".join(texts)
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise _refuse(f"{param}.is_error", f"must be a boolean, got {_kind(is_error)}")
    if is_error:
        text = ERROR_PREFIX + text
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _image(block: dict[str, Any], param: str, left: Ignored) -> dict[str, Any] | None:
    """An image block as a chat part (None: one chat cannot take, the refusal recorded)."""
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
        left.refuse(_refuse(f"{param}.source.type", "file sources (the Files API) are not "
                                                    "supported when the backend speaks chat "
                                                    "completions: send the image as 'base64' "
                                                    "or 'url'"))
        return None
    else:
        raise _refuse(f"{param}.source.type", "must be 'base64', 'url' or 'file'")
    return {"type": "image_url", "image_url": {"url": url}}


def _metadata_user(metadata: Any, left: Ignored) -> str | None:
    metadata = _object(metadata, "metadata")
    for key in metadata:
        if key != "user_id":
            left.drop(f"metadata.{clip(key, 64)}")
    user = metadata.get("user_id")
    return None if user is None else _string(user, "metadata.user_id")


def _effort(payload: dict[str, Any], chat: dict[str, Any], left: Ignored) -> str | None:
    """``output_config`` and ``thinking`` into chat (see the module docstring); the client
    field that set ``reasoning_effort``, if one did."""
    effort: str | None = None
    source: str | None = None
    config = payload.get("output_config")
    if config is not None:
        config = _object(config, "output_config")
        level = config.get("effort")
        if level is not None:
            if level not in _EFFORTS:
                raise _refuse("output_config.effort",
                              "must be one of 'low', 'medium', 'high', 'xhigh' or 'max'")
            effort, source = _EFFORTS[level], "output_config.effort"
        if config.get("format") is not None:
            chat["response_format"] = _format(config["format"])
        for key, value in config.items():
            if key not in ("effort", "format") and not _empty(value):
                left.drop(f"output_config.{clip(key, 64)}")
    thinking = payload.get("thinking")
    if thinking is not None:
        thinking = _object(thinking, "thinking")
        kind = thinking.get("type")
        if kind == "enabled":
            budget = _positive_int(thinking.get("budget_tokens"), "thinking.budget_tokens")
            if effort is None:
                effort = next((e for bound, e in _BUDGETS if budget < bound), "high")
                source = "thinking"
        elif kind == "disabled":
            left.drop("thinking")  # a chat model that thinks by default still does
        elif kind not in _MODEL_DECIDES:
            raise _refuse("thinking.type",
                          "must be 'enabled', 'adaptive', 'between_tools' or 'disabled'")
    if effort is not None:
        chat["reasoning_effort"] = effort
    return source


def _format(fmt: Any) -> dict[str, Any]:
    """``output_config.format`` as a chat ``response_format``."""
    fmt = _object(fmt, "output_config.format")
    if fmt.get("type") != "json_schema":
        raise _refuse("output_config.format.type", "must be 'json_schema'")
    schema = _object(fmt.get("schema"), "output_config.format.schema")
    return {"type": "json_schema", "json_schema": {"name": _SCHEMA_NAME, "schema": schema}}


def _tool(tool: Any, param: str, left: Ignored, names: dict[str, bool]
          ) -> dict[str, Any] | None:
    """A custom tool as a chat function (None: a server or Anthropic-defined tool, dropped);
    ``names`` gets its name, and whether chat was offered it."""
    tool = _object(tool, param)
    kind = tool.get("type")
    _cached(tool, left)
    if tool.get("defer_loading") is True:
        # loaded only through Anthropic's tool search, which chat has not: not offered (a
        # chat model would call it as an ordinary function)
        name = tool.get("name")
        if isinstance(name, str):
            names[name] = False
        left.drop(param)
        return None
    if kind not in (None, "custom"):
        if not isinstance(kind, str):
            raise _refuse(f"{param}.type", "must be a string")
        name = tool.get("name")
        if isinstance(name, str):
            names[name] = False
        left.drop(param)
        return None
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
    names[name] = True
    return {"type": "function", "function": function}


def _tool_choice(choice: Any, chat: dict[str, Any], names: dict[str, bool],
                 left: Ignored) -> None:
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
        if names.get(name) is False:  # a tool the translation dropped
            left.drop("tool_choice")
            return
        translated = {"type": "function", "function": {"name": name}}
    else:
        raise _refuse("tool_choice.type", "must be 'auto', 'any', 'tool' or 'none'")
    parallel = choice.get("disable_parallel_tool_use")
    if parallel is not None and not isinstance(parallel, bool):
        raise _refuse("tool_choice.disable_parallel_tool_use", "must be a boolean")
    if "tools" not in chat:
        if kind in ("any", "tool"):
            if names:  # every tool was dropped: so is the choice among them
                left.drop("tool_choice")
                return
            raise _refuse("tool_choice", f"'{kind}' needs 'tools'")
        return  # auto / none without tools: nothing to choose from
    chat["tool_choice"] = translated
    if parallel and kind != "none":
        chat["parallel_tool_calls"] = False

