"""A lean, auto-pipelining Redis client for the hot path (one node, RESP2, hiredis).

Used by the quota store (admit and settle, every request), the ledger and the key store
whenever Redis is one node over plain TCP (``client.py`` picks it).

Why not redis-py here: profiled through the gateway with quotas on, redis-py's asyncio client
spent ~100 µs of the event loop per EVALSHA (command packing, the connection pool, a timeout
context, and one ``write`` system call per command), and the quota steps are two calls per
request. This client keeps one connection and writes every command issued in the same event-loop
iteration in one ``write`` (auto-pipelining); replies are parsed by hiredis and matched to
callers in order. Each caller still waits exactly one round trip.

One batch of commands is on the wire at a time, so that under load the commands issued while a
batch is answered share the next write, with one exception: an urgent command (a reserve, a
request waits for it) never waits behind a batch of non-urgent ones (settles, whose replies
nobody waits for). At one connection a request's settle goes out as soon as its response has
ended, and the next request's reserve is then written at once, beside it on the wire if its
reply has not come yet; both on one connection, so Redis still runs the settle first (a slot
it frees is free for the reserve behind it).

It speaks to one Redis node (``redis://[user:password@]host[:port][/db]``); Redis Cluster,
TLS and unix sockets stay on redis-py (``client.py`` picks, ``pyredis.py`` adapts it to the
same interface, ``base.RedisLike``). Errors are redis-py's exception classes, so the stores'
failure handling (``errors.py``) is the same for both clients: a lost connection fails every
waiting call with ``ConnectionError`` and the next call reconnects; ``disconnect`` (the stores
call it through ``drop_idle`` on their first failure, a timeout included) drops a connection
that may hang.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import unquote, urlparse

import hiredis
from redis.exceptions import (
    AuthenticationError,
    BusyLoadingError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.redis.encoding import encode_command
from gateway.timers.deadlines import wheel

__all__ = ["LAZY_FLUSH_S", "PipelinedRedis", "supports_url"]

#: how long a command may wait for the batch on the wire before it is written anyway
LAZY_FLUSH_S = 0.001

_ERRORS: tuple[tuple[str, type[ResponseError] | type[RedisConnectionError]], ...] = (
    ("NOSCRIPT", NoScriptError),
    ("LOADING", BusyLoadingError),
    ("READONLY", ReadOnlyError),
    ("OOM", OutOfMemoryError),
    ("NOAUTH", AuthenticationError),
    ("WRONGPASS", AuthenticationError),
)


def supports_url(url: str) -> bool:
    """True for a plain ``redis://`` URL, the only kind this client speaks."""
    return urlparse(url).scheme == "redis"


def _expire(waiter: asyncio.Future[Any], timeout: float) -> None:
    if not waiter.done():
        waiter.set_exception(RedisTimeoutError(f"Redis did not answer within {timeout} s"))


def _error(reply: hiredis.ReplyError) -> Exception:
    message = str(reply)
    for prefix, cls in _ERRORS:
        if message.startswith(prefix):
            return cls(message)
    return ResponseError(message)


class _Protocol(asyncio.Protocol):
    __slots__ = ("answered", "client", "deadlines", "flush_later", "flush_scheduled", "loop",
                 "pending", "pending_urgent", "reader", "sent", "transport", "urgent_sent",
                 "waiters", "writes")

    def __init__(self, client: PipelinedRedis, loop: asyncio.AbstractEventLoop) -> None:
        self.client = client
        self.loop = loop
        #: the connection's loop's coarse deadlines (call timeouts without a timer each)
        self.deadlines = wheel(loop)
        self.reader = hiredis.Reader()
        self.transport: asyncio.Transport | None = None
        #: one per command sent or pending, in order: replies are matched to them
        self.waiters: deque[asyncio.Future[Any]] = deque()
        self.pending: list[bytes] = []
        #: an urgent command is among ``pending``
        self.pending_urgent = False
        self.flush_scheduled = False
        self.flush_later: asyncio.TimerHandle | None = None
        self.writes = 0
        #: commands written and replies read since the connection opened; an urgent command
        #: is on the wire while ``answered < urgent_sent`` (the end of the last batch that
        #: held one)
        self.sent = self.answered = self.urgent_sent = 0

    def queue(self, command: bytes, urgent: bool) -> asyncio.Future[Any]:
        """Queue an encoded command; the future gets its reply.

        The write happens at the end of this loop iteration when nothing is on the wire, or
        when ``urgent`` and what is on the wire holds no urgent command (a reserve does not
        wait behind settles); otherwise when the batch on the wire is answered, within
        :data:`LAZY_FLUSH_S` at the latest."""
        waiter: asyncio.Future[Any] = self.loop.create_future()
        waiters = self.waiters
        waiters.append(waiter)
        pending = self.pending
        pending.append(command)
        if urgent:
            self.pending_urgent = True
        if not self.flush_scheduled:
            if len(waiters) == len(pending) or (urgent and self.urgent_sent <= self.answered):
                # nothing on the wire, or only commands nobody waits on: write at the end of
                # this loop iteration (with whatever else it queues)
                self.flush_scheduled = True
                self.loop.call_soon(self.flush)
            elif self.flush_later is None:
                # a batch is on the wire that this command may wait for: it goes out when
                # those replies are in, with the others queued meanwhile, so under load
                # commands share writes (one batch on the wire at a time); the timer bounds
                # the wait
                self.flush_later = self.loop.call_later(LAZY_FLUSH_S, self.flush)
        return waiter

    def flush(self) -> None:
        """Write what this loop iteration queued, in one ``write``."""
        self.flush_scheduled = False
        if self.flush_later is not None:
            self.flush_later.cancel()
            self.flush_later = None
        pending = self.pending
        transport = self.transport
        if not pending or transport is None or transport.is_closing():
            return  # connection_lost fails the waiters
        self.pending = []
        self.sent += len(pending)
        if self.pending_urgent:
            self.pending_urgent = False
            self.urgent_sent = self.sent
        transport.write(pending[0] if len(pending) == 1 else b"".join(pending))
        self.writes += 1

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        reader = self.reader
        reader.feed(data)
        waiters = self.waiters
        while (reply := reader.gets()) is not False:
            if not waiters:  # a reply nobody asked for: the stream is out of step
                self.transport.close()  # type: ignore[union-attr]
                return
            self.answered += 1
            waiter = waiters.popleft()
            if waiter.done():  # its caller timed out or was cancelled; the order holds
                continue
            if isinstance(reply, hiredis.ReplyError):
                waiter.set_exception(_error(reply))
            else:
                waiter.set_result(reply)
        if self.pending and not self.flush_scheduled and (
                len(waiters) == len(self.pending)
                or (self.pending_urgent and self.urgent_sent <= self.answered)):
            # the wire is clear (or holds no urgent command while one waits): write the
            # commands that waited, with any the woken callers add in this loop iteration
            self.flush_scheduled = True
            self.loop.call_soon(self.flush)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client._lost(self)
        error = RedisConnectionError(f"connection to Redis lost: {exc!r}")
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_exception(error)


class PipelinedRedis:
    """One connection to one Redis node; concurrent calls share its round trips.

    Args:
        host, port, db, username, password: where and who.
        connect_timeout: bound of the TCP connect plus AUTH/SELECT.
    """

    #: what the stores' reprs show (``base.RedisLike.kind``)
    kind = "pipelined"

    def __init__(self, host: str = "127.0.0.1", port: int = 6379, *, db: int = 0,
                 username: str | None = None, password: str | None = None,
                 connect_timeout: float = 0.2) -> None:
        self.host, self.port, self.db = host, port, db
        self.username, self.password = username, password
        self.connect_timeout = connect_timeout
        self._proto: _Protocol | None = None
        self._connecting: asyncio.Future[_Protocol] | None = None
        self.commands = 0
        self.writes = 0

    @classmethod
    def from_url(cls, url: str, *, connect_timeout: float = 0.2) -> PipelinedRedis:
        parts = urlparse(url)
        if parts.scheme != "redis":
            raise ValueError(f"PipelinedRedis speaks redis:// only, not {parts.scheme}://")
        path = parts.path.strip("/")
        return cls(
            parts.hostname or "127.0.0.1",
            parts.port or 6379,
            db=int(path) if path else 0,
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
            connect_timeout=connect_timeout,
        )

    def __repr__(self) -> str:
        proto = self._proto
        state = "connected" if proto is not None else "idle"
        writes = self.writes + (proto.writes if proto is not None else 0)
        return (f"<PipelinedRedis {self.host}:{self.port}/{self.db} {state} "
                f"commands={self.commands} writes={writes}>")

    async def execute_command(self, *args: Any, urgent: bool = True,
                              timeout: float | None = None) -> Any:
        """Send one command with whatever else this loop iteration sends; its reply.

        ``urgent=False``: the command may wait for the batch on the wire (up to
        :data:`LAZY_FLUSH_S`) to share the next write (a write per command is most of a call's
        cost), and an urgent command never waits behind it; at an idle connection it is
        written at once, like any other.
        ``timeout``: raise ``redis.exceptions.TimeoutError`` if no reply came within about
        that many seconds (a coarse deadline wheel, not a timer per call); the reply's place
        in the stream is kept, so later replies still reach their callers.
        """
        return await self.execute_encoded(encode_command(args), urgent=urgent, timeout=timeout)

    async def execute_encoded(self, command: bytes, *, urgent: bool = True,
                              timeout: float | None = None) -> Any:
        """:meth:`execute_command` for a command already in RESP (as :func:`encode_command`
        writes it): callers that send the same keys and limits on every request keep those
        parts encoded."""
        proto = self._proto
        if proto is None:
            proto = await self._connect()
        waiter = proto.queue(command, urgent)
        self.commands += 1
        if timeout is None:
            return await waiter
        deadlines = proto.deadlines
        handle = deadlines.add(timeout, lambda: _expire(waiter, timeout))
        try:
            return await waiter
        finally:
            deadlines.cancel(handle)

    async def execute_many(self, commands: Sequence[tuple[Any, ...] | bytes]) -> list[Any]:
        """Several commands in one write (a pipeline, not a transaction); each reply in
        order, an error reply as its exception object rather than raised (redis-py's
        ``pipeline.execute(raise_on_error=False)``). A command may come encoded already
        (``bytes``, as :func:`encode_command` makes them)."""
        proto = self._proto
        if proto is None:
            proto = await self._connect()
        waiters = [proto.queue(c if isinstance(c, bytes) else encode_command(c), True)
                   for c in commands]
        self.commands += len(commands)
        results: list[Any] = []
        for waiter in waiters:
            try:
                results.append(await waiter)
            except (ResponseError, RedisConnectionError) as exc:
                results.append(exc)
        return results

    async def script_load(self, source: str) -> str:
        sha = await self.execute_command("SCRIPT", "LOAD", source)
        return sha.decode() if isinstance(sha, bytes) else str(sha)

    async def load_scripts(self, sources: Iterable[str]) -> None:
        """``SCRIPT LOAD`` each source, all in one write; the first error reply is raised."""
        for reply in await self.execute_many([("SCRIPT", "LOAD", s) for s in sources]):
            if isinstance(reply, BaseException):
                raise reply

    async def ping(self) -> bool:
        return bool(await self.execute_command("PING"))

    async def drop_idle(self) -> None:
        """The one connection may hang on a dead server: drop it (``base.RedisLike``)."""
        self.disconnect()

    def disconnect(self) -> None:
        """Drop the connection (calls waiting on it fail); the next call reconnects."""
        proto = self._proto
        if proto is not None and proto.transport is not None:
            proto.transport.close()
        self._proto = None

    async def aclose(self) -> None:
        self.disconnect()

    # -- internals --------------------------------------------------------------------------

    def _lost(self, proto: _Protocol) -> None:
        self.writes += proto.writes
        if self._proto is proto:
            self._proto = None

    async def _connect(self) -> _Protocol:
        if self._connecting is not None:
            return await asyncio.shield(self._connecting)
        loop = asyncio.get_running_loop()
        self._connecting = loop.create_future()
        try:
            proto = await self._open(loop)
        except BaseException as exc:
            failed = self._connecting
            self._connecting = None
            if not failed.done():
                failed.set_exception(exc)
                failed.exception()  # retrieved: no "never retrieved" warning if nobody waits
            raise
        done = self._connecting
        self._connecting = None
        done.set_result(proto)
        return proto

    async def _open(self, loop: asyncio.AbstractEventLoop) -> _Protocol:
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, proto = await loop.create_connection(
                    lambda: _Protocol(self, loop), self.host, self.port
                )
        except TimeoutError as exc:
            raise RedisTimeoutError(f"connecting to Redis at {self.host}:{self.port} timed out"
                                    ) from exc
        except OSError as exc:
            raise RedisConnectionError(
                f"cannot connect to Redis at {self.host}:{self.port}: {exc}") from exc
        hello: list[tuple[Any, ...]] = []
        if self.password is not None:
            hello.append(("AUTH", self.username, self.password) if self.username
                         else ("AUTH", self.password))
        if self.db:
            hello.append(("SELECT", self.db))
        if hello:
            waiters = [proto.queue(encode_command(c), True) for c in hello]
            try:
                remaining = max(0.01, self.connect_timeout - (time.monotonic() - started))
                async with asyncio.timeout(remaining):
                    for waiter in waiters:
                        await waiter
            except BaseException:
                assert proto.transport is not None
                proto.transport.close()
                raise
        self._proto = proto
        return proto
