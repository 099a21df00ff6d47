"""The ASGI lifespan handshake, for the small apps the server-protocol tests serve."""

from __future__ import annotations

from typing import Any

__all__ = ["run_lifespan"]


async def run_lifespan(receive: Any, send: Any) -> None:
    """Answer startup and shutdown until the server shuts the app down."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
