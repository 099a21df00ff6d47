"""Simulated tool calls: which tool is called, its arguments, and the tokens they cost.

Every API shares one rule (its front-end decides only the shapes): when a request offers function
tools, its tool choice is not "none" and its last input is not a tool result, the answer is one
call to the named tool (a forced choice) or else the first tool. The arguments are a JSON object
built from the tool's JSON-schema parameters, deterministically, so a test can assert the round
trip: every required property is filled (string ``"sim"``, number and integer ``1``, boolean
``true``, null ``null``, array ``[]``, object: its own required properties); an ``enum`` or
``const`` gives its first value; optional properties are left out.

The call costs ``count_text(name) + count_text(arguments)`` output tokens (what the gateway counts
for a delivered tool call); the engine generates them like text. A stream sends the name once its
tokens are out, then one argument fragment per token: the arguments are ASCII (non-ASCII names
are ``\\u``-escaped), so every token decodes to a piece of text on its own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gateway.sim.errors import BadRequest
from gateway.tokenizers import get_encoding

__all__ = ["ToolCall", "ToolSpec", "arguments_for", "make_call", "pick_tool"]

# Nesting beyond this is answered with an empty object, so a recursive schema cannot loop.
_MAX_DEPTH = 16


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A function tool as offered by the request: its name and JSON-schema parameters."""

    name: str
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class ToolCall:
    """The call an answer will make, split into the tokens the engine generates."""

    #: the API's call id (``call_...`` for OpenAI, ``toolu_...`` for Anthropic)
    call_id: str
    name: str
    #: the whole arguments text (also when the token limit cuts the stream short)
    arguments: str
    #: tokens of the name, generated before any argument fragment
    name_tokens: int
    #: one argument fragment per token, cut to the request's token limit
    pieces: list[str]

    @property
    def tokens(self) -> int:
        """Output tokens this call costs (name and the argument fragments kept)."""
        return self.name_tokens + len(self.pieces)

    @property
    def complete(self) -> bool:
        """Whether every argument fragment fits in the token limit."""
        return "".join(self.pieces) == self.arguments

    @property
    def sent_arguments(self) -> str:
        """The arguments text the answer carries (cut short when the limit hit)."""
        return "".join(self.pieces)


def _value(schema: Any, depth: int) -> Any:
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return {}
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            return _value(options[0], depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None and "properties" in schema:
        kind = "object"
    if kind == "string":
        return "sim"
    if kind in ("number", "integer"):
        return 1
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    if kind == "array":
        return []
    return _object(schema, depth)


def _object(schema: dict[str, Any], depth: int) -> dict[str, Any]:
    properties = schema.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    required = schema.get("required")
    if not isinstance(required, list):
        return {}
    return {str(k): _value(properties.get(k), depth + 1) for k in required if isinstance(k, str)}


def arguments_for(parameters: dict[str, Any]) -> str:
    """The compact JSON arguments of a call to a tool with these parameters (see the module)."""
    return json.dumps(_object(parameters, 0), separators=(",", ":"), ensure_ascii=True)


def make_call(spec: ToolSpec, call_id: str, limit: int, encoding: str) -> ToolCall:
    """The call to ``spec``, its arguments cut after ``limit`` output tokens in all."""
    enc = get_encoding(encoding)
    arguments = arguments_for(spec.parameters)
    name_tokens = max(1, len(enc.encode_ordinary(spec.name)))
    tokens = enc.encode_ordinary(arguments)
    keep = max(0, limit - name_tokens)
    pieces = [enc.decode([t]) for t in tokens[:keep]]
    return ToolCall(
        call_id=call_id,
        name=spec.name,
        arguments=arguments,
        name_tokens=min(name_tokens, max(limit, 1)),
        pieces=pieces,
    )


def pick_tool(
    tools: list[ToolSpec], forced: str | None, *, none: bool, after_result: bool, param: str
) -> ToolSpec | None:
    """The tool the answer calls, or ``None`` for a text answer.

    ``forced``: the tool the request's choice names; ``none``: the choice is "none";
    ``after_result``: the last input is a tool result (the answer is then text). ``param``
    names the choice field in the error for a forced tool the request does not offer.
    """
    if forced is not None and all(t.name != forced for t in tools):
        raise BadRequest(f"{param} names the tool {forced!r}, which is not in tools", param=param)
    if not tools or none or after_result:
        return None
    if forced is not None:
        return next(t for t in tools if t.name == forced)
    return tools[0]
