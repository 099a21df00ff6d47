"""The web console at ``/console``: a tenant's usage and limits, the operator's tenants and
pools, served by the gateway itself as server-rendered pages (``console.enabled`` in the
policy; off by default).

``edge`` gates and secures every answer under ``/console``; ``routes`` is the console's own
small app (sign-in, pages, CSV, JSON, static files), with the handlers of ``keys`` (a
tenant's managed keys), ``rollouts`` (the operator's rollout actions) and ``audit`` (the
audit page) registered from it, sharing ``kit``; ``sessions`` keeps who signed in;
``signin_limit`` bounds failed sign-ins; ``views`` computes what the pages show from the
ledger's usage rows, ``limits`` the limits in use from the quota store, ``budgets`` the
teams' and organizations' budgets and the alerts sent; ``live`` reads the router's pools;
``services`` finds the key store, quota store and rollouts; ``audit_log``
writes the console's actions to the admin audit log and keeps its last entries.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

from gateway.console.edge import CONSOLE_PREFIX, ConsoleEdge, is_console_path

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from gateway.auth.keystore import KeyStore
    from gateway.batch import BatchJobs
    from gateway.ledger.sql.store import SqlLedger
    from gateway.quota.base import QuotaStore
    from gateway.rollouts import Rollouts
    from gateway.runtime import Runtime
    from gateway.types import ASGIApp

__all__ = ["CONSOLE_PREFIX", "ConsoleEdge", "console_edge", "is_console_path"]


def console_edge(current: Callable[[], Runtime], ledger: SqlLedger,
                 caught_up: Callable[[], Awaitable[None]] | None = None, *,
                 keystore: KeyStore | None = None, quota: QuotaStore | None = None,
                 rollouts: Rollouts | None = None,
                 batches: BatchJobs | None = None) -> ConsoleEdge:
    """The ``/console`` handler of a gateway; its app (and the jinja2 import) is made on the
    first request while the console is enabled. Sessions are files under
    ``<store.data_dir>/console-sessions``, shared by the workers of a host. ``keystore``,
    ``quota``, ``rollouts`` and ``batches``: the gateway's, for the console's pages and actions
    (None: not offered)."""

    from gateway.console.audit_log import audit_trail

    trail = audit_trail()  # from now on: the admin API's entries are kept for the audit page

    def build() -> ASGIApp:
        from gateway.console.routes import console_app
        from gateway.console.services import Services
        from gateway.console.sessions import FileSessions

        directory = Path(current().policy.store.data_dir) / "console-sessions"
        app = console_app(current, ledger, FileSessions(directory), caught_up,
                          Services(trail, keystore, quota, rollouts, batches))
        return cast("ASGIApp", app)  # Litestar's own, narrower ASGI types

    return ConsoleEdge(current, build)
