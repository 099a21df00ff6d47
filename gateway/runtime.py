"""One policy's state: keys, tenants and plans (and their teams and organizations), models, the
router, timeouts, prices.

A reload builds a new :class:`Runtime` and swaps it in one assignment; a request reads the
current one once when it starts and keeps that snapshot, so in-flight requests finish under the
policy they started with. Backend state (load, health, latency) carries over to the new router
for backends that stay.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.accounting import PriceTable
from gateway.auth import StaticKeys
from gateway.auth.cache_salt import CacheSalts, load_secret
from gateway.auth.resolver import KeyResolver
from gateway.config import key_hashes
from gateway.quota.calls import CallLimiter
from gateway.quota.scopes import scopes_for
from gateway.routing.router import Router
from gateway.upstream.engines import cache_mode, unisolated

if TYPE_CHECKING:
    from gateway.auth.keystore import KeyStore
    from gateway.config import Alerts, ApiKey, Model, Organization, Plan, Policy, Team, Tenant
    from gateway.config.model import CacheIsolation
    from gateway.quota import Scope

__all__ = ["Runtime"]

_log = logging.getLogger("gateway.runtime")


def _without_none(value: Any) -> Any:
    """Unset optional fields are None in the policy model; the price table wants them absent."""
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    return value


class Runtime:
    """Keys, models and router of one policy."""

    def __init__(
        self, policy: Policy, previous: Runtime | None = None, keystore: KeyStore | None = None
    ) -> None:
        self.policy = policy
        self.keys = StaticKeys(key_hashes(policy), required=policy.auth.required)
        self.key_configs: dict[str, ApiKey] = {k.id: k for k in policy.auth.keys}
        secret = os.environ.get(policy.auth.key_secret_env)
        self.resolver = KeyResolver(
            self.keys, self.key_configs, keystore, secret.encode() if secret else None,
            policy.auth.cache_ttl,
        )
        self.tenants: dict[str, Tenant] = {t.name: t for t in policy.tenants}
        self.plans: dict[str, Plan] = {p.name: p for p in policy.plans}
        self.organizations: dict[str, Organization] = {o.name: o for o in policy.organizations}
        self.teams: dict[str, Team] = {t.name: t for t in policy.teams}
        #: tenant -> (team, organization), for the usage record and the quota scopes
        self._placements: dict[str, tuple[str | None, str | None]] = {
            t.name: (t.team, self.teams[t.team].organization if t.team in self.teams
                     else t.organization)
            for t in policy.tenants if t.team is not None or t.organization is not None
        }
        self._scopes: dict[tuple[str | None, str | None, str], tuple[Scope, ...]] = {}
        self.models: dict[str, Model] = {m.name: m for m in policy.models}
        self.router: Router = Router(policy, previous.router if previous is not None else None)
        self.timeouts = {
            c.name: c.timeouts or policy.server.timeouts for c in policy.classes
        }
        #: the per-key limit of the utility routes (count_tokens, stored reads, usage): its
        #: buckets carry over a reload, so a reload does not refill them
        self.calls: CallLimiter = CallLimiter(policy.server.call_limits,
                                 previous.calls if previous is not None else None)
        #: each tenant's prompt-cache salt (``isolation``); the secret carries over a reload
        self.cache_salts: CacheSalts = CacheSalts(
            policy, previous.cache_salts.secret if previous is not None
            else (lambda: load_secret(policy)))
        self.prices = PriceTable.from_mapping(_without_none(msgspec.to_builtins(policy.prices)))
        for state in self.router.pools.values():
            engine = unisolated(state, policy.isolation.cache)
            if engine is not None:
                _log.warning("pool %s: its engine (%s) takes no prompt-cache salt or switch, so "
                             "its tenants share its prompt cache; set cache_isolation: shared "
                             "to say so", state.name, engine)

    def scopes(
        self, tenant: str | None, key_id: str | None, key_limits: dict[str, int] | None,
        model: str,
    ) -> tuple[Scope, ...]:
        """The quota scopes of a (tenant, key, model), built once per policy and cached."""
        cache_key = (tenant, key_id, model)
        scopes = self._scopes.get(cache_key)
        if scopes is None:
            t = self.tenants.get(tenant or "")
            plan = self.plans.get(t.plan) if t is not None else None
            team_name, org_name = self.placement(tenant)
            org = self.organizations.get(org_name) if org_name is not None else None
            scopes = scopes_for(
                plan, key_id, key_limits, model, tenant=tenant,
                team=self.teams.get(team_name) if team_name is not None else None,
                organization=org, thresholds=tuple(self.alerts_for(org_name).thresholds))
            if len(self._scopes) > 10_000:
                self._scopes.clear()
            self._scopes[cache_key] = scopes
        return scopes

    def cache_mode(self, pool: str) -> CacheIsolation:
        """How the engines of ``pool`` keep tenants apart in their prompt caches: its own
        ``cache_isolation``, else what its engine takes (``upstream/engines.py``)."""
        state = self.router.pools[pool]
        return state.config.cache_isolation or cache_mode(state, self.policy.isolation.cache)

    def placement(self, tenant: str | None) -> tuple[str | None, str | None]:
        """The (team, organization) a tenant belongs to; (None, None) outside any."""
        return self._placements.get(tenant or "", (None, None))

    def alerts_for(self, organization: str | None) -> Alerts:
        """The budget alert settings of an organization's levels (its own, else the
        policy's), or of tenants outside any organization (``None``)."""
        org = self.organizations.get(organization) if organization is not None else None
        if org is not None and org.alerts is not None:
            return org.alerts
        return self.policy.alerts

    def __repr__(self) -> str:
        return f"<Runtime [pools: {len(self.router.pools)} | models: {len(self.models)}]>"
