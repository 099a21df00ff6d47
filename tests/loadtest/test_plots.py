"""Latency charts pick a readable y axis (issue 14, point 24: a log axis over 6.5-11.5 ms had
one labelled tick)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from matplotlib.figure import Figure

from loadtest.plots import latency_figure


def _sweep(values: list[float]) -> Any:
    """A sweep as the charts read it: levels with percentile dicts."""
    levels = [
        SimpleNamespace(concurrency=c, summary=SimpleNamespace(
            tpot_ms={"p50": v, "p95": v * 1.05, "p99": v * 1.1},
            ttft_ms={"p50": v, "p95": v * 1.05, "p99": v * 1.1}))
        for c, v in zip((1, 2, 4, 8, 16, 32), values, strict=False)
    ]
    return SimpleNamespace(target={"label": "sim"}, levels=levels)


def _labelled_ticks(fig: Figure) -> list[str]:
    fig.canvas.draw()
    ax = fig.axes[0]
    low, high = ax.get_ylim()
    return [t.get_text() for t in ax.get_yticklabels()
            if t.get_text() and low <= t.get_position()[1] <= high]


@pytest.mark.parametrize("key", ["tpot_ms", "ttft_ms"])
def test_narrow_span_is_linear_with_readable_ticks(key: str) -> None:
    fig = latency_figure([_sweep([6.5, 7.0, 8.1, 9.0, 10.2, 10.5])], key)
    assert fig.axes[0].get_yscale() == "linear"
    ticks = _labelled_ticks(fig)
    assert len(ticks) >= 4, ticks
    assert all("e" not in t and "^" not in t for t in ticks)  # plain numbers


def test_wide_span_stays_logarithmic() -> None:
    fig = latency_figure([_sweep([5.0, 20.0, 90.0, 400.0, 1500.0, 4000.0])], "ttft_ms")
    assert fig.axes[0].get_yscale() == "log"
    assert len(_labelled_ticks(fig)) >= 4
