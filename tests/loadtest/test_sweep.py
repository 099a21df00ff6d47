"""Plateau and degradation: the detectors on synthetic curves, then on pools of known capacity."""

from __future__ import annotations

import pytest

from gateway.sim.server import SimServer
from loadtest.client import Target
from loadtest.sweep import SweepPlan, detect_degradation, detect_plateau, run_sweep
from loadtest.workload import Workload


@pytest.mark.parametrize(
    ("points", "level"),
    [
        pytest.param([(1, 100), (2, 200), (4, 400), (8, 420), (16, 425)], 4, id="doubling"),
        pytest.param(
            [(1, 150), (4, 550), (8, 1000), (16, 1685), (32, 2567), (64, 2570)],
            32,
            id="simulator-table",
        ),
        # 8 -> 32 is two doublings: +15% overall is ~7% per doubling, under 10%.
        pytest.param([(1, 100), (8, 700), (32, 805)], 8, id="non-doubling-flat"),
        # +25% over two doublings is ~11.8% per doubling: still rising.
        pytest.param([(1, 100), (8, 700), (32, 875)], None, id="non-doubling-rising"),
        pytest.param([(1, 100), (2, 180), (4, 150)], 2, id="falls"),
    ],
)
def test_detect_plateau(points: list[tuple[int, float]], level: int | None) -> None:
    found = detect_plateau(points, 0.10)
    assert (found.level if found else None) == level


@pytest.mark.parametrize(
    ("points", "errors", "level"),
    [
        pytest.param([(1, 100), (2, 200), (4, 400), (8, 400)], [0, 0, 0, 0], None, id="none"),
        pytest.param([(1, 100), (2, 200), (4, 400), (8, 300)], [0, 0, 0, 0], 8, id="drop"),
        pytest.param([(1, 100), (2, 200), (4, 380)], [0, 0, 0], None, id="noise-under-10pct"),
        pytest.param([(1, 100), (2, 200), (4, 400)], [0, 3, 0], 2, id="errors"),
    ],
)
def test_detect_degradation(
    points: list[tuple[int, float]], errors: list[int], level: int | None
) -> None:
    found = detect_degradation(points, errors, 0.10)
    assert (found.level if found else None) == level


async def test_pool_of_four_plateaus_at_four(pool4: SimServer) -> None:
    """With 4 slots, throughput doubles up to 4 and stays flat after; queueing shows in TTFT."""
    plan = SweepPlan(levels=(1, 2, 4, 8, 16), duration=1.0, pause=0.0)
    # Streams long enough that the gap between one request and the next (closed loop) is small.
    result = await run_sweep(
        Target(url=pool4.url, model="m"), Workload(prompt_tokens=200, max_tokens=256), plan
    )
    tps = {lv.concurrency: lv.summary.output_tps for lv in result.levels}
    assert tps[4] > 3.0 * tps[1]
    assert tps[16] < 1.15 * tps[4]
    assert result.plateau is not None and result.plateau.level == 4
    assert all(lv.summary.error_count == 0 for lv in result.levels)
    ttft = {lv.concurrency: lv.summary.ttft_ms["p50"] for lv in result.levels}
    assert ttft[16] > 3 * ttft[4]  # the 12 extra requests wait for a slot


async def test_errors_mark_the_degradation_point() -> None:
    """A pool with 2 slots and a 2-deep queue starts refusing (503) past 4 in flight."""
    with SimServer("interactive", speedup=20, jitter=0.0, max_running=2, queue_limit=2) as sim:
        plan = SweepPlan(levels=(1, 2, 4, 8), duration=None, requests=40, pause=0.0)
        result = await run_sweep(
            Target(url=sim.url, model="m"), Workload(prompt_tokens=100, max_tokens=32), plan
        )
    by_c = {lv.concurrency: lv.summary for lv in result.levels}
    assert by_c[2].error_count == 0 and by_c[8].error_count > 0
    assert result.degradation is not None and result.degradation.level in (4, 8)
    assert all(k.startswith("http_5") for k in by_c[8].errors)
