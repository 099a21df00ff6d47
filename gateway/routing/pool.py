"""Pools and backends at run time: live state and the choice of a backend.

The choice is a pure function of the backends' state (least outstanding requests relative to
capacity, weighted), so it is tested without I/O; the caller does the HTTP work and reports back
through :meth:`BackendState.release`.
"""

from __future__ import annotations

import os
import random
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.config import Backend, Pool

__all__ = ["BackendState", "PoolState", "pick_backend"]


class BackendState:
    """One backend's configuration and live counters (per process)."""

    __slots__ = ("auth_header", "chat_url", "config", "in_flight", "label", "urls")

    def __init__(self, config: Backend, label: str) -> None:
        self.config = config
        self.label = label
        base = config.url.rstrip("/")
        if not base.endswith("/v1"):
            base += "/v1"
        # upstream URLs are fixed here, never taken from the request
        self.urls = {
            "/v1/chat/completions": base + "/chat/completions",
            "/v1/completions": base + "/completions",
            "/v1/embeddings": base + "/embeddings",
        }
        self.chat_url = self.urls["/v1/chat/completions"]
        self.in_flight = 0
        key = os.environ.get(config.api_key_env) if config.api_key_env else None
        self.auth_header = f"Bearer {key}".encode() if key else None

    @property
    def full(self) -> bool:
        return self.in_flight >= self.config.max_in_flight

    def acquire(self) -> None:
        self.in_flight += 1

    def release(self) -> None:
        self.in_flight -= 1

    def __repr__(self) -> str:
        return (
            f"<BackendState {self.label} [in flight: {self.in_flight}/{self.config.max_in_flight}]>"
        )


class PoolState:
    """A pool's backends, in policy order."""

    __slots__ = ("backends", "name", "request_class")

    def __init__(self, config: Pool) -> None:
        self.name = config.name
        self.request_class = config.request_class
        # labels reach clients in error messages: a name, never the internal URL
        self.backends = [
            BackendState(b, b.name or f"{config.name}#{i}") for i, b in enumerate(config.backends)
        ]

    def __repr__(self) -> str:
        busy = sum(b.in_flight for b in self.backends)
        return f"<PoolState {self.name} [backends: {len(self.backends)} | in flight: {busy}]>"


def pick_backend(
    backends: list[BackendState], rng: random.Random | None = None
) -> BackendState | None:
    """Least outstanding requests per unit of weight, with power-of-two random choices.

    Two random candidates are compared rather than scanning for the global minimum, so many
    gateway processes sharing a pool do not all pile onto the same momentarily idle backend.
    Returns None when every backend is at its max in-flight.
    """
    open_ = [b for b in backends if not b.full]
    if not open_:
        return None
    if len(open_) == 1:
        return open_[0]
    r = rng or random
    a, b = r.sample(open_, 2)
    load_a = (a.in_flight + 1) / a.config.weight
    load_b = (b.in_flight + 1) / b.config.weight
    return a if load_a <= load_b else b
