"""Percentiles and summaries."""

from __future__ import annotations

import math

import pytest

from loadtest.client import Result
from loadtest.stats import Summary, pcts, percentile, summarize


@pytest.mark.parametrize(
    ("values", "pct", "expected"),
    [
        pytest.param([1, 2, 3, 4], 50, 2.5, id="median-even"),
        pytest.param([5], 99, 5.0, id="single"),
        pytest.param(list(range(101)), 95, 95.0, id="exact-rank"),
        pytest.param([10, 20], 99, 19.9, id="interpolated"),
    ],
)
def test_percentile(values: list[float], pct: float, expected: float) -> None:
    assert percentile(values, pct) == pytest.approx(expected)


def test_percentile_of_nothing_is_nan() -> None:
    assert math.isnan(percentile([], 50)) and math.isnan(pcts([])["p99"])


def test_summary_counts_only_successes_in_throughput() -> None:
    """Failed requests appear under errors by kind, not in tokens/s or latency."""
    s = 1_000_000_000
    ok = Result(0, first_ns=s // 10, end_ns=s, chunks=10, completion_tokens=10)
    bad = Result(0, end_ns=s // 2, error="http_503")
    summary = summarize([ok, bad], wall_s=2.0)
    assert summary.output_tps == 5.0 and summary.rps == 0.5
    assert summary.errors == {"http_503": 1} and summary.ok == 1
    assert summary.ttft_ms["p50"] == pytest.approx(100.0)
    assert summary.tpot_ms["p50"] == pytest.approx(100.0)  # 900 ms over 9 gaps
    assert Summary.from_dict(summary.to_dict()) == summary
