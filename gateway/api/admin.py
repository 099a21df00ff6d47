"""The admin API under ``/admin``: its own credential, disabled when none is configured.

The credential is read from ``GATEWAY_ADMIN_TOKEN``; with it unset every admin route answers 404
as if it did not exist. Every admin action is logged with its outcome.
"""

from __future__ import annotations

import hmac
import logging
import os
from typing import TYPE_CHECKING, Any

from litestar import Request, Response, get, post

from gateway.auth.manage import KeyAdminError, create_key, parse_expiry, public_view
from gateway.config import PolicyError
from gateway.errors import AuthenticationFailed, InvalidRequest, RouteNotFound

if TYPE_CHECKING:
    from gateway.auth.keystore import KeyStore
    from gateway.runtime import Gateway

__all__ = ["ADMIN_TOKEN_ENV", "admin_handlers", "check_admin", "reload_logged"]

ADMIN_TOKEN_ENV = "GATEWAY_ADMIN_TOKEN"
_log = logging.getLogger("gateway.admin")


async def reload_logged(gateway: Gateway, trigger: str) -> dict[str, Any]:
    """Reload the policy; log and return what happened (an invalid file keeps the old one)."""
    try:
        runtime = await gateway.reload()
    except PolicyError as exc:
        _log.error("policy reload (%s) rejected, keeping the old policy: %s", trigger, exc)
        return {"reloaded": False, "error": str(exc)}
    except Exception as exc:
        _log.exception("policy reload (%s) failed, keeping the old policy", trigger)
        return {"reloaded": False, "error": f"{type(exc).__name__}: {exc}"}
    _log.info("policy reloaded by %s", trigger)
    return {
        "reloaded": True,
        "pools": sorted(runtime.router.pools),
        "models": sorted(runtime.models),
        "reloads": gateway.reloads,
    }


def check_admin(request: Request[Any, Any, Any]) -> None:
    token = os.environ.get(ADMIN_TOKEN_ENV)
    if not token:
        raise RouteNotFound(f"Unknown route: {request.method} {request.url.path}")
    sent = request.headers.get("authorization", "")
    expected = f"Bearer {token}"
    if not hmac.compare_digest(sent.encode(), expected.encode()):
        _log.warning("admin call to %s refused: bad credential", request.url.path)
        raise AuthenticationFailed("Invalid admin credential.")


def admin_handlers(gateway: Gateway) -> list[Any]:
    """Route handlers of the admin API, bound to one gateway."""

    @post("/admin/reload", status_code=200)
    async def reload(request: Request[Any, Any, Any]) -> Response[dict[str, Any]]:
        check_admin(request)
        result = await reload_logged(gateway, "POST /admin/reload")
        return Response(result, status_code=200 if result["reloaded"] else 422)

    @post("/admin/stats", status_code=200)
    async def stats(request: Request[Any, Any, Any]) -> dict[str, Any]:
        check_admin(request)
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
            "shadow": {"started": gateway.shadow_stats.started,
                       "skipped": gateway.shadow_stats.skipped,
                       "by_status": gateway.shadow_stats.by_status,
                       "errors": gateway.shadow_stats.errors},
            "reloads": gateway.reloads,
        }

    @post("/admin/keys", status_code=201)
    async def create(request: Request[Any, Any, Any]) -> dict[str, Any]:
        check_admin(request)
        store = _store(gateway)
        body = await request.json()
        if not isinstance(body, dict) or not isinstance(body.get("tenant"), str):
            raise InvalidRequest("'tenant' is a required string", param="tenant")
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
    async def list_keys(request: Request[Any, Any, Any], tenant: str | None = None
                        ) -> list[dict[str, Any]]:
        check_admin(request)
        _log.info("admin: keys listed (tenant=%s)", tenant)
        return [public_view(r) for r in await _store(gateway).list(tenant)]

    @post("/admin/keys/{key_id:str}/revoke", status_code=200)
    async def revoke(request: Request[Any, Any, Any], key_id: str) -> dict[str, Any]:
        check_admin(request)
        record = await _store(gateway).revoke(key_id)
        if record is None:
            raise RouteNotFound(f"no key with id {key_id!r}")
        _log.info("admin: key %s of tenant %s revoked", record.id, record.tenant)
        return public_view(record)

    return [reload, stats, create, list_keys, revoke]


def _store(gateway: Gateway) -> KeyStore:
    if gateway.keystore is None:
        raise InvalidRequest("no key store configured (set $GATEWAY_REDIS_URL or store.keys_file)")
    return gateway.keystore
