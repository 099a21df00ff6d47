"""The operator's live figures: each pool's and backend's load, as this worker's router sees it
(the figures of ``POST /admin/stats``, and more).

Per backend: requests in flight, whether it is ejected, its TTFT and TPOT averages (EWMA), the
p50 and p99 of its last 256 TTFTs (the ring the backend keeps as it records each TTFT:
``BackendState.ttft_recent``; sorted here, when the page asks, never per request) and the
engine signals the router read from its ``/metrics`` (the pool's ``signals`` scrape: engine,
waiting and running requests, KV-cache use; None when the pool scrapes none or the last
scrape held none of its engine's names). Per pool: in flight, queued and the p50 of its last
256 TTFTs, which the operator's page charts over time.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from gateway.upstream.engines import engine_of

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from gateway.routing.backend import BackendState
    from gateway.routing.pool import PoolState
    from gateway.routing.router import Router

__all__ = ["engine_signals", "percentiles", "pool_stats"]


def _ms(seconds: float | None) -> float | None:
    """Seconds as ms; 0 (or None) is no observation yet (None)."""
    return round(seconds * 1000, 1) if seconds else None


def percentiles(samples: Iterable[float], qs: Sequence[float]) -> list[float | None]:
    """The nearest-rank percentiles ``qs`` (fractions: 0.5, 0.99) of ``samples``: the smallest
    sample with at least that fraction of the samples at or below it; None without samples."""
    ordered = sorted(samples)
    if not ordered:
        return [None for _ in qs]
    n = len(ordered)
    return [ordered[min(n, max(1, math.ceil(q * n - 1e-9))) - 1] for q in qs]


def engine_signals(pool: PoolState, backend: BackendState) -> dict[str, Any] | None:
    """What the pool's scrape of the backend's engine metrics last read; None without one."""
    if pool.config.signals is None or backend.signals_missing:
        return None
    return {"engine": engine_of(pool, backend), "waiting": backend.engine_waiting,
            "running": backend.engine_running,
            "kv_cache": round(backend.engine_kv_usage, 4)}


def _backend(pool: PoolState, b: BackendState, now: float) -> dict[str, Any]:
    p50, p99 = percentiles(b.ttft_recent, (0.5, 0.99))
    return {"backend": b.label, "in_flight": b.in_flight, "ejected": b.ejected_until > now,
            "ttft_ms": _ms(b.ttft_ewma), "tpot_ms": _ms(b.tpot_ewma),
            "ttft_p50_ms": _ms(p50), "ttft_p99_ms": _ms(p99),
            "ttft_samples": len(b.ttft_recent), "engine": engine_signals(pool, b)}


def pool_stats(router: Router, now: float) -> list[dict[str, Any]]:
    """Every pool: requests in flight and queued, its TTFT p50, and per backend its in-flight
    count, whether it is ejected (``now``: the monotonic clock), its TTFT and TPOT averages,
    TTFT p50 and p99 in ms and its engine signals."""
    return [
        {
            "pool": name,
            "in_flight": pool.in_flight,
            "queued": pool.queued,
            "ttft_p50_ms": _ms(percentiles(pool.ttft_recent(), (0.5,))[0]),
            "backends": [_backend(pool, b, now) for b in pool.backends],
        }
        for name, pool in sorted(router.pools.items())
    ]
