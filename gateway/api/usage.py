"""``GET /v1/usage`` (the caller's own tenant) and ``GET /admin/usage`` (all tenants).

Totals of every token kind and cost by day, model, class (and batch), read from the ledger's
aggregates. A tenant only ever sees its own rows: the tenant comes from the API key, never from
the query.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import msgspec
from litestar import Request, get
from litestar.response import Stream

from gateway.auth.resolver import INVALID_KEY
from gateway.errors import AuthenticationFailed, InvalidRequest
from gateway.ledger import GROUP_DIMENSIONS, stream_csv, stream_jsonl

if TYPE_CHECKING:
    from collections.abc import Callable

    from gateway.ledger import Ledger, UsageRow
    from gateway.runtime import Runtime

__all__ = ["usage_handlers"]


def _today() -> str:
    return datetime.now(UTC).date().isoformat()


def _group(group_by: str | None) -> tuple[str, ...]:
    dims = tuple(d.strip() for d in (group_by or "day,model,class").split(",") if d.strip())
    bad = [d for d in dims if d not in GROUP_DIMENSIONS]
    if bad:
        raise InvalidRequest(f"group_by: unknown {bad}; use {', '.join(GROUP_DIMENSIONS)}",
                             param="group_by")
    return dims


def _rows(rows: list[UsageRow]) -> dict[str, Any]:
    return {"object": "list", "data": msgspec.to_builtins(rows)}


def usage_handlers(current: Callable[[], Runtime], ledger: Ledger) -> list[Any]:
    """Route handlers over the policy in force (for authentication) and the ledger. The
    ``/admin/usage`` ones are guarded by the app's admin gate
    (:func:`gateway.api.admin.admin_gate`) before they are routed, so an unauthenticated
    caller never reaches their parameter validation."""

    @get("/v1/usage")
    async def own_usage(request: Request[Any, Any, Any], start: str | None = None,
                        end: str | None = None, group_by: str | None = None) -> dict[str, Any]:
        header = request.headers.get("authorization")
        identity = await current().resolver.authenticate(header.encode() if header else None)
        if identity is None:  # usage belongs to a tenant: anonymous callers have none
            raise AuthenticationFailed(INVALID_KEY)
        try:
            rows = await ledger.usage(identity.tenant, start or _today(),
                                              end or start or _today(), _group(group_by))
        except ValueError as exc:
            raise InvalidRequest(str(exc), param="start") from None
        return {"tenant": identity.tenant, **_rows(rows)}

    @get("/admin/usage")
    async def all_usage(start: str | None = None, end: str | None = None,
                        group_by: str | None = None, tenant: str | None = None
                        ) -> dict[str, Any]:
        group = _group(group_by)
        try:
            if tenant:
                rows = await ledger.usage(tenant, start or _today(),
                                                  end or start or _today(), group)
            else:
                rows = await ledger.usage_all(start or _today(),
                                                      end or start or _today(), group)
        except ValueError as exc:
            raise InvalidRequest(str(exc), param="start") from None
        return _rows(rows)

    @get("/admin/usage/export")
    async def export(start_ms: int, end_ms: int, tenant: str | None = None,
                     format: str = "jsonl") -> Stream:
        records = ledger.export(start_ms, end_ms, tenant)
        if format == "csv":
            return Stream(stream_csv(records), media_type="text/csv")
        return Stream(stream_jsonl(records), media_type="application/x-ndjson")

    @get("/admin/usage/reconcile")
    async def reconcile(tenant: str, day: str) -> dict[str, Any]:
        try:
            diffs = await ledger.reconcile(tenant, day)
        except ValueError as exc:  # not a YYYY-MM-DD day (was a 500)
            raise InvalidRequest(str(exc), param="day") from None
        return {"tenant": tenant, "day": day, "consistent": not diffs,
                "differences": [str(d) for d in diffs]}

    return [own_usage, all_usage, export, reconcile]
