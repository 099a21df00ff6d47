"""The ceiling on a request's output limit, in every client API, before admission.

A request's output limit is what admission reserves against token and spend quotas, what
routing predicts with, and what an engine sizes its answer by; unchecked, ``max_tokens:
10**18`` is reserved and forwarded. Every dialect's limit field is checked here against the
model's bound (``Model.output_ceiling``: its ``max_output_tokens``, else a default), once, right
after the request is parsed and its model known, before it is classified or admitted (the
pipeline's one call, for live requests and batch lines): chat ``max_tokens`` and
``max_completion_tokens``, completions ``max_tokens``, Responses ``max_output_tokens``, Messages
``max_tokens``. A front-end's request is checked in its own fields (``Frontend.output_fields``),
so the 400 names the field the client sent; the front-end renders it in its own shape.

The parsers already refuse a limit that is not a positive integer (a float such as ``1e18``, a
string, a boolean); the same is checked here again, so a new dialect cannot bring a 500.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.errors import InvalidRequest

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gateway.config import Model
    from gateway.dialects.base import Frontend
    from gateway.dialects.shape import ParsedRequest

__all__ = ["CHAT_OUTPUT_FIELDS", "check_output_fields", "check_output_limit"]

#: the output limit fields of the chat-shaped APIs (chat and text completions)
CHAT_OUTPUT_FIELDS = ("max_completion_tokens", "max_tokens")


def check_output_limit(model: Model, parsed: ParsedRequest, frontend: Frontend | None) -> None:
    """Refuse (400, naming the field and the bound) a request whose output limit is above the
    model's bound (``output_ceiling``), or is not a positive integer."""
    if frontend is None:
        check_output_fields(parsed.payload, CHAT_OUTPUT_FIELDS, model.output_ceiling,
                            model.name)
        return
    native = parsed.native if parsed.native is not None else parsed.payload
    check_output_fields(native, frontend.output_fields, model.output_ceiling, model.name)
    # its chat translation (what admission reads) carries the same limit: checked too, under
    # the client's name, should a translation ever set one of its own
    named = frontend.output_fields[0] if frontend.output_fields else None
    check_output_fields(parsed.payload, CHAT_OUTPUT_FIELDS, model.output_ceiling, model.name,
                        named=named)


def check_output_fields(payload: Mapping[str, Any], fields: tuple[str, ...], bound: int,
                        model: str, *, named: str | None = None) -> None:
    """Each of ``fields`` present in ``payload`` is a positive integer of at most ``bound``
    (``named``: the field the error names instead, the client's own)."""
    for field in fields:
        value = payload.get(field)
        if value is None:
            continue
        param = named or field
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidRequest(f"'{param}' must be a positive integer", param=param)
        if value > bound:
            raise InvalidRequest(
                f"'{param}' is too large: {_shown(value)}. The model '{model}' allows at most "
                f"{bound} output tokens (its max_output_tokens); send {param} <= {bound}",
                param=param, code="invalid_value")


def _shown(value: int) -> str:
    """An integer for an error message (a huge one by its size only)."""
    return str(value) if value.bit_length() <= 128 else f"a {value.bit_length()}-bit number"
