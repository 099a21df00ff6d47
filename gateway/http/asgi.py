"""Raw ASGI helpers for the hot path: read a bounded body, answer JSON, find a header.

The proxy routes speak ASGI directly instead of going through the framework's request and
response objects, which cost ~70-100 µs a request here; everything else uses Litestar normally.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.errors import BodyTooLarge, GatewayError, InvalidRequest, clip

if TYPE_CHECKING:
    from gateway.types import RawHeaders, Receive, Scope, Send

__all__ = ["ClientGone", "clip", "get_header", "header_value", "read_body", "send_error",
           "send_json"]

# ``clip(text, n)`` is re-exported for the HTTP edge: an error message that echoes client text
# (an unknown model's name) quotes at most ``n`` characters of it.

JSON = b"application/json"


class ClientGone(Exception):
    """The client disconnected before its request body was read."""


def header_value(headers: RawHeaders, name: bytes) -> bytes | None:
    """First value of a header (``name`` lower-case) in a raw header list."""
    for key, value in headers:
        if key == name:
            return value
    return None


def get_header(scope: Scope, name: bytes) -> bytes | None:
    """First value of a request header (``name`` lower-case)."""
    return header_value(scope["headers"], name)


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """Read the whole request body, refusing more than ``limit`` bytes without buffering it."""
    declared = get_header(scope, b"content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise InvalidRequest("Content-Length is not a number") from None
        if size > limit:
            raise BodyTooLarge(f"request body of {size} bytes exceeds the limit of {limit} bytes")
    message = await receive()
    if message["type"] == "http.disconnect":
        raise ClientGone
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):
        if len(body) > limit:
            raise BodyTooLarge(f"request body exceeds the limit of {limit} bytes")
        return body
    parts = [body]
    total = len(body)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        total += len(chunk)
        if total > limit:
            raise BodyTooLarge(f"request body exceeds the limit of {limit} bytes")
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


async def send_json(
    send: Send, status: int, body: bytes, headers: RawHeaders | None = None
) -> None:
    """Answer with a complete JSON body."""
    raw: RawHeaders = [(b"content-type", JSON), (b"content-length", str(len(body)).encode())]
    if headers:
        raw.extend(headers)
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_error(send: Send, error: GatewayError, headers: RawHeaders | None = None) -> None:
    """Answer with an OpenAI-shaped error."""
    raw = list(headers or [])
    raw.extend((k.lower().encode(), v.encode()) for k, v in error.headers.items())
    await send_json(send, error.status, error.body(), raw)
