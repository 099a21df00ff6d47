"""The gates: each compares the canary with the baseline in one window and says ``pass``,
``fail`` or ``wait`` (not enough data to say), with the figures it used.

A gate is judged per request class (same model, same class, same window) and the verdicts
combine: any class failing fails the gate, any class waiting makes it wait. The tests are
in :mod:`gateway.rollouts.stats`; which one each gate runs is in its function.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from gateway.rollouts import stats

if TYPE_CHECKING:
    from gateway.config.model import Progressive
    from gateway.rollouts.counts import Arm, Histogram, Window

__all__ = ["GateResult", "Verdict", "evaluate", "evaluate_shadow"]

Verdict = Literal["pass", "fail", "wait"]
#: the quantile the latency gates compare
P90 = 0.9
#: fewest samples a latency gate reads a baseline p90 bound from
_MIN_BASELINE = 20


@dataclass(slots=True)
class GateResult:
    """One gate's verdict in one window, with what it measured (for ``/admin/rollouts``)."""

    name: str
    verdict: Verdict
    figures: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "verdict": self.verdict, **self.figures}


def _combine(name: str, per_class: dict[str, GateResult]) -> GateResult:
    verdicts = {r.verdict for r in per_class.values()}
    verdict: Verdict = ("fail" if "fail" in verdicts else "wait" if "wait" in verdicts
                        else "pass")
    return GateResult(name, verdict, {"classes": {c: r.figures | {"verdict": r.verdict}
                                                  for c, r in per_class.items()}})


def _error_rate(canary: Arm, baseline: Arm, max_increase: float, confidence: float
                ) -> GateResult:
    """One-sided Agresti-Caffo test of p_canary - p_baseline <= max_increase."""
    figures: dict[str, Any] = {
        "canary": round(canary.errors / canary.requests, 5) if canary.requests else None,
        "baseline": round(baseline.errors / baseline.requests, 5) if baseline.requests else None,
        "max_increase": max_increase}
    if baseline.requests == 0:
        return GateResult("error_rate", "wait", figures)
    failed, z = stats.difference_exceeds(canary.errors, canary.requests, baseline.errors,
                                         baseline.requests, max_increase, confidence)
    figures["z"] = round(z, 3)
    return GateResult("error_rate", "fail" if failed else "pass", figures)


def _latency(name: str, canary: Histogram, baseline: Histogram, max_ratio: float,
             confidence: float) -> GateResult:
    """Sign test on the canary's exceedances of max_ratio x an upper bound of the
    baseline's p90 (H0: at most 10% of the canary exceeds it)."""
    figures: dict[str, Any] = {
        "canary_p90": _ms(canary.quantile(P90)), "baseline_p90": _ms(baseline.quantile(P90)),
        "max_ratio": max_ratio, "samples": [canary.total, baseline.total]}
    if canary.total == 0 and baseline.total == 0:
        return GateResult(name, "pass", figures | {"note": "no samples"})
    rank = (stats.order_statistic_upper(baseline.total, P90, confidence)
            if baseline.total >= _MIN_BASELINE else None)
    if rank is None:
        return GateResult(name, "wait", figures)
    threshold = max_ratio * baseline.rank_value(rank)
    above = canary.above(threshold)
    failed, p_value = stats.exceedances_exceed(above, canary.total, 1 - P90, confidence)
    figures |= {"threshold": _ms(threshold), "canary_above": above, "p": round(p_value, 5)}
    return GateResult(name, "fail" if failed else "pass", figures)


def _tokens(canary: Arm, baseline: Arm, max_change: float, confidence: float) -> GateResult:
    """Welch z-test that the canary's mean output tokens lie outside (1 +- max_change) x
    the baseline's."""
    if canary.token_n < 2 or baseline.token_n < 2:
        return GateResult("output_tokens", "wait" if canary.token_n or baseline.token_n
                          else "pass", {"note": "too few requests with usage"})
    mean_c, var_c = _moments(canary)
    mean_b, var_b = _moments(baseline)
    failed, z = stats.mean_ratio_outside(mean_c, var_c, canary.token_n, mean_b, var_b,
                                         baseline.token_n, max_change, confidence)
    return GateResult("output_tokens", "fail" if failed else "pass",
                      {"canary_mean": round(mean_c, 2), "baseline_mean": round(mean_b, 2),
                       "max_change": max_change, "z": round(z, 3)})


def _agreement(agreement: tuple[int, int] | None, minimum: float, confidence: float
               ) -> GateResult:
    """Fails when a Wilson upper bound of the agreement rate is below ``minimum``; passes
    once the lower side is as sure (the symmetric bound is above it)."""
    if agreement is None:
        return GateResult("shadow_agreement", "wait", {"note": "no shadow comparison"})
    agreed, compared = agreement
    upper = stats.wilson_upper(agreed, compared, confidence)
    lower = 1 - stats.wilson_upper(compared - agreed, compared, confidence)
    figures = {"rate": round(agreed / compared, 4) if compared else None,
               "compared": compared, "min": minimum}
    if upper < minimum:
        return GateResult("shadow_agreement", "fail", figures)
    return GateResult("shadow_agreement", "pass" if lower >= minimum else "wait", figures)


def evaluate(definition: Progressive, window: Window,
             agreement: tuple[int, int] | None = None) -> list[GateResult]:
    """Every configured gate's verdict on ``window``."""
    gates, confidence = definition.gates, definition.confidence
    classes = [c for c in window.classes() if window.arm("canary", c).requests]
    results: list[GateResult] = []

    def per_class(name: str, judge: Any) -> None:
        results.append(_combine(name, {
            c: judge(window.arm("canary", c), window.arm("baseline", c)) for c in classes}))

    if gates.error_rate is not None:
        margin = gates.error_rate.max_increase
        per_class("error_rate", lambda c, b: _error_rate(c, b, margin, confidence))
    if gates.ttft_p90 is not None:
        ttft = gates.ttft_p90.max_ratio
        per_class("ttft_p90", lambda c, b: _latency("ttft_p90", c.ttft, b.ttft, ttft,
                                                    confidence))
    if gates.tpot_p90 is not None:
        tpot = gates.tpot_p90.max_ratio
        per_class("tpot_p90", lambda c, b: _latency("tpot_p90", c.tpot, b.tpot, tpot,
                                                    confidence))
    if gates.output_tokens is not None:
        change = gates.output_tokens.max_change
        per_class("output_tokens", lambda c, b: _tokens(c, b, change, confidence))
    if gates.shadow_agreement is not None:
        results.append(_agreement(agreement, gates.shadow_agreement.min, confidence))
    return results


def evaluate_shadow(definition: Progressive, agreement: tuple[int, int] | None,
                    ttft: tuple[Histogram, Histogram] | None) -> list[GateResult]:
    """A shadow stage's verdicts: the canary takes no live traffic, so it is judged on the
    mirrored requests alone: ``shadow_agreement``, and ``ttft_p90`` with the shadow's TTFT as
    the canary and the same requests' primary TTFT as the baseline (both timed from the
    mirroring instant)."""
    gates, confidence = definition.gates, definition.confidence
    results: list[GateResult] = []
    if gates.shadow_agreement is not None:
        results.append(_agreement(agreement, gates.shadow_agreement.min, confidence))
    if gates.ttft_p90 is not None:
        if ttft is None:
            results.append(GateResult("ttft_p90", "wait", {"note": "no shadow comparison"}))
        else:
            shadow, primary = ttft
            results.append(_latency("ttft_p90", shadow, primary, gates.ttft_p90.max_ratio,
                                    confidence) if shadow.total
                           else GateResult("ttft_p90", "wait", {"note": "no shadow TTFT"}))
    return results


def _moments(arm: Arm) -> tuple[float, float]:
    mean = arm.tokens / arm.token_n
    var = max(0.0, (arm.tokens_sq - arm.token_n * mean * mean) / (arm.token_n - 1))
    return mean, var


def _ms(value: float | None) -> float | None:
    if value is None or math.isinf(value):
        return None
    return round(value * 1000, 2)
