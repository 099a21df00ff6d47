"""Serving the simulator: blocking :func:`run`, in-process :class:`SimServer`, :func:`spawn`.

uvicorn with uvloop and httptools and no access log: the simulator must never be the bottleneck
of a benchmark, and logs nothing per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import socket
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import uvicorn

from gateway.sim.app import SimApp
from gateway.sim.config import build_config

if TYPE_CHECKING:
    from types import TracebackType

    from gateway.sim.config import SimConfig
    from gateway.sim.engine import Engine
    from gateway.sim.profiles import Profile

__all__ = ["SimServer", "run", "spawn", "uvicorn_config"]

_LOOP = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"


def uvicorn_config(app: SimApp, *, host: str = "127.0.0.1", port: int = 8000) -> uvicorn.Config:
    """The uvicorn settings the simulator always runs with."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        loop=_LOOP,
        http="httptools",
        lifespan="on",
        access_log=False,
        log_level="warning",
        timeout_graceful_shutdown=5,
        backlog=4096,
    )


def run(
    host: str = "127.0.0.1",
    port: int = 8000,
    profile: str | Profile = "interactive",
    **overrides: Any,
) -> None:
    """Serve one simulated replica until interrupted (blocking).

    ``overrides`` are flat :func:`~gateway.sim.config.build_config` settings, e.g. ``speedup=10``,
    ``max_running=64``, ``error_status=500``.
    """
    app = SimApp(build_config(profile, **overrides))
    uvicorn.Server(uvicorn_config(app, host=host, port=port)).run()


class SimServer:
    """A simulator served from a background thread with its own event loop, for tests.

    ``with SimServer("interactive", speedup=10) as sim:`` then use ``sim.url`` and ``sim.stats()``.
    Port 0 picks a free port. :meth:`stop` cancels what is still in the engine, then shuts down.
    """

    def __init__(
        self,
        profile: str | Profile = "interactive",
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        **overrides: Any,
    ) -> None:
        self.config: SimConfig = build_config(profile, **overrides)
        self.app = SimApp(self.config)
        self.host = host
        self.port = port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        state = "running" if self._thread is not None else "stopped"
        return f"<SimServer {self.url} {state} {self.engine!r}>"

    @property
    def engine(self) -> Engine:
        return self.app.engine

    @property
    def url(self) -> str:
        """Base URL without ``/v1``, e.g. ``http://127.0.0.1:41234``."""
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 10.0) -> SimServer:
        """Bind, start serving in a thread and return once the server accepts connections."""
        if self._thread is not None:
            return self
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn_config(self.app, host=self.host, port=self.port)
        server = self._server = uvicorn.Server(config)
        factory = config.get_loop_factory()

        def serve() -> None:
            with asyncio.Runner(loop_factory=factory) as runner:
                self._loop = runner.get_loop()
                runner.run(server.serve(sockets=[sock]))
            sock.close()

        self._thread = threading.Thread(target=serve, name=f"sim-{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"simulator failed to start on {self.url}")
            time.sleep(0.005)
        return self

    def call(self, fn: Any, timeout: float = 10.0) -> Any:
        """Run ``fn()`` (sync or async) on the server's loop and return its result."""
        loop = self._loop
        if loop is None:
            raise RuntimeError("simulator is not running")

        async def invoke() -> Any:
            result = fn()
            return await result if asyncio.iscoroutine(result) else result

        return asyncio.run_coroutine_threadsafe(invoke(), loop).result(timeout)

    def stats(self) -> dict[str, Any]:
        """The ``/sim/stats`` snapshot, taken on the server's loop (safe from any thread)."""
        return dict(self.call(self.app.snapshot))

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel the engine's requests, shut uvicorn down and join the thread; idempotent."""
        if self._thread is None or self._server is None:
            return
        with contextlib.suppress(Exception):
            self.call(self.engine.close, timeout)
        self._server.should_exit = True
        self._thread.join(timeout)
        self._thread = None
        self._loop = None

    def __enter__(self) -> SimServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def spawn(port: int, profile: str = "interactive", *args: str) -> subprocess.Popen[bytes]:
    """Start ``python -m gateway.sim --port PORT --profile PROFILE *args`` as a child process.

    The caller owns the process (``terminate()`` then ``wait()``); poll ``/health`` for readiness.
    """
    cmd = [sys.executable, "-m", "gateway.sim", "--port", str(port), "--profile", profile, *args]
    return subprocess.Popen(cmd)
