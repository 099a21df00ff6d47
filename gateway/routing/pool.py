"""A pool at run time: its backends, its waiting queue, and the figures spill-over reads.

The queue is ordered by class priority first, so an interactive request never waits behind a
batch request; inside a class, by weighted fair share of tokens between tenants
(:mod:`gateway.routing.fair`; with ``fair: false``, one flow for all), and inside a tenant by
deadline, then arrival. A waiting request holds no backend connection: it holds a future that
:meth:`PoolState.dispatch` completes with a backend when one frees up. A tenant holding less
than its weighted share of the pool's slots need not wait for one: it may take one of the
``fair_headroom`` slots above a full backend's ``max_in_flight``, which a tenant at or above
its share never gets. The queue's ``queue_size`` places are shared the same way: when they are
all taken, a tenant within its weighted share of them takes the place of the last waiter of the
tenant furthest over its own (:func:`gateway.routing.fair.push_out`), so a flood refuses only
the flood; and a request finds out whether a slot is free for it before it is refused.

The pool also predicts a new request's time to first token (:mod:`gateway.routing.predict`,
fed by :meth:`PoolState.note_start` and :meth:`PoolState.observe_first_token`): borrowing,
lending and shedding decide on it. A pool that ``lend``s throttles its own class while a higher
class borrows it (:meth:`PoolState.admits`).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import time
from collections import deque
from typing import TYPE_CHECKING

from gateway.routing.backend import BackendState
from gateway.routing.errors import NoHealthyBackend, PoolCoolingDown, PoolSaturated
from gateway.routing.fair import FairQueue, SlotShares, push_out
from gateway.routing.pick import (
    pick_affine,
    pick_least_loaded,
    pick_prefix,
    pick_round_robin,
)
from gateway.routing.predict import Prediction, Predictor
from gateway.routing.prefix import PrefixIndex

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Sequence

    from gateway.config import Pool

__all__ = ["PoolState"]

_TTFT_WINDOW = 256  # recent TTFT observations kept for the p90 that borrowing reads
_RATE_HALF_LIFE = 5.0  # seconds; decay of the completion-rate estimate
_RATE_MIN_SAMPLES = 8  # completions before the rate is trusted to refuse a waiter early
_PRESSURE_WINDOW = 10.0  # seconds a higher class counts as using the pool after its last request
_TOKENS_ALPHA = 0.1  # weight of the newest prompt in the own-class typical prompt size
_BURST_WINDOW = 0.01  # seconds a staggered burst takes more starts (to share one engine step)


class _Waiter:
    __slots__ = (
        "affinity", "counted", "exclude", "flow", "future", "key", "prefix", "pushed_out",
        "tenant", "weight",
    )

    def __init__(
        self,
        key: tuple[int, float, int],
        future: asyncio.Future[BackendState | None],
        exclude: Collection[BackendState],
        affinity: bytes | None,
        prefix: Sequence[int] | None = None,
        tenant: str = "",
        weight: float = 1.0,
        flow: str = "",
    ) -> None:
        self.key, self.future, self.exclude, self.affinity = key, future, exclude, affinity
        self.prefix, self.tenant, self.weight, self.flow = prefix, tenant, weight, flow
        #: counted among its flow's waiters (:meth:`PoolState._join`, :meth:`PoolState._leave`)
        self.counted = False
        #: its place in the full queue went to another tenant's request (:meth:`PoolState._place`)
        self.pushed_out = False

    def __lt__(self, other: _Waiter) -> bool:
        return self.key < other.key


def _waiting(waiter: _Waiter) -> bool:
    """Still waiting (not timed out, cancelled or served)."""
    return not waiter.future.done()


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
        self._queue: FairQueue[_Waiter] = FairQueue()
        #: waiters still waiting, in all and per flow (with the flow's weight), kept as they
        #: come and go: the queue bound per share reads them on every request that finds a
        #: queue, which a count of the queue (it holds gone waiters until they are dropped)
        #: would make cost the queue's length, under a flood, for each refusal
        self._waiting = 0
        self._flows: dict[str, tuple[int, float]] = {}
        #: slots above each backend's max_in_flight for tenants below their share (fair only)
        self.fair_headroom = config.fair_headroom if config.fair else 0
        #: ``fair_stagger``: see :meth:`_staggered`
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
        *,
        tenant: str = "",
        weight: float = 1.0,
        spare: bool = False,
    ) -> BackendState | None:
        """A backend with a free slot now, acquired for ``tenant`` (of ``weight``; give
        :meth:`release` the same tenant); None if there is none.

        ``prefix``: the prompt's chunk hashes (``gateway.routing.prefix``), read by
        ``strategy: prefix`` and recorded against the backend picked. ``spare``: a slot of
        ``fair_headroom`` on a full backend instead (the caller checked :meth:`below_share`).
        """
        self._opening = False
        self._shares.expire(now)
        options = (self._spare(now, exclude) if spare
                   else self._regular(now, exclude, tenant, weight))
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
                    self.config.prefill_aware,
                )
            else:
                backend = pick_least_loaded(options, self._rng, self.config.prefill_aware)
        if backend is not None:
            if backend.full:
                self.headroom_started += 1
            if self._opening:
                self._burst = (backend, now)  # the floods' first start since they were clear
            backend.on_pick(now)
            backend.acquire()
            if self.fair_headroom:
                self._shares.take(tenant, weight)
            if index is not None and prefix:
                # at the pick, not the answer's end: the engine caches the prefix as soon as it
                # has prefilled it, and the next request sharing it may already be on its way
                index.record(backend, prefix)
        return backend

    def _regular(self, now: float, exclude: Collection[BackendState], tenant: str,
                 weight: float) -> list[BackendState]:
        """The backends ``tenant`` may take a slot on now: :meth:`candidates` (those with a free
        slot), of those the staggered ones when the tenant is paced, and for a tenant below its
        share also the :meth:`_clearer_spare` headroom slots (prefill-aware pools)."""
        options = self.candidates(now, exclude)
        if not options or not self.fair_headroom:
            return options
        capacity = self.capacity(now)
        if self.fair_stagger and self._paced(tenant, weight, capacity):
            return self._staggered(options, now, capacity)
        if self.config.prefill_aware and self._shares.below_share(tenant, weight, capacity):
            return options + self._clearer_spare(now, exclude, options)
        return options

    def _clearer_spare(self, now: float, exclude: Collection[BackendState],
                       options: list[BackendState]) -> list[BackendState]:
        """Headroom slots (:meth:`_spare`) on backends with fewer streamed requests awaiting
        their first chunk than every backend with a free slot has: a tenant below its share
        may take one rather than a free slot behind a flood's prefills. The flood fills free
        slots as they open and, staggered, is held off all but one backend, so the free slot
        a light tenant finds is most often on the backend where the flood's burst is
        prefilling; its request would then wait for those prefills, one engine step each."""
        fewest = min(b.prefilling for b in options)
        if not fewest:
            return []
        return [b for b in self._spare(now, exclude) if b.prefilling < fewest]

    def _paced(self, tenant: str, weight: float, capacity: int) -> bool:
        """Does ``tenant`` hold at least its share while another tenant holds slots?"""
        shares = self._shares
        return shares.others(tenant) and not shares.below_share(tenant, weight, capacity)

    def _staggered(self, options: list[BackendState], now: float,
                   capacity: int) -> list[BackendState]:
        """Where a paced tenant may start: never where another tenant's (one below its share)
        streamed request awaits its first chunk; while the paced tenants' own prefills are
        pending, only on the backend their burst began on, within ``_BURST_WINDOW``; else
        anywhere (a new burst). So the floods' prefills are pending on one backend at a time
        and the other is clear for a light tenant's next request."""
        shares = self._shares
        light: set[BackendState] = set()
        flooded = False
        for b, by in self._pending.items():  # only counts above 0 are kept
            for t in by:
                if self._paced(t, shares.weight(t), capacity):
                    flooded = True
                else:
                    light.add(b)
        if not flooded:
            self._opening = True  # a start here begins a burst
            return [b for b in options if b not in light]
        burst = self._burst
        if burst is None or now - burst[1] > _BURST_WINDOW or burst[0] in light:
            return []
        return [b for b in options if b is burst[0]]

    def _count_pending(self, backend: BackendState, tenant: str, n: int) -> None:
        by = self._pending.setdefault(backend, {})
        left = by.get(tenant, 0) + n
        if left > 0:
            by[tenant] = left
        else:
            by.pop(tenant, None)
            if not by:
                del self._pending[backend]

    def prefill_started(self, backend: BackendState, tenant: str, now: float) -> None:
        """A streamed request of ``tenant`` was sent to ``backend``: it awaits its first
        chunk."""
        backend.prefill_started(now)
        if self.fair_stagger:
            self._count_pending(backend, tenant, 1)

    def prefill_ended(self, backend: BackendState, tenant: str, started: float) -> None:
        """Its first chunk came back (or its attempt ended without one): a slot the stagger
        held back may go now."""
        backend.prefill_ended(started)
        if self.fair_stagger:
            self._count_pending(backend, tenant, -1)
            self._release_held()

    def _release_held(self) -> None:
        """Dispatch the slots the stagger held back, if any: what held them has moved on."""
        if self._stagger_held:
            self._stagger_held = False
            self.dispatch()

    def _spare(self, now: float, exclude: Collection[BackendState]) -> list[BackendState]:
        """Full backends with ``fair_headroom`` left: only healthy ones (never an ejected or
        half-open backend, even in panic mode), not cooling down after a Retry-After."""
        limit = self.fair_headroom
        return [b for b in self.backends
                if b.full and b.in_flight < b.config.max_in_flight + limit
                and b.ejected_until == 0.0 and now >= b.not_before and b not in exclude]

    def headroom_prediction(self, now: float, prompt_tokens: int, tenant: str, weight: float,
                            exclude: Collection[BackendState] = ()) -> Prediction | None:
        """The predicted first token of a request that would start at once on a headroom slot
        (its tenant below its share, a full backend with headroom left): the best such
        backend's own prediction, no queue ahead. None when it would wait in the queue."""
        if not self.below_share(tenant, weight, now):
            return None
        spare = self._spare(now, exclude)
        if not spare:
            return None
        return min((self.predictor.predict(b, prompt_tokens, now) for b in spare),
                   key=lambda p: p.ttft)

    def below_share(self, tenant: str, weight: float, now: float) -> bool:
        """May ``tenant`` take a headroom slot: does it hold fewer slots than its weighted share
        of the capacity, among the tenants sharing the pool (holding slots, or within their
        ``fair_linger``)? Never without ``fair_headroom``."""
        if not self.fair_headroom:
            return False
        self._shares.expire(now)
        return self._shares.below_share(tenant, weight, self.capacity(now))

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
        *,
        prompt_tokens: int = 0,
        tenant: str = "",
        weight: float = 1.0,
        tokens: int = 0,
    ) -> BackendState:
        """A backend for a request: at once if one is free, else after waiting in the queue.

        While it waits, ``tenant`` (its flow), ``weight`` and ``tokens`` (its estimated prompt +
        output) place it among the other tenants of its class. Raises :class:`PoolSaturated`
        (with a retry-after) when the queue is full and its tenant holds its share of it (see
        :meth:`_place`; also to a waiter whose place goes to another tenant's request), or when
        the request cannot start before ``deadline`` (judged from the waiters it would be served
        after, not all of them); and :class:`NoHealthyBackend` when nothing could ever serve
        it. Before a refusal, a slot free for this request now is taken (:meth:`_take_now`).
        Waiting holds no backend connection. ``prompt_tokens`` counts in the queue's prompt
        total (the prefill ahead of later requests) while it waits.
        """
        now = time.monotonic()
        backend = (None if self.queued or not self.admits(priority, now)
                   else self.try_pick(now, exclude, affinity, prefix, tenant=tenant,
                                      weight=weight))
        if backend is not None:
            return backend
        if not self.untried(now, exclude):
            raise NoHealthyBackend(f"pool '{self.name}' has no healthy backend to try")
        cooling = self._cooling(now, exclude)
        if cooling:
            raise PoolCoolingDown(
                f"every backend of pool '{self.name}' asked to wait (Retry-After)", cooling
            )
        flow = tenant if self.config.fair else ""
        refusal, victim = self._place(now, priority, deadline, flow, weight)
        if refusal is not None or victim is not None:
            # a slot free for it now goes before a refusal, or another tenant's place
            backend = self._take_now(now, priority, exclude, affinity, prefix, tenant, weight)
            if backend is not None:
                return backend
            refusal, victim = self._place(now, priority, deadline, flow, weight)  # dispatched
        if refusal is not None:
            raise refusal
        if victim is not None:
            victim.pushed_out = True
            self._expire(victim)  # it leaves the queue at no cost to its flow
        loop = asyncio.get_running_loop()
        future: asyncio.Future[BackendState | None] = loop.create_future()
        waiter = _Waiter((priority, deadline, next(self._seq)), future, exclude, affinity, prefix,
                         tenant, weight, flow)
        self._queue.push(waiter, level=priority, order=waiter.key, flow=flow, weight=weight,
                         cost=tokens)
        self._join(waiter)
        self._queued_tokens += prompt_tokens
        self.dispatch()
        # The deadline resolves the same future a dispatch does (with None), so exactly one of
        # them wins: a backend handed over in the loop iteration the deadline passes is used,
        # never dropped with its slot still counted (a timeout cancelling the task could not
        # tell that the future already held a backend).
        expiry = loop.call_at(loop.time() + max(0.0, deadline - now), self._expire, waiter)
        handed = False
        try:
            backend = await future
            if backend is None and waiter.pushed_out:
                raise PoolSaturated(
                    f"pool '{self.name}' queue is full: this request's place went to another"
                    " tenant's, its own tenant holding more than its share of the queue",
                    self._retry_after(self.queued))
            if backend is None:
                raise PoolSaturated(
                    f"pool '{self.name}' had no free backend before the request's deadline",
                    self._retry_after(self.queued))
            handed = True
            if self.fair_stagger:  # the hand-over becomes its send: nothing awaits till then
                self._count_pending(backend, tenant, -1)
                if self._stagger_held:
                    # a slot held back for this hand-over may go once the request is sent
                    # (a streamed one counts as a pending prefill again by then)
                    loop.call_soon(self._release_held)
            return backend
        finally:
            expiry.cancel()
            self._leave(waiter)
            self._queued_tokens -= prompt_tokens
            if not future.done():
                future.cancel()
            elif not handed and not future.cancelled() and (got := future.result()) is not None:
                if self.fair_stagger:
                    self._count_pending(got, tenant, -1)
                self.release(got, tenant)  # got a backend but the request is gone

    def _place(self, now: float, priority: int, deadline: float, flow: str,
               weight: float) -> tuple[PoolSaturated | None, _Waiter | None]:
        """May a request of ``flow`` (of ``weight``) wait in the queue: the refusal if not, else
        the waiter whose place it takes in a full queue (None: there is room). No change made.

        The bound is per share: a bound on the whole queue alone let one tenant's flood refuse
        every other tenant at once while the flood held every place. A full queue refuses the
        request only when its flow holds the most waiters per unit of weight (its request
        counted), else it pushes out the last waiter of the flow that does
        (:func:`~gateway.routing.fair.push_out`). So a tenant alone fills the queue, and
        another always has room for its share of it, taken from the excess of the first.
        With ``fair: false`` (one flow for all) the full queue refuses everyone.

        A request that may wait is still refused when it cannot start before ``deadline``,
        judged from the waiters it would be served after: higher classes and, in its own, the
        tenants whose fair share comes first.
        """
        waiting = self._waiting
        victim: _Waiter | None = None
        if waiting >= self.config.queue_size:
            name = push_out(self._flows, flow, weight)
            if name is None:
                why = ", as many of them this tenant's as its share allows" if self.config.fair \
                    else ""
                return PoolSaturated(f"pool '{self.name}' queue is full ({waiting} waiting{why})",
                                     self._retry_after(waiting)), None
            victim = self._last_of(name)
        ahead = self._queue.ahead_of(level=priority, flow=flow)
        expected = self._expected_wait(ahead)
        if now + expected > deadline:
            return PoolSaturated(
                f"pool '{self.name}' cannot start this request before its deadline"
                f" ({ahead} waiting, ~{expected:.1f}s)", self._retry_after(ahead)), None
        return None, victim

    def _last_of(self, flow: str) -> _Waiter | None:
        """The waiter of ``flow`` served last (the lowest class, latest deadline, newest): the
        one it gives up to a newcomer. None when none still waits (the count lags a waiter
        whose task was cancelled by one step of the loop: its place is free already)."""
        last: _Waiter | None = None
        for waiter in self._queue.of_flow(flow):
            if _waiting(waiter) and (last is None or last < waiter):
                last = waiter
        return last

    def _join(self, waiter: _Waiter) -> None:
        """``waiter`` entered the queue: count it among its flow's."""
        waiter.counted = True
        count = self._flows.get(waiter.flow, (0, 0.0))[0]
        self._flows[waiter.flow] = (count + 1, waiter.weight)
        self._waiting += 1

    def _leave(self, waiter: _Waiter) -> None:
        """``waiter`` stopped waiting (served, past its deadline, pushed out, or gone with its
        task): uncount it, once."""
        if not waiter.counted:
            return
        waiter.counted = False
        self._waiting -= 1
        count, weight = self._flows[waiter.flow]
        if count > 1:
            self._flows[waiter.flow] = (count - 1, weight)
        else:
            del self._flows[waiter.flow]

    def _expire(self, waiter: _Waiter) -> None:
        """A waiter's start deadline, or its place pushed out: it gets no backend (None),
        unless a dispatch came first."""
        self._leave(waiter)
        if not waiter.future.done():
            waiter.future.set_result(None)

    def _take_now(self, now: float, priority: int, exclude: Collection[BackendState],
                  affinity: bytes | None, prefix: Sequence[int] | None, tenant: str,
                  weight: float) -> BackendState | None:
        """A slot free now for a request the queue would refuse (or let in only in another
        tenant's place), acquired for ``tenant``; None if there is none for it.

        The waiters have theirs first (:meth:`dispatch`), so a slot still free is one none of
        them may take: one the stagger keeps from their tenants, or a ``fair_headroom`` slot
        while they are at their shares. A tenant below its share may take either, and it
        would take it at once from the queue anyway: refusing it for the queue's length
        instead (what a request that found a queue did before) turned a flood's full queue
        into a 503 for every other tenant beside free headroom. Never while a higher class
        waits, nor for a class the pool throttles for borrowers (:meth:`admits`).
        """
        self.dispatch()
        first = self._queue.first(_waiting)
        if (first is not None and first.key[0] < priority) or not self.admits(priority, now):
            return None
        backend = self.try_pick(now, exclude, affinity, prefix, tenant=tenant, weight=weight)
        if backend is None and self.below_share(tenant, weight, now) and self._spare(now, exclude):
            backend = self.try_pick(now, exclude, affinity, prefix, tenant=tenant,
                                    weight=weight, spare=True)
        return backend

    def _cooling(self, now: float, exclude: Collection[BackendState]) -> int:
        """Seconds until the first backend's Retry-After ends, when all are inside one; else 0.

        Queueing behind a Retry-After would only turn a backend's "slow down" into a late 503.
        """
        waits = [b.not_before - now for b in self.backends if b.healthy(now) and b not in exclude]
        if waits and all(w > 0 for w in waits):
            return max(1, round(min(waits)))
        return 0

    def release(self, backend: BackendState, tenant: str = "") -> None:
        """Give back a slot acquired for ``tenant`` and hand it to the first waiter, if any."""
        backend.release()
        if self.fair_headroom:
            self._shares.give_back(tenant, time.monotonic())
        self.predictor.settle(backend)
        self._count_completion()
        self.dispatch()

    def dispatch(self) -> None:
        """Hand free backends to waiters in queue order (the fair queue's next, each time).

        With no free slot, a headroom slot goes to the next waiter in fair order whose tenant
        is below its share, of the first class waiting: the waiters before it are of tenants
        that may not take it."""
        queue = self._queue
        now = time.monotonic()
        self._shares.expire(now)
        while (waiter := queue.first(_waiting)) is not None:
            if not self.admits(waiter.key[0], now):  # throttled for borrowers
                if now < self._lent_until:  # no release may come before lending ends
                    self._redispatch_at(self._lent_until)
                return
            backend = self.try_pick(now, waiter.exclude, waiter.affinity, waiter.prefix,
                                    tenant=waiter.tenant, weight=waiter.weight)
            if backend is None:
                chosen, backend = self._pick_unstaggered(now)
                if backend is None:
                    chosen, backend = self._pick_spare(now)
                if chosen is None or backend is None:
                    if self.fair_stagger and self.candidates(now):
                        self._stagger_held = True  # a free slot waits for a first chunk
                    return
                waiter = chosen
            queue.pop_first()  # served: charged to its tenant's share
            if self.fair_stagger:
                self._count_pending(backend, waiter.tenant, 1)
            self._leave(waiter)
            waiter.future.set_result(backend)

    def _pick_unstaggered(self, now: float) -> tuple[_Waiter | None, BackendState | None]:
        """With free slots the stagger keeps from the first waiter: the next waiter in fair
        order that may take one, and the slot."""
        if not self.fair_stagger or not self.candidates(now):
            return None, None
        return self._first_taker(
            now, lambda w: bool(self._regular(now, w.exclude, w.tenant, w.weight)), spare=False)

    def _pick_spare(self, now: float) -> tuple[_Waiter | None, BackendState | None]:
        """The next waiter below its share (see :meth:`dispatch`) and a headroom slot for it."""
        if not self.fair_headroom or not self._spare(now, ()):
            return None, None
        capacity = self.capacity(now)
        return self._first_taker(
            now, lambda w: (self._shares.below_share(w.tenant, w.weight, capacity)
                            and bool(self._spare(now, w.exclude))), spare=True)

    def _first_taker(self, now: float, wanted: Callable[[_Waiter], bool], *,
                     spare: bool) -> tuple[_Waiter | None, BackendState | None]:
        """The first waiter in fair order (of the first class waiting) that ``wanted`` says
        may take a slot, and its pick (``spare``: of the headroom)."""
        waiter = self._queue.first_where(_waiting, wanted)
        if waiter is None:
            return None, None
        return waiter, self.try_pick(now, waiter.exclude, waiter.affinity, waiter.prefix,
                                     tenant=waiter.tenant, weight=waiter.weight, spare=spare)

    def _redispatch_at(self, when: float) -> None:
        """Dispatch again when the lending window ends."""
        if self._throttle_timer is not None and not self._throttle_timer.cancelled():
            self._throttle_timer.cancel()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # outside the event loop (a test's direct call): nothing to wake
            return
        self._throttle_timer = loop.call_at(
            loop.time() + max(0.0, when - time.monotonic()) + 1e-3, self.dispatch)

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

    def __repr__(self) -> str:
        return (
            f"<PoolState {self.name} [backends: {len(self.backends)} | in flight: "
            f"{self.in_flight} | queued: {self.queued}]>"
        )
