"""``gateway serve``: validate the policy, bind the port, run the workers under uvicorn.

The port is bound before any worker starts the app, so a port in use is a one-line error
and an exit, never a half-started process; so is a ledger database whose schema this gateway
does not know (``gateway db migrate`` first).
"""

from __future__ import annotations

import os
import signal
import socket
import tempfile
from pathlib import Path

import uvicorn
from uvicorn.supervisors import Multiprocess

from gateway.app.factory import CONFIG_ENV
from gateway.cli.db import check_ledger_schema
from gateway.config import load_policy
from gateway.http.uvicorn import uvicorn_options

__all__ = ["bind", "serve"]


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound as uvicorn binds it; SystemExit with one line if it can't."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        reason = exc.strerror or str(exc)
        raise SystemExit(f"gateway: cannot listen on {host}:{port}: {reason.lower()}") from None
    sock.set_inheritable(True)
    return sock


def serve(config: str, host: str, port: int, workers: int) -> None:
    """Validate the policy and bind the port (fail fast with a clear message), then serve."""
    policy = load_policy(config)
    problem = check_ledger_schema(policy)
    if problem is not None:
        raise SystemExit(f"gateway: {problem}")
    os.environ[CONFIG_ENV] = str(Path(config).resolve())
    sock = bind(host, port)
    # uvicorn re-raises SIGTERM/SIGINT with the handlers it found once it has drained; finding
    # a no-op here makes a drained shutdown exit 0 instead of dying by the signal.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: None)
    if workers > 1 and "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        # metrics from every worker, summed at /metrics (prometheus_client multiprocess mode)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="gateway-metrics-")
    server = policy.server
    options = uvicorn_options(server.drain_timeout, server.http_protocol, server.limits)
    uv_config = uvicorn.Config(
        "gateway.app:app_from_env", factory=True, host=host, port=port, workers=workers,
        **options,  # type: ignore[arg-type]
    )
    if workers > 1:
        Multiprocess(uv_config, sockets=[sock]).run()
        return
    uv_config.load_app()
    uv_server = uvicorn.Server(uv_config)
    uv_server.run(sockets=[sock])
    if not uv_server.started:
        raise SystemExit(3)  # uvicorn's "startup failure" (the app's lifespan failed)
