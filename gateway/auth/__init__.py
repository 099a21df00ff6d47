"""Authentication: API key -> key id (and, with tenants, the tenant)."""

from __future__ import annotations

from gateway.auth.static import KEY_PREFIX, StaticKeys, bearer_token, new_api_key

__all__ = ["KEY_PREFIX", "StaticKeys", "bearer_token", "new_api_key"]
