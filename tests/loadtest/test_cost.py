"""Cost arithmetic against hand-computed values: the seed article's worked example."""

from __future__ import annotations

import math

import pytest

from loadtest.client import Result
from loadtest.cost import EXAMPLE, CostInputs, estimate, latency_at
from loadtest.monitor import SelfReport
from loadtest.stats import summarize
from loadtest.sweep import LevelResult, SweepResult

# The simulator's interactive table (SIMULATOR.md): concurrency -> (out tok/s, TTFT ms, TPOT ms).
TABLE = {
    1: (150.0, 40.0, 6.6),
    8: (1000.0, 41.0, 7.9),
    32: (2567.0, 45.0, 12.4),
    64: (2570.0, 3220.0, 12.4),
}


def _level(c: int, tps: float, ttft: float, tpot: float) -> LevelResult:
    s = summarize([Result(0, end_ns=1)], wall_s=1.0)
    s.output_tps, s.ttft_mean_ms, s.tpot_mean_ms = tps, ttft, tpot
    s.prompt_tokens_mean = 2000.0
    return LevelResult(
        concurrency=c,
        summary=s,
        client=SelfReport(cpu=0.1, lag_p90_ms=0, lag_p99_ms=0, lag_max_ms=0),
    )


@pytest.fixture()
def sweep() -> SweepResult:
    out = SweepResult(
        target={},
        workload={"max_tokens": 500},
        plan={},
        levels=[_level(c, *v) for c, v in TABLE.items()],
    )
    out.analyse()
    return out


def test_seed_example_by_hand(sweep: SweepResult) -> None:
    """500 output tokens, 10,000 requests/day, 2,000-token context, $2.50/h + $500/month."""
    est = estimate(sweep, EXAMPLE)
    assert est.max_concurrency == 32 and est.plateau_tps == 2567.0
    assert est.target_tps == pytest.approx(10_000 * 500 / 86_400)  # 57.87 tok/s
    assert est.replicas == 1
    assert est.utilisation == pytest.approx(57.8704 / 2567, rel=1e-4)
    # Below single-stream speed: a request takes its idle latency, 40 + 499 x 6.6 ms.
    assert est.latency_ms == pytest.approx(40 + 499 * 6.6)
    assert est.output_tokens == 150_000_000
    assert est.context_tokens == 600_000_000
    assert est.total_tokens == 750_000_000 and est.context_share == pytest.approx(0.8)
    assert est.hardware_cost == pytest.approx(2.5 * 24 * 30)  # 1,800
    assert est.total_cost == pytest.approx(2300.0)
    assert est.per_1k_tokens == pytest.approx(2300 / 750_000)
    assert est.per_1k_output == pytest.approx(2300 / 150_000)
    assert est.hosted == pytest.approx(
        {"context": 1500.0, "output": 1500.0, "total": 3000.0, "per_1k_tokens": 0.004}
    )
    level32 = next(lc for lc in est.levels if lc.concurrency == 32)
    hourly = 2.5 + 500 / 720
    assert level32.per_1k_output == pytest.approx(hourly / (2567 * 3.6))
    assert level32.per_1k_tokens == pytest.approx(level32.per_1k_output / 5)  # 2,500 per 500
    assert not est.notes


def test_more_traffic_needs_replicas_and_interpolates_latency(sweep: SweepResult) -> None:
    """At 40x the example's traffic (2,315 tok/s) one replica runs between levels 8 and 32."""
    inp = CostInputs(
        hardware_per_hour=2.5, requests_per_day=400_000, output_tokens=500, context_tokens=2000
    )
    est = estimate(sweep, inp)
    assert est.replicas == 1
    tps = 400_000 * 500 / 86_400
    lat8, lat32 = 41 + 499 * 7.9, 45 + 499 * 12.4
    frac = (tps - 1000) / (2567 - 1000)
    assert est.latency_ms == pytest.approx(lat8 + (lat32 - lat8) * frac)
    est2 = estimate(
        sweep, CostInputs(hardware_per_hour=2.5, requests_per_day=1_000_000, peak_factor=2.0)
    )
    assert est2.replicas == math.ceil(1_000_000 * 500 / 86_400 * 2 / 2567)  # 5
    assert est2.hardware_cost == pytest.approx(5 * 2.5 * 24 * 30)


def test_latency_at_edges() -> None:
    pts = [(100.0, 1000.0, 1), (400.0, 1500.0, 4)]
    assert latency_at(pts, 50.0)[0] == 1000.0
    assert latency_at(pts, 250.0)[0] == pytest.approx(1250.0)
    assert "beyond" in latency_at(pts, 900.0)[1]


def test_mismatched_sweep_is_noted(sweep: SweepResult) -> None:
    est = estimate(sweep, CostInputs(hardware_per_hour=1.0, context_tokens=8000, output_tokens=100))
    assert any("--prompt-tokens 8000" in n for n in est.notes)
    assert any("--max-tokens 100" in n for n in est.notes)
