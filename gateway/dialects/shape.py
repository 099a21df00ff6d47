"""The one request shape every stage reads: the proxied endpoints, and a request parsed from
any client API (chat completions as sent, or a front-end's request with its chat translation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.dialects.base import Translated

__all__ = ["ENDPOINTS", "Endpoint", "ParsedRequest"]


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
