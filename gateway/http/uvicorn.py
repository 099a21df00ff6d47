"""Serve the app with uvicorn (uvloop + httptools), one or several worker processes.

SIGTERM stops accepting connections, lets in-flight requests and streams finish for up to
``server.drain_timeout`` seconds, then cancels what is left (uvicorn's graceful shutdown).

The listening socket is bound here, before uvicorn starts the app: a port already in use is a
one-line error and a non-zero exit, with nothing started. (uvicorn binds a single worker's
socket only after the app's lifespan has started: Redis clients, the batch runner, the ledger
flusher. It then ran the lifespan shutdown, which could hang, with its signal handlers only
setting flags nobody read, so the process neither exited nor answered SIGTERM or SIGINT.)

``server.http_protocol: uvicorn`` runs uvicorn's httptools protocol with two additions
(:class:`UvicornH1Protocol`): the raw head-byte cap of the native protocol
(:class:`~gateway.http.server.HeadMeter`: one endless header line is refused at 68 KiB, not
buffered whole), and a response the app leaves unfinished aborts the connection instead of
waiting, forever for a client that stopped reading, to flush the unsent rest.
``server.limits.max_connections`` is uvicorn's ``limit_concurrency`` there (503 per request);
uvicorn has no header or body timeout.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.config.model import ClientLimits
from gateway.http.server import GatewayH1Protocol, HeadMeter, HeadTooLarge, error_response

if TYPE_CHECKING:
    import asyncio

__all__ = ["UvicornH1Protocol", "uvicorn_options"]


class _AbortUnfinished:
    """The transport as a request's cycle sees it: ``close`` aborts when the response was
    started and not finished (nothing more will be written; flushing may never end)."""

    __slots__ = ("_cycle", "_transport", "is_closing", "write")

    def __init__(self, transport: asyncio.Transport, cycle: Any) -> None:
        self._transport = transport
        self._cycle = cycle
        self.write = transport.write
        self.is_closing = transport.is_closing

    def close(self) -> None:
        cycle = self._cycle
        if cycle.response_started and not cycle.response_complete:
            self._transport.abort()
        else:
            self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class UvicornH1Protocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with the head cap and the abort of unfinished responses."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._meter = HeadMeter()

    def data_received(self, data: bytes) -> None:
        try:
            self._meter.feed(super().data_received, data)
        except HeadTooLarge as exc:
            if not self.transport.is_closing():
                self.transport.write(error_response(exc.status, exc.message))
                self.transport.close()

    def on_message_begin(self) -> None:
        self._meter.message_done()
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._meter.head_done()
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and not isinstance(cycle.transport, _AbortUnfinished):
            cycle.transport = _AbortUnfinished(self.transport, cycle)  # type: ignore[assignment]

    def on_message_complete(self) -> None:
        self._meter.message_done()
        super().on_message_complete()


def uvicorn_options(
    drain_timeout: float,
    http_protocol: str = "native",
    limits: ClientLimits | None = None,
) -> dict[str, object]:
    """Server settings shared by ``serve`` and the demo; ``http_protocol`` is the policy's
    ``server.http_protocol`` (``native``: :class:`~gateway.http.server.GatewayH1Protocol`),
    ``limits`` its ``server.limits``."""
    limits = limits or ClientLimits()
    native = http_protocol == "native"
    cap = limits.max_connections
    return {
        "loop": "uvloop",
        "http": functools.partial(GatewayH1Protocol, limits=limits) if native
        else UvicornH1Protocol,
        "lifespan": "on",
        "proxy_headers": False,  # the gateway reads no X-Forwarded-* header
        "access_log": False,
        "server_header": False,
        "date_header": True,
        "timeout_graceful_shutdown": drain_timeout,
        "timeout_keep_alive": limits.keep_alive_timeout,
        # the native protocol counts connections itself (503 and close when over); uvicorn
        # counts the connection asking too (limit N serves N - 1 connections)
        "limit_concurrency": None if native or cap is None else cap + 1,
        "backlog": 4096,
        "log_level": "warning",
    }
