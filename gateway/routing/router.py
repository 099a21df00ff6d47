"""The router: model -> pool -> backend, with class-aware spill-over.

A request's primary pool is the model's pool for its class (or its rollout version's pool).
Then, in order:

0. interactive borrowing: when the class has a ``ttft_target`` and the primary pool's
   predicted TTFT for this prompt (:meth:`PoolState.predict`) exceeds it, a lower class's pool
   of the model that ``lend``s, has a free slot and predicts an earlier first token takes the
   request at once, ahead of that pool's own waiting requests (and throttles its own class
   meanwhile);
1. a free backend of the primary pool;
2. borrowing: a pool of the same model that lends headroom (``borrow`` on interactive pools)
   takes the request at once while it has headroom for this prompt - a borrower never queues
   there;
3. overflow: when the primary pool has no healthy capacity at all, another pool of the model
   takes the request (queueing there by class priority, ahead of that pool's own lower class);
4. otherwise the request waits in the primary pool's queue, up to its start deadline.

Before 1 and 4, a pool with ``shed`` refuses at once a request it predicts would start too
late (:mod:`gateway.routing.shed`), raising :class:`RequestShed`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.routing.conversation import conversation_key
from gateway.routing.errors import NoHealthyBackend, RequestShed
from gateway.routing.pool import PoolState
from gateway.routing.prefix import prompt_hashes
from gateway.routing.retry import RetryBudget
from gateway.routing.shed import retry_after, shed_reason
from gateway.routing.versions import choose_version

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Mapping, Sequence
    from typing import Any

    from gateway.config import Model, Policy, RequestClass, Version
    from gateway.routing.backend import BackendState
    from gateway.routing.predict import Prediction

__all__ = ["Route", "Router"]


@dataclass(slots=True)
class Route:
    """The routing decision for one request (per request, not shared)."""

    request_class: RequestClass
    model: Model
    upstream_model: str
    pool: PoolState
    spill: list[PoolState]
    deadline: float  # monotonic time by which the request must have started
    version: str | None = None
    affinity: bytes | None = None
    tried: list[BackendState] = field(default_factory=list)
    #: whose request it is and its share (fair queuing between tenants inside a class)
    tenant: str = ""
    weight: float = 1.0
    #: estimated prompt + output tokens: what the request costs its tenant's share
    tokens: int = 0
    #: the prompt's estimated tokens (admission's count, else from the body's size)
    prompt_tokens: int = 0
    #: the prompt's chunk hashes when a pool of the model routes by prefix (computed once)
    prefix: list[int] | None = None


class Router:
    """Pools and classes of one policy; backend state carries over from the previous router."""

    def __init__(self, policy: Policy, previous: Router | None = None) -> None:
        self.policy = policy
        old: dict[tuple[str, str], BackendState] = {}
        if previous is not None:
            for pool in previous.pools.values():
                for b in pool.backends:
                    old[(pool.name, b.config.url)] = b
        self.pools: dict[str, PoolState] = {}
        for p in policy.pools:
            reuse = {url: state for (name, url), state in old.items() if name == p.name}
            self.pools[p.name] = PoolState(p, reuse)
        self.classes: dict[str, RequestClass] = {c.name: c for c in policy.classes}
        for state in self.pools.values():
            owner = self.classes.get(state.request_class)
            state.own_priority = owner.priority if owner is not None else None
        #: progressive rollouts' version weights by model (set by the gateway, kept across
        #: reloads); None or a None answer: the configured weights
        self.weights: Callable[[str], Sequence[tuple[Version, float]] | None] | None = (
            previous.weights if previous is not None else None)
        self.budget: RetryBudget = (
            previous.budget
            if previous is not None and previous.policy.routing.retry == policy.routing.retry
            else RetryBudget(policy.routing.retry)
        )

    def route_request(
        self,
        model: Model,
        class_name: str,
        key_id: str | None,
        payload: Mapping[str, Any],
        session: bytes | None = None,
        cache_salt: str | None = None,
    ) -> Route:
        """Route one request: its conversation (or key) picks the version a sticky model
        keeps it on, and the backend an affine pool sends it back to; a pool routing by prefix
        reads the prompt's chunk hashes (under the tenant's ``cache_salt``)."""
        pools = [self.pools[model.pool], *(self.pools[p] for p in model.pools.values())]
        affine = any(p.config.affinity is not None for p in pools)
        conversation = (conversation_key(payload, session)
                        if affine or model.sticky == "conversation" else None)
        sticky: bytes | None = None
        if model.sticky == "key":
            sticky = (key_id or "").encode()
        elif model.sticky == "conversation":
            sticky = conversation
        route = self.route(model, class_name, sticky, conversation if affine else None)
        settings = next((p.prefix_routing for p in pools if p.prefix_routing is not None), None)
        if settings is not None:
            route.prefix = prompt_hashes(payload, settings.block_bytes, cache_salt)
        return route

    def route(
        self,
        model: Model,
        class_name: str,
        sticky_key: bytes | None = None,
        affinity: bytes | None = None,
    ) -> Route:
        """Decide class, version and pools (no I/O)."""
        request_class = self.classes[class_name]
        weights = self.weights(model.name) if self.weights is not None else None
        version = choose_version(model, sticky_key, weights=weights)
        pool_name = model.pool_for(class_name)
        upstream = model.upstream_name
        if version is not None:
            upstream = version.backend_model
            pool_name = version.pool or pool_name
        pool = self.pools[pool_name]
        others = {model.pool, *model.pools.values()} - {pool_name}
        spill = [self.pools[n] for n in sorted(others)]
        deadline = time.monotonic() + request_class.start_deadline
        return Route(
            request_class, model, upstream, pool, spill, deadline,
            version.label if version is not None else None, affinity,
        )

    async def acquire(
        self, route: Route, pool: PoolState, exclude: Collection[BackendState]
    ) -> tuple[PoolState, BackendState]:
        """A (pool, backend) for the next attempt; the backend's slot is held by the caller.

        Raises :class:`RequestShed` when a shedding pool predicts the request would start too
        late, besides what :meth:`PoolState.acquire` raises.
        """
        now = time.monotonic()
        request_class = route.request_class
        priority, tokens = request_class.priority, route.prompt_tokens
        pool.note_class(priority, request_class.ttft_target, now)
        prediction = pool.predict(now, tokens, exclude)
        tenant, weight, cost = route.tenant, route.weight, route.tokens
        lender = self._lender(route, pool, prediction, exclude, now)
        if lender is not None:
            lender.note_class(priority, request_class.ttft_target, now)
            backend = lender.try_pick(now, exclude, route.affinity, route.prefix,
                                      tenant=tenant, weight=weight)
            if backend is None:
                backend = await lender.acquire(
                    priority, route.deadline, exclude, route.affinity, route.prefix,
                    prompt_tokens=tokens, tenant=tenant, weight=weight, tokens=cost)
            return lender, self._started(lender, backend, route)
        if not pool.queued and pool.admits(priority, now):
            self._shed(route, pool, prediction, now)
            backend = pool.try_pick(now, exclude, route.affinity, route.prefix,
                                    tenant=tenant, weight=weight)
            if backend is not None:
                return pool, self._started(pool, backend, route)
        for other in route.spill:
            if other.has_headroom(now, tokens):
                backend = other.try_pick(now, exclude, route.affinity, route.prefix,
                                         tenant=tenant, weight=weight)
                if backend is not None:
                    return other, self._started(other, backend, route)
        if not pool.untried(now, exclude):
            for other in route.spill:
                if other.untried(now, exclude):
                    backend = await other.acquire(
                        priority, route.deadline, exclude, None, route.prefix,
                        prompt_tokens=tokens, tenant=tenant, weight=weight, tokens=cost)
                    return other, self._started(other, backend, route)
            raise NoHealthyBackend(f"pool '{pool.name}' has no healthy backend to try")
        # a tenant below its share starts at once on a headroom slot, whatever is queued: the
        # queue's prediction is not its own
        spare = pool.headroom_prediction(now, tokens, tenant, weight, exclude)
        self._shed(route, pool, prediction if spare is None else spare, now)
        backend = await pool.acquire(priority, route.deadline, exclude, route.affinity,
                                     route.prefix, prompt_tokens=tokens, tenant=tenant,
                                     weight=weight, tokens=cost)
        return pool, self._started(pool, backend, route)

    def _lender(self, route: Route, pool: PoolState, prediction: Prediction,
                exclude: Collection[BackendState], now: float) -> PoolState | None:
        """A lower class's lending pool that would start this request sooner than ``pool``,
        when the class has a TTFT target its own pool is predicted to miss; else None."""
        request_class = route.request_class
        target = request_class.ttft_target
        if target is None or prediction.ttft <= target:
            return None
        best, best_ttft = None, prediction.ttft
        for other in route.spill:
            owner = self.classes.get(other.request_class)
            if owner is None or not other.lends(now, exclude):
                continue
            if owner.priority <= request_class.priority:
                continue
            ttft = other.predict(now, route.prompt_tokens, exclude, ahead_of_queue=True).ttft
            if ttft < best_ttft:
                best, best_ttft = other, ttft
        return best

    @staticmethod
    def _shed(route: Route, pool: PoolState, prediction: Prediction, now: float) -> None:
        """Raise :class:`RequestShed` when ``pool`` sheds and the prediction says so."""
        shed = pool.config.shed
        if shed is None:
            return
        priority = route.request_class.priority
        reason = shed_reason(prediction, route.deadline - now, shed.margin,
                             pool.pressure(priority, now))
        if reason is not None:
            raise RequestShed(
                f"pool '{pool.name}' is overloaded: it predicts the first token in"
                f" ~{prediction.ttft:.1f}s, later than class '{route.request_class.name}'"
                f" can wait ({reason})", retry_after(prediction), reason)

    @staticmethod
    def _started(pool: PoolState, backend: BackendState, route: Route) -> BackendState:
        pool.note_start(backend, route.prompt_tokens, route.request_class.priority,
                        time.monotonic())
        return backend

    def __repr__(self) -> str:
        return f"<Router [pools: {', '.join(self.pools)} | classes: {', '.join(self.classes)}]>"
