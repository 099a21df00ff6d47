"""The front-ends by API name, and how a request of one is parsed and answered with an error.

``frontend_for(endpoint.api)`` is None for the chat-shaped endpoints (chat completions,
completions, embeddings), which the request parser checks itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.dialects.body import decode_object
from gateway.dialects.messages import MessagesFrontend
from gateway.dialects.responses import ResponsesFrontend
from gateway.dialects.shape import ParsedRequest
from gateway.errors import InvalidRequest
from gateway.http.asgi import send_json

if TYPE_CHECKING:
    from gateway.dialects.base import Frontend, Translated
    from gateway.errors import GatewayError
    from gateway.types import RawHeaders, Send

__all__ = ["FRONTENDS", "decode_native", "frontend_for", "parse_translated", "send_api_error",
           "translate_native"]

FRONTENDS: dict[str, Frontend] = {f.name: f for f in (MessagesFrontend(), ResponsesFrontend())}


def frontend_for(api: str) -> Frontend | None:
    return FRONTENDS.get(api)


def parse_translated(body: bytes, frontend: Frontend,
                     earlier: list[dict[str, Any]] | None = None
                     ) -> tuple[ParsedRequest, Translated]:
    """Decode a request of ``frontend``'s API and translate it: the parsed request carries the
    chat payload (what quotas, routing and accounting read) and the client's own payload."""
    return translate_native(decode_native(body), frontend, earlier)


def decode_native(body: bytes) -> dict[str, Any]:
    """A front-end request's JSON object (a 400 for an empty body or anything else)."""
    if not body:
        raise InvalidRequest("request body is empty; expected a JSON object")
    return decode_object(body)


def translate_native(native: dict[str, Any], frontend: Frontend,
                     earlier: list[dict[str, Any]] | None = None
                     ) -> tuple[ParsedRequest, Translated]:
    """``parse_translated`` for a request already decoded (``decode_native``)."""
    translated = frontend.to_chat(native, earlier)
    parsed = ParsedRequest(translated.chat, translated.model, translated.stream)
    parsed.native = native
    parsed.earlier = len(earlier) if earlier else 0
    parsed.translated = translated
    return parsed, translated


async def send_api_error(send: Send, frontend: Frontend, error: GatewayError,
                         headers: RawHeaders | None = None) -> None:
    """An error answer in the front-end's shape, with the error's own headers."""
    status, body = frontend.error(error)
    raw = list(headers or [])
    raw.extend((k.lower().encode(), v.encode()) for k, v in error.headers.items())
    await send_json(send, status, body, raw)
