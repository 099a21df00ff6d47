"""The interface every store talks to, whichever Redis client is behind it.

Two implementations: ``pipelined.PipelinedRedis`` (one node over TCP, auto-pipelined, the hot
path's client) and ``pyredis.PyRedis`` (redis-py's ``Redis`` or ``RedisCluster``: TLS, unix
sockets, Cluster). ``client.open_redis`` picks one; a store never asks which it holds.

Replies are what the client parses: bytes, ints, lists (redis-py may turn some into dicts or
tuples, e.g. ``HGETALL``); error replies and failures are redis-py's exception classes
(``errors.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

__all__ = ["Command", "RedisLike"]

#: a command as arguments, or already in RESP (``encoding.encode_command``)
Command = tuple[Any, ...] | bytes


class RedisLike(Protocol):
    """What the quota store, the ledger and the key store use of a Redis client."""

    #: ``pipelined``, ``redis`` or ``cluster``: for the stores' reprs only
    kind: str

    async def execute_command(self, *args: Any) -> Any:
        """One command; its reply, an error reply raised."""

    async def execute_encoded(self, command: bytes, *, urgent: bool = True,
                              timeout: float | None = None) -> Any:
        """One command already in RESP (the stores keep their hot commands' fixed parts
        encoded). ``urgent=False``: it may wait for a batch on the wire (~1 ms at most) to
        share a write with others, and urgent commands never wait behind it.
        ``timeout``: raise ``redis.exceptions.TimeoutError`` (or ``TimeoutError``) after about
        that many seconds."""

    async def execute_many(self, commands: Sequence[Command]) -> list[Any]:
        """Several commands in one round trip (a pipeline, not a transaction); each reply in
        order, an error reply as its exception object, not raised. A failure of the round
        trip itself is raised."""

    async def script_load(self, source: str) -> str:
        """``SCRIPT LOAD`` (on every primary of a Cluster); the sha."""

    async def load_scripts(self, sources: Iterable[str]) -> None:
        """Load several scripts, in as few round trips as the client can."""

    async def drop_idle(self) -> None:
        """Drop connections that may point at a dead server (after a first failure); the
        next call connects again. Calls in flight may fail."""

    async def aclose(self) -> None:
        """Close every connection."""
