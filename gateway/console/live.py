"""The operator's live figures: each pool's and backend's load, as this worker's router sees it
(the same figures as ``POST /admin/stats``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.routing.router import Router

__all__ = ["pool_stats"]


def _ms(seconds: float) -> float | None:
    """Seconds as ms; 0 is no observation yet (None)."""
    return round(seconds * 1000, 1) if seconds else None


def pool_stats(router: Router, now: float) -> list[dict[str, Any]]:
    """Every pool: requests in flight and queued, and per backend its in-flight count, whether
    it is ejected (``now``: the monotonic clock) and its TTFT and TPOT averages in ms."""
    return [
        {
            "pool": name,
            "in_flight": pool.in_flight,
            "queued": pool.queued,
            "backends": [
                {"backend": b.label, "in_flight": b.in_flight,
                 "ejected": b.ejected_until > now,
                 "ttft_ms": _ms(b.ttft_ewma), "tpot_ms": _ms(b.tpot_ewma)}
                for b in pool.backends
            ],
        }
        for name, pool in sorted(router.pools.items())
    ]
