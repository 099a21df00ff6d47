"""The Redis key layout, in one place.

Every key of a tenant carries the tenant in a hash tag, ``gw:q:{tenant}:...``, so all keys a
script touches live in one Redis Cluster slot::

    gw:q:{t}:r:<request id>        hash   reservation record (estimate, periods, scopes); TTL
    gw:q:{t}:s:<scope>:rpm         zset   request id -> admission time (us)       rolling window
    gw:q:{t}:s:<scope>:tpm         zset   request id -> admission time (us)       rolling window
    gw:q:{t}:s:<scope>:tpm:v       hash   request id -> tokens charged in the window
    gw:q:{t}:s:<scope>:tpm:n       string running token total of the window
    gw:q:{t}:s:<scope>:conc        zset   request id -> lease expiry (us)
    gw:q:{t}:s:<scope>:d:<yyyymmdd> string tokens charged that UTC day; TTL past the day
    gw:q:{t}:s:<scope>:m:<yyyymm>  string tokens charged that UTC month; TTL past the month

The scripts derive the sub-keys from the scope base key they are given. The hash-tag rule
itself is ``gateway/redis/keys.py``'s, shared with the ledger.
"""

from __future__ import annotations

from gateway.quota.errors import InvalidQuotaRequest
from gateway.redis.keys import InvalidTag, hash_tag

__all__ = ["PREFIX", "record_key", "scope_key", "tenant_tag"]

PREFIX = "gw:q:"


def tenant_tag(tenant: str) -> str:
    """``gw:q:{tenant}``: the prefix that pins a tenant's keys to one cluster slot."""
    try:
        return hash_tag(PREFIX, tenant)
    except InvalidTag as exc:
        raise InvalidQuotaRequest(f"tenant id {exc}") from None


def scope_key(tenant: str, scope: str) -> str:
    """Base key of one scope; the scripts append ``:rpm``, ``:tpm``, ``:conc``, ``:d:``..."""
    return f"{tenant_tag(tenant)}:s:{scope}"


def record_key(tenant: str, request_id: str) -> str:
    """The reservation record that makes settle idempotent and remembers what was charged."""
    return f"{tenant_tag(tenant)}:r:{request_id}"
