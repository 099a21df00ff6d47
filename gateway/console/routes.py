"""The console's pages, forms and JSON, as a small Litestar app of its own under ``/console``.

- ``GET /console``: to the signed-in page, or to the sign-in form.
- ``GET|POST /console/login``: a tenant signs in with an API key, the operator with the admin
  token (``GATEWAY_ADMIN_TOKEN``), in a POST form (never in a URL). The form carries a
  sign-in CSRF token matched against a short-lived SameSite=Strict cookie, so another site
  cannot sign a browser into its own tenant. At most 10 failed sign-ins per client address a
  minute (:mod:`gateway.console.signin_limit`), then 429 with ``Retry-After``. Sign-ins
  (failed ones too) and sign-outs go to the admin audit log.
- ``POST /console/logout``: ends the session (its CSRF token required).
- ``GET /console/tenants/{tenant}[?month=YYYY-MM]``: the month's usage per day and model, the
  limits; ``.../export.csv``: the month's records. A tenant's session sees its own tenant
  only (403 for any other); the operator's sees every tenant.
- ``GET /console/operator`` and ``/console/operator/live.json``: the operator's pages (every
  tenant, team and organization with its month's spend, budgets and alerts sent; the pools
  live).
- The tenant's keys (:mod:`gateway.console.keys`), the operator's rollout actions
  (:mod:`gateway.console.rollouts`) and audit page (:mod:`gateway.console.audit`): handlers of
  their own modules, registered here, sharing :class:`gateway.console.kit.Kit`.
- ``GET /console/static/{name}``: the vendored chart library, the script and the style sheet,
  cached for a year (their URLs carry a content hash).

A session is server-side (:mod:`gateway.console.sessions`); its id is in an HttpOnly,
SameSite=Strict cookie on ``/console`` (Secure when the request came over https). Every POST
carries the session's CSRF token in a hidden field, compared in constant time; a tenant is
always the session's, never a form's or a query's.
"""

from __future__ import annotations

import hmac
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from litestar import Litestar, Response, get, post
from litestar.datastructures import Cookie
from litestar.exceptions import HTTPException
from litestar.response import Redirect, Stream

from gateway.api.admin import ADMIN_TOKEN_ENV, is_admin_credential
from gateway.console.audit import audit_handlers
from gateway.console.batches import batch_section
from gateway.console.budgets import budget_section
from gateway.console.keys import key_handlers, key_section
from gateway.console.kit import COOKIE, AnyRequest, Kit, static_files, templates
from gateway.console.limits import limits_in_use
from gateway.console.live import pool_stats
from gateway.console.rollouts import rollout_handlers, rollout_rows
from gateway.console.sessions import Session, Sessions, new_token
from gateway.console.signin_limit import SignInLimiter
from gateway.console.views import (
    Month,
    MonthError,
    group_spend,
    limit_lines,
    parse_month,
    read_rows,
    tenant_month,
    tenant_spend,
)
from gateway.ledger.errors import LedgerUnavailable
from gateway.ledger.export import stream_csv
from gateway.ledger.window import today_window

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from gateway.console.services import Services
    from gateway.ledger.sql.store import SqlLedger
    from gateway.runtime import Runtime

__all__ = ["COOKIE", "LOGIN_COOKIE", "console_app"]

LOGIN_COOKIE = "gw_console_login"
#: how long a sign-in form stays usable (seconds)
LOGIN_FORM_SECONDS = 600
#: the longest secret a sign-in form may carry
_MAX_SECRET = 512
_STATIC_CACHE = "public, max-age=31536000, immutable"
_log = logging.getLogger("gateway.console")


def _secure(request: AnyRequest, setting: str) -> bool:
    """Whether the cookie goes with ``Secure``: the policy's ``console.secure_cookie``
    (``auto``: the request came over https)."""
    if setting != "auto":
        return setting == "always"
    return request.url.scheme == "https"


def console_app(current: Callable[[], Runtime], ledger: SqlLedger, sessions: Sessions,
                caught_up: Callable[[], Awaitable[None]] | None = None,
                services: Services | None = None,
                sign_ins: SignInLimiter | None = None) -> Litestar:
    """The console app over the policy in force, the ledger of record and a session store.
    ``caught_up``: awaited before each usage read (the workers' buffered records flushed);
    ``services``: the key store, quota store, rollouts and audit log it acts on (default:
    none of the first three, this process's audit trail); ``sign_ins``: the bound on failed
    sign-ins."""
    if services is None:
        from gateway.console.audit_log import audit_trail
        from gateway.console.services import Services

        services = Services(audit_trail())
    static = static_files()
    kit = Kit(current, ledger, sessions, templates(static), services, caught_up)
    page, refuse, signed_in = kit.page, kit.refuse, kit.signed_in
    audit = services.audit
    limiter = sign_ins or SignInLimiter()

    def home_of(session: Session) -> str:
        if session.role == "operator":
            return "/console/operator"
        return f"/console/tenants/{session.tenant}"

    @get("/console")
    async def home(request: AnyRequest) -> Response[Any]:
        session = await signed_in(request)
        return Redirect(home_of(session) if session else "/console/login", status_code=303)

    @get("/console/login")
    async def login_form(request: AnyRequest) -> Response[str]:
        token = new_token()
        response = page("login.html", csrf=token, session=None, error=None,
                        operator=_operator_enabled())
        response.set_cookie(Cookie(key=LOGIN_COOKIE, value=token, path="/console/login",
                                   max_age=LOGIN_FORM_SECONDS, httponly=True,
                                   secure=_secure(request, current().policy.console.secure_cookie),
                                   samesite="strict"))
        return response

    @post("/console/login", status_code=303)
    async def login(request: AnyRequest) -> Response[Any]:
        client = kit.client(request)
        # the form (a few hundred bytes; server.max_body_bytes bounds any body) is read first, even
        # for a refusal: a response sent before its request's body has arrived ends the
        # connection, and a browser's next request on it would meet the close
        form = await request.form()
        wait = limiter.retry_after(client)
        if wait is not None:
            audit.record("/console/login", client, "-", "sign-in refused: too many failures",
                         429)
            return refuse(429, "Too many failed sign-ins from your address: try again in "
                               f"{wait} s.", headers={"retry-after": str(wait)})
        sent, expected = str(form.get("csrf", "")), request.cookies.get(LOGIN_COOKIE, "")
        if not expected or not hmac.compare_digest(sent.encode(), expected.encode()):
            return refuse(403, "This sign-in form has expired: open the sign-in page again.")
        role, secret = str(form.get("role", "")), str(form.get("secret", "")).strip()
        minutes = current().policy.console.session_minutes
        if role == "operator" and 0 < len(secret) <= _MAX_SECRET \
                and is_admin_credential(f"Bearer {secret}".encode()):
            session_id, session = await sessions.create("operator", minutes)
            _log.info("console: operator signed in")
            audit.record("/console/login", client, "operator", "signed in", 303)
        elif role == "tenant" and 0 < len(secret) <= _MAX_SECRET \
                and (identity := await current().resolver.identify(secret)) is not None:
            session_id, session = await sessions.create(
                "tenant", minutes, tenant=identity.tenant, key_id=identity.key_id,
                key_limits=identity.limits)
            _log.info("console: tenant %s signed in (key %s)", identity.tenant,
                      identity.key_id)
            audit.record("/console/login", client, f"tenant {identity.tenant}",
                         f"signed in with key {identity.key_id}", 303)
        else:
            limiter.failed(client)
            who = "operator" if role == "operator" else "tenant"
            audit.record("/console/login", client, "-", f"{who} sign-in failed", 401)
            what = "admin token" if role == "operator" else "API key"
            return page("login.html", 401, csrf=expected, session=None,
                        error=f"That {what} was not accepted.", operator=_operator_enabled())
        await sessions.delete(request.cookies.get(COOKIE))  # never two at once
        response = Redirect(home_of(session), status_code=303)
        response.set_cookie(Cookie(key=COOKIE, value=session_id, path="/console",
                                   max_age=max(1, int(minutes * 60)), httponly=True,
                                   secure=_secure(request, current().policy.console.secure_cookie),
                                   samesite="strict"))
        response.delete_cookie(LOGIN_COOKIE, path="/console/login")
        return response

    @post("/console/logout", status_code=303)
    async def logout(request: AnyRequest) -> Response[Any]:
        posted = await kit.posted(request)
        if isinstance(posted, Redirect):  # no session: nothing to sign out, refused as before
            return refuse(403, "Refused: this form did not come from your console session.")
        if not isinstance(posted, tuple):
            return posted
        session = posted[0]
        await sessions.delete(request.cookies.get(COOKIE))
        who = session.role if session.tenant is None else f"tenant {session.tenant}"
        _log.info("console: %s signed out", session.tenant or session.role)
        audit.record("/console/logout", kit.client(request), who, "signed out", 303)
        response = Redirect("/console/login", status_code=303)
        response.delete_cookie(COOKIE, path="/console")
        return response

    async def tenant_month_of(request: AnyRequest, tenant: str
                              ) -> tuple[Session, Month] | Response[Any]:
        """The session allowed ``tenant``'s pages and the month asked for (``?month=``), the
        ledger caught up with the answers already given; else the refusal to send."""
        session = await kit.tenant_session(request, tenant)
        if not isinstance(session, Session):
            return session
        try:
            month = parse_month(request.query_params.get("month"))
        except MonthError as exc:
            return refuse(400, str(exc), session)
        await kit.catch_up()
        return session, month

    @get("/console/tenants/{tenant:str}")
    async def tenant_page(request: AnyRequest, tenant: str) -> Response[Any]:
        allowed = await tenant_month_of(request, tenant)
        if not isinstance(allowed, tuple):
            return allowed
        session, month = allowed
        runtime = current()
        rows = await read_rows(ledger, tenant, month.lo, month.hi, ("day", "model"))
        this_month = parse_month(None)
        today = today_window()
        month_total = await read_rows(ledger, tenant, this_month.lo, this_month.hi, ())
        today_total = await read_rows(ledger, tenant, today.lo, today.hi, ())
        key_id = session.key_id if session.tenant == tenant else None
        return await kit.big_page(
            "tenant.html", session=session,
            view=tenant_month(tenant, month, rows, runtime.policy.prices.currency),
            limits=limit_lines(runtime, tenant, today_total[0] if today_total else None,
                               month_total[0] if month_total else None,
                               session.key_limits),
            in_use=await limits_in_use(runtime, services.quota, tenant, key_id,
                                       session.key_limits if key_id else None),
            keys=await key_section(kit, tenant),
            batches=await batch_section(services.batches, tenant),
        )

    @get("/console/tenants/{tenant:str}/export.csv")
    async def tenant_export(request: AnyRequest, tenant: str) -> Response[Any]:
        allowed = await tenant_month_of(request, tenant)
        if not isinstance(allowed, tuple):
            return allowed
        month = allowed[1]
        return Stream(stream_csv(ledger.export(month.lo, month.hi, tenant)),
                      media_type="text/csv; charset=utf-8", headers={
                          "content-disposition":
                          f'attachment; filename="usage-{month.label}.csv"'})

    @get("/console/operator")
    async def operator_page(request: AnyRequest) -> Response[Any]:
        session = await signed_in(request)
        if session is None:
            return Redirect("/console/login", status_code=303)
        if session.role != "operator":
            return refuse(403, "The operator's page needs the admin token.", session)
        try:
            month = parse_month(request.query_params.get("month"))
        except MonthError as exc:
            return refuse(400, str(exc), session)
        runtime = current()
        await kit.catch_up()
        rows = await read_rows(ledger, None, month.lo, month.hi, ("tenant",))
        tenants = tenant_spend(runtime.tenants, rows)
        teams, organizations = group_spend(runtime, rows)
        return await kit.big_page(
            "operator.html", session=session, month=month,
            currency=runtime.policy.prices.currency, tenants=tenants, teams=teams,
            organizations=organizations,
            budgets=await budget_section(runtime, services.quota, [t.tenant for t in tenants]),
            pools=pool_stats(runtime.router, time.monotonic()),
            rollouts=await rollout_rows(services.rollouts))

    @get("/console/operator/live.json")
    async def operator_live(request: AnyRequest) -> Response[Any]:
        session = await signed_in(request)
        if session is None or session.role != "operator":
            status = 401 if session is None else 403
            return Response({"error": "operator session required"}, status_code=status)
        return Response({"pools": pool_stats(current().router, time.monotonic()),
                         "at": int(time.time() * 1000)})

    @get("/console/static/{name:str}")
    async def static_file(name: str) -> Response[bytes]:
        found = static.get(name)
        if found is None:
            return Response(b"not found", status_code=404, media_type="text/plain")
        return Response(found[0], media_type=found[1], headers={"cache-control": _STATIC_CACHE})

    def on_http_error(request: AnyRequest, exc: HTTPException) -> Response[str]:
        return refuse(exc.status_code, str(exc.detail))

    def on_ledger_error(request: AnyRequest, exc: LedgerUnavailable) -> Response[str]:
        return refuse(503, "The usage database is not answering; try again shortly.")

    def on_unexpected(request: AnyRequest, exc: Exception) -> Response[str]:
        _log.error("console: unexpected error on %s %s", request.method, request.url.path,
                   exc_info=exc)
        return refuse(500, "Something went wrong in the console.")

    return Litestar(
        route_handlers=[home, login_form, login, logout, tenant_page, tenant_export,
                        operator_page, operator_live, static_file, *key_handlers(kit),
                        *rollout_handlers(kit), *audit_handlers(kit)],
        exception_handlers={HTTPException: on_http_error, LedgerUnavailable: on_ledger_error,
                            Exception: on_unexpected},
        request_max_body_size=16 * 1024,
        openapi_config=None, debug=False, logging_config=None,
    )


def _operator_enabled() -> bool:
    """Whether the operator can sign in at all (``GATEWAY_ADMIN_TOKEN`` set)."""
    return bool(os.environ.get(ADMIN_TOKEN_ENV))
