"""A Responses request checked in the API's own shape and translated to chat completions.

The gateway counts, classifies, admits and routes chat completions requests, so every
``POST /v1/responses`` becomes one (``to_chat``), whether or not the backend speaks Responses:

* ``instructions`` -> a ``system`` message first; then ``earlier`` (the chat messages of the
  stored conversation a ``previous_response_id`` continues: history for the split); then
  ``input``: a string (one user message) or items: ``message`` (roles user, assistant, system,
  developer -> system), ``function_call`` and ``custom_tool_call`` (an assistant ``tool_calls``
  entry; a custom call's ``input`` as the arguments ``{"input": ...}``: consecutive calls and
  the assistant message before them are one chat message, as chat wants),
  ``function_call_output`` and ``custom_tool_call_output`` (a ``tool`` message). ``reasoning``
  items are dropped unnamed: a chat backend has nowhere to take them back (the model
  re-reasons).
* content parts: ``input_text`` / ``output_text`` / ``refusal`` are text; a content of text only
  becomes a string (what every chat backend accepts for every role); ``input_image`` with an
  ``image_url`` (a URL or a data URL) becomes a chat ``image_url`` part (user messages only, as
  in chat).
* ``tools``: function tools; ``custom`` tools (Codex's ``apply_patch``: free-form text input)
  as chat functions of one string parameter, ``{"input": ...}`` (``custom_parameters``), whose
  calls the answer turns back into ``custom_tool_call`` items (``answer.custom_tool_names``);
  ``tool_choice`` auto / none / required / one named function or custom tool;
  ``parallel_tool_calls`` (sent only with tools, as chat requires); ``max_output_tokens`` ->
  ``max_tokens``; ``temperature``, ``top_p``, ``user`` (else ``safety_identifier``);
  ``text.format`` ``json_schema`` / ``json_object`` -> ``response_format``;
  ``reasoning.effort`` -> ``reasoning_effort``.
* ``stream`` -> chat ``stream`` with ``stream_options.include_usage``: the stream translator needs
  the backend's usage for ``response.completed``.
* honoured by the gateway itself: ``store`` (``false``: nothing stored), ``metadata`` (echoed),
  ``previous_response_id`` (the stored conversation).

What chat cannot express follows the rule of ``dialects.ignored``: when translated, dropped and
named in ``x-gateway-ignored`` (passed through untouched otherwise):

* dropped: ``include`` (``reasoning.encrypted_content`` and the rest: the gateway adds nothing
  to its answer), ``reasoning.summary``, ``text.verbosity``, ``prompt_cache_key`` and the
  other cache, tier and hint fields (``prompt_cache_retention``, ``prompt_cache_options``,
  ``service_tier``, ``max_tool_calls``, ``top_logprobs``, ``truncation: auto``,
  ``stream_options``), ``context_management``, ``client_metadata`` (Codex) and any parameter
  the API does not have; a custom tool's input ``format`` other than ``text`` (a ``grammar``:
  chat cannot constrain the arguments to it; ``tools[i].format``: the tool is still offered);
  hosted and built-in tools (``web_search``, ``local_shell``, ``shell``, ``apply_patch``,
  ``mcp``, ... : ``tools[i]``) and a ``tool_choice`` naming one or choosing a subset
  (``allowed_tools``);
* refused when translated (a 400 naming the field): what would change what is safe
  (``moderation``) or what the model is asked (``background``, ``conversation``, ``prompt``
  templates, ``item_reference`` and hosted-tool items, file and audio parts, images by
  ``file_id``).

Its inverse for the common subset (``to_responses``) is a test helper,
``tests/dialects/inverse_responses.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from gateway.dialects.base import Translated
from gateway.dialects.ignored import Ignored
from gateway.errors import InvalidRequest, clip

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

__all__ = ["REASONING_EFFORTS", "custom_parameters", "to_chat"]

#: parameters translated, checked or honoured by the gateway (see the module docstring); any
#: other is dropped or refused (``_leftover``)
_FIELDS = frozenset({
    "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls",
    "max_output_tokens", "temperature", "top_p", "user", "metadata", "stream", "store",
    "previous_response_id", "reasoning", "text", "truncation", "include", "top_logprobs",
    "safety_identifier",
})

#: parameters the gateway cannot honour through chat completions and may not drop: refused
#: when translated, unless null / false
_REFUSED = {
    "background": "background responses are not supported when the backend speaks chat "
                  "completions",
    "conversation": "the Conversations API is not served: use previous_response_id",
    "prompt": "prompt templates are not served: send instructions and input",
    "moderation": "moderated responses are not supported when the backend speaks chat "
                  "completions",
}

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
_METADATA_PAIRS, _METADATA_KEY, _METADATA_VALUE = 16, 64, 512
_encode = msgspec.json.encode

#: what the one chat parameter of a custom tool holds
_CUSTOM_INPUT = "The raw free-form input of the tool, as plain text (not JSON)."


def custom_parameters() -> dict[str, Any]:
    """The chat parameters of a custom tool: its free-form input as one string (a custom call
    in the input is sent back as these arguments, ``_custom_call``). A new object for each
    request, as the chat payload is the request's own."""
    return {"type": "object",
            "properties": {"input": {"type": "string", "description": _CUSTOM_INPUT}},
            "required": ["input"], "additionalProperties": False}


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


def _empty(value: Any) -> bool:
    """A value that sets nothing: null, false, an empty array or object."""
    return value is None or value is False or value == [] or value == {}


def to_chat(payload: Mapping[str, Any], earlier: Sequence[dict[str, Any]] | None = None
            ) -> Translated:
    """The chat completions request for a Responses request (see the module docstring)."""
    keys = payload.keys()
    left = Ignored()
    if not keys <= _FIELDS:  # (set operations on the keys: most requests pass both at once)
        for key in keys:
            if key not in _FIELDS:
                _leftover(str(key), payload[key], left)
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
    own = _input_messages(payload["input"], left)
    if not own and left.refusal is None:
        raise _bad("'input' must not be empty", "input")
    messages.extend(own)
    chat["messages"] = messages

    tools = payload.get("tools")
    names: dict[str, bool] = {}  # tool name -> offered to chat (False: dropped)
    if tools is not None:
        custom: set[str] = set()  # the custom tools' names
        chat_tools = [t for i, tool in enumerate(_array(tools, "tools"))
                      if (t := _tool(tool, f"tools[{i}]", left, names, custom)) is not None]
        if chat_tools:
            chat["tools"] = chat_tools
    choice = payload.get("tool_choice")
    if choice is not None:
        # every tool dropped (a hosted tool may have no name): chat gets none to choose from
        none_offered = bool(tools) and "tools" not in chat
        chosen = _tool_choice(choice, names, none_offered, left)
        if chosen is not None:
            chat["tool_choice"] = chosen
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
        _check_echoed(payload, chat, left)
    elif payload.get("store") is not None:  # the one ``_check_echoed`` would check
        _boolean(payload["store"], "store")
    _text(payload.get("text"), chat, left)
    effort = _reasoning(payload.get("reasoning"), chat, left)

    stream = payload.get("stream")
    if stream is not None and _boolean(stream, "stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return Translated(chat=chat, model=model, stream=bool(stream),
                      max_output=max_output if isinstance(max_output, int) else None,
                      ignored=left.dropped(), refusal=left.refusal, effort=effort)


def _leftover(key: str, value: Any, left: Ignored) -> None:
    """A parameter chat has no place for: refused when translated (``_REFUSED``), else
    dropped and named. One that sets nothing (null, false, empty) is neither."""
    if _empty(value):
        return
    why = _REFUSED.get(key)
    if why is not None:
        left.refuse(_bad(f"'{key}': {why}", key))
    else:
        left.drop(clip(key, 64))


def _input_messages(value: Any, left: Ignored) -> list[dict[str, Any]]:
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
            messages.append(_message(item, param, left))
        elif kind == "function_call":
            _attach_call(messages, _function_call(item, param))
        elif kind == "function_call_output":
            messages.append(_call_output(item, param))
        elif kind == "custom_tool_call":
            _attach_call(messages, _custom_call(item, param))
        elif kind == "custom_tool_call_output":
            messages.append(_call_output(item, param))
        elif kind == "reasoning":
            continue  # model-internal: a chat backend cannot take it back
        elif kind == "item_reference":
            left.refuse(_bad(f"'{param}': item references are not supported: send the item "
                             "itself or continue with previous_response_id", f"{param}.type"))
        else:
            left.refuse(_bad(f"'{param}.type' {clip(str(kind), 64)!r} is not supported when "
                             "the backend speaks chat completions: input items are message, "
                             "function_call(_output) and custom_tool_call(_output)",
                             f"{param}.type"))
    return messages


def _message(item: dict[str, Any], param: str, left: Ignored) -> dict[str, Any]:
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
    return {"role": _ROLES[role], "content": _content(content, role, f"{param}.content", left)}


def _content(parts: list[Any], role: str, param: str, left: Ignored
             ) -> str | list[dict[str, Any]]:
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
            image = _image(part, role, where, left)
            if image is not None:
                chat_parts.append(image)
                images = True
        elif kind in ("input_file", "input_audio"):
            left.refuse(_bad(f"'{where}': {kind} parts are not supported when the backend "
                             "speaks chat completions: send text or input_image",
                             f"{where}.type"))
        else:
            left.refuse(_bad(f"'{where}.type' {clip(str(kind), 64)!r} is not supported: "
                             "content parts are input_text, output_text and input_image",
                             f"{where}.type"))
    if images:
        return chat_parts
    return "".join(p["text"] for p in chat_parts)


def _image(part: dict[str, Any], role: str, where: str, left: Ignored
           ) -> dict[str, Any] | None:
    if role != "user":
        raise _bad(f"'{where}': images are accepted in user messages only", f"{where}.type")
    url = part.get("image_url")
    if url is None:
        left.refuse(_bad(f"'{where}': an input_image needs image_url (a URL or a data URL) "
                         "when the backend speaks chat completions; images by file_id are "
                         "not supported", f"{where}.image_url"))
        return None
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


def _custom_call(item: dict[str, Any], param: str) -> dict[str, Any]:
    """A custom tool's call: its free-form ``input`` as the arguments ``{"input": ...}``."""
    call_id = _string(item.get("call_id"), f"{param}.call_id")
    name = _string(item.get("name"), f"{param}.name")
    arguments = _encode({"input": _string(item.get("input"), f"{param}.input")}).decode()
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


def _tool(tool: Any, param: str, left: Ignored, names: dict[str, bool], custom: set[str]
          ) -> dict[str, Any] | None:
    """A function or custom tool as a chat tool (None: another type, dropped); ``names`` gets
    its name, and whether chat was offered it; ``custom`` the names of custom tools."""
    tool = _object(tool, param)
    kind = tool.get("type")
    if kind != "function" and kind != "custom":
        if not isinstance(kind, str):
            raise _bad(f"'{param}.type' is required and must be a string", f"{param}.type")
        name = tool.get("name")
        if isinstance(name, str):
            names[name] = False
        left.drop(param)
        return None
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise _bad(f"'{param}.name' is required and must be a non-empty string", f"{param}.name")
    if names.get(name) and (kind == "custom" or name in custom):
        # the answer tells a custom tool's calls from a function's by the name alone
        raise _bad(f"'{param}.name' {clip(name, 64)!r} names another tool of the request: a "
                   "custom tool's name must be its own", f"{param}.name")
    function: dict[str, Any] = {"name": name}
    description = tool.get("description")
    if description is not None:
        function["description"] = _string(description, f"{param}.description")
    if kind == "custom":
        _custom_format(tool.get("format"), f"{param}.format", left)
        function["parameters"] = custom_parameters()
        names[name] = True
        custom.add(name)
        return {"type": "function", "function": function}
    parameters = tool.get("parameters")
    if parameters is not None:
        function["parameters"] = _object(parameters, f"{param}.parameters")
    strict = tool.get("strict")
    if strict is not None:
        function["strict"] = _boolean(strict, f"{param}.strict")
    names[name] = True
    return {"type": "function", "function": function}


def _custom_format(fmt: Any, param: str, left: Ignored) -> None:
    """A custom tool's input ``format``: ``text`` (the default) is what chat's string
    parameter takes; any other (a ``grammar``, Lark or regex) chat cannot constrain the
    arguments to: the tool is offered without it, and the format is named."""
    if fmt is None:
        return
    fmt = _object(fmt, param)
    kind = fmt.get("type")
    if not isinstance(kind, str):
        raise _bad(f"'{param}.type' is required and must be a string", f"{param}.type")
    if kind == "text":
        return
    if kind == "grammar":
        _string(fmt.get("syntax"), f"{param}.syntax")
        _string(fmt.get("definition"), f"{param}.definition")
    left.drop(param)


def _tool_choice(choice: Any, names: dict[str, bool], none_offered: bool, left: Ignored
                 ) -> str | dict[str, Any] | None:
    """The chat ``tool_choice`` (None: it chose among dropped tools, so it is dropped too); a
    named function or custom tool is chat's named function."""
    if isinstance(choice, str):
        mode = _one_of(choice, _TOOL_CHOICES, "tool_choice")
        if none_offered:  # every tool was dropped: chat gets none to choose from
            if mode == "required":
                left.drop("tool_choice")
            return None
        return mode
    choice = _object(choice, "tool_choice")
    kind = choice.get("type")
    if kind != "function" and kind != "custom":
        if not isinstance(kind, str):
            raise _bad("'tool_choice.type' must be a string", "tool_choice.type")
        left.drop("tool_choice")  # a hosted tool, or a subset (allowed_tools)
        return None
    name = _string(choice.get("name"), "tool_choice.name")
    known = names.get(name)
    if known is None:
        raise _bad(f"'tool_choice.name' {clip(name, 64)!r} is not one of the request's tools",
                   "tool_choice.name")
    if not known:
        left.drop("tool_choice")
        return None
    return {"type": "function", "function": {"name": name}}


def _check_echoed(payload: Mapping[str, Any], chat: dict[str, Any], left: Ignored) -> None:
    """Fields honoured, echoed or dropped, checked so a bad one is a 400 rather than a bad
    echo; those chat cannot honour are named (``include``, ``top_logprobs``, ``truncation:
    auto``), and ``safety_identifier`` is chat's ``user`` when the request has none."""
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
    safety = payload.get("safety_identifier")
    if safety is not None and "user" not in chat:
        chat["user"] = safety
    elif safety is not None:
        left.drop("safety_identifier")
    truncation = payload.get("truncation")
    if truncation is not None and _one_of(truncation, _TRUNCATION, "truncation") == "auto":
        left.drop("truncation")
    include = payload.get("include")
    if include is not None:
        for i, value in enumerate(_array(include, "include")):
            _string(value, f"include[{i}]")
        if include:
            left.drop("include")
    top_logprobs = payload.get("top_logprobs")
    if top_logprobs is not None:
        if isinstance(top_logprobs, bool) or not isinstance(top_logprobs, int):
            raise _bad("'top_logprobs' must be an integer", "top_logprobs")
        if top_logprobs:
            left.drop("top_logprobs")
    max_calls = payload.get("max_tool_calls")
    if max_calls is not None and (isinstance(max_calls, bool) or not isinstance(max_calls, int)):
        raise _bad("'max_tool_calls' must be an integer", "max_tool_calls")
    for key in ("stream_options", "prompt_cache_options"):
        if payload.get(key) is not None:
            _object(payload[key], key)


def _text(text: Any, chat: dict[str, Any], left: Ignored) -> None:
    """``text.format`` -> ``response_format``; ``verbosity`` is echoed and named."""
    if text is None:
        return
    text = _object(text, "text")
    for key, value in text.items():
        if key == "verbosity":
            if value is not None:
                _one_of(value, _VERBOSITY, "text.verbosity")
                left.drop("text.verbosity")
        elif key != "format" and not _empty(value):
            left.drop(f"text.{clip(str(key), 64)}")
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


def _reasoning(reasoning: Any, chat: dict[str, Any], left: Ignored) -> str | None:
    """``reasoning.effort`` -> ``reasoning_effort`` (returns the field's name when set); a
    summary is never produced (the gateway returns the backend's reasoning text as a
    ``reasoning`` item instead), so ``summary`` is echoed and named."""
    if reasoning is None:
        return None
    reasoning = _object(reasoning, "reasoning")
    for key, value in reasoning.items():
        if key != "effort" and value is not None:
            left.drop(f"reasoning.{clip(str(key), 64)}")
    effort = reasoning.get("effort")
    if effort is None:
        return None
    chat["reasoning_effort"] = _one_of(effort, REASONING_EFFORTS, "reasoning.effort")
    return "reasoning.effort"
