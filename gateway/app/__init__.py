"""The gateway as a service: wiring of every stage into one ASGI app (``factory``), the
process's long-lived state and background work (``state``), and the link between the workers
of one server (``workers``). Importing it starts nothing."""

from __future__ import annotations

from gateway.app.factory import CONFIG_ENV, app_from_env, create_app

__all__ = ["CONFIG_ENV", "app_from_env", "create_app"]
