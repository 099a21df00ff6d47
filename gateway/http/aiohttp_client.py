"""The aiohttp upstream client: one shared session per process, with keep-alive pools.

aiohttp was measured here at 6,000-12,000 requests/s on this hop where httpx 0.28 manages ~600
(encode/httpx#3215), so it carries the hot path. The session is made once by the app's lifespan
and closed by it; nothing here is created per request except the request itself.

Its answers are held to the native client's rules (:mod:`gateway.http.client`): interim 1xx
responses are skipped (aiohttp does this itself) and 101 is a protocol error; a connection with
bytes left after the response is closed, not reused (aiohttp's ``should_close``); the head and
whole-body caps of :class:`~gateway.http.base.ResponseLimits` apply; aiohttp parses
responses leniently, so header values holding CR, LF or NUL, which the native client and h11
refuse, are refused here after the fact; a plain POST is not sent twice (aiohttp resends only
idempotent methods). Every aiohttp exception is mapped in one place, :func:`_mapped`, to the
same :mod:`gateway.http.errors` classes, with messages built from the exception's *type*,
never its ``str`` or ``repr`` (which carry the request, the backend's key included).
"""

from __future__ import annotations

import asyncio
import functools
import os
from typing import TYPE_CHECKING

import aiohttp
from aiohttp.client_proto import ResponseHandler

from gateway.http.base import DEFAULT_LIMITS
from gateway.http.errors import (
    UpstreamConnectError,
    UpstreamConnectionLost,
    UpstreamConnectTimeout,
    UpstreamError,
    UpstreamFirstByteTimeout,
    UpstreamIdleTimeout,
    UpstreamProtocolError,
    UpstreamResponseTooLarge,
    UpstreamTotalTimeout,
)
from gateway.http.headers import response_headers

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from gateway.config import Timeouts
    from gateway.http.base import ResponseLimits
    from gateway.types import RawHeaders

__all__ = ["AiohttpResponse", "AiohttpUpstream"]

_BAD_VALUE_BYTES = (b"\r", b"\n", b"\x00")


def _mapped(exc: BaseException, stage: str) -> UpstreamError:
    """The UpstreamError for an aiohttp failure ``exc`` during ``stage`` ('connect', 'head',
    'body'); the message names only the exception's type."""
    kind = type(exc).__name__
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return UpstreamConnectTimeout(f"connecting to backend timed out ({kind})")
    if isinstance(exc, aiohttp.ClientConnectorError):
        # the errno's text only: the OS error's own message names the internal address
        err = exc.os_error.errno
        reason = os.strerror(err) if err else type(exc.os_error).__name__
        return UpstreamConnectError(
            f"cannot connect to backend: {reason}", detail=f"cannot connect: {reason}"
        )
    if isinstance(exc, TimeoutError):  # aiohttp's sock_read (ServerTimeoutError) or ours
        if stage == "head":
            return UpstreamFirstByteTimeout(f"no response from backend in time ({kind})")
        return UpstreamIdleTimeout(f"backend went silent ({kind})")
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientOSError):
        return UpstreamConnectionLost(f"backend connection broke during the {stage} ({kind})")
    return UpstreamProtocolError(f"backend sent invalid HTTP in the {stage} ({kind})")


class _StrictHandler(ResponseHandler):
    """aiohttp's protocol, reusable only with nothing unread.

    aiohttp parses bytes that reach an *idle* kept-alive connection into a queued message and
    would hand that message to the next request on it: another tenant's answer. Its connector
    reuses a connection when ``is_connected()``; here that also requires ``should_close`` to be
    false (no queued message, no leftover bytes, no error), so such a connection is closed
    instead of reused.
    """

    def is_connected(self) -> bool:
        return super().is_connected() and not self.should_close


class AiohttpResponse:
    """A backend's response, headers received, body not yet read.

    Per request and not shared. The caller must call :meth:`close` (idempotent) on every path;
    closing before the body is fully read aborts the connection, which is how the backend learns
    that the client went away.
    """

    __slots__ = ("_closed", "_deadline", "_idle", "_max_body", "_resp", "headers", "status")

    def __init__(
        self, resp: aiohttp.ClientResponse, idle: float, deadline: float, max_body: int
    ) -> None:
        self._resp = resp
        self._idle = idle
        self._deadline = deadline
        self._max_body = max_body
        self._closed = False
        self.status = resp.status
        self.headers: RawHeaders = response_headers(list(resp.raw_headers))

    @property
    def is_event_stream(self) -> bool:
        return self._resp.content_type == "text/event-stream"

    @property
    def is_stream(self) -> bool:
        """Relay chunk by chunk only an event stream (see UpstreamResponse.is_stream)."""
        return self.is_event_stream

    def _wait(self, idle: float) -> float:
        """Seconds to wait for the next part: the idle timeout, within the total deadline."""
        left = self._deadline - asyncio.get_running_loop().time()
        if left <= 0:
            raise UpstreamTotalTimeout("the request's total time ran out")
        return min(idle, left)

    def _timed_out(self, idle: float) -> UpstreamError:
        if asyncio.get_running_loop().time() >= self._deadline:
            return UpstreamTotalTimeout("the request's total time ran out")
        return UpstreamIdleTimeout(f"backend went silent for {idle:g}s", detail=f"{idle:g}s")

    async def next_chunk(self, timeout: float | None = None) -> bytes | None:
        """The next body part, None at the end; waits at most ``timeout`` (default: idle)."""
        idle = self._idle if timeout is None else timeout
        try:
            async with asyncio.timeout(self._wait(idle)):
                part = await self._resp.content.readany()
        except TimeoutError as exc:
            raise self._timed_out(idle) from exc
        except aiohttp.ClientError as exc:
            raise _mapped(exc, "body") from exc
        if part:
            return part
        if not self._resp.content.is_eof():
            raise UpstreamConnectionLost("backend stream ended early")
        return None

    async def read(self) -> bytes:
        """The whole body (non-streaming responses), at most ``max_body`` bytes."""
        cap = self._max_body
        length = self._resp.content_length
        if length is not None and length > cap:
            self._resp.close()
            raise UpstreamResponseTooLarge(f"response body over {cap} bytes")
        parts = []
        size = 0
        while (part := await self.next_chunk()) is not None:
            size += len(part)
            if size > cap:
                self._resp.close()
                raise UpstreamResponseTooLarge(f"response body over {cap} bytes")
            parts.append(part)
        return b"".join(parts)

    async def chunks(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive, without waiting to fill any buffer."""
        while (part := await self.next_chunk()) is not None:
            yield part

    def close(self) -> None:
        """Release the connection (or abort it if the body was not read to the end)."""
        if self._closed:
            return
        self._closed = True
        if self._resp.content.is_eof():
            self._resp.release()
        else:
            self._resp.close()


def _check_head(resp: aiohttp.ClientResponse, limits: ResponseLimits) -> None:
    """Refuse what aiohttp's lenient parser let through, and a head over the byte cap."""
    if resp.status == 101:
        raise UpstreamProtocolError("backend answered status 101")
    size = 0
    for name, value in resp.raw_headers:
        size += len(name) + len(value)
        for bad in _BAD_VALUE_BYTES:
            if bad in value or bad in name:
                raise UpstreamProtocolError("backend sent a control byte in a header")
        if name.lower() == b"transfer-encoding" and value.strip().lower() != b"chunked":
            raise UpstreamProtocolError("unsupported transfer-encoding from backend")
    if size > limits.max_head:
        raise UpstreamResponseTooLarge(f"response head over {limits.max_head} bytes")


class AiohttpUpstream:
    """The process's HTTP client for backends (``server.upstream_client: aiohttp``).

    ``keepalive_per_backend`` is taken for the native client's signature: aiohttp's connector
    keeps every idle connection it is given back (no per-host cap, ``limit_per_host=0``), and
    the router bounds the connections in use per backend (``max_in_flight``)."""

    def __init__(
        self,
        timeouts: Timeouts,
        keepalive_per_backend: int = 256,
        limits: ResponseLimits = DEFAULT_LIMITS,
    ) -> None:
        self._timeouts = timeouts
        self._limits = limits
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
        # aiohttp has no public hook for the protocol class; its connector keeps it here
        connector._factory = functools.partial(  # type: ignore[assignment]
            _StrictHandler, loop=connector._loop
        )
        limits = self._limits
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=self._client_timeout,
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
            raise_for_status=False,
            max_line_size=limits.max_head,
            max_field_size=limits.max_head,
            max_headers=limits.max_headers,
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
        deadline = asyncio.get_running_loop().time() + t.total
        try:
            async with asyncio.timeout(min(t.first_token, t.total)):
                resp = await session.post(
                    url, data=body, headers=[(k.decode("latin-1"), v.decode("latin-1"))
                                             for k, v in headers]
                )
        except TimeoutError as exc:  # ours, aiohttp's sock_read before the headers, or connect
            if isinstance(exc, aiohttp.ConnectionTimeoutError):
                raise _mapped(exc, "connect") from exc
            raise UpstreamFirstByteTimeout(
                f"no response from backend within {t.first_token}s",
                detail=f"{t.first_token:g}s",
            ) from exc
        except aiohttp.ClientError as exc:
            raise _mapped(exc, "head") from exc
        try:
            _check_head(resp, self._limits)
        except UpstreamError:
            resp.close()
            raise
        return AiohttpResponse(resp, t.idle, deadline, self._limits.max_body)

    async def get(self, url: str, timeout: float) -> tuple[int, bytes]:
        """A low-rate GET (health checks, engine metrics): status and body, or UpstreamError."""
        session = self._session
        if session is None:
            raise UpstreamConnectError("upstream client is not started")
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                _check_head(resp, self._limits)
                return resp.status, await resp.read()
        except TimeoutError as exc:
            raise UpstreamFirstByteTimeout(f"GET timed out after {timeout}s") from exc
        except aiohttp.ClientError as exc:
            raise _mapped(exc, "head") from exc
