"""A model's context window as its engine reports it, for ``/v1/models`` when the policy has none.

Engines list what they serve on ``GET /v1/models``; vLLM (and the simulator) give each model's
context window as ``max_model_len``, others as ``context_length`` or ``context_window``. The
gateway asks one backend of the model's pool that is taking requests, with a short timeout;
the answer is trusted only as a positive integer no larger than ``MAX_CONTEXT`` (a backend's
number is validated before a client sees it). :func:`context_of` reads a listing (pure);
:class:`ContextLookup` asks and remembers the answer (a found value for ``FOUND_TTL`` seconds,
none for ``MISSING_TTL``), one question in flight per model, so a client polling
``/v1/models`` never makes a backend busy.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.http.errors import UpstreamError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from gateway.routing.pool import PoolState

__all__ = ["FOUND_TTL", "MAX_CONTEXT", "MISSING_TTL", "ContextLookup", "context_of"]

#: the largest context window believed (ten million tokens)
MAX_CONTEXT = 10_000_000
#: seconds a found context window is kept
FOUND_TTL = 300.0
#: seconds an engine that told nothing is left alone
MISSING_TTL = 30.0
#: the names engines give a model's context window, in the order read
_KEYS = ("max_model_len", "context_length", "context_window")

def context_of(body: bytes, model: str) -> int | None:
    """The context window of ``model`` in an engine's ``/v1/models`` listing (the entry with
    its id, else the only entry), or None."""
    try:
        listing: Any = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return None
    data = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(data, list):
        return None
    cards = [c for c in data if isinstance(c, dict)]
    card = next((c for c in cards if c.get("id") == model), None)
    if card is None and len(cards) == 1:
        card = cards[0]
    if card is None:
        return None
    for key in _KEYS:
        value = card.get(key)
        if type(value) is int and 0 < value <= MAX_CONTEXT:
            return value
    return None


def _base(url: str) -> str:
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


class ContextLookup:
    """Engines' context windows by model, asked for lazily and remembered (per process)."""

    __slots__ = ("_found", "_get", "_pending", "timeout")

    def __init__(self, get: Callable[[str, float], Awaitable[tuple[int, bytes]]],
                 *, timeout: float = 2.0) -> None:
        #: ``(url, timeout)`` -> ``(status, body)``: a low-rate GET (``UpstreamClient.get``)
        self._get = get
        self.timeout = timeout
        #: model -> (monotonic expiry, context window or None)
        self._found: dict[str, tuple[float, int | None]] = {}
        self._pending: dict[str, asyncio.Future[int | None]] = {}

    async def context(self, name: str, pool: PoolState, backend_model: str) -> int | None:
        """The context window of model ``name`` (served as ``backend_model`` by ``pool``), as
        a backend of the pool reports it; None when none does (or it is not known yet)."""
        now = time.monotonic()
        known = self._found.get(name)
        if known is not None and known[0] > now:
            return known[1]
        pending = self._pending.get(name)
        if pending is None:
            pending = asyncio.ensure_future(self._ask(pool, backend_model))
            self._pending[name] = pending
            pending.add_done_callback(lambda done: self._remember(name, done))
        return await asyncio.shield(pending)

    def _remember(self, name: str, done: asyncio.Future[int | None]) -> None:
        self._pending.pop(name, None)
        value = None
        with contextlib.suppress(BaseException):
            value = done.result()
        ttl = FOUND_TTL if value is not None else MISSING_TTL
        self._found[name] = (time.monotonic() + ttl, value)

    async def _ask(self, pool: PoolState, backend_model: str) -> int | None:
        now = time.monotonic()
        # one that is not ejected (0: never was)
        backend = next((b for b in pool.backends if b.ejected_until <= now), None)
        if backend is None:
            return None
        try:
            status, body = await self._get(_base(backend.config.url) + "/v1/models", self.timeout)
        except (UpstreamError, OSError, TimeoutError):
            return None
        return context_of(body, backend_model) if status == 200 else None

    def __repr__(self) -> str:
        known = sum(1 for _, value in self._found.values() if value is not None)
        return f"<ContextLookup [{known} known | {len(self._pending)} asking]>"
