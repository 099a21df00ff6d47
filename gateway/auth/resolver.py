"""Who is calling: API key -> identity (key id, tenant, defaults, limits).

Static keys from the policy are checked first (sha256 lookup); managed keys are looked up by
their keyed hash in the key store, through a small cache that holds an entry (found or not) for
at most ``auth.cache_ttl`` seconds - the bound on how long a revoked or expired key still works.
Every failure - missing, malformed, unknown, revoked, expired - gets the same answer, and each
costs one hash plus at most one store lookup, so timing says nothing about which it was.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.auth.keystore import digest_for
from gateway.auth.static import KEY_PREFIX, bearer_token
from gateway.errors import AuthenticationFailed

if TYPE_CHECKING:
    from gateway.auth.keystore import KeyRecord, KeyStore
    from gateway.auth.static import StaticKeys
    from gateway.config import ApiKey, LimitSet

__all__ = ["INVALID_KEY", "Identity", "KeyResolver"]

_CACHE_MAX = 100_000

#: the one answer to every bad key, on every route
INVALID_KEY = "Invalid API key. Pass a valid key as 'Authorization: Bearer <key>'."


@dataclass(frozen=True, slots=True)
class Identity:
    """The caller, as the rest of the pipeline sees it (never the key itself)."""

    key_id: str
    tenant: str
    default_class: str | None = None
    allow_class_header: bool = False
    limits: dict[str, int] | None = None


def _from_static(key: ApiKey) -> Identity:
    limits: LimitSet | None = key.limits
    return Identity(
        key.id, key.tenant, key.default_class, key.allow_class_header,
        None if limits is None else {
            k: v for k, v in (
                ("rpm", limits.rpm), ("tpm", limits.tpm), ("concurrency", limits.concurrency),
                ("tokens_per_day", limits.tokens_per_day),
                ("tokens_per_month", limits.tokens_per_month),
            ) if v is not None
        },
    )


def _from_record(record: KeyRecord) -> Identity:
    return Identity(record.id, record.tenant, record.default_class, record.allow_class_header,
                    record.limits)


class KeyResolver:
    """Static keys plus an optional managed key store behind a bounded, short-lived cache."""

    def __init__(
        self,
        static: StaticKeys,
        static_configs: dict[str, ApiKey],
        store: KeyStore | None,
        secret: bytes | None,
        cache_ttl: float,
    ) -> None:
        self.static = static
        self.static_identities = {k: _from_static(c) for k, c in static_configs.items()}
        self.store = store if secret else None
        self.secret = secret or b""
        self.cache_ttl = cache_ttl
        self._cache: dict[str, tuple[float, Identity | None]] = {}
        self._usable: dict[str, tuple[float, bool]] = {}

    async def authenticate(self, authorization: bytes | None) -> Identity | None:
        """The caller of a request from its ``Authorization`` header: the one check every
        route runs (proxy, models, files, batches, usage).

        None means an anonymous caller, allowed only when the policy does not require keys;
        otherwise a missing or bad key raises :class:`AuthenticationFailed`.
        """
        identity = await self.identify(bearer_token(authorization))
        if identity is None and self.static.required:
            raise AuthenticationFailed(INVALID_KEY)
        return identity

    async def key_usable(self, key_id: str) -> bool:
        """Whether a key that authenticated earlier still may (work started under it, such as a
        batch, stops when this turns False). Cached like lookups: within ``cache_ttl``."""
        if key_id in self.static_identities:
            return True
        if self.store is None:
            return False  # neither a key of this policy nor a managed one any more
        now = time.monotonic()
        hit = self._usable.get(key_id)
        if hit is not None and hit[0] > now:
            return hit[1]
        record = await self.store.by_id(key_id)
        usable = record is not None and record.usable(time.time())
        if len(self._usable) >= _CACHE_MAX:
            self._usable.clear()
        self._usable[key_id] = (now + self.cache_ttl, usable)
        return usable

    async def identify(self, token: str | None) -> Identity | None:
        if token is None:
            return None
        key_id = self.static.identify(token)
        if key_id is not None:
            return self.static_identities.get(key_id)
        if self.store is None or not token.startswith(KEY_PREFIX):
            return None
        digest = digest_for(self.secret, token)
        now = time.monotonic()
        hit = self._cache.get(digest)
        if hit is not None and hit[0] > now:
            return hit[1]
        record = await self.store.get(digest)
        identity = (
            _from_record(record) if record is not None and record.usable(time.time()) else None
        )
        if len(self._cache) >= _CACHE_MAX:
            self._cache.clear()  # crude but bounded; refills within one TTL
        self._cache[digest] = (now + self.cache_ttl, identity)
        return identity
