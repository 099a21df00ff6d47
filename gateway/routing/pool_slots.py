"""Taking a slot on one of a pool's backends now: the pick, fair headroom and the stagger.

:meth:`PoolSlots.try_pick` picks among the backends with a free slot by the pool's strategy
(least loaded, round robin, prefix, affinity) and acquires one. With ``fair_headroom`` a tenant
below its share may take a slot above a full backend's ``max_in_flight``; with ``fair_stagger``
the tenants at their shares start in bursts on one backend at a time, so another stays clear of
their prefills. The queue (:class:`gateway.routing.pool.PoolState`) builds on it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.routing.pick import (
    pick_affine,
    pick_least_loaded,
    pick_prefix,
    pick_round_robin,
)
from gateway.routing.pool_figures import PoolFigures

if TYPE_CHECKING:
    from collections.abc import Collection, Sequence

    from gateway.routing.backend import BackendState
    from gateway.routing.predict import Prediction

__all__ = ["PoolSlots"]

_BURST_WINDOW = 0.01  # seconds a staggered burst takes more starts (to share one engine step)


class PoolSlots(PoolFigures):
    """A pool's slot taking; :class:`~gateway.routing.pool.PoolState` adds its queue."""

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

    def dispatch(self) -> None:
        """Hand free slots to the waiters (:meth:`~gateway.routing.pool.PoolState.dispatch`)."""
        raise NotImplementedError
