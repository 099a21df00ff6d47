"""One ``llama-server`` process on a free loopback port, for tests and benchmarks.

    with LlamaServer(tiny_model_path(), slots=4, ctx=8192, log_path=tmp / "engine.log") as engine:
        engine.url        # http://127.0.0.1:PORT, /health answered 200 (model loaded)
    async with LlamaServer(...) as engine: ...   # the same, started and stopped off the loop

``stop`` sends SIGTERM, then SIGKILL after ``stop_timeout``. stdout and stderr go to
``log_path`` (a temp file by default). ``LLAMA_ARG_*`` variables are not passed on, so the
flags here are the whole configuration. A missing binary raises
:class:`~loadtest.engines.build.EngineNotBuilt` with the command that builds it.

``ctx`` is llama-server's ``-c``, the KV cache for all slots together: each of the ``slots``
sequences gets ``ctx // slots`` tokens (``-np``; no ``--kv-unified``). A prompt longer than that
is answered 400 ``exceed_context_size_error``; a shorter one generates until the slot is full
(``finish_reason: length``). ``embeddings=True`` adds ``--embeddings --pooling mean`` (the
OpenAI-style ``/v1/embeddings`` needs a pooling; chat keeps working). ``alias`` is the ``model``
of chat answers and stream chunks (without it: the model file's path). ``--no-warmup`` and
``--no-webui`` always; ``-t``/``-tb`` ``threads`` (1 decodes the default tiny model fastest).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from loadtest.engines.build import require_server_binary

__all__ = ["LlamaServer", "free_port"]


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LlamaServer:
    """``llama-server -m MODEL -np SLOTS -c CTX -t THREADS [--embeddings] [--metrics] [--slots]``
    on ``host:port`` (a free port by default)."""

    def __init__(
        self,
        model: Path | str,
        *,
        slots: int = 1,
        ctx: int = 4096,
        threads: int = 1,
        embeddings: bool = False,
        pooling: str = "mean",
        metrics: bool = True,
        slots_endpoint: bool = True,
        alias: str | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        log_path: Path | str | None = None,
        extra_args: Sequence[str] = (),
        binary: Path | str | None = None,
        ready_timeout: float = 120.0,
        stop_timeout: float = 10.0,
    ) -> None:
        self.model = Path(model)
        self.slots, self.ctx, self.threads = slots, ctx, threads
        self.embeddings, self.metrics, self.slots_endpoint = embeddings, metrics, slots_endpoint
        self.pooling = pooling
        self.alias = alias
        self.host = host
        self._fixed_port = port
        self.port = port or 0
        self.extra_args = list(extra_args)
        self.binary = Path(binary) if binary else require_server_binary()
        self.ready_timeout, self.stop_timeout = ready_timeout, stop_timeout
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="llama-server-", suffix=".log")
            os.close(fd)
            log_path = name
        self.log_path = Path(log_path)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def args(self) -> list[str]:
        """The command line (with the current port)."""
        args = [
            str(self.binary),
            "-m", str(self.model),
            "--host", self.host,
            "--port", str(self.port),
            "-np", str(self.slots),
            "-c", str(self.ctx),
            "-t", str(self.threads),
            "-tb", str(self.threads),
            "--no-webui",
            "--no-warmup",
        ]
        if self.alias:
            args += ["--alias", self.alias]
        if self.embeddings:
            args += ["--embeddings", "--pooling", self.pooling]
        if self.metrics:
            args.append("--metrics")
        args.append("--slots" if self.slots_endpoint else "--no-slots")
        return args + self.extra_args

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> LlamaServer:
        """Start and wait for ``/health`` 200; on a port race (auto port), retry on another."""
        for attempt in range(3):
            self.port = self._fixed_port or free_port()
            self._spawn()
            try:
                self._wait_ready()
                return self
            except _PortTaken:
                self.stop()
                if self._fixed_port or attempt == 2:
                    raise RuntimeError(f"llama-server: port {self.port} is taken") from None
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def _spawn(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"$ {' '.join(self.args())}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.args(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=env, start_new_session=True,
            )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            code = self.proc.poll()
            if code is not None:
                tail = self.log_tail()
                if "bind" in tail and ("in use" in tail or "couldn't" in tail):
                    raise _PortTaken
                raise RuntimeError(f"llama-server exited ({code}) while starting; "
                                   f"log {self.log_path}:\n{tail}")
            with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
                status, _ = self.get("/health", timeout=1.0)
                if status == 200:
                    return
            time.sleep(0.05)
        raise TimeoutError(f"llama-server not ready in {self.ready_timeout:.0f} s; "
                           f"log {self.log_path}:\n{self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after ``stop_timeout``; idempotent."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(self.stop_timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    # --- small synchronous HTTP helper (stdlib only) ---------------------------------------

    def get(self, path: str, *, timeout: float = 10.0) -> tuple[int, Any]:
        """``GET path``: (status, parsed JSON or text). Error statuses are returned, not raised."""
        req = urllib.request.Request(self.url + path)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, _decode(resp.read(), resp.headers.get_content_type())
        except urllib.error.HTTPError as exc:
            return exc.code, _decode(exc.read(), exc.headers.get_content_type())

    # --- context managers ------------------------------------------------------------------

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> LlamaServer:
        import asyncio

        return await asyncio.to_thread(self.start)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        import asyncio

        await asyncio.to_thread(self.stop)

    def __repr__(self) -> str:
        return f"LlamaServer({self.model.name}, {self.url}, slots={self.slots}, ctx={self.ctx})"


class _PortTaken(Exception):
    pass


def _decode(body: bytes, content_type: str) -> Any:
    if content_type == "application/json":
        return json.loads(body)
    return body.decode(errors="replace")
