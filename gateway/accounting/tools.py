"""Tokens of a request's tool (function) definitions, estimated the way OpenAI renders them.

OpenAI does not publish how definitions are rendered into the prompt. This follows the method of
the OpenAI cookbook ("How to count tokens with tiktoken", section 7), which matches the API's
``prompt_tokens`` on its example (101 tokens for gpt-4o, 105 for gpt-4, tested here):

* per function: ``func_init`` + tokens of ``"<name>:<description without a final period>"``;
* if it has properties: ``prop_init``, then per property ``prop_key`` + tokens of
  ``"<key>:<type>:<description without a final period>"``, and when it has an ``enum``,
  ``enum_init`` + per item ``enum_item`` + tokens of the item;
* once for the whole list: ``func_end``.

``func_init`` is 7 for o200k_base models (gpt-4o family) and 10 for cl100k_base (gpt-4, 3.5).
Beyond the cookbook, which handles only flat properties: a list ``type`` is joined with ``|``,
and a property's nested schema (``properties`` or ``items``) adds the tokens of its compact JSON.
Both ``tools`` (``{"type": "function", "function": {...}}``) and the legacy ``functions`` list
are accepted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

__all__ = ["FUNC_INIT", "count_tools"]

#: Per-function opening tokens by encoding (the cookbook's ``func_init``).
FUNC_INIT = {"o200k_base": 7, "cl100k_base": 10}
PROP_INIT = 3
PROP_KEY = 3
ENUM_INIT = -3
ENUM_ITEM = 3
FUNC_END = 12

_encode_json = msgspec.json.encode


def count_tools(
    definitions: Iterable[Any], encode: Callable[[str], list[int]], func_init: int
) -> int:
    """Tokens of a list of tool or function definitions (0 for an empty list)."""
    total = 0
    functions = 0
    for item in definitions:
        if not isinstance(item, dict):
            continue
        function = item.get("function", item) if item.get("type") == "function" else item
        if isinstance(function, dict):
            functions += 1
            total += func_init + _function(function, encode)
    return total + FUNC_END if functions else 0


def _function(function: dict[str, Any], encode: Callable[[str], list[int]]) -> int:
    name = str(function.get("name", ""))
    description = _strip_period(function.get("description"))
    tokens = len(encode(f"{name}:{description}"))
    parameters = function.get("parameters")
    properties = parameters.get("properties") if isinstance(parameters, dict) else None
    if isinstance(properties, dict) and properties:
        tokens += PROP_INIT
        for key, schema in properties.items():
            tokens += PROP_KEY + _property(str(key), schema, encode)
    return tokens


def _property(key: str, schema: Any, encode: Callable[[str], list[int]]) -> int:
    if not isinstance(schema, dict):
        return len(encode(f"{key}::"))
    kind = schema.get("type", "")
    if isinstance(kind, list):
        kind = "|".join(str(k) for k in kind)
    tokens = len(encode(f"{key}:{kind}:{_strip_period(schema.get('description'))}"))
    enum = schema.get("enum")
    if isinstance(enum, list):
        tokens += ENUM_INIT
        for value in enum:
            tokens += ENUM_ITEM + len(encode(value if isinstance(value, str) else str(value)))
    for nested in ("properties", "items"):
        if nested in schema:
            tokens += len(encode(_encode_json(schema[nested]).decode()))
    return tokens


def _strip_period(description: Any) -> str:
    text = "" if description is None else str(description)
    return text[:-1] if text.endswith(".") else text
