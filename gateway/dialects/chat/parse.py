"""Parse an OpenAI request body once and check the fields the gateway relies on.

Only what the gateway needs is checked (model, stream, token limits, the endpoint's required
input); every other field (tools, response_format, logprobs, seed, ...) passes through untouched.

Two properties of the raw JSON are checked while it is decoded, because the stages after parsing
trust them:

* **Nesting depth** at most :data:`MAX_DEPTH`. msgspec refuses ~1,000 levels with a
  ``RecursionError`` (a 2 KB body), and anything it accepts is walked again by recursive code
  (re-encoding, token counting, span recording); a bound far below the interpreter's limit keeps
  every later stage safe. The check walks containers of the decoded value, never bytes, and is
  skipped for bodies too short to nest that deep.
* **Unique top-level keys.** A body is forwarded unchanged when no rewrite is needed, so a
  backend that keeps the first of two ``model`` keys would serve a model other than the one
  msgspec kept (the last), which was routed, admitted and billed. Whether the gateway rewrote
  the body or not must not change what the backend reads, so a repeated top-level key is refused
  with 400 (RFC 7493, I-JSON: names MUST be unique). msgspec has no such check: the decoder's
  key hook counts the top-level keys (~0.2 µs a key, independent of the body's size), and a
  count larger than the dict's size means a repeat.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import msgspec

from gateway.errors import InvalidRequest, clip

if TYPE_CHECKING:
    from gateway.dialects.base import Translated

__all__ = [
    "ENDPOINTS",
    "MAX_DEPTH",
    "Endpoint",
    "ParsedRequest",
    "decode_object",
    "nests_deeper",
    "parse_request",
]

#: the deepest a request body may nest objects and arrays (the body itself is level 1)
MAX_DEPTH = 128

_CONTAINERS = (dict, list)


class _Key(str):
    """A top-level key, as made by the counting hook (msgspec wants the hook's own type)."""

    __slots__ = ()


#: keys of an OpenAI request made once, so the hook does not build a string for each
_COMMON = {
    k: _Key(k)
    for k in (
        "model", "messages", "prompt", "input", "stream", "stream_options", "max_tokens",
        "max_completion_tokens", "n", "user", "tools", "tool_choice", "functions",
        "function_call", "temperature", "top_p", "stop", "seed", "response_format",
        "logprobs", "top_logprobs", "presence_penalty", "frequency_penalty", "logit_bias",
        "parallel_tool_calls", "metadata", "store", "encoding_format", "dimensions", "suffix",
        "echo", "best_of", "reasoning_effort", "modalities", "audio", "prediction",
        "service_tier", "custom_id", "method", "url", "body",
    )
}


class _CountingDecoder:
    """A decoder of JSON objects whose key hook counts the top-level keys it decodes.

    One per thread (the count lives between the hook's calls and the caller's check).
    """

    __slots__ = ("count", "decode")

    def __init__(self) -> None:
        self.count = 0
        common = _COMMON.get

        def key(type_: type, name: Any) -> _Key:
            self.count += 1
            return common(name) or _Key(name)

        self.decode = msgspec.json.Decoder(dict[_Key, Any], dec_hook=key).decode


_local = threading.local()
_plain = msgspec.json.Decoder()


def _counting() -> _CountingDecoder:
    try:
        decoder: _CountingDecoder = _local.decoder
    except AttributeError:
        decoder = _local.decoder = _CountingDecoder()
    return decoder


def nests_deeper(value: Any, limit: int) -> bool:
    """Whether ``value`` (decoded JSON) nests objects and arrays more than ``limit`` levels.

    Level by level, iteratively (no recursion to run out of): the cost is one step per
    container and per element of a list of containers; a long list of scalars (token ids)
    is skipped by the set of its element types, in C.
    """
    level = [value] if type(value) in _CONTAINERS else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        children: list[Any] = []
        add = children.append
        for node in level:
            if type(node) is dict:
                items: Any = node.values()
            else:
                items = node
                if len(node) > 16:
                    kinds = set(map(type, node))
                    if dict not in kinds and list not in kinds:
                        continue
            for item in items:
                if type(item) is dict or type(item) is list:
                    add(item)
        level = children
    return False


def _repeated_key(body: bytes) -> str:
    """The first top-level key that appears twice (only on the error path: a second parse)."""
    pairs = json.loads(body, object_pairs_hook=lambda p: p)
    seen: set[str] = set()
    for name, _ in pairs:
        if name in seen:
            return str(name)
        seen.add(name)
    return "?"


def decode_object(body: bytes, subject: str = "request body") -> dict[str, Any]:
    """Decode a JSON object, refusing deep nesting and repeated top-level keys.

    Raises :class:`~gateway.errors.InvalidRequest` (param null) whose message starts with
    ``subject``.
    """
    decoder = _counting()
    decoder.count = 0
    try:
        payload = cast("dict[str, Any]", decoder.decode(body))
    except msgspec.ValidationError:  # valid JSON, but not an object
        value = _decode_any(body, subject)
        raise InvalidRequest(f"{subject} must be a JSON object, got {_type_name(value)}"
                             ) from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"{subject} is not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidRequest(f"{subject} nests deeper than {MAX_DEPTH} levels") from None
    if len(body) > 2 * MAX_DEPTH and nests_deeper(payload, MAX_DEPTH):
        raise InvalidRequest(f"{subject} nests deeper than {MAX_DEPTH} levels")
    if decoder.count != len(payload):  # checked second: the error path parses again
        key = clip(_repeated_key(body), 64)
        raise InvalidRequest(f"{subject} repeats the key {key!r}: each key may appear once")
    return payload


def _decode_any(body: bytes, subject: str) -> Any:
    """The value of a body that is not an object (the typed decoder stops at its first byte,
    so the rest may still be malformed: ``2\xff``)."""
    try:
        return _plain.decode(body)
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"{subject} is not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidRequest(f"{subject} nests deeper than {MAX_DEPTH} levels") from None


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One proxied OpenAI operation."""

    path: str
    operation: str  # the gen_ai.operation.name it becomes
    input_field: str
    streams: bool
    #: the client API: chat, completions, embeddings, or a front-end's (responses, messages)
    api: str = "chat"


ENDPOINTS: dict[str, Endpoint] = {
    e.path: e
    for e in (
        Endpoint("/v1/chat/completions", "chat", "messages", True),
        Endpoint("/v1/completions", "text_completion", "prompt", True, "completions"),
        Endpoint("/v1/embeddings", "embeddings", "input", False, "embeddings"),
        Endpoint("/v1/messages", "chat", "messages", True, "messages"),
        Endpoint("/v1/responses", "chat", "input", True, "responses"),
    )
}


@dataclass(slots=True)
class ParsedRequest:
    """The decoded body and the facts the gateway reads from it."""

    payload: dict[str, Any]
    model: str
    stream: bool
    #: a front-end's request as the client sent it (``payload`` is its chat translation)
    native: dict[str, Any] | None = None
    #: how many of ``payload``'s messages are a stored conversation it continues
    #: (``previous_response_id``): they follow the instructions' system message, if any
    earlier: int = 0
    #: a front-end's translation (what it left out: ``gateway.dialects.ignored``)
    translated: Translated | None = None


def _type_name(value: Any) -> str:
    return {
        dict: "object",
        list: "array",
        str: "string",
        bool: "boolean",
        int: "integer",
        float: "number",
    }.get(type(value), "null" if value is None else type(value).__name__)


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list):
        raise InvalidRequest(
            f"'messages' must be an array, got {_type_name(messages)}", param="messages"
        )
    if not messages:
        raise InvalidRequest("'messages' must contain at least one message", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequest(
                f"'messages[{i}]' must be an object, got {_type_name(message)}",
                param=f"messages[{i}]",
            )
        role = message.get("role")
        if not isinstance(role, str):
            raise InvalidRequest(
                f"'messages[{i}].role' is required and must be a string",
                param=f"messages[{i}].role",
            )


def _check_input(field: str, value: Any) -> None:
    if isinstance(value, str):
        return
    if isinstance(value, list) and value:
        first = value[0]
        if isinstance(first, (str, int, list)):
            return
    raise InvalidRequest(
        f"'{field}' must be a string or a non-empty array of strings or token ids,"
        f" got {_type_name(value)}",
        param=field,
    )


def _check_positive_int(payload: dict[str, Any], field: str) -> None:
    value = payload.get(field)
    if value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidRequest(f"'{field}' must be a positive integer", param=field)


def parse_request(body: bytes, endpoint: Endpoint) -> ParsedRequest:
    """Decode and check a request body; raises InvalidRequest naming the field."""
    if not body:
        raise InvalidRequest("request body is empty; expected a JSON object")
    payload = decode_object(body)
    model = payload.get("model")
    if model is None:
        raise InvalidRequest("'model' is a required field", param="model")
    if not isinstance(model, str):
        raise InvalidRequest(f"'model' must be a string, got {_type_name(model)}", param="model")
    if endpoint.input_field not in payload:
        raise InvalidRequest(
            f"'{endpoint.input_field}' is a required field", param=endpoint.input_field
        )
    if endpoint.input_field == "messages":
        _check_messages(payload["messages"])
    else:
        _check_input(endpoint.input_field, payload[endpoint.input_field])
    stream = payload.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise InvalidRequest(
            f"'stream' must be a boolean, got {_type_name(stream)}", param="stream"
        )
    if stream and not endpoint.streams:
        raise InvalidRequest(f"'stream' is not supported on {endpoint.path}", param="stream")
    options = payload.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise InvalidRequest("'stream_options' must be an object", param="stream_options")
    _check_positive_int(payload, "max_tokens")
    _check_positive_int(payload, "max_completion_tokens")
    _check_positive_int(payload, "n")
    return ParsedRequest(payload, model, stream)
