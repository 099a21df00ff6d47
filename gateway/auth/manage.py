"""Creating, listing and revoking managed API keys (shared by the CLI and the admin API)."""

from __future__ import annotations

import os
import re
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

from gateway.auth.keystore import (
    FileKeyStore,
    KeyRecord,
    KeyStore,
    RedisKeyStore,
    digest_for,
    new_managed_key,
)

if TYPE_CHECKING:
    from gateway.config import Policy

__all__ = [
    "KeyAdminError",
    "create_key",
    "open_keystore",
    "parse_expiry",
    "parse_limits",
    "public_view",
]

LIMIT_NAMES = ("rpm", "tpm", "concurrency", "tokens_per_day", "tokens_per_month")
#: seconds a key store's client may take to connect (one policy-wide store timeout is a
#: request's bound, too short for a CLI on a far network)
_CONNECT_TIMEOUT = 5.0


def parse_limits(items: list[str] | None) -> dict[str, int]:
    """``["rpm=60", "tpm=100000"]`` -> ``{"rpm": 60, "tpm": 100000}``."""
    limits: dict[str, int] = {}
    for item in items or []:
        name, _, value = item.partition("=")
        try:
            limits[name.strip()] = int(value)
        except ValueError:
            raise KeyAdminError(f"--limit {item!r}: expected NAME=NUMBER") from None
    return limits

_DURATION = re.compile(r"^(\d+)([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class KeyAdminError(ValueError):
    """A key operation that cannot be done as asked (says why)."""


def parse_expiry(text: str | None, now: float | None = None) -> float | None:
    """``30d``, ``12h``, ``90m``... or an ISO 8601 time -> unix time; None -> never."""
    if not text:
        return None
    now = time.time() if now is None else now
    match = _DURATION.match(text.strip())
    if match:
        return now + int(match.group(1)) * _UNITS[match.group(2)]
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise KeyAdminError(
            f"--expires: {text!r} is neither a duration (30d) nor ISO 8601"
        ) from None
    if when.tzinfo is None:
        raise KeyAdminError("--expires: give a time zone (e.g. 2027-01-01T00:00:00+00:00)")
    return when.timestamp()


def secret_for(policy: Policy) -> bytes:
    secret = os.environ.get(policy.auth.key_secret_env)
    if not secret or len(secret) < 16:
        raise KeyAdminError(
            f"managed keys need a secret of >= 16 characters in ${policy.auth.key_secret_env}"
        )
    return secret.encode()


def open_keystore(policy: Policy) -> KeyStore:
    """The key store a policy names: Redis if its URL variable is set, else its keys_file."""
    url = os.environ.get(policy.store.redis_url_env)
    if url:
        from gateway.redis import Timeouts, open_redis

        # a lookup is bounded by the store's timeout; the connect may take longer (the CLI)
        client = open_redis(url, cluster=policy.store.cluster, max_connections=None,
                            timeouts=Timeouts(connect=_CONNECT_TIMEOUT))
        return RedisKeyStore(client, policy.store.timeout)
    if policy.store.keys_file:
        return FileKeyStore(policy.store.keys_file)
    raise KeyAdminError(
        f"no key store: set ${policy.store.redis_url_env} or store.keys_file in the policy"
    )


async def create_key(
    store: KeyStore,
    policy: Policy,
    tenant: str,
    *,
    name: str = "",
    expires: float | None = None,
    default_class: str | None = None,
    allow_class_header: bool = False,
    limits: dict[str, int] | None = None,
) -> tuple[KeyRecord, str]:
    """Create and store a key; returns (record, the key itself - shown once, never stored)."""
    if tenant not in {t.name for t in policy.tenants}:
        raise KeyAdminError(f"unknown tenant {tenant!r} (declare it under tenants: in the policy)")
    if default_class is not None and default_class not in {c.name for c in policy.classes}:
        raise KeyAdminError(f"unknown class {default_class!r}")
    _check_limits(limits)
    if expires is not None and expires <= time.time():
        raise KeyAdminError("the expiry is in the past")
    key_id, key = new_managed_key()
    record = KeyRecord(
        id=key_id, tenant=tenant, digest=digest_for(secret_for(policy), key), name=name,
        created=time.time(), expires=expires, default_class=default_class,
        allow_class_header=allow_class_header, limits=limits or None,
    )
    await store.put(record)
    return record, key


def _check_limits(limits: dict[str, int] | None) -> None:
    """Refuse unknown limit names and values that are not whole numbers >= 0.

    Its own function so that its loop variables cannot shadow ``create_key``'s parameters (a
    loop over ``name, value`` once overwrote the key's ``name`` with the last limit's name).
    """
    for limit, value in (limits or {}).items():
        if (limit not in LIMIT_NAMES or not isinstance(value, int) or isinstance(value, bool)
                or value < 0):
            raise KeyAdminError(
                f"limit {limit}={value!r}: use {', '.join(LIMIT_NAMES)} with whole numbers >= 0"
            )


def public_view(record: KeyRecord) -> dict[str, Any]:
    """A record as shown to operators: never the digest."""
    now = time.time()
    state = "revoked" if record.revoked else (
        "expired" if record.expires is not None and record.expires <= now else "active")
    return {
        "id": record.id, "tenant": record.tenant, "name": record.name, "state": state,
        "created": record.created, "expires": record.expires, "revoked": record.revoked,
        "default_class": record.default_class,
        "limits": record.limits,
    }
