"""Two endpoints, one sweep (:func:`run_compare`): A and B interleaved level by level.

Each level runs against A, then B (the order alternates from level to level, so slow drift on the
machine does not always favour one side), with a pause between. The report per level is B - A for
TTFT and end-to-end percentiles (what B adds, e.g. a gateway in front of backend A) and B / A for
throughput.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from loadtest.client import Result, Target
from loadtest.sweep import LevelResult, LevelRunner, SweepPlan, SweepResult
from loadtest.workload import Workload

__all__ = ["CompareResult", "LevelDelta", "delta", "run_compare"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LevelDelta:
    concurrency: int
    ttft_ms: dict[str, float]  # b - a
    e2e_ms: dict[str, float]  # b - a
    tpot_ms: dict[str, float]  # b - a
    throughput_ratio: float  # b / a


def delta(a: LevelResult, b: LevelResult) -> LevelDelta:
    """B minus A at one level (pure)."""
    sa, sb = a.summary, b.summary

    def diff(x: dict[str, float], y: dict[str, float]) -> dict[str, float]:
        return {k: y[k] - x[k] for k in x if k in y}

    return LevelDelta(
        concurrency=a.concurrency,
        ttft_ms=diff(sa.ttft_ms, sb.ttft_ms),
        e2e_ms=diff(sa.e2e_ms, sb.e2e_ms),
        tpot_ms=diff(sa.tpot_ms, sb.tpot_ms),
        throughput_ratio=sb.output_tps / sa.output_tps if sa.output_tps > 0 else float("nan"),
    )


@dataclass(slots=True, kw_only=True)
class CompareResult:
    a: SweepResult
    b: SweepResult
    deltas: list[LevelDelta] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "compare",
            "a": self.a.to_dict(),
            "b": self.b.to_dict(),
            "deltas": [
                {
                    "concurrency": d.concurrency,
                    "ttft_ms": d.ttft_ms,
                    "e2e_ms": d.e2e_ms,
                    "tpot_ms": d.tpot_ms,
                    "throughput_ratio": d.throughput_ratio,
                }
                for d in self.deltas
            ],
        }


def _sweep_shell(target: Target, workload: Workload, plan: SweepPlan) -> SweepResult:
    return SweepResult(
        target={"url": target.url, "model": target.model, "label": target.label},
        workload=workload.to_dict(),
        plan=plan.to_dict(),
    )


async def run_compare(
    a: Target,
    b: Target,
    workload: Workload,
    plan: SweepPlan,
    *,
    on_level_start: Callable[[str, int], None] | None = None,
    on_result: Callable[[Result], None] | None = None,
    on_level_end: Callable[[LevelResult], None] | None = None,
) -> CompareResult:
    """Run ``plan``'s levels against A and B, interleaved; analyse both curves."""
    out = CompareResult(a=_sweep_shell(a, workload, plan), b=_sweep_shell(b, workload, plan))
    async with (
        LevelRunner(a, workload, plan, label=a.label or "A") as ra,
        LevelRunner(b, workload, plan, label=b.label or "B") as rb,
    ):
        sides = [(ra, out.a), (rb, out.b)]
        for i, c in enumerate(plan.levels):
            for runner, sweep in sides if i % 2 == 0 else sides[::-1]:
                if plan.pause > 0:
                    await asyncio.sleep(plan.pause)
                if on_level_start is not None:
                    on_level_start(runner.label, c)
                level = await runner.run(c, on_result)
                sweep.levels.append(level)
                if on_level_end is not None:
                    on_level_end(level)
            out.deltas.append(delta(out.a.levels[-1], out.b.levels[-1]))
    out.a.analyse(plan.min_gain, plan.max_drop)
    out.b.analyse(plan.min_gain, plan.max_drop)
    return out
