"""The admin API under ``/admin``: its own credential, disabled when none is configured.

The credential is read from ``GATEWAY_ADMIN_TOKEN``; with it unset every admin route answers 404
as if it did not exist, and a wrong credential gets 401. The check is one gate in front of the
whole ``/admin`` tree (:func:`admin_gate`, called by the app before the framework routes the
request), not a call in each handler: a handler's parameter validation, body parsing or 405
would otherwise answer first and tell an unauthenticated caller which admin routes exist and
what they take. Every admin action is logged with its outcome.
"""

from __future__ import annotations

import hmac
import logging
import os
from typing import TYPE_CHECKING, Any

import msgspec
from litestar import Request, Response, get, post

from gateway.api.audit import KEEP
from gateway.auth.manage import KeyAdminError, create_key, parse_expiry, public_view
from gateway.dialects.body import decode_object
from gateway.errors import AuthenticationFailed, InvalidRequest, RouteNotFound
from gateway.http.asgi import get_header

if TYPE_CHECKING:
    from gateway.api.audit import AdminAudit, Auth
    from gateway.app.state import Gateway
    from gateway.auth.keystore import KeyStore
    from gateway.errors import GatewayError
    from gateway.types import Scope

__all__ = ["ADMIN_PREFIX", "ADMIN_TOKEN_ENV", "admin_gate", "admin_handlers",
           "is_admin_credential", "is_admin_path"]

ADMIN_TOKEN_ENV = "GATEWAY_ADMIN_TOKEN"
ADMIN_PREFIX = "/admin"
#: how long a reload waits for the other workers of this server to confirm theirs
_log = logging.getLogger("gateway.admin")


def is_admin_path(path: str) -> bool:
    """``/admin`` and everything under it (not ``/administrator``), in any letter case.

    ``path`` is the canonical path (:mod:`gateway.http.canonical`). The router matches case
    exactly, so ``/ADMIN/keys`` reaches no handler; gating it anyway costs nothing and keeps
    the gate wider than the router, never narrower.
    """
    lowered = path.lower()
    return lowered == ADMIN_PREFIX or lowered.startswith(ADMIN_PREFIX + "/")


def admin_gate(scope: Scope, path: str) -> tuple[Auth, GatewayError | None]:
    """How an admin request authenticated, and the error it gets before anything else looks
    at it (None to let it in).

    No token configured: 404, the same answer as an unknown route, whatever the method,
    parameters or body. A token configured but not sent exactly: 401.
    """
    token = os.environ.get(ADMIN_TOKEN_ENV)
    if not token:
        return "disabled", RouteNotFound(f"Unknown route: {scope.get('method', '')} {path}")
    sent = get_header(scope, b"authorization")
    if sent is None:
        return "none", AuthenticationFailed("Invalid admin credential.")
    if not is_admin_credential(sent):
        return "bad", AuthenticationFailed("Invalid admin credential.")
    return "token", None


def is_admin_credential(sent: bytes | None) -> bool:
    """Whether an ``Authorization`` header value is exactly the configured admin token (False
    when none is configured)."""
    token = os.environ.get(ADMIN_TOKEN_ENV)
    if not token or sent is None:
        return False
    return hmac.compare_digest(sent, f"Bearer {token}".encode())


def admin_handlers(gateway: Gateway, audit_log: AdminAudit) -> list[Any]:
    """Route handlers of the admin API, bound to one gateway and its audit log."""

    @post("/admin/reload", status_code=200)
    async def reload() -> Response[dict[str, Any]]:
        result = await gateway.reload_logged("POST /admin/reload")
        if result["reloaded"]:
            return Response(result, status_code=200)
        # an invalid policy: 422; a valid one some worker did not take: 503
        return Response(result, status_code=503 if "workers" in result else 422)

    @post("/admin/stats", status_code=200)
    async def stats() -> dict[str, Any]:
        router = gateway.runtime.router
        return {
            "pools": {
                name: {
                    "in_flight": pool.in_flight,
                    "queued": pool.queued,
                    "backends": {
                        b.label: {"in_flight": b.in_flight, "ejected": bool(b.ejected_until),
                                  "ttft_ewma": b.ttft_ewma, "tpot_ewma": b.tpot_ewma}
                        for b in pool.backends
                    },
                }
                for name, pool in router.pools.items()
            },
            "retries_in_window": router.budget.retries,
            "shadow": {"started": gateway.mirror.stats.started,
                       "skipped": gateway.mirror.stats.skipped,
                       "by_status": gateway.mirror.stats.by_status,
                       "errors": gateway.mirror.stats.errors},
            "reloads": gateway.reloads,
        }

    @post("/admin/keys", status_code=201)
    async def create(request: Request[Any, Any, Any]) -> dict[str, Any]:
        store = _store(gateway)
        body = decode_object(await request.body())
        if not isinstance(body.get("tenant"), str):
            raise InvalidRequest("'tenant' is a required string", param="tenant")
        for field in ("expires", "default_class", "name"):
            if body.get(field) is not None and not isinstance(body[field], str):
                raise InvalidRequest(f"'{field}' must be a string", param=field)
        try:
            record, key = await create_key(
                store, gateway.runtime.policy, body["tenant"], name=str(body.get("name", "")),
                expires=parse_expiry(body.get("expires")),
                default_class=body.get("default_class"),
                allow_class_header=bool(body.get("allow_class_header", False)),
                limits=body.get("limits") if isinstance(body.get("limits"), dict) else None,
            )
        except KeyAdminError as exc:
            raise InvalidRequest(str(exc)) from None
        _log.info("admin: key %s created for tenant %s", record.id, record.tenant)
        return {**public_view(record), "key": key}

    @get("/admin/keys")
    async def list_keys(tenant: str | None = None) -> list[dict[str, Any]]:
        _log.info("admin: keys listed (tenant=%s)", tenant)
        return [public_view(r) for r in await _store(gateway).list(tenant)]

    @post("/admin/keys/{key_id:str}/revoke", status_code=200)
    async def revoke(key_id: str) -> dict[str, Any]:
        record = await _store(gateway).revoke(key_id)
        if record is None:
            raise RouteNotFound(f"no key with id {key_id!r}")
        _log.info("admin: key %s of tenant %s revoked", record.id, record.tenant)
        return public_view(record)

    @get("/admin/audit")
    async def audit(limit: int = 100) -> list[dict[str, Any]]:
        """This worker's latest admin requests, newest first (the log has every worker's)."""
        if not 1 <= limit <= KEEP:
            raise InvalidRequest(f"'limit' must be between 1 and {KEEP}", param="limit")
        return [msgspec.structs.asdict(e) for e in audit_log.recent(limit)]

    return [reload, stats, create, list_keys, revoke, audit]


def _store(gateway: Gateway) -> KeyStore:
    if gateway.keystore is None:
        raise InvalidRequest("no key store configured (set $GATEWAY_REDIS_URL or store.keys_file)")
    return gateway.keystore
