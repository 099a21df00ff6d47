"""Policies: the typed model, loading and validation."""

from __future__ import annotations

from gateway.config.load import PolicyError, key_hashes, load_policy, parse_policy, validate
from gateway.config.model import (
    Affinity,
    ApiKey,
    Auth,
    Backend,
    Borrow,
    Health,
    Model,
    Policy,
    Pool,
    RequestClass,
    Retry,
    RouteRule,
    Routing,
    Server,
    Shadow,
    Signals,
    Timeouts,
    Version,
)

__all__ = [
    "Affinity",
    "ApiKey",
    "Auth",
    "Backend",
    "Borrow",
    "Health",
    "Model",
    "Policy",
    "PolicyError",
    "Pool",
    "RequestClass",
    "Retry",
    "RouteRule",
    "Routing",
    "Server",
    "Shadow",
    "Signals",
    "Timeouts",
    "Version",
    "key_hashes",
    "load_policy",
    "parse_policy",
    "validate",
]
