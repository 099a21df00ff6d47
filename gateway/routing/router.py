"""The router: model -> pool -> backend, with class-aware spill-over.

A request's primary pool is the model's pool for its class (or its rollout version's pool).
Then, in order:

1. a free backend of the primary pool;
2. borrowing: a pool of the same model that lends headroom (``borrow`` on interactive pools)
   takes the request at once while it has headroom - a borrower never queues there;
3. overflow: when the primary pool has no healthy capacity at all, another pool of the model
   takes the request (queueing there by class priority, ahead of that pool's own lower class);
4. otherwise the request waits in the primary pool's queue, up to its start deadline.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.routing.conversation import conversation_key
from gateway.routing.errors import NoHealthyBackend
from gateway.routing.pool import PoolState
from gateway.routing.prefix import prompt_hashes
from gateway.routing.retry import RetryBudget
from gateway.routing.rollout import choose_version

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping
    from typing import Any

    from gateway.config import Model, Policy, RequestClass
    from gateway.routing.backend import BackendState

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
    ) -> Route:
        """Route one request: its conversation (or key) picks the version a sticky model
        keeps it on, and the backend an affine pool sends it back to; a pool routing by prefix
        reads the prompt's chunk hashes."""
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
            route.prefix = prompt_hashes(payload, settings.block_bytes)
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
        version = choose_version(model, sticky_key)
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
        """A (pool, backend) for the next attempt; the backend's slot is held by the caller."""
        now = time.monotonic()
        priority = route.request_class.priority
        if not pool.queued:
            backend = pool.try_pick(now, exclude, route.affinity, route.prefix)
            if backend is not None:
                return pool, backend
        for other in route.spill:
            if other.has_headroom(now):
                backend = other.try_pick(now, exclude, route.affinity, route.prefix)
                if backend is not None:
                    return other, backend
        if not pool.untried(now, exclude):
            for other in route.spill:
                if other.untried(now, exclude):
                    return other, await other.acquire(priority, route.deadline, exclude)
            raise NoHealthyBackend(f"pool '{pool.name}' has no healthy backend to try")
        return pool, await pool.acquire(
            priority, route.deadline, exclude, route.affinity, route.prefix
        )

    def __repr__(self) -> str:
        return f"<Router [pools: {', '.join(self.pools)} | classes: {', '.join(self.classes)}]>"
