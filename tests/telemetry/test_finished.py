"""Finished requests reach the metrics and the access log in batches: nothing lost, nothing
changed by the batching (same counts, same lines as one call per request), bounded delay."""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import structlog

from gateway.telemetry import NOOP_SPAN, FinishedRequests, LogSettings, Metrics, setup_logging
from gateway.telemetry.logging import AccessLog
from tests.telemetry.fakes import FakeContext, FakeUsage, finished


@dataclass
class FakeSpan:
    trace_id: str | None = "0af7651916cd43dd8448eb211c80319c"
    span_id: str | None = "b7ad6b7169203331"


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.reset_defaults()


def access_log(buf: io.BytesIO, **kw: Any) -> AccessLog:
    return setup_logging(LogSettings(buffered=False, **kw), stream=buf)


def lines(buf: io.BytesIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in buf.getvalue().splitlines()]


def series(metrics: Metrics) -> list[str]:
    """The gateway's own series (the process_* ones change by themselves)."""
    return [x for x in metrics.render()[0].decode().splitlines() if x.startswith("gateway_")]


def requests(n: int) -> list[FakeContext]:
    """A mix: streams and not, statuses, tenants, retries, with and without usage."""
    out = []
    for i in range(n):
        ctx = finished(request_id=f"r{i}", stream=i % 2 == 0, attempts=1 + i % 3,
                       status=(200, 200, 429, 502)[i % 4], failovers=int(i % 5 == 0))
        ctx.tenant = ("acme", "globex", None)[i % 3]  # type: ignore[attr-defined]
        ctx.usage = FakeUsage(output=1 + i % 40) if i % 4 != 2 else None  # type: ignore[attr-defined]
        out.append(ctx)
    return out


def test_same_counts_and_lines_as_one_call_per_request() -> None:
    """Batching changes when, not what: the metrics and the access lines (timestamps aside)
    equal those of one ``observe_request`` and one ``access_log`` call per request."""
    ctxs = requests(300)
    spans = [FakeSpan() if i % 7 == 0 else NOOP_SPAN for i in range(len(ctxs))]
    one_by_one, one_out = Metrics(tenant_label=True), io.BytesIO()
    log = access_log(one_out)
    for ctx, span in zip(ctxs, spans, strict=True):
        one_by_one.observe_request(ctx)
        log(ctx, span=span)  # type: ignore[arg-type]
    batched, batched_out = Metrics(tenant_label=True), io.BytesIO()
    finisher = FinishedRequests(batched, access_log(batched_out), batch=64)
    for ctx, span in zip(ctxs, spans, strict=True):
        finisher(ctx, span)  # type: ignore[arg-type]
    finisher.flush()

    assert series(batched) == series(one_by_one)
    assert len(series(batched)) > 20
    got, want = lines(batched_out), lines(one_out)
    for line in got + want:
        del line["timestamp"]
    assert got == want
    assert [x["request_id"] for x in got] == [f"r{i}" for i in range(300)]
    assert sum(x.get("trace_id") is not None for x in got) == len(range(0, 300, 7))


async def test_hands_over_within_the_interval() -> None:
    """Inside an event loop a request waits at most ``interval`` to be counted and logged."""
    metrics, out = Metrics(), io.BytesIO()
    finisher = FinishedRequests(metrics, access_log(out), interval=0.05)
    for ctx in requests(10):
        finisher(ctx, NOOP_SPAN)
    assert lines(out) == []  # not yet
    await asyncio.sleep(0.2)
    assert len(lines(out)) == 10
    assert 'gateway_requests_total{' in "\n".join(series(metrics))


async def test_a_full_batch_is_handed_over_at_once() -> None:
    out = io.BytesIO()
    finisher = FinishedRequests(Metrics(), access_log(out), interval=60.0, batch=16)
    for ctx in requests(40):
        finisher(ctx, NOOP_SPAN)
    assert len(lines(out)) == 32  # two full batches; 8 wait for the timer or a flush
    finisher.flush()
    assert len(lines(out)) == 40


def test_without_an_event_loop_at_once() -> None:
    out = io.BytesIO()
    finisher = FinishedRequests(Metrics(), access_log(out))
    finisher(finished(), NOOP_SPAN)  # type: ignore[arg-type]
    assert len(lines(out)) == 1


def test_line_is_stamped_when_the_request_finished() -> None:
    """The access line's time is the request's end (its ``finished_ns`` on the
    ``perf_counter`` clock, turned into wall time), not the time of the batch."""
    out = io.BytesIO()
    finisher = FinishedRequests(Metrics(), access_log(out))
    ctx = finished()
    ctx.finished_ns = time.perf_counter_ns() - 5 * 10**9  # five seconds ago
    ctx.started_ns = ctx.finished_ns - 10**6
    ctx.first_token_ns = ctx.last_chunk_ns = None
    finisher(ctx, NOOP_SPAN)  # type: ignore[arg-type]
    (line,) = lines(out)
    stamped = dt.datetime.fromisoformat(line["timestamp"].replace("Z", "+00:00"))
    ago = (dt.datetime.now(dt.UTC) - stamped).total_seconds()
    assert 4.9 < ago < 5.5


async def test_all_off_holds_nothing() -> None:
    """With metrics and access log off, a finished request is not even kept."""
    out = io.BytesIO()
    finisher = FinishedRequests(Metrics(enabled=False), access_log(out, access=False))
    for ctx in requests(5):
        finisher(ctx, NOOP_SPAN)
    assert "waiting: 0" in repr(finisher)
    finisher.flush()
    assert lines(out) == []
