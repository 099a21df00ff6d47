"""The interface every upstream client implements (the swappable bottom layer).

Two implementations: :mod:`gateway.upstream.h1` (the default, a lean HTTP/1.1 client) and
:mod:`gateway.upstream.aiohttp_client`. Both raise only :mod:`gateway.upstream.errors`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from gateway.config import Timeouts
    from gateway.types import RawHeaders

__all__ = ["UpstreamClient", "UpstreamResponse", "make_upstream"]


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
        """Relay chunk by chunk: an event stream, or a body of unknown length."""

    async def next_chunk(self, timeout: float | None = None) -> bytes | None:
        """The next body part (None at the end), waiting at most ``timeout`` s (default idle)."""

    async def read(self) -> bytes: ...

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


def make_upstream(kind: str, timeouts: Timeouts, keepalive_per_backend: int) -> UpstreamClient:
    """The client named by ``server.upstream_client``."""
    if kind == "aiohttp":
        from gateway.upstream.aiohttp_client import AiohttpUpstream

        return AiohttpUpstream(timeouts, keepalive_per_backend)
    from gateway.upstream.h1 import H1Upstream

    return H1Upstream(timeouts, keepalive_per_backend)
