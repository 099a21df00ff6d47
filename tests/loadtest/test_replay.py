"""Trace parsing, the replay schedule, and open-loop replay that keeps its arrival times."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from gateway.sim.server import SimServer
from loadtest.client import Target
from loadtest.replay import ReplayPlan, parse_targets, plan_requests, run_replay
from loadtest.trace import TraceRow, parse_timestamp, read_trace

AZURE = Path("/work/shared/data/azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv")


def test_reads_the_azure_format(tmp_path: Path) -> None:
    """Seven fractional digits; offsets are relative to the first row read."""
    p = tmp_path / "t.csv"
    p.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
        "2023-11-16 18:15:51.2224670,879,55\n"
    )
    rows = read_trace(p)
    assert [r.context_tokens for r in rows] == [374, 396, 879]
    assert rows[1].offset_s == pytest.approx(4.314579)
    assert read_trace(p, start=1)[0].offset_s == 0.0
    assert len(read_trace(p, window_s=1.0)) == 1
    assert parse_timestamp("2023-11-16 18:15:46.6805900").microsecond == 680590


@pytest.mark.skipif(not AZURE.exists(), reason="shared Azure trace not present")
def test_reads_the_real_trace_in_place() -> None:
    rows = read_trace(AZURE, limit=50)
    assert len(rows) == 50 and rows[0].offset_s == 0.0
    assert all(b.offset_s >= a.offset_s for a, b in itertools.pairwise(rows))


def test_targets_parse() -> None:
    assert parse_targets("interactive=500ms, batch=5s") == {"interactive": 0.5, "batch": 5.0}
    with pytest.raises(ValueError):
        parse_targets("fast")


def test_schedule_classes_caps_and_sessions() -> None:
    rows = [TraceRow(float(i), 100 + i, 500) for i in range(10)]
    plan = plan_requests(rows, ReplayPlan(speedup=2.0, max_output=64, batch_share=0.5, seed=3))
    assert [p.at_s for p in plan] == [i / 2 for i in range(10)]
    assert {p.max_tokens for p in plan} == {64}
    assert 0 < sum(p.klass == "batch" for p in plan) < 10
    sess = plan_requests(rows, ReplayPlan(sessions=3, batch_share=0.5, seed=3))
    # 10 rows, 3 turns -> 4 conversations; conversation j takes rows j, j+4, j+8.
    assert [(p.conversation, p.turn) for p in sess[:5]] == [(0, 0), (1, 0), (2, 0), (3, 0), (0, 1)]
    for conv in range(4):
        assert len({p.klass for p in sess if p.conversation == conv}) == 1


async def test_replay_keeps_its_schedule(small_trace: tuple[Path, list[TraceRow]]) -> None:
    """Each request leaves within a few ms of its due time; classes get their own report."""
    path, _ = small_trace
    rows = read_trace(path)
    plan = ReplayPlan(
        speedup=1.5, batch_share=0.3, seed=1, ttft_targets={"interactive": 0.5, "batch": 5.0}
    )
    with SimServer("batch", speedup=20, jitter=0.0) as sim:
        result = await run_replay(Target(url=sim.url, model="m"), rows, plan)
    assert result.rows == 60
    due = [r.offset_s / 1.5 for r in rows]
    sent = [p["at_s"] for p in result.timeline]
    # behaviour, not speed (how late a loaded box lets a send be is the benchmark's business):
    # nothing leaves before it is due, sends keep the trace's order, and the reported lag is
    # the lag of this timeline
    lags = sorted(s - d for s, d in zip(sent, due, strict=True))
    assert lags[0] > -0.005, lags[0]
    by_due = sorted(zip(due, sent, strict=True))
    assert all(a[1] <= b[1] for a, b in itertools.pairwise(by_due) if a[0] < b[0])
    assert result.lag_ms["p99"] <= lags[-1] * 1000 + 1.0
    assert {c.klass for c in result.classes} == {"interactive", "batch"}
    for c in result.classes:
        assert c.summary.error_count == 0 and c.attainment == 1.0
    assert sum(c.summary.requests for c in result.classes) == 60


async def test_sessions_resend_history(small_trace: tuple[Path, list[TraceRow]]) -> None:
    """In multi-turn mode later turns carry the earlier prompts and replies."""
    path, _ = small_trace
    rows = read_trace(path, limit=12)
    with SimServer("interactive", speedup=20, jitter=0.0) as sim:
        result = await run_replay(
            Target(url=sim.url, model="m"), rows, ReplayPlan(speedup=2.0, sessions=3)
        )
    assert sum(c.summary.error_count for c in result.classes) == 0
    new_tokens = sum(r.context_tokens for r in rows)
    assert result.history_tokens > 0
    assert result.input_tokens > new_tokens + 0.8 * result.history_tokens
