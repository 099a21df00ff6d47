"""``create_app(policy)``: the one factory that wires the gateway's stages into a Litestar app.

Importing this module starts nothing; the app opens its upstream client in the lifespan and
closes it after the server has drained. The proxied OpenAI routes are raw ASGI handlers (the hot
path); health and errors use the framework normally.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import signal
import sys
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, cast

from litestar import Litestar, Request, Response, asgi, get
from litestar.exceptions import HTTPException, MethodNotAllowedException, NotFoundException

from gateway.api.admin import admin_gate, admin_handlers, is_admin_path
from gateway.api.audit import AdminAudit
from gateway.api.batches import batch_handlers
from gateway.api.count_tokens import CountTokensHandler
from gateway.api.files import file_handlers
from gateway.api.health import Readiness
from gateway.api.models import ModelsHandler
from gateway.api.openapi import openapi_handlers
from gateway.api.proxy import ProxyHandler
from gateway.api.rollouts import rollout_handlers
from gateway.api.shadow import shadow_handlers
from gateway.api.stored_responses import PREFIX as STORED_PREFIX
from gateway.api.stored_responses import StoredResponsesHandler
from gateway.api.usage import usage_handlers
from gateway.app.state import METRICS_TOKEN_ENV, Gateway
from gateway.config import PolicyError, load_policy
from gateway.console import CONSOLE_PREFIX, console_edge
from gateway.context import new_request_id
from gateway.dialects.shape import ENDPOINTS
from gateway.errors import (
    AuthenticationFailed,
    GatewayError,
    InvalidRequest,
    MethodNotAllowed,
    RouteNotFound,
    error_body,
)
from gateway.http.asgi import send_error
from gateway.http.canonical import BadPath, canonical_path, encode_path
from gateway.upstream.model_info import ContextLookup

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from gateway.config import Policy
    from gateway.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["CONFIG_ENV", "app_from_env", "create_app"]

_log = logging.getLogger("gateway.app")

#: where ``gateway serve`` tells worker processes which policy to load
CONFIG_ENV = "GATEWAY_CONFIG"
#: how long a scrape waits for the other workers to flush what they have counted
SCRAPE_FLUSH_TIMEOUT = 2.0


def _error_response(error: GatewayError) -> Response[bytes]:
    return Response(
        content=error.body(),
        status_code=error.status,
        media_type="application/json",
        headers=error.headers or None,
    )


def _on_http_exception(request: Request[Any, Any, Any], exc: HTTPException) -> Response[bytes]:
    """Framework errors (unknown route, wrong method) in OpenAI shape."""
    if isinstance(exc, NotFoundException):
        return _error_response(RouteNotFound(f"Unknown route: {request.method} {request.url.path}"))
    if isinstance(exc, MethodNotAllowedException):
        allow = (exc.headers or {}).get("Allow", "")
        return _error_response(
            MethodNotAllowed(
                f"method {request.method} is not allowed on {request.url.path}",
                headers={"Allow": allow} if allow else None,
            )
        )
    return Response(
        content=error_body(str(exc.detail), "invalid_request_error", None, None),
        status_code=exc.status_code,
        media_type="application/json",
    )


def _on_gateway_error(request: Request[Any, Any, Any], exc: GatewayError) -> Response[bytes]:
    return _error_response(exc)


def _on_unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    """Anything unforeseen: a plain 500 in OpenAI shape, never a traceback to the client; the
    traceback goes to the log, where a bug can be found."""
    _log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return Response(
        content=error_body("internal gateway error", "server_error", None, None),
        status_code=500,
        media_type="application/json",
    )


async def _add_request_id(message: Message, scope: Scope) -> None:
    """Every response carries ``x-request-id`` (the proxy routes set their own first)."""
    if message["type"] != "http.response.start":
        return
    headers = message.setdefault("headers", [])
    for key, _ in headers:
        if key == b"x-request-id":
            return
    headers.append((b"x-request-id", new_request_id().encode()))


def _mark_draining_on_sigterm(gateway: Gateway) -> None:
    """Flip readiness off as soon as SIGTERM arrives, then let the server drain as usual."""
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum: int, frame: Any) -> None:
        gateway.draining = True
        if callable(previous):
            previous(signum, frame)

    # ValueError: not the main thread (an app run by tests in a thread)
    with contextlib.suppress(ValueError):
        signal.signal(signal.SIGTERM, handler)


class GatewayApp(Litestar):
    """Litestar, with the proxied routes dispatched before the framework's router.

    The hot routes are registered with Litestar too (so they are listed and answer 405 the same
    way), but an exact path match is served directly: the framework's routing and middleware
    stack cost more per request than the whole proxy hop should.
    """

    fast_routes: dict[str, ASGIApp]
    #: (path prefix, handler): served before the framework too, for a path under the prefix
    prefix_routes: tuple[tuple[str, ASGIApp], ...] = ()
    audit: AdminAudit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:  # type: ignore[override]
        if scope["type"] == "http":
            try:
                path = _canonicalise(scope)
            except BadPath as exc:
                await send_error(send, InvalidRequest(f"Invalid request path: {exc}.",
                                                      code="invalid_path"),
                                 [(b"x-request-id", new_request_id().encode())])
                return
            handler = self.fast_routes.get(path)
            if handler is not None:
                await handler(scope, receive, send)  # answers its own errors, 500 included
                return
            for prefix, handler in self.prefix_routes:
                if path.startswith(prefix):
                    await handler(scope, receive, send)
                    return
            if is_admin_path(path):  # one gate for the whole admin tree, before routing
                await self._admin(scope, receive, send, path)
                return
        await super().__call__(scope, receive, send)  # type: ignore[arg-type]

    async def _admin(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        """Gate an admin request, serve it if let in, and audit it either way."""
        auth, refused = admin_gate(scope, path)
        if refused is not None:
            await send_error(send, refused, [(b"x-request-id", new_request_id().encode())])
            self.audit.record(scope, path, auth, refused.status)
            return
        watched, status = self.audit.watch(scope, path, auth, send)
        try:
            await super().__call__(scope, receive, watched)  # type: ignore[arg-type]
        finally:
            self.audit.record(scope, path, auth, status[0] or 500)


def _canonicalise(scope: Scope) -> str:
    """The canonical path of the request, relative to ``root_path``, written back into the
    scope (``path`` and ``raw_path``) so the router and every handler read the same one.

    Raises :class:`BadPath` for a path that does not canonicalise cleanly.
    """
    root = scope.get("root_path", "")
    raw = scope.get("raw_path")
    if raw is None:  # a server that gives no raw path: its decoded one, minus the root path
        full: str = scope["path"]
        raw = encode_path(full[len(root):] if root and full.startswith(root) else full)
    path = canonical_path(raw)
    full = root + path
    if scope["path"] != full or raw.partition(b"?")[0] != path.encode():
        scope["path"] = full
        scope["raw_path"] = encode_path(path)
    return path


def _reload_on_sighup(gateway: Gateway) -> None:
    """SIGHUP re-reads the policy file; an invalid one keeps the old policy (and says why)."""
    if gateway.source is None:
        return
    loop = asyncio.get_running_loop()

    def reload() -> None:
        task = loop.create_task(gateway.reload_logged("SIGHUP"))
        gateway.tasks.add(task)  # keep a reference until done
        task.add_done_callback(gateway.tasks.discard)

    with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
        loop.add_signal_handler(signal.SIGHUP, reload)


def create_app(policy: Policy, source: str | None = None) -> Litestar:
    """Build the gateway app for one policy (``source``: its path, for reloads)."""
    gateway = Gateway(policy, source)
    current = gateway.current  # the policy snapshot in force, for the handlers that read it
    readiness = Readiness(current)

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        await gateway.start()
        _mark_draining_on_sigterm(gateway)
        _reload_on_sighup(gateway)
        try:
            yield
        finally:
            await gateway.close()

    audit = AdminAudit()
    handlers: list[Any] = []
    fast_routes: dict[str, ASGIApp] = {}
    proxies: dict[str, ProxyHandler] = {}
    for path, endpoint in ENDPOINTS.items():
        handler: ASGIApp = proxies.setdefault(path, ProxyHandler(gateway.pipeline, endpoint))
        fast_routes[path] = handler
        handlers.append(asgi(path, name=endpoint.operation, copy_scope=False)(handler))
    handlers += [*file_handlers(current, gateway.batches),
                 *batch_handlers(current, gateway.batches, gateway.batch_runner.poke)]
    count: ASGIApp = CountTokensHandler(current, gateway.counter)
    fast_routes["/v1/messages/count_tokens"] = count
    handlers.append(asgi("/v1/messages/count_tokens", name="count_tokens",
                         copy_scope=False)(count))
    # the context window an engine reports, for models whose policy sets none
    lookup = ContextLookup(lambda url, timeout: gateway.upstream.get(url, timeout))
    models: ASGIApp = ModelsHandler(current, lookup)
    # a mount, because model ids may hold slashes ("meta-llama/Llama-3.1-8B")
    handlers.append(asgi("/v1/models", name="models", is_mount=True, copy_scope=True)(models))

    @get("/healthz", sync_to_thread=False)
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @get("/readyz")
    async def readyz() -> Response[dict[str, Any]]:
        pools = await readiness.pools()
        # a replica that cannot make usage records durable (a full disk under the spool and
        # the database away) would answer nothing within its bound: drain it
        durable = gateway.ledger.durability.ok
        ready = not gateway.draining and durable and all(pools.values())
        body = {
            "status": "ready" if ready else "not ready",
            "draining": gateway.draining,
            "ledger": "ok" if durable else "failing",
            "pools": pools,
        }
        return Response(body, status_code=200 if ready else 503)

    metrics_token = os.environ.get(METRICS_TOKEN_ENV)

    @get("/metrics")
    async def metrics(request: Request[Any, Any, Any]) -> Response[bytes]:
        if metrics_token and not hmac.compare_digest(
                request.headers.get("authorization", "").encode(),
                f"Bearer {metrics_token}".encode()):
            raise AuthenticationFailed(
                f"/metrics needs 'Authorization: Bearer <token>' (${METRICS_TOKEN_ENV})")
        gateway.finished.flush()  # requests finished in the last few ms count too
        for pool in gateway.runtime.router.pools.values():  # ejections up to this moment
            gateway.report_ejections(pool)
        if gateway.siblings is not None:  # and those the other workers answered
            await gateway.siblings.broadcast("flush", SCRAPE_FLUSH_TIMEOUT)
        body, content_type = gateway.metrics.render()
        return Response(body, media_type=content_type)

    handlers += [healthz, readyz, metrics, *admin_handlers(gateway, audit),
                 *usage_handlers(current, gateway.ledger, gateway.ledger_caught_up),
                 *openapi_handlers(current),
                 *shadow_handlers(current, gateway.mirror.comparisons),
                 *rollout_handlers(gateway.rollouts)]
    app = GatewayApp(
        route_handlers=handlers,
        lifespan=[lifespan],
        exception_handlers={
            GatewayError: _on_gateway_error,
            HTTPException: _on_http_exception,
            Exception: _on_unexpected,
        },
        before_send=[cast("Any", _add_request_id)],
        openapi_config=None,
        debug=False,
        logging_config=None,
    )
    app.state.gateway = gateway
    app.fast_routes = fast_routes
    app.audit = audit
    # stored responses (Responses API): retrieve, delete, input items; dispatched by prefix,
    # since /v1/responses itself is a proxied route (no framework mount can sit on it)
    app.prefix_routes = ((STORED_PREFIX, StoredResponsesHandler(current, gateway.responses)),)
    # the web console (off unless ``console.enabled``; a 404 like any unknown route then)
    app.prefix_routes += ((CONSOLE_PREFIX, console_edge(
        current, gateway.ledger, gateway.ledger_caught_up, keystore=gateway.keystore,
        quota=gateway.quota, rollouts=gateway.rollouts, batches=gateway.batches)),)
    return app


def app_from_env() -> Litestar:
    """Factory for worker processes: the policy path comes from ``GATEWAY_CONFIG``."""
    if not logging.getLogger().handlers:  # structured logging replaces this when configured
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
    source = os.environ[CONFIG_ENV]
    try:
        policy = load_policy(source)
    except PolicyError as exc:
        # a worker (re)started on a policy that is now invalid (uvicorn restarts its workers
        # on SIGHUP): the one-line reason, as ``gateway check`` prints it, not a traceback
        print(f"gateway: invalid policy: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    app = create_app(policy, source)
    tune_gc()
    return app


def tune_gc() -> None:
    """Fewer, cheaper garbage collections on the hot path.

    Each request allocates a few hundred short-lived objects, so the default gen-0 threshold
    (700) runs a collection every couple of requests; and every full collection walks the
    long-lived start-up objects again. Freezing what exists after start-up and raising the
    thresholds cut the collector's share of a busy worker's CPU (profiled with py-spy).
    """
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)
