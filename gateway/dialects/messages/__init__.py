"""The Anthropic Messages front-end (``POST /v1/messages``): Anthropic's shapes to chat and back.

Agent and coding tools speak Anthropic's Messages API; the gateway's pipeline (quotas, routing,
accounting with the history split) speaks chat completions. ``MessagesFrontend`` is the
``Frontend`` (``gateway.dialects.base``) the pipeline holds; its parts, each pure (no I/O) and
tested table-driven and by round-trip properties:

* ``request.py``: check a request in Anthropic's shape (every refusal an ``InvalidRequest``
  whose ``param`` names the field) and translate it to chat completions, leaving out what chat
  cannot express by the rule of ``dialects.ignored`` (dropped and named in ``x-gateway-ignored``,
  or refused only when the request is translated);
* ``answer.py``: the ``message`` for a chat completion (stop reasons, stop sequences, usage
  without double counts) and errors in Anthropic's shape and status;
* ``stream.py``: chat SSE in, Anthropic's events out, chunk by chunk, in Anthropic's order;

:func:`count_tokens` answers ``/v1/messages/count_tokens`` from the translated request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from gateway.accounting.usage import usage_from_mapping
from gateway.dialects.base import Frontend
from gateway.dialects.messages.answer import answer, shows_thinking, status_and_type
from gateway.dialects.messages.request import ERROR_PREFIX, translate
from gateway.dialects.messages.stream import MessagesStream

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from gateway.accounting.usage import BackendUsage
    from gateway.dialects.base import Translated
    from gateway.errors import GatewayError

__all__ = [
    "ERROR_PREFIX",
    "MessagesFrontend",
    "MessagesStream",
    "count_tokens",
]

_encode = msgspec.json.encode


class MessagesFrontend(Frontend):
    """Anthropic's Messages API on the chat pipeline."""

    name = "messages"
    path = "/v1/messages"
    upstream_path = "/v1/messages"
    output_fields = ("max_tokens",)
    stream_counts_prompt = True  # ``message_start`` carries the input tokens
    key_header = b"x-api-key"  # Anthropic's clients send the key here

    def to_chat(self, payload: dict[str, Any],
                  earlier: list[dict[str, Any]] | None = None) -> Translated:
        return translate(payload, earlier)

    def answer(self, chat: dict[str, Any], *, model: str, request_id: str,
               request: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return answer(chat, model, request_id, shows_thinking(request))

    def stream(self, *, model: str, request_id: str, prompt_tokens: int,
               request: Mapping[str, Any] | None = None) -> MessagesStream:
        return MessagesStream(model=model, request_id=request_id, prompt_tokens=prompt_tokens,
                              thinking=shows_thinking(request))

    def error(self, error: GatewayError) -> tuple[int, bytes]:
        """Anthropic's shape; the error's headers (``Retry-After``) are the caller's to send."""
        status, kind = status_and_type(error)
        return status, _encode({"type": "error", "error": {"type": kind,
                                                             "message": error.message}})

    def usage(self, answer: dict[str, Any]) -> BackendUsage | None:
        usage = answer.get("usage")
        return usage_from_mapping(usage, "anthropic") if isinstance(usage, dict) else None


def count_tokens(payload: dict[str, Any],
                 count_chat: Callable[[dict[str, Any]], int]) -> dict[str, int]:
    """``/v1/messages/count_tokens``: the input tokens of the translated request, counted by
    ``count_chat`` (the gateway's tokenizer over a chat payload). Checked like a create
    request, except that ``max_tokens`` is not needed; what a translation would refuse or drop
    is counted without (the count is the gateway's, of what chat would be sent)."""
    translated = translate(payload, None, count_only=True)
    return {"input_tokens": count_chat(translated.chat)}
