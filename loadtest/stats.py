"""Percentiles and the summary of a batch of results (:class:`Summary`).

Percentiles interpolate linearly between closest ranks (numpy's default ``linear`` method), so
p50 of ``[1, 2, 3, 4]`` is 2.5. Latencies are reported in milliseconds.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loadtest.client import Result

__all__ = ["PCTS", "Summary", "pcts", "percentile", "summarize"]

PCTS = (50.0, 95.0, 99.0)


def percentile(values: Sequence[float], pct: float) -> float:
    """The ``pct`` percentile (0-100) of ``values``, linear between ranks; NaN when empty."""
    if not values:
        return math.nan
    data = sorted(values)
    if len(data) == 1:
        return float(data[0])
    rank = (len(data) - 1) * pct / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(data) - 1)
    return float(data[lo] + (data[hi] - data[lo]) * (rank - lo))


def pcts(values: Iterable[float], which: Sequence[float] = PCTS) -> dict[str, float]:
    """``{"p50": ..., "p95": ..., "p99": ...}`` of ``values`` (sorted once)."""
    data = sorted(values)
    return {f"p{p:g}": percentile(data, p) for p in which}


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


@dataclass(slots=True, kw_only=True)
class Summary:
    """Aggregate figures of a set of requests over a wall-clock window (latencies in ms)."""

    requests: int
    ok: int
    wall_s: float
    rps: float
    output_tps: float
    output_tokens: int
    prompt_tokens_mean: float
    ttft_ms: dict[str, float]
    tpot_ms: dict[str, float]
    e2e_ms: dict[str, float]
    e2e_mean_ms: float
    ttft_mean_ms: float
    tpot_mean_ms: float
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    @property
    def timeouts(self) -> int:
        return self.errors.get("timeout", 0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Summary:
        """From :meth:`to_dict` output (JSON nulls back to NaN)."""
        nan = math.nan
        fixed: dict[str, Any] = {k: nan if v is None else v for k, v in data.items()}
        for key in ("ttft_ms", "tpot_ms", "e2e_ms"):
            values: dict[str, Any] = fixed.get(key) or {}
            fixed[key] = {k: nan if v is None else v for k, v in values.items()}
        fixed.setdefault("tpot_mean_ms", nan)
        return cls(**fixed)


def summarize(results: Sequence[Result], wall_s: float | None = None) -> Summary:
    """Summarise ``results``; ``wall_s`` defaults to first start -> last end.

    Throughput counts the output tokens of successful requests only.
    """
    if wall_s is None:
        if results:
            wall_s = (max(r.end_ns for r in results) - min(r.start_ns for r in results)) / 1e9
        else:
            wall_s = 0.0
    good = [r for r in results if r.ok]
    ttft = [r.ttft_s * 1e3 for r in good if r.ttft_s is not None]
    tpot = [t * 1e3 for r in good if (t := r.tpot_s) is not None]
    e2e = [r.e2e_s * 1e3 for r in good if r.e2e_s is not None]
    tokens = sum(r.output_tokens for r in good)
    prompts = [float(r.prompt_tokens) for r in good if r.prompt_tokens is not None]
    errors = Counter(r.error for r in results if r.error is not None)
    per_s = 1.0 / wall_s if wall_s > 0 else 0.0
    return Summary(
        requests=len(results),
        ok=len(good),
        wall_s=wall_s,
        rps=len(good) * per_s,
        output_tps=tokens * per_s,
        output_tokens=tokens,
        prompt_tokens_mean=_mean(prompts),
        ttft_ms=pcts(ttft),
        tpot_ms=pcts(tpot),
        e2e_ms=pcts(e2e),
        e2e_mean_ms=_mean(e2e),
        ttft_mean_ms=_mean(ttft),
        tpot_mean_ms=_mean(tpot),
        errors=dict(sorted(errors.items())),
    )
