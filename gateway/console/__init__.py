"""The web console at ``/console``: a tenant's usage and limits, the operator's tenants and
pools, served by the gateway itself as server-rendered pages (``console.enabled`` in the
policy; off by default).

``edge`` gates and secures every answer under ``/console``; ``routes`` is the console's own
small app (sign-in, pages, CSV, JSON, static files); ``sessions`` keeps who signed in;
``views`` computes what the pages show from the ledger's usage rows; ``live`` reads the
router's pools.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

from gateway.console.edge import CONSOLE_PREFIX, ConsoleEdge, is_console_path

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from gateway.ledger.sql.store import SqlLedger
    from gateway.runtime import Runtime
    from gateway.types import ASGIApp

__all__ = ["CONSOLE_PREFIX", "ConsoleEdge", "console_edge", "is_console_path"]


def console_edge(current: Callable[[], Runtime], ledger: SqlLedger,
                 caught_up: Callable[[], Awaitable[None]] | None = None) -> ConsoleEdge:
    """The ``/console`` handler of a gateway; its app (and the jinja2 import) is made on the
    first request while the console is enabled. Sessions are files under
    ``<store.data_dir>/console-sessions``, shared by the workers of a host."""

    def build() -> ASGIApp:
        from gateway.console.routes import console_app
        from gateway.console.sessions import FileSessions

        directory = Path(current().policy.store.data_dir) / "console-sessions"
        app = console_app(current, ledger, FileSessions(directory), caught_up)
        return cast("ASGIApp", app)  # Litestar's own, narrower ASGI types

    return ConsoleEdge(current, build)
