"""The Redis key layout, in one place.

Every key of one reservation carries the same hash tag, so all keys a script touches live in
one Redis Cluster slot. The tag is the tenant's, ``gw:q:{tenant}:...``, unless the tenant
belongs to an organization: then every quota key of the tenant carries the organization's tag,
``gw:q:{org/<organization>}:...`` (no tenant name holds a ``/``, so the two never meet), and
the organization's, its teams' and its tenants' counters share a slot::

    gw:q:{t}:r:<request id>        hash   reservation record (estimate, periods, scopes); TTL
    gw:q:{t}:s:<scope>:rpm         zset   request id -> admission time (us)       rolling window
    gw:q:{t}:s:<scope>:tpm         zset   request id -> admission time (us)       rolling window
    gw:q:{t}:s:<scope>:tpm:v       hash   request id -> tokens charged in the window
    gw:q:{t}:s:<scope>:tpm:n       string running token total of the window
    gw:q:{t}:s:<scope>:conc        zset   request id -> lease expiry (us)
    gw:q:{t}:s:<scope>:d:<yyyymmdd> string tokens charged that day; TTL past the day
    gw:q:{t}:s:<scope>:m:<yyyymm>  string tokens charged that month; TTL past the month
    gw:q:{t}:s:<scope>:d:<yyyymmdd>:a  hash  threshold (percent) -> usage when it alerted;
    gw:q:{t}:s:<scope>:m:<yyyymm>:a    hash  the alert dedupe, with its budget counter's TTL

Inside an organization ``{t}`` is ``{org/<organization>}``, the record is
``gw:q:{org/<o>}:r:<tenant>/<request id>``, and the scope names say whose counters they are
(``gateway.quota.scopes.scopes_for``): ``org:<o>``, ``team:<team>``, ``tenant:<tenant>``,
``tenant:<tenant>/key:<id>``, ``tenant:<tenant>/model:<m>``, and ``.../cost`` beside each for
spend. Day and month ids are then those of the organization's time zone. A tenant outside any
organization keeps exactly the keys it always had (no live counter moves).

The scripts derive the sub-keys from the scope base key they are given. The hash-tag rule
itself is ``gateway/redis/keys.py``'s, shared with the ledger.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.quota.errors import InvalidQuotaRequest
from gateway.redis.keys import InvalidTag, hash_tag

if TYPE_CHECKING:
    from gateway.quota.limits import Partition

__all__ = ["PREFIX", "owner_tag", "record_key", "record_prefix", "scope_key", "tenant_tag"]

PREFIX = "gw:q:"


def tenant_tag(tenant: str) -> str:
    """``gw:q:{tenant}``: the prefix that pins a tenant's keys to one cluster slot."""
    try:
        return hash_tag(PREFIX, tenant)
    except InvalidTag as exc:
        raise InvalidQuotaRequest(f"tenant id {exc}") from None


def owner_tag(tenant: str, partition: Partition | None) -> str:
    """The tag of a request's keys: its organization's when it has one, else its tenant's."""
    if partition is None:
        return tenant_tag(tenant)
    return hash_tag(PREFIX, partition.tag)  # Partition refuses braces itself


def scope_key(tenant: str, scope: str, partition: Partition | None = None) -> str:
    """Base key of one scope; the scripts append ``:rpm``, ``:tpm``, ``:conc``, ``:d:``..."""
    return f"{owner_tag(tenant, partition)}:s:{scope}"


def record_prefix(tenant: str, partition: Partition | None = None) -> str:
    """Everything of a record key before the request id."""
    if partition is None:
        return f"{tenant_tag(tenant)}:r:"
    tenant_tag(tenant)  # the same check of the tenant id as outside an organization
    return f"{owner_tag(tenant, partition)}:r:{tenant}/"


def record_key(tenant: str, request_id: str, partition: Partition | None = None) -> str:
    """The reservation record that makes settle idempotent and remembers what was charged."""
    return record_prefix(tenant, partition) + request_id
