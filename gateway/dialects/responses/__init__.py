"""The OpenAI Responses front-end: ``POST /v1/responses`` on the chat completions pipeline.

``ResponsesFrontend`` is the ``Frontend`` (``gateway.dialects.base``) the pipeline holds; its parts,
each pure (no I/O) and table-tested:

* ``request.py``: check a request in the Responses shape, translate it to chat completions
  (its inverse, for the round-trip tests, is ``tests/dialects/inverse_responses.py``);
* ``answer.py``: the ``response`` object for a chat answer (and ``chat_answer_from_response``);
* ``stream.py``: chat SSE in, Responses SSE out, chunk by chunk;
* ``stored.py``: what a stored response gives back: the conversation a ``previous_response_id``
  request re-sends (``earlier_messages``), and ``GET /v1/responses/{id}/input_items``.

Errors are OpenAI's shape (``gateway.errors``), as for chat completions; the usage of a
Responses answer passed through from a backend that speaks the API is read by
``gateway.accounting.usage`` (shape ``responses``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.accounting.usage import usage_from_mapping
from gateway.dialects.base import Frontend
from gateway.dialects.responses.answer import (
    chat_answer_from_response,
    response_id,
    responses_answer,
)
from gateway.dialects.responses.request import to_chat
from gateway.dialects.responses.stored import earlier_messages, input_items
from gateway.dialects.responses.stream import ResponsesStream

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gateway.accounting.usage import BackendUsage
    from gateway.dialects.base import Translated
    from gateway.errors import GatewayError

__all__ = [
    "ResponsesFrontend",
    "ResponsesStream",
    "chat_answer_from_response",
    "earlier_messages",
    "input_items",
    "response_id",
]


class ResponsesFrontend(Frontend):
    """OpenAI's Responses API, translated to and from chat completions."""

    name = "responses"
    path = "/v1/responses"
    upstream_path = "/v1/responses"
    output_fields = ("max_output_tokens",)

    def to_chat(self, payload: dict[str, Any],
                  earlier: list[dict[str, Any]] | None = None) -> Translated:
        return to_chat(payload, earlier)

    def answer(self, chat: dict[str, Any], *, model: str, request_id: str,
               request: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return responses_answer(chat, model=model, request_id=request_id, request=request)

    def stream(self, *, model: str, request_id: str, prompt_tokens: int,
               request: Mapping[str, Any] | None = None) -> ResponsesStream:
        return ResponsesStream(model=model, request_id=request_id, prompt_tokens=prompt_tokens,
                               request=request)

    def error(self, error: GatewayError) -> tuple[int, bytes]:
        return error.status, error.body()

    def usage(self, answer: dict[str, Any]) -> BackendUsage | None:
        usage = answer.get("usage")
        return usage_from_mapping(usage, "responses") if isinstance(usage, dict) else None
