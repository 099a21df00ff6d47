"""What a Redis failure means, decided once for every store (quota, ledger, keys, batch).

Both clients raise redis-py's exception classes (``pipelined.py`` maps its replies onto them),
plus the socket and deadline errors of asyncio. A store needs three answers about one:

- is it a failure of the call at all: catch :data:`FAILURES` (``RedisClusterException``, raised
  by a cluster client that reached no startup node, is not a ``RedisError``);
- is Redis away or degraded, worth a back-off and a retry later (:func:`is_outage`: refused,
  reset, no answer, LOADING, CLUSTERDOWN, TRYAGAIN, READONLY, OOM, MASTERDOWN, MOVED/ASK), as
  opposed to a command Redis refused for good (a script error, a wrong type) or ``NOSCRIPT``
  (:func:`is_no_script`: load the script and send again);
- which of the store's own errors to raise (:class:`ErrorMap`), by :func:`kind_of`::

      timeout    no answer within the bound         RedisTimeoutError, TimeoutError
      connect    could not connect, or it dropped   ConnectionError (not LOADING), OSError,
                                                    RedisClusterException, ClusterError
                                                    (not CLUSTERDOWN)
      refused    Redis answered with an error       every other RedisError
"""

from __future__ import annotations

from typing import Generic, Literal, TypeVar

from redis.exceptions import (
    BusyLoadingError,
    ClusterDownError,
    ClusterError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["FAILURES", "ErrorKind", "ErrorMap", "is_no_script", "is_outage", "kind_of"]

#: everything a call to Redis raises when it fails, whichever client made it
FAILURES: tuple[type[BaseException], ...] = (RedisError, RedisClusterException, OSError,
                                             TimeoutError)

ErrorKind = Literal["timeout", "connect", "refused"]

_DEGRADED = (BusyLoadingError, ClusterDownError, TryAgainError, ReadOnlyError, OutOfMemoryError)
#: error replies of a server that is loading, failing over or full (not of a bad command)
_DEGRADED_PREFIXES = ("LOADING", "CLUSTERDOWN", "TRYAGAIN", "READONLY", "OOM", "MASTERDOWN",
                      "MOVED", "ASK")

E = TypeVar("E", bound=Exception)


def is_no_script(exc: object) -> bool:
    """``NOSCRIPT``: Redis restarted (or a new node) and lost the script cache."""
    return isinstance(exc, NoScriptError) or (
        isinstance(exc, ResponseError) and str(exc).startswith("NOSCRIPT"))


def is_outage(exc: object) -> bool:
    """Redis is away or degraded: back off and retry later (spool, fail over), rather than
    treat the command as refused for good."""
    if isinstance(exc, ResponseError):
        if isinstance(exc, NoScriptError):
            return False
        return isinstance(exc, _DEGRADED) or str(exc).startswith(_DEGRADED_PREFIXES)
    return isinstance(exc, FAILURES)


def kind_of(exc: BaseException) -> ErrorKind:
    """Which of the three families (module docstring) a failure belongs to."""
    if isinstance(exc, RedisTimeoutError | TimeoutError):
        return "timeout"
    if isinstance(exc, RedisConnectionError | OSError | RedisClusterException | ClusterError
                  ) and not isinstance(exc, BusyLoadingError | ResponseError):
        return "connect"  # (CLUSTERDOWN is a ClusterError too, but an answer)
    return "refused"


class ErrorMap(Generic[E]):
    """A store's translation of Redis failures into its own error tree (the cause chained
    by the caller: ``raise errors(exc) from exc``).

    Args:
        timeout, connect, refused: the store's error class for each family.
    """

    __slots__ = ("_classes",)

    def __init__(self, *, timeout: type[E], connect: type[E], refused: type[E]) -> None:
        self._classes: dict[ErrorKind, type[E]] = {
            "timeout": timeout, "connect": connect, "refused": refused}

    def __call__(self, exc: BaseException) -> E:
        kind = kind_of(exc)
        return self._classes[kind](f"{_SAYS[kind]}: {exc!r}")

    def __repr__(self) -> str:
        names = ", ".join(f"{k}={c.__name__}" for k, c in self._classes.items())
        return f"<ErrorMap {names}>"


_SAYS: dict[ErrorKind, str] = {
    "timeout": "Redis did not answer in time",
    "connect": "Redis could not be reached",
    "refused": "Redis answered with an error",
}
