"""The Responses ``response`` object, built from a chat completions answer (and back).

One builder (``response_object``) makes every response the front-end writes: the non-streamed
answer, and the objects a stream carries in ``response.created`` / ``response.in_progress`` /
``response.completed`` (the stream writes their JSON from pieces of one ``response_object``, and
builds its ``final`` with it), so a stream's last event and the whole answer for the same chat
answer are the same object. Besides the output it echoes the request's settings, as OpenAI
does and as the SDK's ``Response`` model requires (``tools``, ``tool_choice``,
``parallel_tool_calls``, ...).

Output items from a chat answer, in this order: the backend's reasoning text
(``reasoning_content`` or ``reasoning``, as vLLM and DeepSeek send it) as a ``reasoning`` item
with a ``reasoning_text`` part; the assistant text (and a refusal) as one ``message`` item; each
tool call as a ``function_call`` item whose ``call_id`` is the chat tool call's id, or, when it
calls one of the request's ``custom`` tools (``custom_tool_names``: the request translation
offered each as a chat function of one string parameter, ``{"input": ...}``), a
``custom_tool_call`` item whose ``input`` is that string (``custom_input``). A message
item is written when there is text or a refusal, or when there is nothing else (an empty
answer is an empty message). Item ids are ``<kind>_<request id>_<output index>``, so the stream
and the whole answer name them alike. ``finish_reason`` ``length`` makes the response
``incomplete`` (reason ``max_output_tokens``; ``content_filter`` likewise), and its last item too.

Usage: the chat usage read by ``gateway.accounting.usage`` (one reading of the cache aliases,
clamped buckets), written in the Responses names; null when the backend sent none (the
gateway's own estimate is not known here).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.accounting.usage import usage_from_mapping

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gateway.accounting.usage import BackendUsage

__all__ = [
    "ECHOED",
    "INCOMPLETE",
    "chat_answer_from_response",
    "chat_usage",
    "custom_input",
    "custom_tool_call_item",
    "custom_tool_names",
    "function_call_item",
    "item_id",
    "message_item",
    "output_text",
    "reasoning_item",
    "response_id",
    "response_object",
    "responses_answer",
    "responses_usage",
    "text_part",
]

#: chat ``finish_reason`` -> the reason of an ``incomplete`` response
INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}
_FINISH = {"max_output_tokens": "length", "content_filter": "content_filter"}
_decode = msgspec.json.decode
_NO_NAMES: frozenset[str] = frozenset()


def response_id(request_id: str) -> str:
    """The response's id for the gateway's request id."""
    return f"resp_{request_id}"


def item_id(kind: str, request_id: str, index: int) -> str:
    """An output item's id: ``msg``, ``fc``, ``ctc`` or ``rs``, the request id, its output
    index."""
    return f"{kind}_{request_id}_{index}"


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def message_item(id_: str, parts: list[dict[str, Any]], status: str) -> dict[str, Any]:
    return {"id": id_, "type": "message", "status": status, "role": "assistant",
            "content": parts}


def function_call_item(id_: str, call_id: str, name: str, arguments: str, status: str
                       ) -> dict[str, Any]:
    return {"id": id_, "type": "function_call", "status": status, "arguments": arguments,
            "call_id": call_id, "name": name}


def custom_tool_call_item(id_: str, call_id: str, name: str, input_: str, status: str
                          ) -> dict[str, Any]:
    return {"id": id_, "type": "custom_tool_call", "status": status, "call_id": call_id,
            "input": input_, "name": name}


def custom_tool_names(request: Mapping[str, Any] | None) -> frozenset[str]:
    """The names of the request's ``custom`` tools: the chat functions whose calls are
    ``custom_tool_call`` items (the request translation refuses a custom tool whose name
    another tool has, so a name tells them apart). Read from the client's request, as the
    answer's echoed settings are."""
    tools = request.get("tools") if request is not None else None
    if not tools or not isinstance(tools, list):
        return _NO_NAMES
    return frozenset(tool["name"] for tool in tools
                     if isinstance(tool, dict) and tool.get("type") == "custom"
                     and isinstance(tool.get("name"), str))


def custom_input(arguments: str) -> str:
    """A custom tool's free-form input from the chat arguments it was called with: the string
    ``input`` of their JSON object, or the arguments as they are when they are not such an
    object (a model that answered with the bare text, arguments cut at the length limit)."""
    try:
        decoded = _decode(arguments)
    except msgspec.DecodeError:
        return arguments
    value = decoded.get("input") if isinstance(decoded, dict) else None
    return value if isinstance(value, str) else arguments


def reasoning_item(id_: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [{"type": "reasoning_text", "text": text}]
    return {"id": id_, "type": "reasoning", "summary": [], "content": content, "status": status}


def output_text(output: list[dict[str, Any]]) -> str:
    """The joined text of the output's messages (what the SDK's ``output_text`` computes)."""
    return "".join(part["text"] for item in output if item.get("type") == "message"
                   for part in item.get("content", ()) if part.get("type") == "output_text")


def responses_usage(usage: BackendUsage | None) -> dict[str, Any] | None:
    """Usage in the Responses names (the details are parts of the totals, as in chat)."""
    if usage is None:
        return None
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens,
                                 "cache_write_tokens": usage.cache_write_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.total_tokens or usage.prompt_tokens + usage.completion_tokens,
    }


def chat_usage(usage: Mapping[str, Any]) -> dict[str, Any]:
    """Responses usage in the chat names (the inverse of ``responses_usage``)."""
    details = usage.get("input_tokens_details") or {}
    out_details = usage.get("output_tokens_details") or {}
    return {
        "prompt_tokens": usage.get("input_tokens", 0),
        "completion_tokens": usage.get("output_tokens", 0),
        "total_tokens": usage.get("total_tokens", 0),
        "prompt_tokens_details": {"cached_tokens": details.get("cached_tokens", 0),
                                  "cache_write_tokens": details.get("cache_write_tokens", 0)},
        "completion_tokens_details": {"reasoning_tokens": out_details.get("reasoning_tokens", 0)},
    }


#: request fields echoed from something other than themselves, or with a default other than
#: None: a request with none of them (``model``, ``input``, ``max_output_tokens``, ``store``,
#: ``stream``: the usual short request) gets the defaults as they are, without reading each
ECHOED = frozenset({
    "instructions", "parallel_tool_calls", "previous_response_id", "reasoning", "temperature",
    "text", "tool_choice", "tools", "top_p", "truncation", "user", "metadata",
})
_NO_REQUEST: Mapping[str, Any] = {}
#: a ``response``'s keys in OpenAI's order, with the values that are the same in every response
#: (and the defaults of the echoed settings that are immutable): ``response_object`` copies it
#: and sets the rest, which keeps the order (a key set again keeps its place) and costs half
#: as much as writing the whole object out
_TEMPLATE: dict[str, Any] = {
    "id": None, "object": "response", "created_at": None, "status": None,
    "background": False, "error": None, "incomplete_details": None, "instructions": None,
    "max_output_tokens": None, "model": None, "output": None, "output_text": None,
    "parallel_tool_calls": True, "previous_response_id": None, "reasoning": None,
    "store": True, "temperature": 1.0, "text": None, "tool_choice": "auto", "tools": None,
    "top_p": 1.0, "truncation": "disabled", "usage": None, "user": None, "metadata": None,
}


def response_object(
    *,
    request_id: str,
    model: str,
    created_at: int,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    request: Mapping[str, Any] | None,
    incomplete: str | None = None,
    text: str | None = None,
) -> dict[str, Any]:
    """A ``response`` with the request's settings echoed (defaults when ``request`` is None).

    ``text``: the output's ``output_text`` when the caller knows it (else joined from
    ``output``). The nested defaults are new objects each time, as a caller may change its
    response; the request's settings are read only when it has one (``ECHOED``) besides
    ``max_output_tokens`` and ``store``.
    """
    req = request if request is not None else _NO_REQUEST
    response = _TEMPLATE.copy()
    response["id"] = "resp_" + request_id
    response["created_at"] = created_at
    response["status"] = status
    if incomplete is not None:
        response["incomplete_details"] = {"reason": incomplete}
    response["max_output_tokens"] = req.get("max_output_tokens")
    response["model"] = model
    response["output"] = output
    response["output_text"] = output_text(output) if text is None else text
    response["reasoning"] = {"effort": None, "summary": None}
    response["store"] = req.get("store", True)
    response["text"] = {"format": {"type": "text"}}
    response["tools"] = []
    response["usage"] = usage
    response["metadata"] = {}
    if not ECHOED.isdisjoint(req):
        _echo(req, response)
    return response


def _echo(req: Mapping[str, Any], response: dict[str, Any]) -> None:
    """The request's settings over the defaults ``response_object`` wrote."""
    text = req.get("text") or {}
    reasoning = req.get("reasoning") or {}
    text_echo: dict[str, Any] = {"format": text.get("format") or {"type": "text"}}
    if text.get("verbosity") is not None:
        text_echo["verbosity"] = text["verbosity"]
    response["instructions"] = req.get("instructions")
    response["parallel_tool_calls"] = req.get("parallel_tool_calls", True)
    response["previous_response_id"] = req.get("previous_response_id")
    response["reasoning"] = {"effort": reasoning.get("effort"),
                             "summary": reasoning.get("summary")}
    response["temperature"] = req.get("temperature", 1.0)
    response["text"] = text_echo
    response["tool_choice"] = req.get("tool_choice", "auto")
    response["tools"] = req.get("tools") or []
    response["top_p"] = req.get("top_p", 1.0)
    response["truncation"] = req.get("truncation") or "disabled"
    response["user"] = req.get("user")
    response["metadata"] = req.get("metadata") or {}


def _text_of(content: Any) -> str:
    """A chat message's text: a string, or the text of its parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _arguments(value: Any) -> str:
    if isinstance(value, str):
        return value
    return "" if value is None else msgspec.json.encode(value).decode()


#: a chat ``usage`` of the three totals alone (as vLLM, llama.cpp and the fixtures send it)
_TOTALS = frozenset({"prompt_tokens", "completion_tokens", "total_tokens"})


def _answer_usage(raw: Any) -> dict[str, Any] | None:
    """A chat answer's usage in the Responses names. Three non-negative integer totals
    (details absent) need none of ``gateway.accounting.usage``'s reconciling of aliases and
    buckets, which would give them back as they are with every detail 0: they are written
    directly; any other usage goes through it."""
    if type(raw) is not dict:
        return None
    if raw.keys() == _TOTALS:
        prompt, completion, total = (raw["prompt_tokens"], raw["completion_tokens"],
                                     raw["total_tokens"])
        if (type(prompt) is int and type(completion) is int and type(total) is int
                and prompt >= 0 and completion >= 0 and total >= 0):
            return {
                "input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                "output_tokens": completion,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": total or prompt + completion,
            }
    return responses_usage(usage_from_mapping(raw, "openai"))


def responses_answer(chat: Mapping[str, Any], *, model: str, request_id: str,
                     request: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``response`` for a non-streamed chat completions answer."""
    choices = chat.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") or {}
    incomplete = INCOMPLETE.get(str(choice.get("finish_reason")))
    output: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        output.append(reasoning_item(item_id("rs", request_id, 0), reasoning, "completed"))
    text = _text_of(message.get("content"))
    refusal = message.get("refusal")
    calls = [c for c in message.get("tool_calls") or () if isinstance(c, dict)]
    if text or refusal or not calls:
        parts = [text_part(text)] if text or not refusal else []
        if isinstance(refusal, str) and refusal:
            parts.append({"type": "refusal", "refusal": refusal})
        output.append(message_item(item_id("msg", request_id, len(output)), parts, "completed"))
    custom = custom_tool_names(request) if calls else _NO_NAMES
    for call in calls:
        function = call.get("function") or {}
        name = str(function.get("name") or "")
        arguments = _arguments(function.get("arguments"))
        if name in custom:
            output.append(custom_tool_call_item(
                item_id("ctc", request_id, len(output)), str(call.get("id") or ""), name,
                custom_input(arguments), "completed"))
        else:
            output.append(function_call_item(
                item_id("fc", request_id, len(output)), str(call.get("id") or ""), name,
                arguments, "completed"))
    if incomplete is not None:
        output[-1]["status"] = "incomplete"
    created = chat.get("created")
    # the one message item holds the text (or nothing: then the text is empty), so it is the
    # output's ``output_text``
    return response_object(
        request_id=request_id, model=model,
        created_at=created if isinstance(created, int) else int(time.time()),
        status="completed" if incomplete is None else "incomplete",
        output=output, usage=_answer_usage(chat.get("usage")), request=request,
        incomplete=incomplete, text=text)


def chat_answer_from_response(response: Mapping[str, Any]) -> dict[str, Any]:
    """A ``response`` as the chat completions answer it was made from (the common subset: one
    assistant message with its text, tool calls and reasoning; finish reason; usage). A
    ``custom_tool_call`` is the chat tool call it was made from, its ``input`` as the arguments
    ``{"input": ...}`` (as the request translation sends such a call back)."""
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in response.get("output") or ():
        kind = item.get("type")
        if kind == "message":
            texts.extend(p["text"] for p in item.get("content", ())
                         if p.get("type") == "output_text")
        elif kind == "reasoning":
            reasoning.extend(p["text"] for p in item.get("content") or ())
        elif kind == "function_call":
            calls.append({"id": item["call_id"], "type": "function",
                          "function": {"name": item["name"], "arguments": item["arguments"]}})
        elif kind == "custom_tool_call":
            arguments = msgspec.json.encode({"input": item["input"]}).decode()
            calls.append({"id": item["call_id"], "type": "function",
                          "function": {"name": item["name"], "arguments": arguments}})
    message: dict[str, Any] = {"role": "assistant",
                               "content": "".join(texts) if texts or not calls else None}
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    details = response.get("incomplete_details") or {}
    finish = _FINISH.get(str(details.get("reason")), "tool_calls" if calls else "stop")
    answer: dict[str, Any] = {
        "id": response.get("id"),
        "object": "chat.completion",
        "created": response.get("created_at"),
        "model": response.get("model"),
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }
    usage = response.get("usage")
    if isinstance(usage, dict):
        answer["usage"] = chat_usage(usage)
    return answer
