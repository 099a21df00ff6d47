"""The one-connection latency tool's own parts: its summary and the stage timer's arithmetic."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest.bench.overhead import latency, stages


def _window(p50: float, p99: float) -> dict[str, float]:
    return {"p50_ms": p50, "p99_ms": p99, "rps": 1000 / p50}


def test_added_latency_is_the_median_of_each_rounds_difference_to_the_hop() -> None:
    """A slow round moves the target and the hop together: the difference of the same round
    is what is reported, not the difference of the two medians."""
    windows = {
        "direct": [_window(0.03, 1.0), _window(0.03, 1.0), _window(0.03, 1.0)],
        "nginx hop": [_window(0.1, 2.0), _window(0.5, 3.0), _window(0.12, 2.0)],
        "all-on": [_window(0.4, 3.0), _window(0.85, 4.5), _window(0.45, 3.5)],
    }
    row = latency.summarize(windows)["all-on"]
    assert row["p50_ms"] == pytest.approx(0.45)
    assert row["added_p50_vs_hop_ms"] == pytest.approx(0.33)  # of 0.30, 0.35, 0.33
    assert row["added_p99_vs_hop_ms"] == pytest.approx(1.5)
    assert row["added_p50_vs_direct_ms"] == pytest.approx(0.42)
    assert latency.summarize(windows)["nginx hop"]["added_p50_vs_hop_ms"] == 0


def test_stage_own_times_exclude_what_is_timed_inside_them() -> None:
    raw = {"protocol in": 20, "auth": 5, "parse": 6, "count": 4, "admit": 160, "reserve": 140,
           "forward": 100, "relay": 60, "meter": 14, "record": 6, "protocol out": 24,
           "telemetry": 2, "total": 400}
    row = stages.derive(raw)
    assert row["admit, own"] == 16
    assert row["relay, own"] == 16
    named = sum(row[s] for s in stages.PATH_STAGES if s != "other")
    assert named + row["other"] + raw["telemetry"] == raw["total"]


def test_setups_name_every_configuration(tmp_path: Path) -> None:
    args = latency.parse_args(["--baseline-tree", str(tmp_path)])
    made = latency.setups(args, tmp_path)
    assert list(made) == ["embedded", "all-on", "all-on-commit", "all-on-journal",
                          "all-on-process", "all-on-stages", "baseline", "baseline-stages"]
    assert made["all-on"]["store"] == {"ledger_durability": "buffered"}
    assert made["all-on-commit"]["store"] == {"ledger_durability": "commit"}
    assert made["all-on-journal"]["store"] == {"ledger_durability": "journal"}
    assert made["all-on-process"]["store"] == {"ledger_durability": "process"}
    assert made["baseline"]["env"]["PYTHONPATH"] == str(tmp_path.resolve())
    assert "stages.py" in made["baseline-stages"]["template"]
    assert "{redis_url}" in made["all-on"]["env"]["GATEWAY_REDIS_URL"]
    assert "GATEWAY_REDIS_URL" not in made["embedded"]["env"]
