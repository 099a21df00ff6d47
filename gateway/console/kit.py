"""What every console handler shares: page rendering, refusals, the signed-in session, the CSRF
check of a POST and the client's address, bound to one console app (:class:`Kit`)."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import ipaddress
import logging
import time
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

import jinja2
from litestar import Request, Response
from litestar.response import Redirect

from gateway.console.sessions import Session

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from gateway.console.services import Services
    from gateway.console.sessions import Sessions
    from gateway.ledger.sql.store import SqlLedger
    from gateway.runtime import Runtime

    IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

__all__ = ["COOKIE", "AnyRequest", "Kit", "client_host", "static_files", "templates"]

COOKIE = "gw_console"
_STATIC_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
                 ".md": "text/plain; charset=utf-8"}
_log = logging.getLogger("gateway.console")

AnyRequest = Request[Any, Any, Any]


def static_files() -> dict[str, tuple[bytes, str]]:
    """The static files, read once: name -> (content, media type)."""
    files: dict[str, tuple[bytes, str]] = {}
    for entry in resources.files("gateway.console").joinpath("static").iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if entry.is_file() and suffix in _STATIC_TYPES:
            files[entry.name] = (entry.read_bytes(), _STATIC_TYPES[suffix])
    return files


#: the longest a page's rendering holds the event loop before it lets other work run
SLICE_SECONDS = 0.0005


async def render_sliced(template: jinja2.Template, context: dict[str, Any]) -> str:
    """``template`` rendered with ``context``, yielding the event loop every
    ``SLICE_SECONDS`` of rendering: the console shares the worker's loop with the proxy,
    and a page of hundreds of rows rendered at once would stall every stream in flight for
    milliseconds (``loadtest/bench/console_bench.py`` measures the proxy's p99 beside it)."""
    parts: list[str] = []
    deadline = time.perf_counter() + SLICE_SECONDS
    for n, part in enumerate(template.generate(**context)):
        parts.append(part)
        if not n % 16 and time.perf_counter() >= deadline:
            await asyncio.sleep(0)
            deadline = time.perf_counter() + SLICE_SECONDS
    return "".join(parts)


def templates(static: dict[str, tuple[bytes, str]]) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("gateway.console", "templates"),
        autoescape=True, undefined=jinja2.StrictUndefined,
    )
    versions = {name: hashlib.sha256(data).hexdigest()[:12] for name, (data, _) in static.items()}
    env.globals["static"] = lambda name: f"/console/static/{name}?v={versions[name]}"
    return env


@dataclass(frozen=True, slots=True)
class Kit:
    """One console app's shared parts and helpers."""

    current: Callable[[], Runtime]
    ledger: SqlLedger
    sessions: Sessions
    env: jinja2.Environment
    services: Services
    caught_up: Callable[[], Awaitable[None]] | None = None

    def page(self, name: str, status: int = 200, **context: Any) -> Response[str]:
        html = self.env.get_template(name).render(**context)
        return Response(html, status_code=status, media_type="text/html; charset=utf-8")

    async def big_page(self, name: str, **context: Any) -> Response[str]:
        """:meth:`page` for the pages of many rows (the tenant's month, the operator's), made
        in slices (:func:`render_sliced`) so the proxy's requests on this worker's event loop
        never wait long behind a page."""
        html = await render_sliced(self.env.get_template(name), context)
        return Response(html, media_type="text/html; charset=utf-8")

    def refuse(self, status: int, message: str, session: Session | None = None,
               headers: dict[str, str] | None = None) -> Response[str]:
        answer = self.page("error.html", status, message=message, session=session, code=status)
        for name, value in (headers or {}).items():
            answer.headers[name] = value
        return answer

    async def signed_in(self, request: AnyRequest) -> Session | None:
        """The request's live session; a tenant's ends with its key (revoked, expired)."""
        session_id = request.cookies.get(COOKIE)
        session = await self.sessions.get(session_id)
        if session is not None and session.key_id is not None \
                and not await self.current().resolver.key_usable(session.key_id):
            await self.sessions.delete(session_id)
            return None
        return session

    def client(self, request: AnyRequest) -> str:
        """The client's address (:func:`client_host`, the policy's trusted proxies)."""
        return client_host(request, self.current().policy.console.trusted_proxies)

    async def catch_up(self) -> None:
        if self.caught_up is not None:
            await self.caught_up()

    async def tenant_session(self, request: AnyRequest, tenant: str
                             ) -> Session | Response[Any]:
        """The session allowed ``tenant``'s pages (the tenant's own, or the operator's); else
        the refusal to send (a redirect to the sign-in page, or 403)."""
        session = await self.signed_in(request)
        if session is None:
            return Redirect("/console/login", status_code=303)
        return self.own_tenant(session, tenant)

    def own_tenant(self, session: Session, tenant: str) -> Session | Response[Any]:
        """``session`` if it may see ``tenant``'s pages, else the 403 to send."""
        if session.role != "operator" and session.tenant != tenant:
            _log.warning("console: tenant %s refused the page of tenant %s", session.tenant,
                         tenant[:128])
            return self.refuse(403, "This page belongs to another tenant.", session)
        return session

    async def posted(self, request: AnyRequest, role: str | None = None
                     ) -> tuple[Session, dict[str, str]] | Response[Any]:
        """A POST's session and form, its CSRF token checked (in constant time) and, with
        ``role``, the session's role; else the refusal to send (403; a redirect to the sign-in
        page without a session)."""
        session = await self.signed_in(request)
        if session is None:
            return Redirect("/console/login", status_code=303)
        form = await request.form()
        if not hmac.compare_digest(str(form.get("csrf", "")).encode(), session.csrf.encode()):
            _log.warning("console: a POST to %s without its session's CSRF token",
                         request.url.path)
            return self.refuse(403, "Refused: this form did not come from your console "
                                    "session.", session)
        if role is not None and session.role != role:
            return self.refuse(403, f"This action needs the {role}'s session.", session)
        return session, {name: str(value) for name, value in form.items()}


@functools.lru_cache(maxsize=8)
def _networks(entries: tuple[str, ...]) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(e, strict=False) for e in entries)


def _among(address: str, networks: tuple[IPNetwork, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in networks)


def client_host(request: AnyRequest, trusted: tuple[str, ...] = ()) -> str:
    """The client's address (no port: one browser opens many): the peer's, or, when the peer
    is one of the ``trusted`` proxies (``console.trusted_proxies``), the last hop of
    ``X-Forwarded-For`` that is not one of them (a client's own entries come before its
    proxies' and prove nothing)."""
    client = request.scope.get("client")
    peer = str(client[0]) if client else "-"
    if not trusted:
        return peer
    networks = _networks(trusted)
    if not _among(peer, networks):
        return peer
    hops = [h.strip() for value in request.headers.getall("x-forwarded-for", [])
            for h in value.split(",") if h.strip()]
    for hop in reversed(hops):
        if not _among(hop, networks):
            try:
                return str(ipaddress.ip_address(hop))
            except ValueError:  # not an address: the chain cannot be read past it
                return peer
    return peer
