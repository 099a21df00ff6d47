"""The aiohttp upstream client: one shared session per process, with keep-alive pools.

aiohttp was measured here at 6,000-12,000 requests/s on this hop where httpx 0.28 manages ~600
(encode/httpx#3215), so it carries the hot path. The session is made once by the app's lifespan
and closed by it; nothing here is created per request except the request itself.
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING

import aiohttp

from gateway.upstream.errors import (
    UpstreamConnectError,
    UpstreamConnectTimeout,
    UpstreamError,
    UpstreamFirstByteTimeout,
    UpstreamIdleTimeout,
    UpstreamProtocolError,
)
from gateway.upstream.headers import response_headers

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from gateway.config import Timeouts
    from gateway.types import RawHeaders

__all__ = ["AiohttpResponse", "AiohttpUpstream"]


class AiohttpResponse:
    """A backend's response, headers received, body not yet read.

    Per request and not shared. The caller must call :meth:`close` (idempotent) on every path;
    closing before the body is fully read aborts the connection, which is how the backend learns
    that the client went away.
    """

    __slots__ = ("_closed", "_idle", "_resp", "headers", "status")

    def __init__(self, resp: aiohttp.ClientResponse, idle: float) -> None:
        self._resp = resp
        self._idle = idle
        self._closed = False
        self.status = resp.status
        self.headers: RawHeaders = response_headers(list(resp.raw_headers))

    @property
    def is_event_stream(self) -> bool:
        return self._resp.content_type == "text/event-stream"

    @property
    def is_stream(self) -> bool:
        """Relay chunk by chunk: an event stream, or a body of unknown length."""
        return self.is_event_stream or self._resp.content_length is None

    async def next_chunk(self, timeout: float | None = None) -> bytes | None:
        """The next body part, None at the end; waits at most ``timeout`` (default: idle)."""
        try:
            async with asyncio.timeout(self._idle if timeout is None else timeout):
                part = await self._resp.content.readany()
        except TimeoutError as exc:
            raise UpstreamIdleTimeout(f"backend went silent for {timeout or self._idle}s") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamProtocolError(f"backend connection broke: {exc!r}") from exc
        if part:
            return part
        if not self._resp.content.is_eof():
            raise UpstreamProtocolError("backend stream ended early")
        return None

    async def read(self) -> bytes:
        """The whole body (non-streaming responses)."""
        try:
            return await self._resp.read()
        except TimeoutError as exc:
            raise UpstreamIdleTimeout(f"backend went silent for {self._idle}s") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamProtocolError(f"backend connection broke: {exc!r}") from exc

    async def chunks(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive, without waiting to fill any buffer."""
        try:
            async for chunk in self._resp.content.iter_any():
                yield chunk
        except TimeoutError as exc:
            raise UpstreamIdleTimeout(f"backend went silent for {self._idle}s") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamProtocolError(f"backend connection broke: {exc!r}") from exc
        if not self._resp.content.is_eof():
            raise UpstreamProtocolError("backend stream ended early")

    def close(self) -> None:
        """Release the connection (or abort it if the body was not read to the end)."""
        if self._closed:
            return
        self._closed = True
        if self._resp.content.is_eof():
            self._resp.release()
        else:
            self._resp.close()


class AiohttpUpstream:
    """The process's HTTP client for backends."""

    def __init__(self, timeouts: Timeouts, keepalive_per_backend: int = 256) -> None:
        self._timeouts = timeouts
        self._keepalive = keepalive_per_backend
        self._client_timeout = aiohttp.ClientTimeout(
            total=None, connect=None, sock_connect=timeouts.connect, sock_read=timeouts.idle
        )
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        """Open the shared session (called by the app's lifespan, inside the running loop)."""
        connector = aiohttp.TCPConnector(
            limit=0,  # per-backend limits are the router's job (max_in_flight)
            limit_per_host=0,
            keepalive_timeout=60.0,
            ttl_dns_cache=300,
            enable_cleanup_closed=False,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=self._client_timeout,
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
            raise_for_status=False,
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def post(
        self, url: str, body: bytes, headers: RawHeaders, timeouts: Timeouts | None = None
    ) -> AiohttpResponse:
        """Send a POST and wait for the response headers.

        Connect errors are :class:`UpstreamConnectError` (safe to retry: nothing was sent);
        a missing response within ``timeouts.first_token`` is :class:`UpstreamFirstByteTimeout`.
        """
        session = self._session
        if session is None:
            raise UpstreamConnectError("upstream client is not started")
        t = timeouts or self._timeouts
        try:
            async with asyncio.timeout(t.first_token):
                resp = await session.post(
                    url, data=body, headers=[(k.decode("latin-1"), v.decode("latin-1"))
                                             for k, v in headers]
                )
        except aiohttp.ConnectionTimeoutError as exc:
            raise UpstreamConnectTimeout(f"connecting to backend timed out: {exc}") from exc
        except TimeoutError as exc:  # our deadline, or aiohttp's sock_read before the headers
            raise UpstreamFirstByteTimeout(
                f"no response from backend within {t.first_token}s"
            ) from exc
        except aiohttp.ClientConnectorError as exc:
            # the errno's text only: the OS error's own message names the internal address
            err = exc.os_error.errno
            reason = os.strerror(err) if err else type(exc.os_error).__name__
            raise UpstreamConnectError(f"cannot connect to backend: {reason}") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamProtocolError(f"backend request failed: {exc!r}") from exc
        return AiohttpResponse(resp, t.idle)

    async def get(self, url: str, timeout: float) -> tuple[int, bytes]:
        """A low-rate GET (health checks, engine metrics): status and body, or UpstreamError."""
        session = self._session
        if session is None:
            raise UpstreamConnectError("upstream client is not started")
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                return resp.status, await resp.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise UpstreamError(f"GET {url} failed: {exc!r}") from exc
