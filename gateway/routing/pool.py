"""A pool at run time: its backends, its waiting queue, and the figures spill-over reads.

The queue is ordered by class priority, then deadline, then arrival, so an interactive request
never waits behind a batch request. A waiting request holds no backend connection: it holds a
future that :meth:`PoolState.dispatch` completes with a backend when one frees up.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
import time
from collections import deque
from typing import TYPE_CHECKING

from gateway.routing.backend import BackendState
from gateway.routing.errors import NoHealthyBackend, PoolCoolingDown, PoolSaturated
from gateway.routing.pick import pick_affine, pick_least_loaded, pick_prefix, pick_round_robin
from gateway.routing.prefix import PrefixIndex

if TYPE_CHECKING:
    from collections.abc import Collection, Sequence

    from gateway.config import Pool

__all__ = ["PoolState"]

_TTFT_WINDOW = 256  # recent TTFT observations kept for the p90 that borrowing reads
_RATE_HALF_LIFE = 5.0  # seconds; decay of the completion-rate estimate


class _Waiter:
    __slots__ = ("affinity", "exclude", "future", "key", "prefix")

    def __init__(
        self,
        key: tuple[int, float, int],
        future: asyncio.Future[BackendState],
        exclude: Collection[BackendState],
        affinity: bytes | None,
        prefix: Sequence[int] | None = None,
    ) -> None:
        self.key, self.future, self.exclude, self.affinity = key, future, exclude, affinity
        self.prefix = prefix

    def __lt__(self, other: _Waiter) -> bool:
        return self.key < other.key


class PoolState:
    """A pool's backends (in policy order), queue and recent latency."""

    def __init__(self, config: Pool, reuse: dict[str, BackendState] | None = None) -> None:
        self.name = config.name
        self.config = config
        self.request_class = config.request_class
        self.backends: list[BackendState] = []
        for i, b in enumerate(config.backends):
            # labels reach clients in error messages: a name, never the internal URL
            label = b.name or f"{config.name}#{i}"
            state = (reuse or {}).get(b.url)
            if state is not None:
                state.configure(b)
                state.label = label
            else:
                state = BackendState(b, label)
            self.backends.append(state)
        self._queue: list[_Waiter] = []
        self._seq = itertools.count()
        self._rr = itertools.count()
        self._rng = random.Random()
        self._ttfts: deque[float] = deque(maxlen=_TTFT_WINDOW)
        self._p90_cache = (0.0, 0.0)  # (computed at, value)
        self._rate = 0.0  # completions per second (decaying)
        self._rate_at = time.monotonic()
        #: ``strategy: prefix``: its settings and the index of prefixes sent to each backend
        self.prefix_routing = config.prefix_routing
        self.prefix_index = (
            PrefixIndex(self.backends, self.prefix_routing.max_entries)
            if self.prefix_routing is not None
            else None
        )

    # --- figures
    @property
    def in_flight(self) -> int:
        return sum(b.in_flight for b in self.backends)

    @property
    def queued(self) -> int:
        return sum(1 for w in self._queue if not w.future.done())

    def capacity(self, now: float) -> int:
        """max_in_flight summed over healthy backends (all of them in panic mode)."""
        healthy = [b for b in self.backends if b.healthy(now)]
        if self._panic(len(healthy)):
            healthy = self.backends
        return sum(b.config.max_in_flight for b in healthy)

    def has_healthy(self, now: float) -> bool:
        return self.capacity(now) > 0

    def ttft_p90(self) -> float | None:
        if not self._ttfts:
            return None
        now = time.monotonic()
        at, value = self._p90_cache
        if now - at > 0.25:
            ordered = sorted(self._ttfts)
            value = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
            self._p90_cache = (now, value)
        return value

    def has_headroom(self, now: float) -> bool:
        """May a borrower from another class use this pool now?"""
        borrow = self.config.borrow
        if borrow is None or self.queued:
            return False
        if self.in_flight >= borrow.max_share * self.capacity(now):
            return False
        p90 = self.ttft_p90()
        return p90 is None or p90 < borrow.ttft_p90_target

    def observe_ttft(self, seconds: float) -> None:
        self._ttfts.append(seconds)

    def _panic(self, healthy: int) -> bool:
        return healthy < self.config.health.panic_threshold * len(self.backends)

    # --- choosing
    def candidates(self, now: float, exclude: Collection[BackendState] = ()) -> list[BackendState]:
        """Backends that may take a request now."""
        healthy = sum(1 for b in self.backends if b.healthy(now))
        if self._panic(healthy):  # never eject the pool empty: use everything not full
            return [b for b in self.backends
                    if not b.full and now >= b.not_before and b not in exclude]
        return [b for b in self.backends if b.available(now) and b not in exclude]

    def try_pick(
        self,
        now: float,
        exclude: Collection[BackendState] = (),
        affinity: bytes | None = None,
        prefix: Sequence[int] | None = None,
    ) -> BackendState | None:
        """A backend with a free slot now, acquired; None if there is none.

        ``prefix``: the prompt's chunk hashes (``gateway.routing.prefix``), read by
        ``strategy: prefix`` and recorded against the backend picked.
        """
        options = self.candidates(now, exclude)
        backend: BackendState | None = None
        index = self.prefix_index
        if affinity is not None and self.config.affinity is not None:
            backend = pick_affine(options, affinity, self.config.affinity.bounded_load)
        if backend is None:
            if self.config.strategy == "round_robin":
                backend = pick_round_robin(options, next(self._rr))
            elif index is not None and prefix and self.prefix_routing is not None:
                depths = index.depths(prefix)
                backend = pick_prefix(
                    options,
                    lambda b: index.depth_of(depths, b),
                    self.prefix_routing.bounded_load,
                    self._rng,
                )
            else:
                backend = pick_least_loaded(options, self._rng)
        if backend is not None:
            backend.on_pick(now)
            backend.acquire()
            if index is not None and prefix:
                # at the pick, not the answer's end: the engine caches the prefix as soon as it
                # has prefilled it, and the next request sharing it may already be on its way
                index.record(backend, prefix)
        return backend

    def untried(self, now: float, exclude: Collection[BackendState]) -> bool:
        """Is there a healthy backend not in ``exclude`` (full or not)?"""
        healthy = [b for b in self.backends if b.healthy(now)]
        if self._panic(len(healthy)):
            healthy = self.backends
        return any(b not in exclude for b in healthy)

    async def acquire(
        self,
        priority: int,
        deadline: float,
        exclude: Collection[BackendState] = (),
        affinity: bytes | None = None,
        prefix: Sequence[int] | None = None,
    ) -> BackendState:
        """A backend for a request: at once if one is free, else after waiting in the queue.

        Raises :class:`PoolSaturated` (with a retry-after) when the queue is full or the request
        cannot start before ``deadline``, and :class:`NoHealthyBackend` when nothing could ever
        serve it. Waiting holds no backend connection.
        """
        now = time.monotonic()
        backend = None if self.queued else self.try_pick(now, exclude, affinity, prefix)
        if backend is not None:
            return backend
        if not self.untried(now, exclude):
            raise NoHealthyBackend(f"pool '{self.name}' has no healthy backend to try")
        cooling = self._cooling(now, exclude)
        if cooling:
            raise PoolCoolingDown(
                f"every backend of pool '{self.name}' asked to wait (Retry-After)", cooling
            )
        ahead = self.queued
        if ahead >= self.config.queue_size:
            raise PoolSaturated(f"pool '{self.name}' queue is full ({ahead} waiting)",
                                self._retry_after(ahead))
        expected = self._expected_wait(ahead)
        if now + expected > deadline:
            raise PoolSaturated(
                f"pool '{self.name}' cannot start this request before its deadline"
                f" ({ahead} waiting, ~{expected:.1f}s)", self._retry_after(ahead))
        future: asyncio.Future[BackendState] = asyncio.get_running_loop().create_future()
        waiter = _Waiter((priority, deadline, next(self._seq)), future, exclude, affinity, prefix)
        heapq.heappush(self._queue, waiter)
        self.dispatch()
        try:
            async with asyncio.timeout(max(0.0, deadline - now)):
                return await future
        except TimeoutError:
            raise PoolSaturated(
                f"pool '{self.name}' had no free backend before the request's deadline",
                self._retry_after(self.queued)) from None
        finally:
            if not future.done():
                future.cancel()
            elif not future.cancelled() and future.exception() is None and (
                asyncio.current_task() is not None and asyncio.current_task().cancelling()  # type: ignore[union-attr]
            ):
                self.release(future.result())  # got a backend but the request is gone

    def _cooling(self, now: float, exclude: Collection[BackendState]) -> int:
        """Seconds until the first backend's Retry-After ends, when all are inside one; else 0.

        Queueing behind a Retry-After would only turn a backend's "slow down" into a late 503.
        """
        waits = [b.not_before - now for b in self.backends if b.healthy(now) and b not in exclude]
        if waits and all(w > 0 for w in waits):
            return max(1, round(min(waits)))
        return 0

    def release(self, backend: BackendState) -> None:
        """Give a slot back and hand it to the first waiter, if any."""
        backend.release()
        self._count_completion()
        self.dispatch()

    def dispatch(self) -> None:
        """Hand free backends to waiters in queue order."""
        queue = self._queue
        now = time.monotonic()
        while queue:
            waiter = queue[0]
            if waiter.future.done():
                heapq.heappop(queue)
                continue
            backend = self.try_pick(now, waiter.exclude, waiter.affinity, waiter.prefix)
            if backend is None:
                return
            heapq.heappop(queue)
            waiter.future.set_result(backend)

    # --- queue estimates
    def _count_completion(self) -> None:
        now = time.monotonic()
        elapsed = now - self._rate_at
        decay = 0.5 ** (elapsed / _RATE_HALF_LIFE)
        self._rate = self._rate * decay + (1 - decay) * (1.0 / max(elapsed, 1e-3))
        self._rate_at = now

    def _expected_wait(self, ahead: int) -> float:
        """Seconds until a request behind ``ahead`` others starts, from the completion rate."""
        if self._rate <= 0:
            return 0.0  # no data: let it wait up to its deadline
        return (ahead + 1) / self._rate

    def _retry_after(self, ahead: int) -> int:
        return max(1, min(60, round(self._expected_wait(ahead)) or 1))

    def __repr__(self) -> str:
        return (
            f"<PoolState {self.name} [backends: {len(self.backends)} | in flight: "
            f"{self.in_flight} | queued: {self.queued}]>"
        )
