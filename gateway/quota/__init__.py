"""Tenant limits, exact across replicas: one Redis round trip to admit, one to settle.

``base.py`` holds the interface (``QuotaStore``) and its values; ``memory.py``, ``redis.py`` and
``failover.py`` the stores; ``scripts.py`` the Lua; ``keys.py`` the Redis key layout;
``limits.py`` scopes, organization partitions and budget calendars; ``alerts.py`` the budget
threshold alerts the stores report.
"""

from __future__ import annotations

from gateway.quota.alerts import AlertSink, BudgetAlert
from gateway.quota.base import (
    DEFAULT_LEASE_TTL,
    WINDOW,
    Decision,
    QuotaRequest,
    QuotaStore,
    RateLimitState,
    Reservation,
    Usage,
)
from gateway.quota.errors import (
    InvalidQuotaRequest,
    QuotaBackingOff,
    QuotaConnectError,
    QuotaError,
    QuotaStoreError,
    QuotaTimeout,
    QuotaUnavailable,
)
from gateway.quota.failover import FailoverMode, FailoverQuotaStore
from gateway.quota.limits import (
    LIMIT_NAMES,
    AlertRule,
    LimitName,
    Limits,
    Partition,
    Scope,
    build_scopes,
)
from gateway.quota.memory import MemoryQuotaStore
from gateway.quota.redis import RedisQuotaStore
from gateway.timers.backoff import Backoff

__all__ = [
    "DEFAULT_LEASE_TTL",
    "LIMIT_NAMES",
    "WINDOW",
    "AlertRule",
    "AlertSink",
    "Backoff",
    "BudgetAlert",
    "Decision",
    "FailoverMode",
    "FailoverQuotaStore",
    "InvalidQuotaRequest",
    "LimitName",
    "Limits",
    "MemoryQuotaStore",
    "Partition",
    "QuotaBackingOff",
    "QuotaConnectError",
    "QuotaError",
    "QuotaRequest",
    "QuotaStore",
    "QuotaStoreError",
    "QuotaTimeout",
    "QuotaUnavailable",
    "RateLimitState",
    "RedisQuotaStore",
    "Reservation",
    "Scope",
    "Usage",
    "build_scopes",
]
