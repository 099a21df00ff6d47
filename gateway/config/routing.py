"""The policy's request classes and routing: which class a request is, and how it is retried.

``classes:`` and ``routing:`` in a policy: each :class:`RequestClass` (priority, deadlines,
its :class:`Timeouts`), the :class:`RouteRule` list that sets a request's class, and the
:class:`Retry` budget and back-off.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from gateway.config.base import Name, PolicyStruct, PositiveFloat, PositiveInt

__all__ = [
    "DEFAULT_CLASSES",
    "RequestClass",
    "Retry",
    "RouteRule",
    "Routing",
    "Timeouts",
]


class Timeouts(PolicyStruct, frozen=True):
    """Upstream timeouts, in seconds; ``total`` and ``client_stall`` also bound relaying the
    answer to the client."""

    connect: PositiveFloat = 5.0
    #: until the first token: the response headers, and for a stream its first chunk
    first_token: PositiveFloat = 120.0
    #: the longest silence allowed between two chunks of a response
    idle: PositiveFloat = 120.0
    #: the whole request, from the attempt that answers to the last byte relayed: a client
    #: that stops reading is cut off then (response ended, backend connection closed, slot
    #: released)
    total: PositiveFloat = 900.0
    #: the longest one write to the client may wait for it to read (the connection's send
    #: buffer not draining): past it the stream is cancelled as if the client had left
    #: (backend connection closed, slot released, billed for what was relayed)
    client_stall: PositiveFloat = 30.0


class RequestClass(PolicyStruct, frozen=True):
    """A class of requests with its priority, deadlines and timeouts."""

    name: Name
    #: lower is served first from a pool's queue
    priority: int = 0
    #: a request that cannot start (get a backend) within this many seconds is refused at once
    start_deadline: PositiveFloat = 10.0
    #: the time to first token this class aims for: above it (predicted on its own pool) its
    #: requests borrow a lower class's pool that ``lend``s, and a pool that ``shed``s refuses
    #: lower classes first; None: neither
    ttft_target: PositiveFloat | None = None
    #: per-class upstream timeouts (default: ``server.timeouts``)
    timeouts: Timeouts | None = None


DEFAULT_CLASSES = [
    RequestClass(name="interactive", priority=0, start_deadline=5.0),
    RequestClass(name="batch", priority=10, start_deadline=600.0),
]


class RouteRule(PolicyStruct, frozen=True):
    """Sets the class of matching requests; every given condition must hold."""

    request_class: Name = msgspec.field(name="class")
    models: list[str] | None = None
    endpoints: list[str] | None = None
    stream: bool | None = None
    #: matches when the request's max_tokens (or max_completion_tokens) is at least this
    min_max_tokens: PositiveInt | None = None
    #: fnmatch-style pattern on the request's ``user`` field
    user: str | None = None


class Retry(PolicyStruct, frozen=True):
    """Retries on another backend (then the fallback pool) before the first byte is relayed."""

    max_attempts: PositiveInt = 3
    backoff_base: PositiveFloat = 0.025
    backoff_max: PositiveFloat = 1.0
    #: retries may be at most this share of recent requests ...
    budget_ratio: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.2
    #: ... plus this many per second, so light traffic can always retry
    budget_min_per_s: Annotated[float, msgspec.Meta(ge=0)] = 2.0
    #: the window of "recent", in seconds
    budget_window: PositiveFloat = 10.0
    #: the longest a backend's ``Retry-After`` may keep it out of picks (and the most a client
    #: is told to wait on its behalf), in seconds: a backend answering ``Retry-After: 1e12``
    #: sits out this long, not 31,700 years; unparseable values (``inf``, ``nan``, negative,
    #: garbage) are ignored
    retry_after_max: PositiveFloat = 60.0


class Routing(PolicyStruct, frozen=True):
    """How a request's class is chosen, and how failures are retried."""

    default_class: Name = "interactive"
    #: honour the X-Request-Class header from every key (keys may opt in one by one)
    class_header: bool = False
    rules: list[RouteRule] = msgspec.field(default_factory=list)
    retry: Retry = msgspec.field(default_factory=Retry)
