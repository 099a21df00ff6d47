"""The operator's audit page: ``GET /console/operator/audit[?page=N]``, the admin audit log's
entries of this worker (the admin API's requests and the console's actions), newest first,
:data:`PAGE_SIZE` a page (see :mod:`gateway.console.audit_log`)."""

from __future__ import annotations

from typing import Any

from litestar import Response, get
from litestar.response import Redirect

from gateway.console.kit import AnyRequest, Kit

__all__ = ["PAGE_SIZE", "audit_handlers"]

PAGE_SIZE = 50


def audit_handlers(kit: Kit) -> list[Any]:
    """The audit page."""

    @get("/console/operator/audit")
    async def audit_page(request: AnyRequest) -> Response[Any]:
        session = await kit.signed_in(request)
        if session is None:
            return Redirect("/console/login", status_code=303)
        if session.role != "operator":
            return kit.refuse(403, "The audit log needs the admin token.", session)
        text = request.query_params.get("page", "1")
        if not text.isdigit() or not 1 <= int(text) <= 10_000:
            return kit.refuse(400, "page: a whole number from 1.", session)
        number = int(text)
        rows, more = kit.services.audit.page((number - 1) * PAGE_SIZE, PAGE_SIZE)
        return kit.page("audit.html", session=session, rows=rows, number=number, more=more)

    return [audit_page]
