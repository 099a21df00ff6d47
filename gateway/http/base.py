"""The interface every upstream client implements (the swappable bottom layer), its caps
and the factory that picks one.

Two implementations: :mod:`gateway.http.client` (the default, a lean HTTP/1.1 client) and
:mod:`gateway.http.aiohttp_client`. Both raise only :mod:`gateway.http.errors`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from gateway.config import Timeouts
    from gateway.types import RawHeaders

__all__ = [
    "DEFAULT_LIMITS",
    "ResponseLimits",
    "UpstreamClient",
    "UpstreamResponse",
    "make_upstream",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseLimits:
    """Caps on what a backend may send, so one bad backend cannot exhaust a worker's memory.

    Over a cap, a response is :class:`~gateway.http.errors.UpstreamResponseTooLarge` and its
    connection is closed. Streams (``chunks()``) are not capped in size: they are bounded by the
    idle and total timeouts instead.
    """

    #: bytes of status line and headers (interim 1xx responses included)
    max_head: int = 64 * 1024
    #: header lines in one response head
    max_headers: int = 128
    #: bytes of a body read whole (``read()``)
    max_body: int = 64 * 1024 * 1024


DEFAULT_LIMITS = ResponseLimits()


class UpstreamResponse(Protocol):
    """A response whose headers have arrived. The caller must ``close()`` it on every path."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> RawHeaders:
        """Already filtered for relaying to the client."""

    @property
    def is_event_stream(self) -> bool: ...

    @property
    def is_stream(self) -> bool:
        """Relay chunk by chunk: the backend answered ``text/event-stream``.

        Any other body, chunked or close-delimited included, is read whole with ``read()``
        (capped by ``ResponseLimits.max_body``), so a body that breaks midway is an error
        before the client's first byte (retryable), not a truncated 200.
        """

    async def next_chunk(self, timeout: float | None = None) -> bytes | None:
        """The next body part (None at the end), waiting at most ``timeout`` s (default idle)."""

    async def read(self) -> bytes:
        """The whole body; UpstreamError if it breaks or passes ``max_body``."""

    def chunks(self) -> AsyncIterator[bytes]: ...

    def close(self) -> None: ...


class UpstreamClient(Protocol):
    """One per process, opened and closed by the app's lifespan."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def post(
        self, url: str, body: bytes, headers: RawHeaders, timeouts: Timeouts | None = None
    ) -> UpstreamResponse: ...

    async def get(self, url: str, timeout: float) -> tuple[int, bytes]: ...


def make_upstream(
    kind: str,
    timeouts: Timeouts,
    keepalive_per_backend: int,
    limits: ResponseLimits = DEFAULT_LIMITS,
) -> UpstreamClient:
    """The client named by ``server.upstream_client``."""
    if kind == "aiohttp":
        from gateway.http.aiohttp_client import AiohttpUpstream

        return AiohttpUpstream(timeouts, keepalive_per_backend, limits)
    from gateway.http.client import H1Upstream

    return H1Upstream(timeouts, keepalive_per_backend, limits)
