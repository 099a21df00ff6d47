"""``POST /v1/responses``: OpenAI's Responses API, served natively.

The request's ``instructions`` and ``input`` (a string, or items: messages with text parts,
``function_call`` / ``custom_tool_call`` and their outputs; ``reasoning`` items count nothing)
are written as chat messages to count the prompt and seed the text (``prompt.py``). With
function ``tools`` (custom and built-in tools are accepted, echoed and never called), a
``tool_choice`` other than "none" and a last input item that is not a call's output, the answer
is one ``function_call`` output item (``tools.py``); else one ``message`` item. Fields the
simulator has no use for (``include``, ``reasoning``, ``prompt_cache_key``, a client's own
such as Codex's ``client_metadata``) are accepted and ignored.

A text answer cut by ``max_output_tokens`` is ``incomplete`` (``incomplete_details.reason``
``max_output_tokens``); without that limit it ends ``completed`` at the simulator's default
length. The simulator stores nothing: ``store`` is echoed, and ``previous_response_id`` (or a
``conversation``, or an ``item_reference``) is refused with 400, since rebuilding a stored
conversation is the gateway's business. Streams follow the Responses event sequence with a
``sequence_number`` on every event and no ``[DONE]``; an error after the headers is an ``error``
event.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.sim.answer import Renderer, decide
from gateway.sim.errors import BadRequest
from gateway.sim.prompt import prompt_ids, prompt_key
from gateway.sim.shapes import named_event, new_id
from gateway.sim.tools import ToolSpec, pick_tool

if TYPE_CHECKING:
    from gateway.sim.answer import Plan
    from gateway.sim.config import SimConfig
    from gateway.sim.errors import SimHTTPError

__all__ = ["ResponsesRenderer", "parse_response"]

_encode = msgspec.json.Encoder().encode
_ROLES = frozenset({"user", "assistant", "system", "developer"})
_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "summary_text", "reasoning_text"})
_OTHER_PARTS = frozenset({"input_image", "input_file", "input_audio", "refusal"})
_STATEFUL = ("previous_response_id", "conversation")


def _text(content: Any, where: str) -> str:
    """The text of a message's or an output's content: a string or a list of parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where} must be a string or a list of content parts", param=where)
    texts: list[str] = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS:
            text = part.get("text")
            if not isinstance(text, str):
                raise BadRequest(f"{where}[{i}].text must be a string", param=f"{where}[{i}].text")
            texts.append(text)
        elif kind == "refusal":
            texts.append(str(part.get("refusal") or ""))
        elif kind not in _OTHER_PARTS:
            raise BadRequest(
                f"{where}[{i}] must be a content part with a known type, e.g. input_text",
                param=f"{where}[{i}]",
            )
    return "".join(texts)


def _string(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise BadRequest(f"{where}.{key} must be a string", param=f"{where}.{key}")
    return value


def _join_call(messages: list[dict[str, Any]], call: dict[str, Any]) -> None:
    """Put a function call on the assistant message just before, else on a new one."""
    if messages and messages[-1]["role"] == "assistant":
        message = messages[-1]
    else:
        message = {"role": "assistant", "content": None}
        messages.append(message)
    calls = message.get("tool_calls")
    if calls is None:
        message["tool_calls"] = [call]
    else:
        calls.append(call)


def chat_messages(instructions: str | None, raw: Any) -> tuple[list[dict[str, Any]], bool]:
    """The request as chat messages, and whether its last item is a function call's output.

    A function call joins the ``tool_calls`` of the assistant message just before it (its text,
    or the calls before it), as a chat model would have sent them together.
    """
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    if isinstance(raw, str):
        messages.append({"role": "user", "content": raw})
        return messages, False
    if not isinstance(raw, list) or not raw:
        raise BadRequest("input must be a string or a non-empty list of input items", param="input")
    last = ""
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise BadRequest(f"{where} must be an object", param=where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise BadRequest(
                    f"{where}.role must be one of user, assistant, system, developer",
                    param=f"{where}.role",
                )
            text = _text(item.get("content"), where + ".content")
            messages.append({"role": role, "content": text})
        elif kind == "function_call":
            call = {
                "id": _string(item, "call_id", where),
                "type": "function",
                "function": {
                    "name": _string(item, "name", where),
                    "arguments": _string(item, "arguments", where),
                },
            }
            _join_call(messages, call)
        elif kind == "custom_tool_call":
            call = {
                "id": _string(item, "call_id", where),
                "type": "function",
                "function": {
                    "name": _string(item, "name", where),
                    "arguments": json.dumps({"input": _string(item, "input", where)}),
                },
            }
            _join_call(messages, call)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = _text(item.get("output"), where + ".output")
            call_id = _string(item, "call_id", where)
            messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
        elif kind == "reasoning":
            pass  # the simulator reasons about nothing: no tokens
        elif kind == "item_reference":
            raise BadRequest(
                f"{where}: item_reference needs stored items; the simulator stores none",
                param=where,
            )
        else:
            raise BadRequest(
                f"{where}.type {kind!r} is not served by the simulator (message, function_call, "
                "function_call_output, reasoning)",
                param=f"{where}.type",
            )
        last = str(kind)
    return messages, last in ("function_call_output", "custom_tool_call_output")


def _tools(raw: Any) -> tuple[list[ToolSpec], list[dict[str, Any]]]:
    """The function tools offered, and their echo for the response object (other tool types
    are echoed as sent and never called)."""
    if raw is None:
        return [], []
    if not isinstance(raw, list):
        raise BadRequest("tools must be a list of tool objects", param="tools")
    specs: list[ToolSpec] = []
    echo: list[dict[str, Any]] = []
    for i, tool in enumerate(raw):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise BadRequest(f"{where}.type must be a string", param=f"{where}.type")
        if tool["type"] != "function":
            echo.append(tool)
            continue
        name = _string(tool, "name", where)
        parameters = tool.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise BadRequest(f"{where}.parameters must be an object", param=f"{where}.parameters")
        specs.append(ToolSpec(name, parameters or {}))
        echo.append(
            {
                "type": "function",
                "name": name,
                "description": tool.get("description"),
                "parameters": parameters,
                "strict": tool.get("strict", True),
            }
        )
    return specs, echo


def _choice(raw: Any) -> tuple[str | None, bool]:
    """(the tool ``tool_choice`` forces, whether it is "none")."""
    if raw is None or raw in ("auto", "required"):
        return None, False
    if raw == "none":
        return None, True
    if isinstance(raw, dict):
        if raw.get("type") == "function" and isinstance(raw.get("name"), str):
            return raw["name"], False
        if isinstance(raw.get("type"), str):  # a subset, a custom or built-in tool: none
            return None, False  # the simulator calls (it calls function tools only)
    raise BadRequest(
        "tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'name': ...}",
        param="tool_choice",
    )


def _limit(body: dict[str, Any]) -> int | None:
    value = body.get("max_output_tokens")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise BadRequest("max_output_tokens must be a positive integer", param="max_output_tokens")
    return value


def parse_response(
    body: dict[str, Any], *, model: str, cfg: SimConfig
) -> tuple[Plan, ResponsesRenderer]:
    """Validate a Responses request and decide its answer."""
    for key in _STATEFUL:
        if body.get(key) is not None:
            raise BadRequest(
                f"{key}: the simulator stores no responses; resolving it is the gateway's job",
                param=key,
            )
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise BadRequest("instructions must be a string", param="instructions")
    messages, after_result = chat_messages(instructions, body.get("input"))
    specs, echo = _tools(body.get("tools"))
    forced, none = _choice(body.get("tool_choice"))
    tool = pick_tool(specs, forced, none=none, after_result=after_result, param="tool_choice")
    token_ids = prompt_ids(messages, cfg.encoding)
    plan = decide(
        api="responses",
        model=model,
        prompt_tokens=len(token_ids),
        key=prompt_key(messages),
        seed=None,
        limit=_limit(body),
        default_limit=cfg.default_max_tokens,
        natural=cfg.natural_length,
        tool=tool,
        call_id=new_id("call", "_"),
        encoding=cfg.encoding,
        stream=bool(body.get("stream")),
        max_len=cfg.profile.max_model_len,
        param="max_output_tokens",
    )
    plan.token_ids = token_ids
    plan.read_cache_fields(body)
    return plan, ResponsesRenderer(plan, body, instructions, echo)


class ResponsesRenderer(Renderer):
    """A ``response`` object, whole or as the Responses API's typed stream events."""

    def __init__(
        self,
        plan: Plan,
        body: dict[str, Any],
        instructions: str | None,
        tools: list[dict[str, Any]],
    ) -> None:
        self.plan = plan
        self.id = new_id("resp", "_")
        self.item_id = new_id("fc" if plan.call is not None else "msg", "_")
        self.created = int(time.time())
        self.seq = 0
        self._started = False
        metadata = body.get("metadata")
        temperature = body.get("temperature")
        top_p = body.get("top_p")
        user = body.get("user")
        self._echo: dict[str, Any] = {
            "instructions": instructions,
            "max_output_tokens": body.get("max_output_tokens"),
            "metadata": metadata if isinstance(metadata, dict) else {},
            "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
            "store": body.get("store") is not False,
            "temperature": temperature if isinstance(temperature, (int, float)) else 1.0,
            "tool_choice": body.get("tool_choice") or "auto",
            "tools": tools,
            "top_p": top_p if isinstance(top_p, (int, float)) else 1.0,
            "user": user if isinstance(user, str) else None,
        }
        item = _encode(self.item_id)
        self._delta_head = (
            b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
            b'"item_id":' + item + b',"output_index":0,"content_index":0,"logprobs":[],"delta":'
        )
        self._args_head = (
            b"event: response.function_call_arguments.delta\ndata: "
            b'{"type":"response.function_call_arguments.delta","item_id":'
            + item
            + b',"output_index":0,"delta":'
        )

    # -- the objects -----------------------------------------------------------------------------

    @property
    def _status(self) -> str:
        return "incomplete" if self.plan.finish == "length" else "completed"

    def _usage(self, generated: int) -> dict[str, Any]:
        p = self.plan
        return {
            "input_tokens": p.prompt_tokens,
            "input_tokens_details": {"cached_tokens": p.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": generated,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": p.prompt_tokens + generated,
        }

    def _item(self, generated: int, status: str) -> dict[str, Any]:
        p = self.plan
        if p.call is not None:
            return {
                "id": self.item_id,
                "type": "function_call",
                "status": status,
                "call_id": p.call.call_id,
                "name": p.call.name,
                "arguments": p.call.sent_arguments if status != "in_progress" else "",
            }
        content = [] if status == "in_progress" else [self._part("".join(p.words[:generated]))]
        return {
            "id": self.item_id,
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": content,
        }

    @staticmethod
    def _part(text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def _response(self, status: str, generated: int | None) -> dict[str, Any]:
        done = generated is not None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "completed_at": int(time.time()) if status == "completed" else None,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": (
                {"reason": "max_output_tokens"} if status == "incomplete" else None
            ),
            "model": self.plan.model,
            "output": [self._item(generated, self._status)] if done else [],  # type: ignore[arg-type]
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "service_tier": "default",
            "text": {"format": {"type": "text"}, "verbosity": "medium"},
            "top_logprobs": 0,
            "truncation": "disabled",
            "usage": self._usage(generated) if done else None,  # type: ignore[arg-type]
            **self._echo,
        }

    def body(self, generated: int) -> bytes:
        return _encode(self._response(self._status, generated))

    # -- the stream ------------------------------------------------------------------------------

    def _event(self, payload: dict[str, Any]) -> bytes:
        payload["sequence_number"] = self.seq
        self.seq += 1
        return named_event(payload["type"].encode(), _encode(payload))

    def _seq(self) -> bytes:
        seq = self.seq
        self.seq += 1
        return b',"sequence_number":' + str(seq).encode() + b"}\n\n"

    def opening(self) -> bytes:
        response = self._response("in_progress", None)
        created = self._event({"type": "response.created", "response": response})
        return created + self._event({"type": "response.in_progress", "response": response})

    def _start_item(self) -> bytes:
        self._started = True
        added = self._event(
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": self._item(0, "in_progress"),
            }
        )
        if self.plan.call is not None:
            return added
        return added + self._event(
            {
                "type": "response.content_part.added",
                "item_id": self.item_id,
                "output_index": 0,
                "content_index": 0,
                "part": self._part(""),
            }
        )

    def tokens(self, start: int, end: int) -> bytes:
        call = self.plan.call
        out: list[bytes] = []
        if call is None:
            if not self._started:
                out.append(self._start_item())
            head = self._delta_head
            out.extend(head + _encode(w) + self._seq() for w in self.plan.words[start:end])
            return b"".join(out)
        named = call.name_tokens
        if start < named <= end:
            out.append(self._start_item())
        head = self._args_head
        pieces = call.pieces[max(start - named, 0) : max(end - named, 0)]
        out.extend(head + _encode(piece) + self._seq() for piece in pieces)
        return b"".join(out)

    def closing(self, generated: int) -> bytes:
        p = self.plan
        out = [] if self._started else [self._start_item()]
        status = self._status
        item = self._item(generated, status)
        common = {"item_id": self.item_id, "output_index": 0}
        if p.call is not None:
            done = {"type": "response.function_call_arguments.done", **common}
            out.append(self._event({**done, "arguments": item["arguments"]}))
        else:
            text = item["content"][0]["text"]
            common["content_index"] = 0
            out.append(
                self._event(
                    {"type": "response.output_text.done", **common, "text": text, "logprobs": []}
                )
            )
            out.append(
                self._event(
                    {"type": "response.content_part.done", **common, "part": self._part(text)}
                )
            )
        done_item = {"type": "response.output_item.done", "output_index": 0, "item": item}
        out.append(self._event(done_item))
        final = "response.completed" if status == "completed" else "response.incomplete"
        out.append(self._event({"type": final, "response": self._response(status, generated)}))
        return b"".join(out)

    def failure(self, error: SimHTTPError) -> bytes:
        return self._event(
            {"type": "error", "code": error.code, "message": error.message, "param": error.param}
        )
