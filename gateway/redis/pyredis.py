"""redis-py's ``Redis`` and ``RedisCluster`` behind ``base.RedisLike``.

For what the pipelined client does not speak (TLS, unix sockets, Cluster) or when it is turned
off. redis-py cannot send a command already in RESP: :meth:`PyRedis.execute_encoded` reads the
arguments back (``encoding.decode_command``, hiredis, ~1 µs against redis-py's ~100 µs per
call), so the stores build one form of their commands for both clients.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from gateway.redis.encoding import decode_command

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from gateway.redis.base import Command

__all__ = ["PyRedis"]


class PyRedis:
    """A redis-py client (single node or Cluster) with the stores' interface.

    Args:
        client: the redis-py client; closed by :meth:`aclose`.
    """

    __slots__ = ("kind", "raw")

    def __init__(self, client: Redis | RedisCluster) -> None:
        #: the redis-py client itself, for code that needs its full API (batch state, tests)
        self.raw = client
        self.kind = "cluster" if isinstance(client, RedisCluster) else "redis"

    def __repr__(self) -> str:
        return f"<PyRedis {self.kind} {self.raw!r}>"

    async def execute_command(self, *args: Any) -> Any:
        return await self.raw.execute_command(*args)

    async def execute_encoded(self, command: bytes, *, urgent: bool = True,
                              timeout: float | None = None) -> Any:
        """The command's arguments sent by redis-py (``urgent`` does not apply: redis-py
        writes each command at once)."""
        args = decode_command(command)
        if timeout is None:
            return await self.raw.execute_command(*args)
        async with asyncio.timeout(timeout):
            return await self.raw.execute_command(*args)

    async def execute_many(self, commands: Sequence[Command]) -> list[Any]:
        pipe = self.raw.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*(decode_command(command) if isinstance(command, bytes)
                                   else command))
        return list(await pipe.execute(raise_on_error=False))

    async def script_load(self, source: str) -> str:
        sha = await self.raw.script_load(source)
        return sha.decode() if isinstance(sha, bytes) else str(sha)

    async def load_scripts(self, sources: Iterable[str]) -> None:
        """One ``SCRIPT LOAD`` at a time: a Cluster sends each to every primary, which its
        pipeline cannot (the command has no key)."""
        for source in sources:
            await self.raw.script_load(source)

    async def drop_idle(self) -> None:
        """Disconnect the pool's idle connections; a Cluster re-discovers its nodes itself."""
        raw = self.raw
        if isinstance(raw, Redis):
            with contextlib.suppress(Exception):
                await raw.connection_pool.disconnect(inuse_connections=False)

    async def aclose(self) -> None:
        await self.raw.aclose()
