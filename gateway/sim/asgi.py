"""Minimal ASGI plumbing for the simulator's raw app: aliases, body reading, responses.

No framework: a request costs a few dict lookups and one ``msgspec`` decode, which is what lets a
single process hold thousands of streams.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = [
    "JSON_HEADERS",
    "SSE_HEADERS",
    "Receive",
    "Scope",
    "Send",
    "abort_connection",
    "read_body",
    "send_bytes",
    "watch_disconnect",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

JSON_HEADERS = [(b"content-type", b"application/json")]
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]


async def read_body(receive: Receive) -> bytes | None:
    """The whole request body, or ``None`` if the client left first."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def send_bytes(
    send: Send,
    status: int,
    body: bytes,
    headers: list[tuple[bytes, bytes]] | None = None,
    content_type: bytes = b"application/json",
) -> None:
    """A complete response with a content length."""
    head = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    if headers:
        head.extend(headers)
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})


async def watch_disconnect(receive: Receive, on_disconnect: Callable[[], None]) -> None:
    """Call ``on_disconnect`` when the client goes away (run as a task beside the response).

    Needed because uvicorn drops writes to a closed connection silently instead of raising.
    """
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            on_disconnect()
            return


def abort_connection(send: Send) -> bool:
    """Close the client connection mid-response; ``False`` if the server hides its transport.

    ASGI has no "abort" message. uvicorn's ``send`` is a bound method of its per-request cycle,
    which holds the transport; closing it (after the written data flushes) leaves the client with
    a truncated chunked body, as a crashed backend would.
    """
    cycle = getattr(send, "__self__", None)
    close = getattr(getattr(cycle, "transport", None), "close", None)
    if callable(close):  # uvloop's transports do not subclass asyncio.BaseTransport
        close()
        return True
    return False
