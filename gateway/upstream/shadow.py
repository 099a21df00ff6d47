"""Shadow traffic: mirror a share of requests to a shadow pool and discard the answers.

A shadow request runs as its own task, takes a backend only if one is free at once (it never
queues and never retries), and is never billed or counted against quotas. Its latency, status
and output are kept in ``ShadowStats`` for metrics and traces. The primary never waits for it.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.http.errors import UpstreamError
from gateway.routing.rollout import ShadowStats, should_shadow

if TYPE_CHECKING:
    from collections.abc import Callable

    from gateway.config import Shadow
    from gateway.http.base import UpstreamClient
    from gateway.routing.backend import BackendState
    from gateway.routing.router import Router
    from gateway.telemetry import Metrics
    from gateway.types import RawHeaders

__all__ = ["Mirror"]

_encoder = msgspec.json.Encoder()


class Mirror:
    """The process's shadow traffic: its stats and the tasks in flight (kept referenced)."""

    def __init__(self, upstream: UpstreamClient, metrics: Metrics) -> None:
        self.upstream = upstream
        self.metrics = metrics
        self.stats = ShadowStats()
        self.tasks: set[asyncio.Task[Any]] = set()

    def start(
        self,
        router: Router,
        shadow: Shadow,
        endpoint: str,
        payload: dict[str, Any],
        headers: RawHeaders,
    ) -> None:
        """Maybe mirror this request; returns at once."""
        if not should_shadow(shadow.share):
            return
        stats = self.stats
        if stats.in_flight >= shadow.max_in_flight:
            stats.skipped += 1
            return
        pool = router.pools[shadow.pool]
        backend = pool.try_pick(time.monotonic())
        if backend is None:
            stats.skipped += 1
            return
        mirrored = dict(payload)
        mirrored["model"] = shadow.backend_model or mirrored["model"]
        body = _encoder.encode(mirrored)
        task = asyncio.get_running_loop().create_task(
            self._run(pool.release, backend, endpoint, body, headers)
        )
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run(
        self,
        release: Callable[[BackendState], None],
        backend: BackendState,
        endpoint: str,
        body: bytes,
        headers: RawHeaders,
    ) -> None:
        stats = self.stats
        stats.started += 1
        stats.in_flight += 1
        status: int | str = "error"
        t0 = time.perf_counter()
        try:
            send_headers = list(headers)
            if backend.auth_header:
                send_headers.append((b"authorization", backend.auth_header))
            response = await self.upstream.post(backend.urls[endpoint], body, send_headers)
            try:
                async for chunk in response.chunks():
                    stats.output_bytes += len(chunk)
            finally:
                response.close()
            status = response.status
            stats.by_status[status] = stats.by_status.get(status, 0) + 1
        except UpstreamError:
            stats.errors += 1
        finally:
            stats.in_flight -= 1
            stats.latencies.append(time.perf_counter() - t0)
            del stats.latencies[:-1000]
            release(backend)
            self.metrics.shadow(status)
