"""A Responses request checked in the API's own shape and translated to chat completions.

The gateway counts, classifies, admits and routes chat completions requests, so every
``POST /v1/responses`` becomes one (``to_chat``), whether or not the backend speaks Responses:

* ``instructions`` -> a ``system`` message first; then ``earlier`` (the chat messages of the
  stored conversation a ``previous_response_id`` continues: history for the split); then
  ``input``: a string (one user message) or items: ``message`` (roles user, assistant, system,
  developer -> system), ``function_call`` (an assistant ``tool_calls`` entry: consecutive calls
  and the assistant message before them are one chat message, as chat wants) and
  ``function_call_output`` (a ``tool`` message). ``reasoning`` items are dropped: a chat backend
  has nowhere to take them back (the model re-reasons).
* content parts: ``input_text`` / ``output_text`` / ``refusal`` are text; a content of text only
  becomes a string (what every chat backend accepts for every role); ``input_image`` with an
  ``image_url`` (a URL or a data URL) becomes a chat ``image_url`` part (user messages only, as
  in chat); an image by ``file_id``, files and audio are refused.
* ``tools``: function tools only; ``tool_choice`` auto / none / required / one named function;
  ``parallel_tool_calls`` (sent only with tools, as chat requires); ``max_output_tokens`` ->
  ``max_tokens``; ``temperature``, ``top_p``, ``user``; ``text.format`` ``json_schema`` /
  ``json_object`` -> ``response_format``; ``reasoning.effort`` -> ``reasoning_effort``.
* ``stream`` -> chat ``stream`` with ``stream_options.include_usage``: the stream translator needs
  the backend's usage for ``response.completed``.
* kept for the answer's echo, not sent: ``metadata``, ``store``, ``previous_response_id``,
  ``truncation``, ``text.verbosity``, ``reasoning.summary``, ``include`` and the cache, tier and
  safety hints (``prompt_cache_key``, ``service_tier``, ...), which a chat backend has no use for.
* refused with a 400 naming the field: what the gateway cannot do through chat (``background``,
  ``conversation``, ``prompt`` templates, hosted tools, item references, logprobs, ...) and any
  parameter the API does not have (as OpenAI answers: ``Unknown parameter``).

``to_responses`` is the inverse for the common subset (a chat request as a Responses request),
for the property tests and for tools that replay chat traffic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.apis.base import Translated
from gateway.errors import InvalidRequest, clip

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

__all__ = ["REASONING_EFFORTS", "to_chat", "to_responses"]

#: parameters translated or echoed (see the module docstring)
_FIELDS = frozenset({
    "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls",
    "max_output_tokens", "temperature", "top_p", "user", "metadata", "stream", "stream_options",
    "store", "previous_response_id", "reasoning", "text", "truncation", "include",
    "top_logprobs", "max_tool_calls", "prompt_cache_key", "prompt_cache_retention",
    "prompt_cache_options", "safety_identifier", "service_tier",
    # refused unless null or false (``_REFUSED``)
    "background", "background_options", "conversation", "prompt", "context_management",
    "moderation", "image", "access_programs",
})

#: parameters the gateway cannot honour through chat completions: refused unless null / false
_REFUSED = {
    "background": "background responses are not supported",
    "background_options": "background responses are not supported",
    "conversation": "the Conversations API is not served: use previous_response_id",
    "prompt": "prompt templates are not served: send instructions and input",
    "context_management": "context management (compaction) is not supported",
    "moderation": "moderated responses are not supported",
    "image": "image context options are not supported",
    "access_programs": "access programs are not supported",
}

_REFUSED_KEYS = frozenset(_REFUSED)
#: the fields ``_check_echoed`` checks but ``store`` (a request with none of them skips it)
_CHECKED = frozenset({
    "metadata", "previous_response_id", "prompt_cache_key", "safety_identifier",
    "service_tier", "prompt_cache_retention", "truncation", "include", "top_logprobs",
    "max_tool_calls", "stream_options", "prompt_cache_options",
})

#: ``reasoning.effort`` values (sent as chat ``reasoning_effort``)
REASONING_EFFORTS = frozenset({"none", "minimal", "low", "medium", "high", "xhigh", "max"})
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = frozenset({"input_text", "output_text"})
_IMAGE_DETAIL = {"low": "low", "high": "high", "auto": "auto", "original": "high"}
_TOOL_CHOICES = frozenset({"auto", "none", "required"})
_TRUNCATION = frozenset({"auto", "disabled"})
_VERBOSITY = frozenset({"low", "medium", "high"})
#: the one ``include`` value that would need a translation the gateway does not make
_LOGPROBS_INCLUDE = "message.output_text.logprobs"
_METADATA_PAIRS, _METADATA_KEY, _METADATA_VALUE = 16, 64, 512


def _bad(message: str, param: str, code: str | None = None) -> InvalidRequest:
    return InvalidRequest(message, param=param, code=code)


def _string(value: Any, param: str) -> str:
    if not isinstance(value, str):
        raise _bad(f"'{param}' must be a string", param)
    return value


def _boolean(value: Any, param: str) -> bool:
    if not isinstance(value, bool):
        raise _bad(f"'{param}' must be a boolean", param)
    return value


def _number(value: Any, param: str, low: float, high: float) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(f"'{param}' must be a number", param)
    if not low <= value <= high:
        raise _bad(f"'{param}' must be between {low:g} and {high:g}", param)
    return value


def _object(value: Any, param: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(f"'{param}' must be an object", param)
    return value


def _array(value: Any, param: str) -> list[Any]:
    if not isinstance(value, list):
        raise _bad(f"'{param}' must be an array", param)
    return value


def _one_of(value: Any, allowed: frozenset[str], param: str) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise _bad(f"'{param}' must be one of {', '.join(sorted(allowed))}", param)
    return value


def to_chat(payload: Mapping[str, Any], earlier: Sequence[dict[str, Any]] | None = None
            ) -> Translated:
    """The chat completions request for a Responses request (see the module docstring)."""
    keys = payload.keys()
    if not keys <= _FIELDS:  # (set operations on the keys: most requests pass both at once)
        for key in keys:
            if key not in _FIELDS:
                raise _bad(f"Unknown parameter: '{clip(str(key), 64)}'.", str(key),
                           "unknown_parameter")
    if not _REFUSED_KEYS.isdisjoint(keys):
        for key, why in _REFUSED.items():
            if payload.get(key) not in (None, False):
                raise _bad(f"'{key}': {why}", key)
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("'model' is required and must be a non-empty string", "model")
    chat: dict[str, Any] = {"model": model}

    messages: list[dict[str, Any]] = []
    instructions = payload.get("instructions")
    if instructions is not None:
        messages.append({"role": "system", "content": _string(instructions, "instructions")})
    if earlier:
        messages.extend(earlier)
    if "input" not in payload:
        raise _bad("Missing required parameter: 'input'.", "input", "missing_required_parameter")
    own = _input_messages(payload["input"])
    if not own:
        raise _bad("'input' must not be empty", "input")
    messages.extend(own)
    chat["messages"] = messages

    tools = payload.get("tools")
    names: set[str] = set()
    if tools is not None:
        chat_tools = [_tool(t, f"tools[{i}]") for i, t in enumerate(_array(tools, "tools"))]
        names = {t["function"]["name"] for t in chat_tools}
        if chat_tools:
            chat["tools"] = chat_tools
    choice = payload.get("tool_choice")
    if choice is not None:
        chat["tool_choice"] = _tool_choice(choice, names)
    parallel = payload.get("parallel_tool_calls")
    if parallel is not None:
        _boolean(parallel, "parallel_tool_calls")
        if "tools" in chat:
            chat["parallel_tool_calls"] = parallel

    max_output = payload.get("max_output_tokens")
    if max_output is not None:
        if isinstance(max_output, bool) or not isinstance(max_output, int) or max_output < 1:
            raise _bad("'max_output_tokens' must be a positive integer", "max_output_tokens")
        chat["max_tokens"] = max_output
    for key, high in (("temperature", 2.0), ("top_p", 1.0)):
        value = payload.get(key)
        if value is not None:
            chat[key] = _number(value, key, 0.0, high)
    user = payload.get("user")
    if user is not None:
        chat["user"] = _string(user, "user")
    if not _CHECKED.isdisjoint(keys):
        _check_echoed(payload)
    elif payload.get("store") is not None:  # the one ``_check_echoed`` would check
        _boolean(payload["store"], "store")
    _text(payload.get("text"), chat)
    _reasoning(payload.get("reasoning"), chat)

    stream = payload.get("stream")
    if stream is not None and _boolean(stream, "stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return Translated(chat=chat, model=model, stream=bool(stream),
                      max_output=max_output if isinstance(max_output, int) else None)


def _input_messages(value: Any) -> list[dict[str, Any]]:
    """The chat messages of ``input``."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise _bad("'input' must be a string or an array of input items", "input")
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        param = f"input[{i}]"
        if not isinstance(item, dict):
            raise _bad(f"'{param}' must be an object", param)
        kind = item.get("type")
        if kind is None and "role" in item:
            kind = "message"
        if kind == "message":
            messages.append(_message(item, param))
        elif kind == "function_call":
            _attach_call(messages, _function_call(item, param))
        elif kind == "function_call_output":
            messages.append(_call_output(item, param))
        elif kind == "reasoning":
            continue  # model-internal: a chat backend cannot take it back
        elif kind == "item_reference":
            raise _bad(f"'{param}': item references are not supported: send the item itself "
                       "or continue with previous_response_id", f"{param}.type")
        else:
            raise _bad(f"'{param}.type' {clip(str(kind), 64)!r} is not supported: input items "
                       "are message, function_call and function_call_output", f"{param}.type")
    return messages


def _message(item: dict[str, Any], param: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in _ROLES:
        raise _bad(f"'{param}.role' must be one of assistant, developer, system, user",
                   f"{param}.role")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": _ROLES[role], "content": content}
    if not isinstance(content, list):
        raise _bad(f"'{param}.content' must be a string or an array of content parts",
                   f"{param}.content")
    return {"role": _ROLES[role], "content": _content(content, role, f"{param}.content")}


def _content(parts: list[Any], role: str, param: str) -> str | list[dict[str, Any]]:
    """Chat content of a message's parts: a string when they are all text, else chat parts."""
    chat_parts: list[dict[str, Any]] = []
    images = False
    for j, part in enumerate(parts):
        where = f"{param}[{j}]"
        if not isinstance(part, dict):
            raise _bad(f"'{where}' must be an object", where)
        kind = part.get("type")
        if kind in _TEXT_PARTS:
            chat_parts.append({"type": "text", "text": _string(part.get("text"), f"{where}.text")})
        elif kind == "refusal":
            text = _string(part.get("refusal"), f"{where}.refusal")
            chat_parts.append({"type": "text", "text": text})
        elif kind == "input_image":
            chat_parts.append(_image(part, role, where))
            images = True
        elif kind in ("input_file", "input_audio"):
            raise _bad(f"'{where}': {kind} parts are not supported: send text or input_image",
                       f"{where}.type")
        else:
            raise _bad(f"'{where}.type' {clip(str(kind), 64)!r} is not supported: content parts "
                       "are input_text, output_text and input_image", f"{where}.type")
    if images:
        return chat_parts
    return "".join(p["text"] for p in chat_parts)


def _image(part: dict[str, Any], role: str, where: str) -> dict[str, Any]:
    if role != "user":
        raise _bad(f"'{where}': images are accepted in user messages only", f"{where}.type")
    url = part.get("image_url")
    if url is None:
        raise _bad(f"'{where}': an input_image needs image_url (a URL or a data URL); images "
                   "by file_id are not supported", f"{where}.image_url")
    if not isinstance(url, str) or not url:
        raise _bad(f"'{where}.image_url' must be a non-empty string", f"{where}.image_url")
    detail = part.get("detail", "auto")
    if detail not in _IMAGE_DETAIL:
        raise _bad(f"'{where}.detail' must be one of auto, high, low, original",
                   f"{where}.detail")
    return {"type": "image_url", "image_url": {"url": url, "detail": _IMAGE_DETAIL[detail]}}


def _function_call(item: dict[str, Any], param: str) -> dict[str, Any]:
    call_id = _string(item.get("call_id"), f"{param}.call_id")
    name = _string(item.get("name"), f"{param}.name")
    arguments = _string(item.get("arguments"), f"{param}.arguments")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _attach_call(messages: list[dict[str, Any]], call: dict[str, Any]) -> None:
    """A call joins the assistant message just before it (chat has one assistant message per
    turn, its text and its calls), or starts one without text."""
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        last["tool_calls"] = [*last.get("tool_calls", ()), call]
        return
    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _call_output(item: dict[str, Any], param: str) -> dict[str, Any]:
    call_id = _string(item.get("call_id"), f"{param}.call_id")
    output = item.get("output")
    if isinstance(output, list):
        texts = []
        for j, part in enumerate(output):
            where = f"{param}.output[{j}]"
            if not isinstance(part, dict) or part.get("type") not in _TEXT_PARTS:
                raise _bad(f"'{where}': a function call output is text (input_text parts)",
                           f"{where}.type")
            texts.append(_string(part.get("text"), f"{where}.text"))
        output = "".join(texts)
    elif not isinstance(output, str):
        raise _bad(f"'{param}.output' must be a string or an array of input_text parts",
                   f"{param}.output")
    return {"role": "tool", "tool_call_id": call_id, "content": output}


def _tool(tool: Any, param: str) -> dict[str, Any]:
    tool = _object(tool, param)
    kind = tool.get("type")
    if kind != "function":
        raise _bad(f"'{param}.type' {clip(str(kind), 64)!r} is not supported: the gateway "
                   "serves function tools only", f"{param}.type")
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise _bad(f"'{param}.name' is required and must be a non-empty string", f"{param}.name")
    function: dict[str, Any] = {"name": name}
    description = tool.get("description")
    if description is not None:
        function["description"] = _string(description, f"{param}.description")
    parameters = tool.get("parameters")
    if parameters is not None:
        function["parameters"] = _object(parameters, f"{param}.parameters")
    strict = tool.get("strict")
    if strict is not None:
        function["strict"] = _boolean(strict, f"{param}.strict")
    return {"type": "function", "function": function}


def _tool_choice(choice: Any, names: set[str]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        return _one_of(choice, _TOOL_CHOICES, "tool_choice")
    choice = _object(choice, "tool_choice")
    if choice.get("type") != "function":
        raise _bad(f"'tool_choice.type' {clip(str(choice.get('type')), 64)!r} is not supported: "
                   "use auto, none, required or {\"type\": \"function\", \"name\": ...}",
                   "tool_choice.type")
    name = _string(choice.get("name"), "tool_choice.name")
    if name not in names:
        raise _bad(f"'tool_choice.name' {clip(name, 64)!r} is not one of the request's tools",
                   "tool_choice.name")
    return {"type": "function", "function": {"name": name}}


def _check_echoed(payload: Mapping[str, Any]) -> None:
    """Fields only echoed or ignored, checked so a bad one is a 400 rather than a bad echo."""
    metadata = payload.get("metadata")
    if metadata is not None:
        metadata = _object(metadata, "metadata")
        if len(metadata) > _METADATA_PAIRS:
            raise _bad(f"'metadata' has at most {_METADATA_PAIRS} pairs", "metadata")
        for key, value in metadata.items():
            if len(key) > _METADATA_KEY or not isinstance(value, str) or (
                    len(value) > _METADATA_VALUE):
                raise _bad(f"'metadata' keys are strings of at most {_METADATA_KEY} characters "
                           f"and values strings of at most {_METADATA_VALUE}", "metadata")
    if payload.get("store") is not None:
        _boolean(payload["store"], "store")
    for key in ("previous_response_id", "prompt_cache_key", "safety_identifier",
                "service_tier", "prompt_cache_retention"):
        if payload.get(key) is not None:
            _string(payload[key], key)
    truncation = payload.get("truncation")
    if truncation is not None:
        _one_of(truncation, _TRUNCATION, "truncation")
    include = payload.get("include")
    if include is not None:
        for i, value in enumerate(_array(include, "include")):
            if _string(value, f"include[{i}]") == _LOGPROBS_INCLUDE:
                raise _bad(f"'include[{i}]': logprobs are not returned by the gateway",
                           f"include[{i}]")
    top_logprobs = payload.get("top_logprobs")
    if top_logprobs not in (None, 0):
        raise _bad("'top_logprobs': logprobs are not returned by the gateway", "top_logprobs")
    max_calls = payload.get("max_tool_calls")
    if max_calls is not None and (isinstance(max_calls, bool) or not isinstance(max_calls, int)):
        raise _bad("'max_tool_calls' must be an integer", "max_tool_calls")
    for key in ("stream_options", "prompt_cache_options"):
        if payload.get(key) is not None:
            _object(payload[key], key)


def _text(text: Any, chat: dict[str, Any]) -> None:
    """``text.format`` -> ``response_format``; ``verbosity`` is only echoed."""
    if text is None:
        return
    text = _object(text, "text")
    verbosity = text.get("verbosity")
    if verbosity is not None:
        _one_of(verbosity, _VERBOSITY, "text.verbosity")
    fmt = text.get("format")
    if fmt is None:
        return
    fmt = _object(fmt, "text.format")
    kind = fmt.get("type")
    if kind == "text":
        return
    if kind == "json_object":
        chat["response_format"] = {"type": "json_object"}
        return
    if kind != "json_schema":
        raise _bad("'text.format.type' must be one of text, json_object, json_schema",
                   "text.format.type")
    name = fmt.get("name")
    if not isinstance(name, str) or not name:
        raise _bad("'text.format.name' is required and must be a non-empty string",
                   "text.format.name")
    schema: dict[str, Any] = {"name": name,
                              "schema": _object(fmt.get("schema"), "text.format.schema")}
    description = fmt.get("description")
    if description is not None:
        schema["description"] = _string(description, "text.format.description")
    strict = fmt.get("strict")
    if strict is not None:
        schema["strict"] = _boolean(strict, "text.format.strict")
    chat["response_format"] = {"type": "json_schema", "json_schema": schema}


def _reasoning(reasoning: Any, chat: dict[str, Any]) -> None:
    """``reasoning.effort`` -> ``reasoning_effort``; a summary is never produced (the gateway
    returns the backend's reasoning text as a ``reasoning`` item instead), so ``summary`` is
    only echoed."""
    if reasoning is None:
        return
    reasoning = _object(reasoning, "reasoning")
    effort = reasoning.get("effort")
    if effort is not None:
        chat["reasoning_effort"] = _one_of(effort, REASONING_EFFORTS, "reasoning.effort")


# -- the inverse, chat -> Responses ------------------------------------------------------------

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
