"""Policies: the typed model, loading and validation."""

from __future__ import annotations

from gateway.config.load import PolicyError, key_hashes, load_policy, parse_policy, validate
from gateway.config.model import ApiKey, Auth, Backend, Model, Policy, Pool, Server, Timeouts

__all__ = [
    "ApiKey",
    "Auth",
    "Backend",
    "Model",
    "Policy",
    "PolicyError",
    "Pool",
    "Server",
    "Timeouts",
    "key_hashes",
    "load_policy",
    "parse_policy",
    "validate",
]
