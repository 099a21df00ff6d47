"""The quota store interface and the values that cross it.

A request is admitted against several scopes of one tenant at once (tenant, API key, model;
and its team and organization when it has them: all scopes of one request then share the
organization's ``Partition``).
``reserve`` checks every limit of every scope and reserves all of them or none; ``renew`` keeps a
long request's concurrency lease alive; ``settle`` replaces the token estimate by the real count
and frees the lease. Implementations: ``MemoryQuotaStore`` (one process, no Redis),
``RedisQuotaStore`` (exact across replicas) and ``FailoverQuotaStore`` (Redis, with a local
fallback when Redis is away).

Per request the gateway does::

    scopes = build_scopes(plan.limits, key_id=key.id, key=key.limits,
                          model=model, per_model=plan.models.get(model))
    decision = await store.reserve(QuotaRequest(request_id=..., tenant=..., key_id=...,
                                                model=..., scopes=scopes,
                                                estimated_tokens=input_tokens + max_tokens))
    # decision.ratelimit (RateLimitState or None): the x-ratelimit-* headers, 200 or 429
    if not decision.admitted: answer 429 with Retry-After: ceil(decision.retry_after)
    try:  ... forward; every decision.reservation.renew_every s: await store.renew(res)
    finally: await store.settle(res, input_tokens + output_tokens)   # or store.cancel(res)
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import msgspec

from gateway.quota.errors import InvalidQuotaRequest
from gateway.quota.keys import tenant_tag

if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import TracebackType

    from gateway.quota.limits import LimitName, Partition, Scope

__all__ = [
    "DEFAULT_LEASE_TTL",
    "WINDOW",
    "Alerted",
    "Decision",
    "Origin",
    "QuotaRequest",
    "QuotaStore",
    "RateLimitState",
    "Reservation",
    "Usage",
    "partition_of",
]

WINDOW = 60.0
"""Seconds in the rolling window of ``rpm`` and ``tpm``; stores take a shorter one for tests."""

DEFAULT_LEASE_TTL = 30.0
"""Seconds a concurrency lease lives unless renewed: how long a crashed process holds a slot."""

Origin = Literal["redis", "memory"]


class QuotaRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What ``reserve`` needs to know about one request.

    This, :class:`Reservation` and :class:`Decision` are frozen msgspec structs rather than
    frozen dataclasses: each request builds all three, and a frozen dataclass's ``__init__``
    (one ``object.__setattr__`` per field) cost ~6 µs for the three, a struct's a tenth of it.

    ``estimated_tokens`` is the caller's upper bound (counted input + ``max_tokens``); settle
    corrects it. ``key_id`` and ``model`` are for logs; the limits that apply are in ``scopes``.
    """

    request_id: str
    tenant: str
    scopes: tuple[Scope, ...]
    estimated_tokens: int
    key_id: str | None = None
    model: str | None = None
    lease_ttl: float = DEFAULT_LEASE_TTL
    #: for scopes of unit "cost": the caller's upper bound of the cost, in micro-units
    estimated_cost: int = 0
    #: a refusal by a watched budget fires its 100 % alert; False for a probe that will be
    #: tried again with a smaller estimate (``admit``'s bound on a large body)
    refusal_alerts: bool = True

    def __post_init__(self) -> None:
        tenant_tag(self.tenant)  # raises on ids that would break the hash tag
        if not self.request_id:
            raise InvalidQuotaRequest("request_id must not be empty")
        if self.estimated_tokens < 0:
            raise InvalidQuotaRequest(f"estimated_tokens {self.estimated_tokens} < 0")
        if self.lease_ttl <= 0:
            raise InvalidQuotaRequest(f"lease_ttl {self.lease_ttl} must be > 0")
        if len({s.name for s in self.scopes}) != len(self.scopes):
            raise InvalidQuotaRequest("scope names of one request must be distinct")
        if self.scopes:
            first = self.scopes[0].partition
            if any(s.partition != first for s in self.scopes):
                raise InvalidQuotaRequest("the scopes of one request must share one partition")


def partition_of(scopes: tuple[Scope, ...]) -> Partition | None:
    """The partition of a request's scopes (``QuotaRequest`` checks they share one)."""
    return scopes[0].partition if scopes else None


class Reservation(msgspec.Struct, frozen=True, kw_only=True):
    """Proof of admission: pass it to ``renew``, then to ``settle`` or ``cancel`` exactly once.

    ``origin`` says which store holds the counters, so a failover store settles a reservation
    where it was made. ``expires_at`` is the lease expiry on the store's clock (epoch seconds).
    """

    request_id: str
    tenant: str
    scopes: tuple[Scope, ...]
    estimated_tokens: int
    lease_ttl: float
    expires_at: float
    origin: Origin
    estimated_cost: int = 0

    @property
    def renew_every(self) -> float:
        """How often a long request should renew: a third of the TTL survives two lost renews."""
        return self.lease_ttl / 3.0


class RateLimitState(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The figures of the ``x-ratelimit-*`` headers, from the tightest scope of one request.

    Requests: among the scopes that set ``rpm``, the one with the fewest requests left (ties go
    to the first scope of the request, i.e. tenant before key before model). Tokens: likewise
    among the token-unit scopes that set ``tpm`` (a cost scope's ``tpm`` counts money, not
    tokens). The two may come from different scopes. ``limit_*`` is None when no scope sets
    that limit, and then the ``*_requests`` (or ``*_tokens``) trio means nothing.

    ``remaining_*`` is what is left after this request was counted (its estimate, for tokens),
    never negative; on a refusal it is what is left as things stand (nothing was reserved), so
    the limit that refused shows 0 (or fewer tokens than the request's estimate).

    ``reset_*_s`` is the seconds until the oldest entry of that scope's rolling window leaves
    it: the time until ``remaining_*`` next grows. When remaining is 0 that is when one more
    request fits (for ``rpm`` it equals the refusal's ``retry_after``). A window that holds
    nothing gives 0; a limit of 0 never frees and gives the window length. This is not
    OpenAI's "time until the limit is back to its initial state": in a rolling log that is
    always a full window after the request just counted, which tells a client nothing, while
    the time until the next slot frees is what a client pacing itself needs.

    A plain struct with no cycles (``gc=False``): every admitted request builds one.
    """

    limit_requests: int | None = None
    remaining_requests: int = 0
    reset_requests_s: float = 0.0
    limit_tokens: int | None = None
    remaining_tokens: int = 0
    reset_tokens_s: float = 0.0


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """The answer to ``reserve``: a reservation, or the limit that refused and when to retry.

    On refusal ``scope``/``limit`` name the binding limit (the one that frees up last, so a
    retry after ``retry_after`` seconds is not refused by another one right away) and nothing
    was reserved in any scope.

    ``ratelimit`` carries the ``x-ratelimit-*`` figures (admitted or refused). It is None when
    no scope sets ``rpm`` or a token ``tpm``, on an idempotent replay of a request id that
    already holds a reservation, and when a failover store decided without the shared store
    (its local figures are this process's share, not the tenant's).
    """

    admitted: bool
    reservation: Reservation | None = None
    scope: str | None = None
    limit: LimitName | None = None
    retry_after: float = 0.0
    ratelimit: RateLimitState | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """What one scope is using now; counters whose limit is unset are not tracked (0)."""

    requests: int = 0  # admitted in the rolling window (tracked when rpm is set)
    tokens: int = 0  # charged in the rolling window (tracked when tpm is set)
    in_flight: int = 0  # live leases (tracked when concurrency is set)
    tokens_today: int = 0  # tracked when tokens_per_day is set
    tokens_this_month: int = 0  # tracked when tokens_per_month is set


@dataclass(frozen=True, slots=True, kw_only=True)
class Alerted:
    """The thresholds (percent) of one scope's day and month budgets that have alerted in the
    current day and month of its calendar: the marks the store keeps to alert once."""

    day: tuple[int, ...] = ()
    month: tuple[int, ...] = ()


class QuotaStore(ABC):
    """Admission against tenant limits: check-and-reserve, renew, settle.

    Implementations are shared by all requests of a process and safe for concurrent use from
    one event loop. Every method either completes its whole step or raises
    ``QuotaUnavailable`` having changed nothing the caller can rely on.
    """

    @abstractmethod
    async def reserve(self, request: QuotaRequest) -> Decision:
        """Check every limit of every scope; if all pass, reserve them all, atomically.

        Reserving the same ``request_id`` again while its reservation is live returns the
        existing reservation (a retried call after a lost reply does not count twice).
        """

    @abstractmethod
    async def renew(self, reservation: Reservation) -> bool:
        """Extend the concurrency leases by the lease TTL from now.

        False when the reservation is settled or a lease already expired (the slot may have
        been given away); the request may go on, but its slot is no longer guaranteed.
        """

    @abstractmethod
    async def settle(
        self, reservation: Reservation, actual_tokens: int, actual_cost: int | None = None
    ) -> bool:
        """Replace the estimate by ``actual_tokens`` (input + output) and free the leases.

        Unused tokens go back to the window and budgets; an overshoot is charged even past a
        limit (only admission refuses). Scopes of unit "cost" get ``actual_cost`` (micro-units)
        the same way; None keeps their estimate. Idempotent by request id: True when this call
        settled, False when it was already settled (or its record expired) and nothing changed.
        """

    async def cancel(self, reservation: Reservation) -> bool:
        """Release a request that never reached a backend: ``settle`` with 0 tokens.

        Tokens and leases come back; the request still counts against ``rpm``, because the
        rolling-window guarantee is about admissions. A request that did reach a backend should
        be settled with the tokens it used (at least its counted input) instead.
        """
        return await self.settle(reservation, 0, 0)

    @abstractmethod
    async def usage(self, tenant: str, scope: str, partition: Partition | None = None) -> Usage:
        """What ``scope`` of ``tenant`` uses now, for admin views and tests; a scope of an
        organization is named with its ``partition`` (then ``tenant`` is not part of the key)."""

    async def alerted(self, tenant: str, scope: str,
                      partition: Partition | None = None) -> Alerted:
        """The budget thresholds of ``scope`` that alerted this day and month, for admin views
        (read only; named as in :meth:`usage`). A store that keeps no marks answers none."""
        return Alerted()

    async def alerted_many(self, scopes: Sequence[tuple[str, str, Partition | None]]
                           ) -> list[Alerted]:
        """:meth:`alerted` of each ``(tenant, scope, partition)``, in order: a page of every
        tenant's asks for hundreds at once (a store may answer them in one round trip)."""
        return list(await asyncio.gather(*(self.alerted(*s) for s in scopes)))

    async def ping(self) -> None:  # noqa: B027 - optional hook, a no-op in memory
        """Raise ``QuotaUnavailable`` unless the store answers (readiness, outage probes)."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release connections and tasks; the default has none."""

    async def __aenter__(self) -> QuotaStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
