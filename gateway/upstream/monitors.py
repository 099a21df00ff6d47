"""Active health checks and engine-signal scraping: one background task per pool that wants them.

Checks feed the same state machine as passive outcomes (``BackendState.on_success`` /
``on_failure``), so an ejected backend that passes its probe comes back, and a silent one is
ejected without waiting for client traffic to find out. Engine signals (the metric names of
the backend's engine: vLLM, SGLang, llama.cpp, TGI; :mod:`gateway.upstream.engines`) set the
backend's waiting and running requests and KV-cache use, which backend choice reads; a
backend whose metrics hold none of its engine's names is warned of once and flagged
(``signals_missing``, the ``gateway_engine_signals_missing`` gauge).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from gateway.http.errors import UpstreamError
from gateway.upstream.engines import ENGINES, engine_of, read_signals

if TYPE_CHECKING:
    from gateway.http.base import UpstreamClient
    from gateway.routing.backend import BackendState
    from gateway.routing.pool import PoolState

__all__ = ["Monitors", "parse_engine_metrics"]

_log = logging.getLogger("gateway.health")



def parse_engine_metrics(text: bytes) -> tuple[float | None, float | None]:
    """(waiting requests, KV-cache use 0-1) from Prometheus text, under any engine's names."""
    signals = read_signals(text)
    return (None, None) if signals is None else (signals.waiting, signals.kv)


def _base(backend: BackendState) -> str:
    url = backend.config.url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


class Monitors:
    """The background tasks of one router's pools; started and stopped with it."""

    def __init__(self, pools: list[PoolState], upstream: UpstreamClient) -> None:
        self.pools = pools
        self.upstream = upstream
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        for pool in self.pools:
            if pool.config.health.path is not None:
                self.tasks.append(asyncio.create_task(self._check_loop(pool)))
            if pool.config.signals is not None:
                self.tasks.append(asyncio.create_task(self._signal_loop(pool)))

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.tasks.clear()

    async def check(self, pool: PoolState, backend: BackendState) -> bool:
        health = pool.config.health
        assert health.path is not None
        try:
            status, _ = await self.upstream.get(_base(backend) + health.path, health.timeout)
            ok = 200 <= status < 300
        except (UpstreamError, OSError, TimeoutError):
            ok = False
        was_ejected = bool(backend.ejected_until)
        if ok:
            backend.on_success()
            if was_ejected:
                _log.info("backend %s of pool %s recovered", backend.label, pool.name)
        elif backend.on_failure(health, time.monotonic()):
            _log.warning("backend %s of pool %s ejected by health check", backend.label,
                         pool.name)
        return ok

    async def _check_loop(self, pool: PoolState) -> None:
        interval = pool.config.health.interval
        while True:
            results = await asyncio.gather(*(self.check(pool, b) for b in pool.backends),
                                           return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException):  # never let the loop die
                    _log.error("health check of pool %s failed: %r", pool.name, result)
            await asyncio.sleep(interval)

    async def scrape(self, pool: PoolState, backend: BackendState) -> None:
        signals = pool.config.signals
        assert signals is not None
        try:
            status, body = await self.upstream.get(_base(backend) + signals.path, signals.timeout)
        except (UpstreamError, OSError, TimeoutError):
            return
        engine = engine_of(pool, backend)
        found = read_signals(body, engine) if status == 200 else None
        if found is None:
            backend.engine_waiting = backend.engine_running = backend.engine_kv_usage = 0.0
            backend.signals_missing = True
            if not backend.signals_warned:
                backend.signals_warned = True
                _log.warning(
                    "engine signals missing: backend %s of pool %s answered %s with status %d "
                    "and none of the %s metric names; its queue and KV cache are not read "
                    "(check the engine's metrics flag, signals.path and the engine key)",
                    backend.label, pool.name, signals.path, status,
                    f"{engine} engine's" if engine in ENGINES else "known engines'")
            return
        backend.signals_missing = False
        if backend.config.engine is None and pool.config.engine is None:
            backend.detected_engine = found.engine
        backend.engine_waiting = found.waiting or 0.0
        backend.engine_running = found.running or 0.0
        backend.engine_kv_usage = found.kv or 0.0

    async def _signal_loop(self, pool: PoolState) -> None:
        signals = pool.config.signals
        assert signals is not None
        while True:
            await asyncio.gather(*(self.scrape(pool, b) for b in pool.backends),
                                 return_exceptions=True)
            await asyncio.sleep(signals.interval)
