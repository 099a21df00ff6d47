"""The console's edge: on or off by the policy in force, and the security headers on every
answer under ``/console`` (pages, errors, static files alike).

The gateway dispatches every canonical path under ``/console`` here (a prefix route of
:class:`gateway.app.factory.GatewayApp`). With ``console.enabled`` false the answer is the
gateway's ordinary 404 for an unknown route, so a disabled console is indistinguishable from
none; the console's own app is built on first use, so a gateway without it pays nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.context import new_request_id
from gateway.errors import RouteNotFound
from gateway.http.asgi import send_error

if TYPE_CHECKING:
    from collections.abc import Callable

    from gateway.runtime import Runtime
    from gateway.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["CONSOLE_PREFIX", "CSP", "SECURITY_HEADERS", "ConsoleEdge", "is_console_path"]

CONSOLE_PREFIX = "/console"
#: scripts, styles, images and fetches from the console's own origin only: no inline script
#: or style, no plug-ins, no framing, forms post back to the console only
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
       "frame-ancestors 'none'")
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-content-type-options", b"nosniff"),
    (b"cross-origin-opener-policy", b"same-origin"),
)


def is_console_path(path: str) -> bool:
    """``/console`` and everything under it (not ``/consoles``)."""
    return path == CONSOLE_PREFIX or path.startswith(CONSOLE_PREFIX + "/")


class ConsoleEdge:
    """The ASGI handler of ``/console``: gate on the policy, then the console app, with the
    security headers, ``cache-control: no-store`` (unless the answer sets its own, as static
    files do) and an ``x-request-id`` added to whatever it answers."""

    def __init__(self, current: Callable[[], Runtime], build: Callable[[], ASGIApp]) -> None:
        self.current = current
        self._build = build
        self._app: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"][len(scope.get("root_path", "")):]
        if not (self.current().policy.console.enabled and is_console_path(path)):
            await send_error(send, RouteNotFound(f"Unknown route: {scope['method']} {path}"),
                             [(b"x-request-id", new_request_id().encode())])
            return
        if self._app is None:
            self._app = self._build()

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {name.lower() for name, _ in headers}
                headers += [h for h in SECURITY_HEADERS if h[0] not in names]
                if b"cache-control" not in names:
                    headers.append((b"cache-control", b"no-store"))
                if b"x-request-id" not in names:
                    headers.append((b"x-request-id", new_request_id().encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self._app(scope, receive, send_secured)

    def __repr__(self) -> str:
        return f"<ConsoleEdge [{'built' if self._app is not None else 'not built'}]>"
