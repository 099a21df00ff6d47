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
import time
from typing import TYPE_CHECKING

from gateway.routing.errors import NoHealthyBackend, PoolCoolingDown, PoolSaturated
from gateway.routing.fair import push_out
from gateway.routing.pool_slots import PoolSlots
from gateway.routing.waiter import Waiter, still_waiting

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Sequence

    from gateway.routing.backend import BackendState

__all__ = ["PoolState"]


class PoolState(PoolSlots):
    """A pool's backends (in policy order), queue and recent latency.

    Its state and figures are :class:`~gateway.routing.pool_figures.PoolFigures`', its slot
    taking :class:`~gateway.routing.pool_slots.PoolSlots`'; this class is its queue.
    """

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
        waiter = Waiter((priority, deadline, next(self._seq)), future, exclude, affinity, prefix,
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
               weight: float) -> tuple[PoolSaturated | None, Waiter | None]:
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
        victim: Waiter | None = None
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

    def _last_of(self, flow: str) -> Waiter | None:
        """The waiter of ``flow`` served last (the lowest class, latest deadline, newest): the
        one it gives up to a newcomer. None when none still waits (the count lags a waiter
        whose task was cancelled by one step of the loop: its place is free already)."""
        last: Waiter | None = None
        for waiter in self._queue.of_flow(flow):
            if still_waiting(waiter) and (last is None or last < waiter):
                last = waiter
        return last

    def _join(self, waiter: Waiter) -> None:
        """``waiter`` entered the queue: count it among its flow's."""
        waiter.counted = True
        count = self._flows.get(waiter.flow, (0, 0.0))[0]
        self._flows[waiter.flow] = (count + 1, waiter.weight)
        self._waiting += 1

    def _leave(self, waiter: Waiter) -> None:
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

    def _expire(self, waiter: Waiter) -> None:
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
        first = self._queue.first(still_waiting)
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
        while (waiter := queue.first(still_waiting)) is not None:
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

    def _pick_unstaggered(self, now: float) -> tuple[Waiter | None, BackendState | None]:
        """With free slots the stagger keeps from the first waiter: the next waiter in fair
        order that may take one, and the slot."""
        if not self.fair_stagger or not self.candidates(now):
            return None, None
        return self._first_taker(
            now, lambda w: bool(self._regular(now, w.exclude, w.tenant, w.weight)), spare=False)

    def _pick_spare(self, now: float) -> tuple[Waiter | None, BackendState | None]:
        """The next waiter below its share (see :meth:`dispatch`) and a headroom slot for it."""
        if not self.fair_headroom or not self._spare(now, ()):
            return None, None
        capacity = self.capacity(now)
        return self._first_taker(
            now, lambda w: (self._shares.below_share(w.tenant, w.weight, capacity)
                            and bool(self._spare(now, w.exclude))), spare=True)

    def _first_taker(self, now: float, wanted: Callable[[Waiter], bool], *,
                     spare: bool) -> tuple[Waiter | None, BackendState | None]:
        """The first waiter in fair order (of the first class waiting) that ``wanted`` says
        may take a slot, and its pick (``spare``: of the headroom)."""
        waiter = self._queue.first_where(still_waiting, wanted)
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

    def __repr__(self) -> str:
        return (
            f"<PoolState {self.name} [backends: {len(self.backends)} | in flight: "
            f"{self.in_flight} | queued: {self.queued}]>"
        )
