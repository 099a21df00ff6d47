"""Step 3 of the validation path: the bill, from a sweep and a workload (:func:`estimate`).

Arithmetic, all pure:

- hourly cost of one replica (the machine the sweep measured) =
  ``hardware_per_hour + fees_per_hour + ops_per_month / (30 * 24)``;
- cost per 1k output tokens at a level, fully used = ``hourly / (output_tps * 3.6)``, plus
  ``fees_per_1k_tokens`` x (input + output tokens per output token) when fees are per token;
- workload: ``target_tps = requests_per_day * output_tokens / 86,400`` (x ``peak_factor`` for the
  rate to provision for); replicas = ``ceil(peak tps / plateau tps)``;
- max concurrency the hardware holds = the sweep's plateau level (or its best level);
- mean latency at the target throughput, for the workload's output length: at each level
  ``TTFT mean + (output_tokens - 1) x TPOT mean``, interpolated (linearly in throughput) between
  the two levels around the per-replica target; below the lowest level's throughput it is that
  level's latency, since a request cannot finish faster than alone;
- ``days``-day totals: output = requests x output_tokens x days, context (history re-sent with
  every request) = requests x context_tokens x days, on its own line; cost = replicas x
  (hardware + fees per hour) x 24 x days + ops x days / 30 + per-token fees on all tokens;
- a hosted-API comparison prices the same tokens at ``input_price_per_1k`` and
  ``output_price_per_1k``, the context re-send again on its own line.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from loadtest.sweep import SweepResult

__all__ = [
    "EXAMPLE",
    "CostEstimate",
    "CostInputs",
    "LevelCost",
    "estimate",
    "latency_at",
]

HOURS_PER_MONTH = 30 * 24


@dataclass(frozen=True, slots=True, kw_only=True)
class CostInputs:
    """Prices and the workload to project (money in any one currency)."""

    hardware_per_hour: float
    fees_per_hour: float = 0.0
    fees_per_1k_tokens: float = 0.0
    ops_per_month: float = 0.0
    requests_per_day: float = 10_000
    output_tokens: int = 500
    context_tokens: int = 2_000
    peak_factor: float = 1.0
    days: int = 30
    input_price_per_1k: float | None = None
    output_price_per_1k: float | None = None
    baseline_tps: float | None = None

    @property
    def hourly(self) -> float:
        """One replica's cost per hour, operations spread over a 30-day month."""
        return self.hardware_per_hour + self.fees_per_hour + self.ops_per_month / HOURS_PER_MONTH


#: The seed article's worked example: 500 output tokens per request, 10,000 requests per day,
#: a 2,000-token context; prices are illustrative (one rented H100-class GPU at $2.50/hour, $500
#: a month of operations; hosted API at $2.50 / $10 per million input / output tokens).
EXAMPLE = CostInputs(
    hardware_per_hour=2.50,
    ops_per_month=500.0,
    requests_per_day=10_000,
    output_tokens=500,
    context_tokens=2_000,
    input_price_per_1k=0.0025,
    output_price_per_1k=0.010,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class LevelCost:
    concurrency: int
    output_tps: float
    per_1k_output: float
    per_1k_tokens: float  # input + output tokens processed, at the workload's in/out ratio


@dataclass(slots=True, kw_only=True)
class CostEstimate:
    """The projection and the per-level table."""

    inputs: dict[str, Any]
    levels: list[LevelCost]
    max_concurrency: int
    plateau_found: bool
    plateau_tps: float
    target_tps: float
    provision_tps: float
    replicas: int
    utilisation: float
    latency_ms: float
    latency_level: str
    output_tokens: float
    context_tokens: float
    total_tokens: float
    context_share: float
    hardware_cost: float
    ops_cost: float
    token_fees: float
    total_cost: float
    per_1k_tokens: float
    per_1k_output: float
    hosted: dict[str, float] | None = None
    baseline_ratio: float | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["kind"] = "cost"
        return out


def latency_at(points: list[tuple[float, float, int]], tps: float) -> tuple[float, str]:
    """Mean latency (ms) at throughput ``tps`` from ``(tps, latency_ms, concurrency)`` points."""
    pts = sorted(p for p in points if not math.isnan(p[1]))
    if not pts:
        return math.nan, "no successful requests"
    if tps <= pts[0][0]:
        return pts[0][1], f"concurrency {pts[0][2]} (the lowest level already exceeds it)"
    for (x0, l0, c0), (x1, l1, c1) in itertools.pairwise(pts):
        if x0 <= tps <= x1:
            frac = (tps - x0) / (x1 - x0) if x1 > x0 else 0.0
            return l0 + (l1 - l0) * frac, f"between concurrency {c0} and {c1}"
    return pts[-1][1], f"concurrency {pts[-1][2]} (beyond the sweep; more replicas needed)"


def _level_costs(sweep: SweepResult, inp: CostInputs) -> list[LevelCost]:
    tokens_per_output = (inp.context_tokens + inp.output_tokens) / inp.output_tokens
    out = []
    for lv in sweep.levels:
        tps = lv.summary.output_tps
        per_out = inp.hourly / (tps * 3.6) if tps > 0 else math.inf
        per_out += inp.fees_per_1k_tokens * tokens_per_output
        out.append(
            LevelCost(
                concurrency=lv.concurrency,
                output_tps=tps,
                per_1k_output=per_out,
                per_1k_tokens=per_out / tokens_per_output,
            )
        )
    return out


def _capacity(sweep: SweepResult) -> tuple[int, float]:
    """The plateau level and its throughput (the best level when there is no plateau)."""
    by_c = {lv.concurrency: lv.summary.output_tps for lv in sweep.levels}
    if sweep.plateau is not None and sweep.plateau.level in by_c:
        return sweep.plateau.level, by_c[sweep.plateau.level]
    best = max(sweep.levels, key=lambda lv: lv.summary.output_tps)
    return best.concurrency, best.summary.output_tps


def estimate(sweep: SweepResult, inp: CostInputs) -> CostEstimate:
    """Project ``inp``'s workload onto the hardware ``sweep`` measured."""
    if not sweep.levels:
        raise ValueError("the sweep has no levels")
    notes: list[str] = []
    max_c, cap_tps = _capacity(sweep)
    if sweep.plateau is None:
        notes.append("no plateau in the sweep: capacity is the best level measured (a lower bound)")
    target = inp.requests_per_day * inp.output_tokens / 86_400
    provision = target * inp.peak_factor
    replicas = max(1, math.ceil(provision / cap_tps)) if cap_tps > 0 else 0
    per_replica = provision / replicas if replicas else math.nan
    points = [
        (
            lv.summary.output_tps,
            lv.summary.ttft_mean_ms + (inp.output_tokens - 1) * lv.summary.tpot_mean_ms,
            lv.concurrency,
        )
        for lv in sweep.levels
    ]
    latency, where = latency_at(points, per_replica)
    out_tok = inp.requests_per_day * inp.output_tokens * inp.days
    ctx_tok = inp.requests_per_day * inp.context_tokens * inp.days
    total_tok = out_tok + ctx_tok
    hardware = replicas * (inp.hardware_per_hour + inp.fees_per_hour) * 24 * inp.days
    ops = inp.ops_per_month * inp.days / 30
    fees = inp.fees_per_1k_tokens * total_tok / 1000
    total = hardware + ops + fees
    hosted = None
    if inp.input_price_per_1k is not None and inp.output_price_per_1k is not None:
        h_ctx = ctx_tok / 1000 * inp.input_price_per_1k
        h_out = out_tok / 1000 * inp.output_price_per_1k
        hosted = {
            "context": h_ctx,
            "output": h_out,
            "total": h_ctx + h_out,
            "per_1k_tokens": (h_ctx + h_out) / (total_tok / 1000),
        }
    prompt_mean = _sweep_prompt_mean(sweep)
    if prompt_mean and abs(prompt_mean - inp.context_tokens) > 0.25 * inp.context_tokens:
        notes.append(
            f"the sweep's prompts averaged {prompt_mean:,.0f} tokens but the workload sends "
            f"{inp.context_tokens:,}: re-run the sweep with --prompt-tokens "
            f"{inp.context_tokens} for a faithful capacity"
        )
    asked = sweep.workload.get("max_tokens")
    if asked and abs(asked - inp.output_tokens) > 0.25 * inp.output_tokens:
        notes.append(
            f"the sweep asked {asked:,} output tokens per request, the workload "
            f"{inp.output_tokens:,}: throughput per level may differ; re-run with --max-tokens "
            f"{inp.output_tokens}"
        )
    return CostEstimate(
        inputs=asdict(inp),
        levels=_level_costs(sweep, inp),
        max_concurrency=max_c,
        plateau_found=sweep.plateau is not None,
        plateau_tps=cap_tps,
        target_tps=target,
        provision_tps=provision,
        replicas=replicas,
        utilisation=per_replica / cap_tps if cap_tps > 0 else math.nan,
        latency_ms=latency,
        latency_level=where,
        output_tokens=out_tok,
        context_tokens=ctx_tok,
        total_tokens=total_tok,
        context_share=ctx_tok / total_tok if total_tok else 0.0,
        hardware_cost=hardware,
        ops_cost=ops,
        token_fees=fees,
        total_cost=total,
        per_1k_tokens=total / (total_tok / 1000) if total_tok else math.nan,
        per_1k_output=total / (out_tok / 1000) if out_tok else math.nan,
        hosted=hosted,
        baseline_ratio=cap_tps / inp.baseline_tps if inp.baseline_tps else None,
        notes=notes,
    )


def _sweep_prompt_mean(sweep: SweepResult) -> float | None:
    vals = [lv.summary.prompt_tokens_mean for lv in sweep.levels]
    vals = [v for v in vals if v is not None and not math.isnan(v)]
    return sum(vals) / len(vals) if vals else None
