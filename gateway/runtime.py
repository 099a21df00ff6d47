"""The gateway's live state for one process, built from a policy by ``create_app``.

Holding it in one object passed to the handlers (instead of module globals) keeps the app
importable without side effects and lets tests build as many gateways as they like.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.auth import StaticKeys
from gateway.config import key_hashes
from gateway.routing.pool import PoolState
from gateway.upstream.base import make_upstream

if TYPE_CHECKING:
    from gateway.config import Model, Policy

__all__ = ["Runtime"]


class Runtime:
    """Policy, keys, pools and the upstream client of one gateway process."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.keys = StaticKeys(key_hashes(policy), required=policy.auth.required)
        self.pools = {p.name: PoolState(p) for p in policy.pools}
        self.models: dict[str, Model] = {m.name: m for m in policy.models}
        server = policy.server
        self.upstream = make_upstream(
            server.upstream_client, server.timeouts, server.keepalive_per_backend
        )
        self.draining = False

    async def start(self) -> None:
        await self.upstream.start()

    async def close(self) -> None:
        await self.upstream.close()

    def __repr__(self) -> str:
        return f"<Runtime [pools: {len(self.pools)} | models: {len(self.models)}]>"
