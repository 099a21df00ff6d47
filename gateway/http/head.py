"""Request heads on both server protocols: their byte caps, the meter that enforces the raw
cap as bytes arrive, and the error response a refused request gets straight on the socket.

Shared by the native protocol (:mod:`gateway.http.server`) and uvicorn's httptools protocol as
the gateway runs it (:mod:`gateway.http.uvicorn`), so both refuse the same heads the same way.
"""

from __future__ import annotations

import http
from typing import TYPE_CHECKING, Any

from gateway.errors import error_body

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "MAX_HEAD_BYTES",
    "MAX_RAW_HEAD_BYTES",
    "HeadMeter",
    "HeadTooLarge",
    "error_response",
    "status_line",
]

#: request line + headers of one request; more gets 431 (uvicorn has no such bound)
MAX_HEAD_BYTES = 64 * 1024
#: raw bytes of one request head (line, headers, their separators) counted as they arrive,
#: before the parser has reported a header: a header line still arriving is cut off here
MAX_RAW_HEAD_BYTES = MAX_HEAD_BYTES + 4096

_STATUS_LINES = {
    s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n".encode("latin-1") for s in http.HTTPStatus
}


def status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    return line if line is not None else f"HTTP/1.1 {status} \r\n".encode("latin-1")


def error_response(status: int, message: str) -> bytes:
    """A complete OpenAI-shaped error response that closes the connection."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    body = error_body(message, kind, None, None)
    return (
        status_line(status)
        + b"content-type: application/json\r\nconnection: close\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


class HeadMeter:
    """Counts the raw bytes of a request head as they arrive, for both server protocols.

    httptools reports a header only once its line is complete, and until then copies the
    growing line at each read (quadratic): a 50 MiB header line cost seconds of CPU and the
    memory of several copies before a cap on reported headers could act. The protocol feeds
    the parser through :meth:`feed`, which counts bytes while a head is being read and feeds
    at most the bytes left under :data:`MAX_RAW_HEAD_BYTES`; when the head is still not
    complete there, it raises :class:`HeadTooLarge` (431). ``head_done`` and ``message_done``
    are called from the parser's ``on_headers_complete`` and ``on_message_complete``.

    Bytes after a body in the same read begin the next head uncounted, so one head may exceed
    the cap by at most one read (64-256 KiB); the reported-header cap still holds for those.
    """

    __slots__ = ("in_head", "seen")

    def __init__(self) -> None:
        self.in_head = True
        self.seen = 0

    def feed(self, feed_data: Callable[[Any], None], data: bytes) -> None:
        """Feed ``data`` to the parser, at most up to the head cap while a head is read."""
        if not self.in_head:
            feed_data(data)
            return
        room = MAX_RAW_HEAD_BYTES - self.seen
        if len(data) <= room:
            self.seen += len(data)
            feed_data(data)
            return
        view = memoryview(data)
        self.seen = MAX_RAW_HEAD_BYTES
        feed_data(view[:room])
        if self.in_head:
            raise HeadTooLarge(431, "request headers too large")
        feed_data(view[room:])  # the head ended within the cap: the rest is body and beyond

    def head_done(self) -> None:
        self.in_head = False

    def message_done(self) -> None:
        self.in_head = True
        self.seen = 0


class HeadTooLarge(Exception):
    """A request head over its cap (raised from a parser callback or :class:`HeadMeter`)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

