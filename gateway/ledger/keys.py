"""The Redis key layout of the ledger, in one place.

Every key of a tenant carries the tenant as a hash tag, so one record's keys share a Redis
Cluster slot and one script call can touch them all atomically::

    gw:l:{t}:seen:<request id>   string  "1", TTL seen_ttl_days        the idempotency guard
    gw:l:{t}:s:<YYYY-MM-DD>      stream  field "r" = record JSON        one per UTC day
    gw:l:{t}:d:<YYYY-MM-DD>      hash    <model>|<class>|<batch>|<counter> -> int
    gw:l:{t}:m:<YYYY-MM>         hash    the same fields, per UTC month
    gw:l:tenants                 set     tenant ids with records (admin listing)

``gw:l:tenants`` lives outside every tenant's slot, so it is not touched by the script: the
writer adds to it with a plain ``SADD`` in the same pipeline (a set add is idempotent, and a
lost one only hides a tenant from ``usage_all`` until its next record). Streams and day
totals expire ``retention_days`` after their day, month totals ``month_retention_days``
after their month.

A tenant id is used verbatim except that ``{``, ``}`` and ``%`` are percent-escaped, so no id
can break the hash tag (the rule is ``gateway/redis/keys.py``'s, shared with the quota store).
"""

from __future__ import annotations

from gateway.redis.keys import escape_tag, hash_tag

__all__ = [
    "PREFIX",
    "TENANTS_KEY",
    "day_key",
    "month_key",
    "seen_key",
    "stream_key",
    "tenant_tag",
]

PREFIX = "gw:l:"
TENANTS_KEY = "gw:l:tenants"


def tenant_tag(tenant: str) -> str:
    """``gw:l:{tenant}``: pins the tenant's keys to one cluster slot."""
    return hash_tag(PREFIX, escape_tag(tenant))


def seen_key(tag: str, request_id: str) -> str:
    return f"{tag}:seen:{request_id}"


def stream_key(tag: str, day: str) -> str:
    return f"{tag}:s:{day}"


def day_key(tag: str, day: str) -> str:
    return f"{tag}:d:{day}"


def month_key(tag: str, month: str) -> str:
    return f"{tag}:m:{month}"
