"""The policy's callers: who may call the gateway and how much of it they may use.

``auth:``, ``tenants:``, ``plans:``, ``organizations:``, ``teams:`` and ``alerts:`` in a
policy: API keys, tenants and their plans, the :class:`LimitSet` quotas of each scope, the
bound on stored responses, and the budget alerts.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from gateway.config.base import Amount, Name, PolicyStruct, PositiveFloat, PositiveInt

__all__ = [
    "DEFAULT_STORED_RESPONSES_BYTES",
    "DEFAULT_STORED_RESPONSES_ROWS",
    "Alerts",
    "ApiKey",
    "Auth",
    "GroupName",
    "LimitSet",
    "NonNegInt",
    "Organization",
    "Percent",
    "Plan",
    "StoredResponseLimits",
    "Team",
    "Tenant",
    "TenantName",
]


NonNegInt = Annotated[int, msgspec.Meta(ge=0)]
TenantName = Annotated[
    str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._:-]+$")
]


class LimitSet(PolicyStruct, frozen=True):
    """Quota limits; an absent limit is unlimited."""

    #: requests in any rolling 60 s window
    rpm: NonNegInt | None = None
    #: input + output tokens in any rolling 60 s window
    tpm: NonNegInt | None = None
    #: requests in flight at once
    concurrency: NonNegInt | None = None
    #: input + output tokens per calendar day / month (UTC, or the organization's timezone)
    tokens_per_day: NonNegInt | None = None
    tokens_per_month: NonNegInt | None = None
    #: spend per calendar day / month in the price currency (e.g. "25.00"), from ``prices``
    cost_per_day: Amount | None = None
    cost_per_month: Amount | None = None


#: ``stored_responses.max_rows`` unless a plan or tenant sets it
DEFAULT_STORED_RESPONSES_ROWS = 1_000_000
#: ``stored_responses.max_bytes`` unless a plan or tenant sets it: 1 GiB
DEFAULT_STORED_RESPONSES_BYTES = 1 << 30


class StoredResponseLimits(PolicyStruct, frozen=True):
    """A tenant's bound on its stored responses (Responses API ``store`` not false, the
    default), counted across every replica in the ledger's database: past either bound a
    request that would store one more is answered 400 ``stored_responses_limit_exceeded``
    (naming the bound, the tenant's usage and the limit) before admission, so nothing is
    reserved or forwarded; ``store: false`` requests still run. Deleting stored responses
    (``DELETE /v1/responses/{id}``) or their expiry (``store.responses_ttl_hours``) frees the
    room. Checked before the request runs, so concurrent requests may pass it together: a
    tenant can go past a bound by at most its requests in flight (rows) and their answers
    (bytes; beyond the first request, their requests too)."""

    #: stored responses the tenant keeps at once (``null``: no bound)
    max_rows: PositiveInt | None = DEFAULT_STORED_RESPONSES_ROWS
    #: bytes of stored responses the tenant keeps at once: each response's request, its new
    #: chat messages and its answer, as JSON (``null``: no bound). A request is refused when
    #: the tenant's bytes plus twice its body (its request and its messages) would pass it
    max_bytes: PositiveInt | None = DEFAULT_STORED_RESPONSES_BYTES


class Plan(PolicyStruct, frozen=True):
    """Limits a tenant gets; ``models`` adds per-model limits inside the tenant's."""

    name: Name
    limits: LimitSet = msgspec.field(default_factory=LimitSet)
    models: dict[str, LimitSet] = msgspec.field(default_factory=dict)
    #: its tenants' share of a busy pool, against other tenants of the same class (fair
    #: queuing): a tenant of weight 2 is served twice the tokens of one of weight 1
    weight: PositiveFloat = 1.0
    #: each of its tenants' bound on stored responses (rows and bytes; a tenant outside any
    #: plan gets the defaults: 1,000,000 responses, 1 GiB)
    stored_responses: StoredResponseLimits = msgspec.field(
        default_factory=StoredResponseLimits)


# --- organizations, teams and budget alerts (issue 16) ---------------------------------------
#: organization and team names: no ``:`` or ``/`` (they separate the names of quota scopes)
GroupName = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")]
Percent = Annotated[int, msgspec.Meta(ge=1, le=100)]


class Alerts(PolicyStruct, frozen=True):
    """Budget alerts: a log event, a metric and (with a webhook) an HMAC-signed POST when a day
    or month budget (tokens or spend) of an organization, team, tenant or key crosses one of
    ``thresholds`` - once per budget, period and threshold across all replicas."""

    #: percentages of each day/month budget that alert, in 1..100
    thresholds: Annotated[list[Percent], msgspec.Meta(min_length=1)] = msgspec.field(
        default_factory=lambda: [50, 80, 100])
    #: environment variable holding the webhook URL (http:// or https://); unset: no webhook
    webhook_url_env: str | None = None
    #: environment variable holding the secret that signs the webhook body (HMAC-SHA256)
    webhook_secret_env: str | None = None


class Organization(PolicyStruct, frozen=True):
    """Holds teams, which hold tenants: its limits bind all of them together."""

    name: GroupName
    limits: LimitSet = msgspec.field(default_factory=LimitSet)
    #: the calendar of the day/month budgets of the organization, its teams and its tenants:
    #: "UTC" or an IANA name ("Europe/Paris") from the installed tzdata
    timezone: str = "UTC"
    #: budget alerts of the organization and everything in it (default: the policy's
    #: ``alerts``)
    alerts: Alerts | None = None
    #: its tenants share one prompt-cache salt (``isolation``): a tenant's prompt is reused
    #: for, and so can be learnt by, the other tenants of the organization
    share_cache: bool = False


class Team(PolicyStruct, frozen=True):
    """A group of tenants inside one organization, with limits of its own."""

    name: GroupName
    organization: GroupName
    limits: LimitSet = msgspec.field(default_factory=LimitSet)


class Tenant(PolicyStruct, frozen=True):
    """A customer of the gateway: its plan and defaults."""

    name: TenantName
    plan: Name
    #: the class of this tenant's requests unless a key, header or rule says otherwise
    default_class: Name | None = None
    #: record prompt and completion text in traces, and the texts of disagreeing shadow
    #: answers (off unless turned on per tenant; counts and agreement are always kept)
    record_content: bool = False
    #: the team this tenant belongs to (and so the team's organization)
    team: GroupName | None = None
    #: the organization this tenant belongs to without a team (or its team's, if repeated)
    organization: GroupName | None = None
    #: its share of a busy pool against other tenants of its class (default: its plan's)
    weight: PositiveFloat | None = None
    #: tenants of one cache group share one prompt-cache salt (``isolation``): they can reuse,
    #: and so learn, each other's prompts; unset: its organization's if that shares, else its own
    cache_group: GroupName | None = None
    #: its own bound on stored responses, in place of its plan's (default: its plan's)
    stored_responses: StoredResponseLimits | None = None


class ApiKey(PolicyStruct, frozen=True):
    """A static API key, stored only as the sha256 of the key (or read from an env variable)."""

    id: Name
    sha256: Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}$")] | None = None
    key_env: str | None = None
    #: the class of this key's requests unless a header or rule says otherwise
    default_class: Name | None = None
    #: may this key choose its class with the X-Request-Class header
    allow_class_header: bool = False
    #: the tenant this key belongs to (default: "default")
    tenant: TenantName = "default"
    #: the key's own limits, inside its tenant's
    limits: LimitSet | None = None


class Auth(PolicyStruct, frozen=True):
    """Who may call the gateway. Tenants and managed keys extend this."""

    #: when false, requests without a key are served (a local demo or a trusted sidecar)
    required: bool = True
    keys: list[ApiKey] = msgspec.field(default_factory=list)
    #: seconds a managed key's lookup is cached: a revocation takes effect within this bound
    cache_ttl: Annotated[float, msgspec.Meta(ge=0, le=10)] = 2.0
    #: environment variable with the secret that keys managed API keys' hashes (HMAC-SHA256)
    key_secret_env: str = "GATEWAY_KEY_SECRET"
