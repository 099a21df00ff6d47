"""One request and its response on a native server connection: ASGI ``receive`` and ``send``.

The protocol (:class:`gateway.http.server.GatewayH1Protocol`) parses a request into an
``_Exchange`` and runs the app with its ``receive`` and ``send``; the exchange hands the app the
body as it is read, and frames the response (the status line and headers held until the first
body part so both go in one write; Content-Length or chunked encoding; HEAD; keep-alive). The
class keeps its private name: leak checks (``tests/http/test_stream_teardown.py``) count its
instances by it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.http.head import status_line

if TYPE_CHECKING:
    import asyncio

    from gateway.http.server import GatewayH1Protocol

__all__ = ["_Exchange"]

_NO_BODY_STATUS = frozenset({204, 304})
_CHUNK_END = b"0\r\n\r\n"
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_DISCONNECT = {"type": "http.disconnect"}


class _Exchange:
    """One request and its response on a connection."""

    __slots__ = (
        "body",
        "body_given",
        "body_since",
        "buffered",
        "chunked",
        "complete",
        "continue_pending",
        "finished",
        "head_headers",
        "head_sent",
        "is_head",
        "keep_alive",
        "proto",
        "scope",
        "started",
        "status",
        "waiter",
    )

    def __init__(self, proto: GatewayH1Protocol, scope: dict[str, Any], keep_alive: bool,
                 expect_continue: bool) -> None:
        self.proto = proto
        self.scope = scope
        self.keep_alive = keep_alive
        self.continue_pending = expect_continue
        self.is_head = scope["method"] == "HEAD"
        self.body: list[bytes] = []
        self.buffered = 0
        self.body_given = False
        self.complete = False
        self.waiter: asyncio.Future[None] | None = None
        self.started = False
        self.head_sent = False
        self.finished = False
        self.chunked = False
        self.status = 0
        self.head_headers: Any = ()
        self.body_since = proto.loop.time()  # for the body timeout; reset while reads pause

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def receive(self) -> dict[str, Any]:
        """ASGI ``receive``: body parts as they come, then ``http.disconnect`` once the client
        leaves or the response is complete (as uvicorn does)."""
        proto = self.proto
        while True:
            if proto.lost or self.finished:
                return _DISCONNECT
            if proto.read_paused and proto.active is self:
                proto.resume_reading()  # the app is reading: whatever was buffered is taken
            if self.body or (self.complete and not self.body_given):
                parts = self.body
                data = b"".join(parts) if len(parts) != 1 else parts[0]
                self.body = []
                self.buffered = 0
                more = not self.complete
                self.body_given = not more
                return {"type": "http.request", "body": data, "more_body": more}
            if self.continue_pending:
                self.continue_pending = False
                proto.transport.write(_CONTINUE)
            waiter = self.waiter = proto.loop.create_future()
            await waiter

    async def send(self, message: dict[str, Any]) -> None:
        """ASGI ``send``: the head is held until the first body part so both go in one write."""
        proto = self.proto
        kind = message["type"]
        if kind == "http.response.start":
            if self.started:
                raise RuntimeError("http.response.start sent twice")
            self.started = True
            self.continue_pending = False
            self.status = message["status"]
            self.head_headers = message.get("headers", ())
            return
        if kind != "http.response.body":
            raise RuntimeError(f"unexpected ASGI message {kind!r}")
        if not self.started:
            raise RuntimeError("http.response.body before http.response.start")
        if self.finished:
            raise RuntimeError("http.response.body after the response was complete")
        if proto.write_paused and not proto.lost:
            await proto.drain()
        body: bytes = message.get("body", b"")
        more: bool = message.get("more_body", False)
        if not more:
            self.finished = True
        if proto.lost:
            if not more:
                proto.exchange_done(self)
            return
        out = self._head(body, more) if not self.head_sent else b""
        if body and not self.is_head:
            if self.chunked:
                out += b"%x\r\n" % len(body) + body + b"\r\n"
            else:
                out += body
        if not more and self.chunked:
            out += _CHUNK_END
        if out:
            proto.transport.write(out)
        if not more:
            proto.exchange_done(self)

    def _head(self, body: bytes, more: bool) -> bytes:
        self.head_sent = True
        status = self.status
        proto = self.proto
        parts = [status_line(status), proto.default_head()]
        has_length = False
        for name, value in self.head_headers:
            low = name.lower()
            if low == b"content-length":
                has_length = True
            elif low == b"transfer-encoding" or low == b"connection":
                continue  # framing and connection management are this protocol's job
            parts.append(name + b": " + value + b"\r\n")
        if status in _NO_BODY_STATUS or status < 200:
            pass
        elif not has_length:
            if more:
                self.chunked = True
                parts.append(b"transfer-encoding: chunked\r\n")
            else:
                parts.append(b"content-length: " + str(len(body)).encode() + b"\r\n")
        if not more and not self.complete:
            # the whole answer before the request's whole body (an early refusal): the rest
            # is read and dropped, then the connection ends (``exchange_done``); say so, so
            # the client does not send its next request on it
            self.keep_alive = False
        if not self.keep_alive or proto.closing:
            self.keep_alive = False
            parts.append(b"connection: close\r\n")
        parts.append(b"\r\n")
        return b"".join(parts)
