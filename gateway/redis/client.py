"""The one place the gateway builds Redis clients, for every store and every kind of URL.

    redis://host:port/db         one node over TCP: the pipelined client (``pipelined.py``),
                                 or redis-py with ``pipelined=False``
    rediss://host:port/db        one node over TLS: redis-py (``?ssl_cert_reqs=...`` etc.
                                 as redis-py reads them)
    unix:///path/redis.sock      a unix socket: redis-py (``redis+unix://`` is the same)
    any of them, cluster=True    Redis Cluster: redis-py's ``RedisCluster`` (startup node)

:func:`open_redis` gives the stores' interface (``base.RedisLike``); :func:`open_redis_py`
gives redis-py itself, for the batch state, which uses more of its API. Both switch redis-py's
own retries off unless asked (a store's back-off and deadline replace them: hidden retries
multiply the wait on a dead server) and never start a health-check timer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.backoff import NoBackoff
from redis.retry import Retry

from gateway.redis.base import RedisLike
from gateway.redis.pipelined import PipelinedRedis, supports_url
from gateway.redis.pyredis import PyRedis

__all__ = ["Timeouts", "open_redis", "open_redis_py"]

_UNIX_ALIASES = ("redis+unix://",)


@dataclass(frozen=True, slots=True, kw_only=True)
class Timeouts:
    """How long a client may wait, seconds.

    Args:
        connect: the TCP (or TLS, or unix) connect, with AUTH/SELECT for the pipelined client.
        socket: redis-py's bound of each read and write; None leaves it to the caller's
            deadline (redis-py implements it with a task per write, a fifth of its CPU per
            call). The pipelined client bounds calls on its own deadline wheel.
    """

    connect: float = 0.2
    socket: float | None = None


def open_redis(url: str, *, cluster: bool = False, pipelined: bool = True,
               timeouts: Timeouts | None = None, max_connections: int | None = 64
               ) -> RedisLike:
    """A client for ``url`` (module docstring): the pipelined one where it applies (one
    node, plain TCP, ``pipelined``), else redis-py behind the same interface."""
    timeouts = timeouts or Timeouts()
    url = _normalized(url)
    if pipelined and not cluster and supports_url(url):
        return PipelinedRedis.from_url(url, connect_timeout=timeouts.connect)
    return PyRedis(open_redis_py(url, cluster=cluster, timeouts=timeouts,
                                 max_connections=max_connections))


def open_redis_py(url: str, *, cluster: bool = False, timeouts: Timeouts | None = None,
                  max_connections: int | None = 64, retries: bool = False
                  ) -> Redis | RedisCluster:
    """redis-py's client for ``url``: ``RedisCluster`` if ``cluster``, else ``Redis``.

    ``max_connections``: redis-py's pool refuses a call beyond it (it does not wait); None is
    redis-py's own default (no bound).
    ``retries=True`` keeps redis-py's default retries (the batch state, whose steps are not
    on a request's path and have no back-off of their own).
    """
    timeouts = timeouts or Timeouts()
    url = _normalized(url)
    options: dict[str, Any] = {
        "socket_connect_timeout": timeouts.connect,
        "socket_timeout": timeouts.socket,
    }
    if max_connections is not None:
        options["max_connections"] = max_connections
    if not retries:
        options["retry"] = Retry(NoBackoff(), 0)
    if cluster:
        return RedisCluster.from_url(url, **options)
    return Redis.from_url(url, health_check_interval=0, **options)


def _normalized(url: str) -> str:
    """``redis+unix://`` (as some clients write it) is redis-py's ``unix://``."""
    for alias in _UNIX_ALIASES:
        if url.startswith(alias):
            return "unix://" + url[len(alias):]
    return url
