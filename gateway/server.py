"""Serve the app with uvicorn (uvloop + httptools), one or several worker processes.

SIGTERM stops accepting connections, lets in-flight requests and streams finish for up to
``server.drain_timeout`` seconds, then cancels what is left (uvicorn's graceful shutdown).
"""

from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path

import uvicorn

from gateway.app import CONFIG_ENV
from gateway.config import load_policy
from gateway.h1server import GatewayH1Protocol

__all__ = ["serve", "uvicorn_options"]


def uvicorn_options(drain_timeout: float, http_protocol: str = "native") -> dict[str, object]:
    """Server settings shared by ``serve`` and the demo; ``http_protocol`` is the policy's
    ``server.http_protocol`` (``native``: :class:`~gateway.h1server.GatewayH1Protocol`)."""
    return {
        "loop": "uvloop",
        "http": GatewayH1Protocol if http_protocol == "native" else "httptools",
        "lifespan": "on",
        "proxy_headers": False,  # the gateway reads no X-Forwarded-* header
        "access_log": False,
        "server_header": False,
        "date_header": True,
        "timeout_graceful_shutdown": drain_timeout,
        "timeout_keep_alive": 75,
        "backlog": 4096,
        "log_level": "warning",
    }


def serve(config: str, host: str, port: int, workers: int) -> None:
    """Validate the policy (fail fast with a clear message), then run the server."""
    policy = load_policy(config)
    os.environ[CONFIG_ENV] = str(Path(config).resolve())
    # uvicorn re-raises SIGTERM/SIGINT with the handlers it found once it has drained; finding
    # a no-op here makes a drained shutdown exit 0 instead of dying by the signal.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: None)
    if workers > 1 and "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        # metrics from every worker, summed at /metrics (prometheus_client multiprocess mode)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="gateway-metrics-")
    uvicorn.run(
        "gateway.app:app_from_env",
        factory=True,
        host=host,
        port=port,
        workers=workers if workers > 1 else None,
        **uvicorn_options(policy.server.drain_timeout, policy.server.http_protocol),  # type: ignore[arg-type]
    )
