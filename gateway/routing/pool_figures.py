"""A pool's run-time state and the figures read from it: load, capacity, recent latency.

:class:`PoolFigures` holds everything a pool keeps between requests (its backends, queue, slot
shares, pending prefills, completion rate, TTFT predictor) and answers the questions asked of
it without changing it: in flight, queued, capacity, TTFT p90, the predicted time to first token
of a new request (:mod:`gateway.routing.predict`), and the borrow, lend and shed decisions made
on them. Taking slots (``pool_slots``) and the queue (``pool``) build on it in subclasses.
"""

from __future__ import annotations

import itertools
import math
import random
import time
from collections import deque
from typing import TYPE_CHECKING

from gateway.routing.backend import BackendState
from gateway.routing.fair import FairQueue, SlotShares
from gateway.routing.predict import Prediction, Predictor
from gateway.routing.prefix import PrefixIndex

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Collection

    from gateway.config import Pool
    from gateway.routing.waiter import Waiter

__all__ = ["PoolFigures"]

_TTFT_WINDOW = 256  # recent TTFT observations kept for the p90 that borrowing reads
_RATE_HALF_LIFE = 5.0  # seconds; decay of the completion-rate estimate
_RATE_MIN_SAMPLES = 8  # completions before the rate is trusted to refuse a waiter early
_PRESSURE_WINDOW = 10.0  # seconds a higher class counts as using the pool after its last request
_TOKENS_ALPHA = 0.1  # weight of the newest prompt in the own-class typical prompt size


class PoolFigures:
    """A pool's backends (in policy order), its queue's and slots' state, and its figures."""

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
        self._queue: FairQueue[Waiter] = FairQueue()
        #: waiters still waiting, in all and per flow (with the flow's weight), kept as they
        #: come and go: the queue bound per share reads them on every request that finds a
        #: queue, which a count of the queue (it holds gone waiters until they are dropped)
        #: would make cost the queue's length, under a flood, for each refusal
        self._waiting = 0
        self._flows: dict[str, tuple[int, float]] = {}
        #: slots above each backend's max_in_flight for tenants below their share (fair only)
        self.fair_headroom = config.fair_headroom if config.fair else 0
        #: ``fair_stagger``: see :meth:`~gateway.routing.pool_slots.PoolSlots._staggered`
        self.fair_stagger = bool(self.fair_headroom) and config.fair_stagger
        #: slots held per tenant (counted while fair_headroom > 0); with the stagger, a tenant
        #: counts among those sharing the pool for ``fair_linger`` seconds after its last slot
        self._shares = SlotShares(config.fair_linger if self.fair_stagger else 0.0)
        #: requests started on the headroom since the metrics last took the count
        self.headroom_started = 0
        #: per backend, per tenant: streamed requests awaiting their first chunk, and backends
        #: handed to waiters whose tasks have not yet resumed (kept with ``fair_stagger``)
        self._pending: dict[BackendState, dict[str, int]] = {}
        self._burst: tuple[BackendState, float] | None = None  # backend, when it began
        self._stagger_held = False  # a free slot was held back: dispatch on a first chunk
        self._opening = False  # the pick being made begins a burst
        self._seq = itertools.count()
        self._rr = itertools.count()
        self._rng = random.Random()
        self._ttfts: deque[float] = deque(maxlen=_TTFT_WINDOW)
        self._p90_cache = (0.0, 0.0)  # (computed at, value)
        # completions per second: an exponentially decayed count of completions over the
        # decayed time since the first (``_completion_rate``)
        self._decayed = 0.0  # completions, each decayed by its age (half-life _RATE_HALF_LIFE)
        self._rate_at = 0.0  # when ``_decayed`` was last brought up to date
        self._first_done = 0.0  # when the first completion was seen
        self._done = 0  # completions seen (the estimate is trusted from _RATE_MIN_SAMPLES)
        self.predictor = Predictor()
        #: priority of the pool's own class (set by the router; None: unknown, no throttling)
        self.own_priority: int | None = None
        self._own_tokens = 0.0  # EWMA of the own class's prompt tokens
        self._queued_tokens = 0  # prompt tokens of the requests waiting in the queue
        self._lent_until = 0.0  # monotonic time the pool stops counting as lending
        self._throttle_timer: asyncio.TimerHandle | None = None
        self._pressure: dict[int, tuple[float, float]] = {}  # priority -> (seen at, ttft target)
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

    @property
    def headroom_in_use(self) -> int:
        """Slots in use above the backends' max_in_flight (taken from ``fair_headroom``)."""
        return sum(max(0, b.in_flight - b.config.max_in_flight) for b in self.backends)

    def capacity(self, now: float) -> int:
        """max_in_flight summed over healthy backends (all of them in panic mode)."""
        healthy = [b for b in self.backends if b.healthy(now)]
        if self._panic(len(healthy)):
            healthy = self.backends
        return sum(b.config.max_in_flight for b in healthy)

    def ttft_recent(self) -> tuple[float, ...]:
        """The pool's newest TTFTs (seconds, up to 256, oldest first), read only."""
        return tuple(self._ttfts)

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

    def has_headroom(self, now: float, prompt_tokens: int = 0) -> bool:
        """May a borrower of a lower class, with a prompt of ``prompt_tokens``, use this pool now?

        Besides the share and the recent p90, the borrower's prefill must not push the pool's
        own next request past the target: an engine queue reported by any backend refuses it,
        and so does a prediction, for the own class's typical prompt behind the borrower's,
        above ``ttft_p90_target``.
        """
        borrow = self.config.borrow
        if borrow is None or self.queued:
            return False
        if self.in_flight >= borrow.max_share * self.capacity(now):
            return False
        p90 = self.ttft_p90()
        if p90 is not None and p90 >= borrow.ttft_p90_target:
            return False
        options = self.candidates(now)
        if not options or any(b.engine_waiting > 0 for b in options):
            return False
        behind = prompt_tokens + round(self._own_tokens)
        best = min(self.predictor.predict(b, behind, now).ttft for b in options)
        return best <= borrow.ttft_p90_target

    def predict(self, now: float, prompt_tokens: int, exclude: Collection[BackendState] = (),
                *, ahead_of_queue: bool = False) -> Prediction:
        """Predicted time to first token of a request entering this pool now.

        With a free backend and no queue: the best free backend's prediction. Otherwise the
        expected wait for a slot, plus the queued prompts' prefill spread over the healthy
        backends, plus the best backend's prediction. ``ahead_of_queue``: the request would be
        served before everything queued (a higher class borrowing the pool).
        """
        options = self.candidates(now, exclude)
        if options and (ahead_of_queue or not self.queued):
            return min((self.predictor.predict(b, prompt_tokens, now) for b in options),
                       key=lambda p: p.ttft)
        healthy = [b for b in self.backends if b.healthy(now) and b not in exclude]
        if not healthy:
            return Prediction(float("inf"), float("inf"))
        best = min((self.predictor.predict(b, prompt_tokens, now) for b in healthy),
                   key=lambda p: p.ttft)
        if ahead_of_queue:
            wait = self._expected_wait(0)
        else:
            rate = min(self.predictor.load(b).seconds_per_token for b in healthy)
            queued = self._queued_tokens * rate / len(healthy)
            wait = (self._expected_wait(self.queued) if self.queued else 0.0) + queued
        return Prediction(best.ttft + wait, best.ahead + wait)

    def note_start(self, backend: BackendState, prompt_tokens: int, priority: int,
                   now: float) -> None:
        """A request of ``prompt_tokens`` got ``backend``: count its prefill ahead of the next."""
        self.predictor.start(backend, prompt_tokens, now)
        if self.own_priority is None:
            return
        if priority == self.own_priority:
            self._own_tokens = prompt_tokens if not self._own_tokens else (
                _TOKENS_ALPHA * prompt_tokens + (1 - _TOKENS_ALPHA) * self._own_tokens)
        elif priority < self.own_priority and self.config.lend is not None:  # a borrower
            self._lent_until = now + self.config.lend.window

    def note_class(self, priority: int, ttft_target: float | None, now: float) -> None:
        """A request of a class (with its target) entered this pool, for :meth:`pressure`."""
        if ttft_target is not None:
            self._pressure[priority] = (now, ttft_target)

    def pressure(self, priority: int, now: float) -> float | None:
        """The lowest ``ttft_target`` of a higher class than ``priority`` using the pool lately."""
        targets = [target for p, (at, target) in self._pressure.items()
                   if p < priority and now - at <= _PRESSURE_WINDOW]
        return min(targets) if targets else None

    def admits(self, priority: int, now: float) -> bool:
        """May a request of ``priority`` take a free slot now? Always, unless the pool lends
        and the request is of its own class (or lower): then only while the in-flight is below
        ``1 - lend.reserve`` of capacity, and ``lend.own_share`` while a higher class borrowed
        the pool within ``lend.window``."""
        lend = self.config.lend
        if lend is None or self.own_priority is None or priority < self.own_priority:
            return True
        share = lend.own_share if now < self._lent_until else 1.0 - lend.reserve
        return self.in_flight < share * self.capacity(now)

    def lends(self, now: float, exclude: Collection[BackendState] = ()) -> bool:
        """Could a higher class borrow a free slot here now?"""
        return self.config.lend is not None and bool(self.candidates(now, exclude))

    def observe_ttft(self, seconds: float) -> None:
        self._ttfts.append(seconds)

    def observe_first_token(self, backend: BackendState, seconds: float | None,
                            sent_ns: int) -> None:
        """A first token came back from ``backend`` ``seconds`` after the request was sent at
        ``sent_ns`` (``time.perf_counter_ns``): the predictor learns from it at once, not when
        the answer ends, so a queue building up is seen within one TTFT. None: the request
        expects no first token of its own (not streamed)."""
        self.predictor.observe(backend, seconds, sent_ns)

    def _panic(self, healthy: int) -> bool:
        return healthy < self.config.health.panic_threshold * len(self.backends)

    def candidates(self, now: float, exclude: Collection[BackendState] = ()) -> list[BackendState]:
        """Backends that may take a request now."""
        healthy = sum(1 for b in self.backends if b.healthy(now))
        if self._panic(healthy):  # never eject the pool empty: use everything not full
            return [b for b in self.backends
                    if not b.full and now >= b.not_before and b not in exclude]
        return [b for b in self.backends if b.available(now) and b not in exclude]

    # --- queue estimates
    def _count_completion(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if not self._done:  # the first completion starts the clock: n more take n intervals
            self._first_done = self._rate_at = now
        else:
            self._decayed = self._decayed * 0.5 ** ((now - self._rate_at) / _RATE_HALF_LIFE) + 1
            self._rate_at = now
        self._done += 1

    def _completion_rate(self, now: float) -> float:
        """Completions per second lately; 0 until there are enough to say.

        The decayed count divided by the decayed time it was gathered over (the integral of the
        decay since the first completion), which is unbiased from the first seconds on: the
        previous estimate, an average of 1 / (time since the last completion), read a pool's
        first completion after an idle spell as a rate near zero and refused its first waiters
        as unable to start before their deadline."""
        if self._done < _RATE_MIN_SAMPLES:
            return 0.0
        half = _RATE_HALF_LIFE
        count = self._decayed * 0.5 ** ((now - self._rate_at) / half)
        span = (1 - 0.5 ** ((now - self._first_done) / half)) * half / math.log(2)
        return count / span if span > 0 else 0.0

    def _expected_wait(self, ahead: int) -> float:
        """Seconds until a request behind ``ahead`` others starts, from the completion rate."""
        rate = self._completion_rate(time.monotonic())
        if rate <= 0:
            return 0.0  # no data: let it wait up to its deadline
        return (ahead + 1) / rate

    def _retry_after(self, ahead: int) -> int:
        return max(1, min(60, round(self._expected_wait(ahead)) or 1))
