"""Decode a request body's JSON object once, for every API, with two properties checked.

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
from typing import Any, cast

import msgspec

from gateway.errors import InvalidRequest, clip

__all__ = ["MAX_DEPTH", "decode_object", "nests_deeper", "type_name"]

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
        raise InvalidRequest(f"{subject} must be a JSON object, got {type_name(value)}"
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


def type_name(value: Any) -> str:
    return {
        dict: "object",
        list: "array",
        str: "string",
        bool: "boolean",
        int: "integer",
        float: "number",
    }.get(type(value), "null" if value is None else type(value).__name__)
