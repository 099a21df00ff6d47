"""Active health checks and engine-signal scraping: one background task per pool that wants them.

Checks feed the same state machine as passive outcomes (``BackendState.on_success`` /
``on_failure``), so an ejected backend that passes its probe comes back, and a silent one is
ejected without waiting for client traffic to find out. Engine signals (vLLM or SGLang metric
names) set the backend's waiting-queue length and KV-cache use, which backend choice reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from gateway.http.errors import UpstreamError

if TYPE_CHECKING:
    from gateway.http.base import UpstreamClient
    from gateway.routing.backend import BackendState
    from gateway.routing.pool import PoolState

__all__ = ["Monitors", "parse_engine_metrics"]

_log = logging.getLogger("gateway.health")

_WAITING = (b"vllm:num_requests_waiting", b"sglang:num_queue_reqs")
_KV = (b"vllm:kv_cache_usage_perc", b"vllm:gpu_cache_usage_perc", b"sglang:token_usage")


def parse_engine_metrics(text: bytes) -> tuple[float | None, float | None]:
    """(waiting requests, KV-cache use 0-1) summed over label sets, from Prometheus text."""
    waiting: float | None = None
    kv: float | None = None
    for line in text.splitlines():
        if not line or line[0] == 35:  # '#'
            continue
        name = line.split(b"{", 1)[0].split(b" ", 1)[0]
        if name in _WAITING or name in _KV:
            try:
                value = float(line.rsplit(b" ", 1)[-1])
            except ValueError:
                continue
            if name in _WAITING:
                waiting = (waiting or 0.0) + value
            else:
                kv = max(kv or 0.0, value)
    return waiting, kv


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
        if status == 200:
            waiting, kv = parse_engine_metrics(body)
            backend.engine_waiting = waiting or 0.0
            backend.engine_kv_usage = kv or 0.0

    async def _signal_loop(self, pool: PoolState) -> None:
        signals = pool.config.signals
        assert signals is not None
        while True:
            await asyncio.gather(*(self.scrape(pool, b) for b in pool.backends),
                                 return_exceptions=True)
            await asyncio.sleep(signals.interval)
