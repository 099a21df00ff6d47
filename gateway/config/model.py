"""The typed policy model: the single source of truth for what a policy file may say.

Every section has defaults, so a policy directory may split sections across files; the loader
(``gateway.config.load``) merges them and then runs the cross-field checks in ``validate``. The
JSON Schema published as ``policies/schema.json`` is generated from these types.

This module assembles :class:`Policy` from its sections and re-exports every name of the model,
so ``from gateway.config.model import X`` works for all of them; the sections live next to it:
``base`` (the struct base and field types), ``pools`` (pools and backends), ``catalog`` (public
models, versions, rollouts, shadows, prices), ``routing`` (request classes, route rules,
retries, timeouts), ``tenants`` (keys, tenants, plans, organizations, teams, limits, alerts) and
``server`` (the HTTP edge, store, batch jobs, console).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from gateway.config.base import Amount as Amount
from gateway.config.base import Duration as Duration
from gateway.config.base import Name as Name
from gateway.config.base import PolicyStruct, seconds
from gateway.config.base import PositiveFloat as PositiveFloat
from gateway.config.base import PositiveInt as PositiveInt
from gateway.config.catalog import DEFAULT_MAX_OUTPUT_TOKENS as DEFAULT_MAX_OUTPUT_TOKENS
from gateway.config.catalog import MAX_OUTPUT_TOKENS_LIMIT as MAX_OUTPUT_TOKENS_LIMIT
from gateway.config.catalog import AgreementGate as AgreementGate
from gateway.config.catalog import ErrorRateGate as ErrorRateGate
from gateway.config.catalog import Fraction as Fraction
from gateway.config.catalog import LatencyGate as LatencyGate
from gateway.config.catalog import (
    Model,
    Price,
    Prices,
    Progressive,
    RolloutGates,
    Shadow,
    Version,
)
from gateway.config.catalog import PriceOverride as PriceOverride
from gateway.config.catalog import TokensGate as TokensGate
from gateway.config.pools import (
    Affinity,
    Backend,
    Borrow,
    CacheIsolation,
    Continuation,
    Engine,
    Health,
    Isolation,
    Lend,
    Pool,
    PrefixRouting,
    Shed,
    Signals,
)
from gateway.config.pools import ApiName as ApiName
from gateway.config.routing import (
    DEFAULT_CLASSES,
    RequestClass,
    Retry,
    RouteRule,
    Routing,
    Timeouts,
)
from gateway.config.server import Batch, CallLimits, ClientLimits, Console, Server, Store
from gateway.config.tenants import DEFAULT_STORED_RESPONSES_BYTES as DEFAULT_STORED_RESPONSES_BYTES
from gateway.config.tenants import DEFAULT_STORED_RESPONSES_ROWS as DEFAULT_STORED_RESPONSES_ROWS
from gateway.config.tenants import (
    Alerts,
    ApiKey,
    Auth,
    LimitSet,
    Organization,
    Plan,
    StoredResponseLimits,
    Team,
    Tenant,
)
from gateway.config.tenants import GroupName as GroupName
from gateway.config.tenants import NonNegInt as NonNegInt
from gateway.config.tenants import Percent as Percent
from gateway.config.tenants import TenantName as TenantName

__all__ = [
    "Affinity",
    "Alerts",
    "ApiKey",
    "Auth",
    "Backend",
    "Batch",
    "Borrow",
    "CacheIsolation",
    "CallLimits",
    "ClientLimits",
    "Console",
    "Continuation",
    "Engine",
    "Health",
    "Isolation",
    "Lend",
    "LimitSet",
    "Model",
    "Organization",
    "Plan",
    "Policy",
    "Pool",
    "PrefixRouting",
    "Price",
    "Prices",
    "Progressive",
    "RequestClass",
    "Retry",
    "RolloutGates",
    "RouteRule",
    "Routing",
    "Server",
    "Shadow",
    "Shed",
    "Signals",
    "Store",
    "StoredResponseLimits",
    "Team",
    "Tenant",
    "Timeouts",
    "Version",
    "seconds",
]


class Policy(PolicyStruct, frozen=True):
    """A whole policy: what the gateway serves and how."""

    version: Literal[1] = 1
    server: Server = msgspec.field(default_factory=Server)
    auth: Auth = msgspec.field(default_factory=Auth)
    classes: list[RequestClass] = msgspec.field(default_factory=lambda: list(DEFAULT_CLASSES))
    routing: Routing = msgspec.field(default_factory=Routing)
    pools: list[Pool] = msgspec.field(default_factory=list)
    models: list[Model] = msgspec.field(default_factory=list)
    prices: Prices = msgspec.field(default_factory=Prices)
    plans: list[Plan] = msgspec.field(default_factory=list)
    tenants: list[Tenant] = msgspec.field(default_factory=list)
    organizations: list[Organization] = msgspec.field(default_factory=list)
    teams: list[Team] = msgspec.field(default_factory=list)
    #: budget alerts of tenants outside any organization, and of organizations that set none
    alerts: Alerts = msgspec.field(default_factory=Alerts)
    store: Store = msgspec.field(default_factory=Store)
    batch: Batch = msgspec.field(default_factory=Batch)
    #: tenants kept apart in the engines' prompt caches
    isolation: Isolation = msgspec.field(default_factory=Isolation)
    #: the web console at ``/console``
    console: Console = msgspec.field(default_factory=Console)
