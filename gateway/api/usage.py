"""``GET /v1/usage`` (the caller's own tenant), ``GET /admin/usage`` (every tenant, or one),
and the admin export and reconcile routes, over the ledger of record.

Usage rows come from the hourly rollups (:meth:`~gateway.ledger.sql.store.SqlLedger.usage_rows`):
``from``/``to`` (``[from, to)``, ISO dates or times on the hour, UTC unless a zone is given,
default today) or the old ``start``/``end`` (inclusive UTC days); ``group_by``, a comma list of
hour, day, month, tenant, key, model, class, version, batch, team, organization; ``limit``
(1..10000, default 1000) and ``after`` (the ``next`` of the page before). Each row carries its
group's values, every counter, and the cost as micro-units and as a decimal string in the
price currency.

A tenant only ever sees its own rows: ``/v1/usage`` takes the tenant from the API key and
nowhere else (a ``tenant`` parameter is not read; a cursor carries group values, never the
tenant condition). The ``/admin`` routes are guarded by the app's admin gate
(:func:`gateway.api.admin.admin_gate`) before they are routed. Every bad parameter is a 400
naming it; a database that is away is a 503, never a 500.
"""

from __future__ import annotations

from datetime import date
from typing import TYPE_CHECKING, Any

import msgspec
from litestar import Request, get
from litestar.response import Stream

from gateway.accounting.prices import format_micros
from gateway.auth.resolver import INVALID_KEY
from gateway.errors import AuthenticationFailed, GatewayError, InvalidRequest
from gateway.ledger.errors import LedgerUnavailable
from gateway.ledger.export import stream_csv, stream_jsonl
from gateway.ledger.sql.schema import ROLLUP_COUNTERS
from gateway.ledger.sql.usage_query import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    TEXT_DIMENSIONS,
    UsageQueryError,
    check_text,
    parse_group_by,
)
from gateway.ledger.window import WindowError, iso_hour, read_window

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from gateway.ledger.aggregate import UsageRow
    from gateway.ledger.sql.store import SqlLedger
    from gateway.runtime import Runtime

__all__ = ["ADMIN_GROUP_BY", "DEFAULT_GROUP_BY", "LedgerReadUnavailable", "usage_handlers"]

DEFAULT_GROUP_BY = ("day", "model", "class")
#: the admin's default across tenants: the same rows, one set per tenant
ADMIN_GROUP_BY = ("tenant", "day", "model", "class")
#: the bounds of an export's ``start_ms``/``end_ms``
_MAX_MS = 2**53


class LedgerReadUnavailable(GatewayError):
    """The ledger database did not answer a read."""

    status = 503
    type = "api_error"
    code = "ledger_unavailable"


def _field(dimension: str) -> str:
    """The row field a dimension fills (``key`` -> ``key_id``, ``class`` -> ...)."""
    return TEXT_DIMENSIONS.get(dimension, dimension)


def _row(row: UsageRow, group_by: Sequence[str], currency: str) -> dict[str, Any]:
    out: dict[str, Any] = {_field(d): getattr(row, _field(d)) for d in group_by}
    for counter in ROLLUP_COUNTERS:
        out[counter] = getattr(row, counter)
    out["cost"] = format_micros(row.cost_micros)
    out["currency"] = currency
    return out


def _limit(text: str | None) -> int:
    if text is None or text == "":
        return DEFAULT_LIMIT
    try:
        value = int(text.strip())
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_LIMIT:
        raise InvalidRequest(f"limit: an integer between 1 and {MAX_LIMIT}", param="limit")
    return value


def _unavailable() -> LedgerReadUnavailable:
    return LedgerReadUnavailable("the usage ledger database is unavailable; try again shortly",
                                 headers={"Retry-After": "1"})


def usage_handlers(current: Callable[[], Runtime], ledger: SqlLedger,
                   caught_up: Callable[[], Awaitable[None]] | None = None) -> list[Any]:
    """Route handlers over the policy in force (authentication, the price currency) and the
    ledger of record. ``caught_up``: awaited before each read, so the records of answers
    already given are in it (the workers' buffers flushed: read your own writes)."""

    async def catch_up() -> None:
        if caught_up is not None:
            await caught_up()

    async def rows(request: Request[Any, Any, Any], tenant: str | None,
                   default_group: Sequence[str]) -> dict[str, Any]:
        query = request.query_params
        try:
            window = read_window(from_=query.get("from"), to=query.get("to"),
                                 start=query.get("start"), end=query.get("end"))
            group = parse_group_by(query.get("group_by"), default_group)
            limit = _limit(query.get("limit"))
            await catch_up()
            page = await ledger.usage_rows(tenant, window.lo, window.hi, group, limit=limit,
                                           after=query.get("after"))
        except (WindowError, UsageQueryError) as exc:
            raise InvalidRequest(str(exc), param=exc.param) from None
        except LedgerUnavailable:
            raise _unavailable() from None
        currency = current().policy.prices.currency
        body: dict[str, Any] = {"object": "list"}
        if tenant is not None:
            body["tenant"] = tenant
        body.update({
            "from": iso_hour(window.lo), "to": iso_hour(window.hi), "group_by": list(group),
            "data": [_row(r, group, currency) for r in page.rows],
            "has_more": page.has_more, "next": page.next,
        })
        return body

    @get("/v1/usage")
    async def own_usage(request: Request[Any, Any, Any]) -> dict[str, Any]:
        header = request.headers.get("authorization")
        identity = await current().resolver.authenticate(header.encode() if header else None)
        if identity is None:  # usage belongs to a tenant: anonymous callers have none
            raise AuthenticationFailed(INVALID_KEY)
        current().calls.take(identity.key_id)  # a query scans rollups: the per-key call limit
        return await rows(request, identity.tenant, DEFAULT_GROUP_BY)

    @get("/admin/usage")
    async def all_usage(request: Request[Any, Any, Any]) -> dict[str, Any]:
        tenant = request.query_params.get("tenant") or None
        if tenant is not None:
            try:
                check_text(tenant, "tenant")
            except UsageQueryError as exc:
                raise InvalidRequest(str(exc), param="tenant") from None
        return await rows(request, tenant, DEFAULT_GROUP_BY if tenant else ADMIN_GROUP_BY)

    @get("/admin/usage/export")
    async def export(start_ms: int, end_ms: int, tenant: str | None = None,
                     format: str = "jsonl") -> Stream:
        for name, value in (("start_ms", start_ms), ("end_ms", end_ms)):
            if not 0 <= value <= _MAX_MS:
                raise InvalidRequest(f"{name}: unix milliseconds, 0..{_MAX_MS}", param=name)
        if format not in ("jsonl", "csv"):
            raise InvalidRequest("format: jsonl or csv", param="format")
        if tenant is not None:
            try:
                check_text(tenant, "tenant")
            except UsageQueryError as exc:
                raise InvalidRequest(str(exc), param="tenant") from None
        await catch_up()
        records = ledger.export(start_ms, end_ms, tenant or None)
        if format == "csv":
            return Stream(stream_csv(records), media_type="text/csv")
        return Stream(stream_jsonl(records), media_type="application/x-ndjson")

    @get("/admin/usage/reconcile")
    async def reconcile(tenant: str, day: str) -> dict[str, Any]:
        try:
            when = date.fromisoformat(day)
            check_text(tenant, "tenant")
        except UsageQueryError as exc:
            raise InvalidRequest(str(exc), param="tenant") from None
        except ValueError:  # not a YYYY-MM-DD day
            raise InvalidRequest(f"day: {day[:64]!r} is not a day (YYYY-MM-DD)",
                                 param="day") from None
        try:
            await catch_up()
            drifts = await ledger.drift(tenant, when)
        except LedgerUnavailable:
            raise _unavailable() from None
        return {"tenant": tenant, "day": when.isoformat(), "consistent": not drifts,
                "differences": msgspec.to_builtins(drifts)}

    return [own_usage, all_usage, export, reconcile]
